"""The built-in extractor (`python -m app.extract`) as a job: `eaglewatch extract` over a tiny random model."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from tests.extract.conftest import build_tiny_model, extraction_config, make_samples, write_shards


@pytest.mark.slow
def test_extract_runs_the_builtin_extractor_per_shard(tmp_path, capsys):
    pytest.importorskip("torch")
    model = build_tiny_model(tmp_path / "model")
    manifest = write_shards(tmp_path / "export", [make_samples(3, seed=1)])
    cfg = extraction_config(tmp_path, model, gpus=0)
    assert main(["extract", str(cfg), "--manifest", str(manifest), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "-m app.extract --manifest" in plan and "--device cpu" in plan and "disk: about" in plan

    assert main(["extract", str(cfg), "--manifest", str(manifest), "--interval", "0.1", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in job["shards"]] == ["done"]
    assert (job["done_items"], job["total_items"]) == (3, 3)
    assert job["tokens"] == sum(
        json.loads(line)["input_ids"].__len__()
        for f in sorted((tmp_path / "export").glob("shard_*.jsonl"))
        for line in f.read_text().splitlines()
    )
    assert all((tmp_path / "hidden" / f"shard_{i}.done").exists() for i in range(1))
