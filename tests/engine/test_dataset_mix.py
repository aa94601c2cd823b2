"""A mix declared by weight: three datasets sharing data.total, run against the simulator end to end."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from app.config import parse_config, weighted_shares
from app.engine.run import Run
from app.engine.work.config_ingest import ingest_config
from app.store.run_store import RunStore
from tests.engine.conftest import config_data


def test_weighted_shares_sum_to_the_total() -> None:
    assert weighted_shares(100, [0.4, 0.3, 0.3]) == [40, 30, 30]
    assert weighted_shares(10, [1, 1, 1]) == [4, 3, 3]
    assert sum(weighted_shares(997, [5, 3, 2.5])) == 997


def test_weights_without_a_total_are_refused(tmp_path: Path, sample_data: Path) -> None:
    data = config_data(tmp_path, sample_data)
    data["data"]["datasets"][0]["weight"] = 1.0
    with pytest.raises(Exception, match="data.total is not set"):
        parse_config(data, base_dir=tmp_path)


async def test_a_three_dataset_mix_by_weight_is_what_is_generated(tmp_path: Path, sample_data: Path) -> None:
    lines = (sample_data / "prompts.openai.jsonl").read_text().splitlines()
    refs = (sample_data / "reference.jsonl").read_text().splitlines()
    datasets = []
    ref = (tmp_path / "reference.jsonl").open("w")
    for name, weight in (("code", 4), ("chat", 3), ("tools", 3)):
        for line in refs:
            obj = json.loads(line)
            obj["id"] = f"{name}-{obj['id']}"
            ref.write(json.dumps(obj) + "\n")
        path = tmp_path / f"{name}.jsonl"
        with path.open("w") as fh:
            for line in lines:
                obj = json.loads(line)
                obj["id"] = f"{name}-{obj['id']}"
                fh.write(json.dumps(obj) + "\n")
        datasets.append({"path": str(path), "weight": weight})
    ref.close()
    data = config_data(tmp_path, sample_data)
    data["data"] = {"datasets": datasets, "total": 200, "reference": str(tmp_path / "reference.jsonl")}
    config = parse_config(data, base_dir=tmp_path)
    store = await RunStore.open(config.run.database)
    try:
        await ingest_config(store, config, check=False)
        run = Run(config, store)
        try:
            await run.start()
            await asyncio.wait_for(run.wait(), 60)
        finally:
            await run.close()
    finally:
        await store.close()
    conn = sqlite3.connect(config.run.database)
    done = dict(conn.execute("SELECT dataset, COUNT(*) FROM samples WHERE state = 'done' GROUP BY dataset"))
    conn.close()
    total = sum(done.values())
    assert total == 200
    for name, weight in (("code", 0.4), ("chat", 0.3), ("tools", 0.3)):
        assert abs(done[name] / total - weight) <= 0.01, done
    # the mix as `status --json` shows it: per dataset (no category column: the dataset's name stands)
    from app.store.queries import dataset_mix

    conn = sqlite3.connect(config.run.database)
    mix = {row.dataset: row for row in dataset_mix(conn, 1)}
    conn.close()
    assert {n: (r.category, r.prompts, r.answers) for n, r in mix.items()} == {
        "code": ("code", 80, 80),
        "chat": ("chat", 60, 60),
        "tools": ("tools", 60, 60),
    }
    assert all(r.loss_tokens > r.answers for r in mix.values())
    assert all(sum(dict(r.languages).values()) == r.prompts for r in mix.values())
    assert 0 <= mix["code"].as_json()["tool_call_share"] <= 1
