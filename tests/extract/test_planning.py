"""The torch-free half of the extractor: layer conventions, batching, disk budget, manifest, markers."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import InputError
from app.extract import (
    check_disk_room,
    default_aux_layers,
    done_marker_path,
    estimate_output_bytes,
    read_manifest,
    resolve_aux_layers,
    shard_is_complete,
)
from app.extract.batching import plan_batches
from app.extract.disk_budget import model_shape

from .conftest import HIDDEN, extraction_config, make_samples, write_shards


def test_importing_the_package_and_cli_needs_no_torch(repo_root):
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['safetensors'] = None\n"
        "import app.extract, app.extract.main, app.extract.output\n"
        "app.extract.main.build_parser().parse_args(['--manifest','m','--shard','0','--model','x','--out','o'])\n"
        "assert 'transformers' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_kimi_depth_defaults_match_both_published_conventions():
    assert default_aux_layers(61) == (1, 29, 57)
    layers = resolve_aux_layers(None, "input", 61)
    assert layers.ids == (2, 30, 58)  # SGLang / vLLM numbering of the same layers
    assert layers.output_ids == (1, 29, 57)
    assert resolve_aux_layers("1,29,57", "output", 61).hidden_state_indices == layers.hidden_state_indices


def test_layer_ids_outside_the_model_are_refused_with_the_range():
    with pytest.raises(InputError, match=r"\[32\] outside 0..31 for a model with 32 decoder layers"):
        resolve_aux_layers((1, 32), "output", 32)
    assert resolve_aux_layers((0, 32), "input", 32).output_ids == (-1, 31)
    with pytest.raises(InputError, match="'x' is not a layer number"):
        resolve_aux_layers("1,x", "output", 32)
    with pytest.raises(InputError, match="too few for the EAGLE-3 default"):
        resolve_aux_layers(None, "output", 4)


@given(st.lists(st.integers(1, 300), max_size=60), st.integers(1, 1000))
def test_batches_cover_every_sample_once_within_the_token_budget(lengths, budget):
    batches = plan_batches(lengths, budget)
    assert sorted(k for b in batches for k in b) == list(range(len(lengths)))
    for batch in batches:
        widths = [lengths[k] for k in batch]
        assert widths == sorted(widths, reverse=True)
        assert len(batch) == 1 or len(batch) * widths[0] <= budget


def test_estimate_counts_tokens_times_hidden_times_layers_times_dtype(tmp_path):
    manifest = write_shards(tmp_path / "export", [make_samples(4, seed=1), make_samples(3, seed=2)])
    tokens = [e.tokens for e in read_manifest(manifest).shards]
    config = {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}
    one = estimate_output_bytes(manifest, config, [1, 29, 57], "bf16", shards=[1])
    assert one == tokens[1] * (4 * 7168 * 2 + 16) + 64 * 1024
    both = estimate_output_bytes(manifest, {"text_config": config}, 3, "fp32")
    assert both == sum(tokens) * (4 * 7168 * 4 + 16) + 2 * 64 * 1024


def test_estimate_bounds_the_real_output_size(tmp_path, tiny_model):
    pytest.importorskip("torch")
    from app.extract.progress_lines import ProgressLog
    from app.extract.runner import ExtractOptions, run_extraction

    manifest = write_shards(tmp_path / "export", [make_samples(6, seed=3)])
    out = tmp_path / "hs"
    run_extraction(manifest, [0], ExtractOptions(tiny_model, out, device="cpu"), ProgressLog(io.StringIO()))
    written = (out / "shard_0.safetensors").stat().st_size
    estimate = estimate_output_bytes(manifest, tiny_model, [1, 3, 4], "fp32")
    assert written <= estimate <= written + 64 * 1024
    assert model_shape(tiny_model).hidden_size == HIDDEN


def test_disk_refusal_names_needed_and_free_bytes(tmp_path):
    # a manifest claiming a petabyte-scale export: the real free space of tmp_path cannot hold it
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"shards": [{"index": 0, "path": "s.jsonl", "tokens": 10**12}]}))
    needed = estimate_output_bytes(manifest, {"hidden_size": 7168, "num_hidden_layers": 61}, None, "bf16")
    with pytest.raises(InputError) as info:
        check_disk_room(tmp_path / "not-yet" / "hs", needed)
    message = str(info.value)
    assert f"needs 57360.0 TB ({needed:,} bytes)" in message
    assert re.search(r"but only [\d.]+ [KMGT]?B \([\d,]+ bytes\) is free", message)


def test_manifest_defects_name_the_file_and_field(tmp_path):
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps({"shards": [{"index": 0, "path": "a.jsonl"}, {"index": 0, "path": "b.jsonl"}]}))
    with pytest.raises(InputError, match=r"manifest.json: shards\[1\].index: shard 0 is listed twice"):
        read_manifest(bad)
    with pytest.raises(InputError, match="manifest not found"):
        read_manifest(tmp_path / "missing")


def test_a_marker_without_complete_data_does_not_count_as_done(tmp_path):
    done_marker_path(tmp_path, 2).write_text(json.dumps({"path": "shard_2.safetensors", "bytes": 10}))
    assert not shard_is_complete(tmp_path, 2)
    (tmp_path / "shard_2.safetensors").write_bytes(b"x" * 10)
    assert shard_is_complete(tmp_path, 2)
    done_marker_path(tmp_path, 2).write_text("{not json")
    assert not shard_is_complete(tmp_path, 2)


def test_dry_run_plans_without_a_gpu(tmp_path, capsys, monkeypatch):
    """`eaglewatch extract --dry-run` on a machine with no GPU: the plan, the disk estimate and the argv (with
    the configured layout), and a note that a real run needs the GPUs the config asks for."""
    import json as _json

    from app.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(_json.dumps({"hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 512}))
    manifest = write_shards(tmp_path / "export", [make_samples(4, seed=1), make_samples(3, seed=2)])
    cfg = extraction_config(tmp_path, model, gpus=2, layout="speculators")
    assert main(["extract", str(cfg), "--manifest", str(manifest), "--dry-run", "--json"]) == 0
    plan = _json.loads(capsys.readouterr().out)
    assert plan["slots"] is None and "0 GPU(s)" in plan["notes"][0]
    assert plan["layout"] == "speculators" and plan["estimate_bytes"] > 0
    argv = plan["shards"]["1"]
    assert argv[argv.index("--layout") + 1] == "speculators" and argv[argv.index("--shard") + 1] == "1"
    assert main(["extract", str(cfg), "--manifest", str(manifest), "--dry-run", "--layout", "modelopt"]) == 0
    text = capsys.readouterr().out
    assert "note: not runnable here" in text and "disk: about" in text and "--layout modelopt" in text
    assert not (tmp_path / "run.db").exists()  # a plan starts nothing


def test_the_vllm_backend_runs_the_extractor_with_vllms_python(tmp_path, monkeypatch, capsys):
    """`[extraction] backend = "vllm"`: the same job argv launched by the configured (or EAGLEWATCH_VLLM_PYTHON)
    interpreter with `--backend vllm`; with neither, the plan is refused with a sentence naming both."""
    import json as _json

    from app.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("EAGLEWATCH_VLLM_PYTHON", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(_json.dumps({"hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 512}))
    manifest = write_shards(tmp_path / "export", [make_samples(3, seed=1)])
    cfg = extraction_config(tmp_path, model, gpus=0, backend="vllm")
    assert main(["extract", str(cfg), "--manifest", str(manifest), "--dry-run", "--json"]) != 0
    assert "extraction.python" in capsys.readouterr().err
    monkeypatch.setenv("EAGLEWATCH_VLLM_PYTHON", "/opt/vllm/bin/python")
    assert main(["extract", str(cfg), "--manifest", str(manifest), "--dry-run", "--json"]) == 0
    argv = _json.loads(capsys.readouterr().out)["shards"]["0"]
    assert argv[:3] == ["/opt/vllm/bin/python", "-m", "app.extract"]
    assert argv[argv.index("--backend") + 1] == "vllm"
    cfg = extraction_config(tmp_path, model, gpus=0, backend="vllm", python="/srv/v/bin/python")
    assert main(["extract", str(cfg), "--manifest", str(manifest), "--dry-run", "--json"]) == 0
    assert _json.loads(capsys.readouterr().out)["shards"]["0"][0] == "/srv/v/bin/python"
