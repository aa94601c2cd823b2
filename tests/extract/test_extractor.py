"""The built-in extractor on a tiny random model: saved states equal a direct forward pass, checks refuse
bad data, resume skips finished shards."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import InputError
from app.extract.manifest import ShardSample, read_manifest, read_shard
from app.extract.output import done_marker_path, load_shard_output, read_output_metadata, shard_data_path
from app.extract.progress_lines import ProgressLog

from .conftest import LAYERS, build_tiny_model, make_samples, write_shards

torch = pytest.importorskip("torch")

from app.extract.runner import ExtractionError, ExtractOptions, _check_batch, run_extraction  # noqa: E402


def _options(model: Path, out: Path, **kw) -> ExtractOptions:
    kw.setdefault("batch_tokens", 96)  # several samples per batch, several batches per shard
    kw.setdefault("device", "cpu")
    return ExtractOptions(model_path=model, out_dir=out, **kw)


def _run(manifest, shards, options) -> list[dict]:
    stream = io.StringIO()
    run_extraction(manifest, shards, options, ProgressLog(stream))
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def _direct(reference, ids: list[int]):
    with torch.no_grad():
        out = reference(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states


def _assert_matches_direct(reference, manifest_path: Path, shard: int, data_path: Path, hs_indices) -> None:
    samples = read_shard(read_manifest(manifest_path).shard(shard))
    saved = load_shard_output(data_path)
    assert [s["sample_id"] for s in saved] == [s.sample_id for s in samples]
    for sample, got in zip(samples, saved, strict=True):
        states = _direct(reference, list(sample.input_ids))
        assert got["input_ids"].tolist() == list(sample.input_ids)
        assert got["loss_mask"].tolist() == list(sample.loss_mask)
        torch.testing.assert_close(got["hidden_states"], states[-1][0], rtol=1e-4, atol=1e-5)
        want_aux = torch.cat([states[h][0] for h in hs_indices], dim=-1)
        torch.testing.assert_close(got["aux_hidden_states"], want_aux, rtol=1e-4, atol=1e-5)


def test_output_convention_states_equal_a_direct_forward_pass(tiny_model, tiny_reference, two_shards, tmp_path):
    out = tmp_path / "hs"
    _run(two_shards, [0, 1], _options(tiny_model, out))  # default layers [1, N//2-1, N-4] = [1, 3, 4]
    for shard in (0, 1):
        _assert_matches_direct(tiny_reference, two_shards, shard, shard_data_path(out, shard), [2, 4, 5])
    meta = read_output_metadata(shard_data_path(out, 0))
    assert json.loads(meta["aux_layers"]) == [1, 3, 4]
    assert meta["layer_convention"] == "output"
    assert json.loads(meta["aux_layers_input_convention"]) == [2, 4, 5]
    assert json.loads(meta["hidden_state_indices"]) == [2, 4, 5]


def test_input_convention_states_equal_a_direct_forward_pass(tiny_model, tiny_reference, two_shards, tmp_path):
    out = tmp_path / "hs"
    # 0 = the embeddings entering layer 0; 8 = the last layer's output before the final norm
    _run(two_shards, [1], _options(tiny_model, out, aux_layers=(0, 2, 5), convention="input"))
    _assert_matches_direct(tiny_reference, two_shards, 1, shard_data_path(out, 1), [0, 2, 5])
    meta = read_output_metadata(shard_data_path(out, 1))
    assert meta["layer_convention"] == "input"
    assert json.loads(meta["aux_layers_output_convention"]) == [-1, 1, 4]


def test_per_sample_files_hold_the_same_states(tiny_model, tiny_reference, two_shards, tmp_path):
    out = tmp_path / "hs"
    events = _run(two_shards, [0], _options(tiny_model, out, per_sample=True, aux_layers=(1, 5, 6)))
    folder = shard_data_path(out, 0, per_sample=True)
    assert folder.is_dir() and len(list(folder.glob("*.safetensors"))) == 7
    _assert_matches_direct(tiny_reference, two_shards, 0, folder, [2, 6, 7])
    assert events[-1]["event"] == "shard_done" and events[-1]["path"] == str(folder)


def test_qwen2_model_is_extracted_too(tmp_path, two_shards):
    from transformers import AutoModelForCausalLM

    model_dir = build_tiny_model(tmp_path / "qwen2", arch="qwen2", seed=3)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True).eval()
    out = tmp_path / "hs"
    _run(two_shards, [1], _options(model_dir, out))
    _assert_matches_direct(reference, two_shards, 1, shard_data_path(out, 1), [2, 4, 5])


def test_cli_prints_contract_progress_lines_and_exit_1_for_a_failed_shard(tmp_path, repo_root):
    poisoned = 9  # its embedding row is NaN: only shard 1, which contains it, fails
    model_dir = build_tiny_model(tmp_path / "model", nan_token=poisoned)
    clean = [{**r, "input_ids": [t if t != poisoned else 10 for t in r["input_ids"]]} for r in make_samples(7, 1)]
    bad = [{"id": "x", "input_ids": [5, poisoned, 11], "loss_mask": [0, 1, 1]}]
    manifest = write_shards(tmp_path / "export", [clean, bad])
    out = tmp_path / "hs"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.extract",
            "--manifest",
            str(manifest),
            "--shard",
            "0",
            "--shard",
            "1",
            "--model",
            str(model_dir),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--batch-tokens",
            "96",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=repo_root,
        env={**os.environ, "PYTHONPATH": str(repo_root)},
    )
    assert proc.returncode == 1
    assert "error: shard 1, sample 'x'" in proc.stderr and "Traceback" not in proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    mine = [e for e in events if e["shard"] == 0]
    progress = [e for e in mine if e["event"] == "progress"]
    assert len(progress) >= 3  # the start line plus one per batch (96-token batches, up to 40 tokens each)
    assert [e["done"] for e in progress] == sorted(e["done"] for e in progress)
    assert progress[-1]["done"] == progress[-1]["total"] == 7
    assert progress[-1]["tokens"] == progress[-1]["tokens_total"] == sum(len(r["input_ids"]) for r in clean)
    assert mine[-1] == {**mine[-1], "event": "shard_done", "skipped": False, "path": str(out / "shard_0.safetensors")}
    assert json.loads(done_marker_path(out, 0).read_text())["path"] == "shard_0.safetensors"
    assert events[-1]["event"] == "shard_failed" and events[-1]["shard"] == 1 and events[-1]["sample_id"] == "x"
    assert not done_marker_path(out, 1).exists()


def test_a_done_shard_is_skipped_and_an_incomplete_one_redone(tiny_model, two_shards, tmp_path):
    out = tmp_path / "hs"
    _run(two_shards, [0, 1], _options(tiny_model, out))
    first = shard_data_path(out, 0).stat().st_mtime_ns
    # shard 1 loses the tail of its data: its marker no longer describes a complete output
    data1 = shard_data_path(out, 1)
    with data1.open("r+b") as f:
        f.truncate(data1.stat().st_size - 10)
    events = _run(two_shards, [0, 1], _options(tiny_model, out))
    done = {e["shard"]: e for e in events if e["event"] == "shard_done"}
    assert done[0]["skipped"] is True and done[1]["skipped"] is False
    assert not any(e["event"] == "progress" and e["shard"] == 0 for e in events)
    assert shard_data_path(out, 0).stat().st_mtime_ns == first
    assert len(load_shard_output(data1)) == 5


def test_all_shards_done_skips_without_loading_the_model(two_shards, tiny_model, tmp_path):
    out = tmp_path / "hs"
    _run(two_shards, [1], _options(tiny_model, out))
    # the model folder is not even read when every requested shard is done
    events = _run(two_shards, [1], _options(tmp_path / "no-such-model", out))
    assert [e["event"] for e in events] == ["shard_done"] and events[0]["skipped"] is True


def test_nan_states_name_the_sample_and_leave_no_marker(tmp_path):
    poisoned = 77
    model_dir = build_tiny_model(tmp_path / "nan-model", nan_token=poisoned)
    rows = make_samples(6, seed=5)
    rows = [{**r, "input_ids": [t if t != poisoned else poisoned + 1 for t in r["input_ids"]]} for r in rows]
    rows[3]["input_ids"][1] = poisoned
    manifest = write_shards(tmp_path / "export", [rows])
    out = tmp_path / "hs"
    stream = io.StringIO()
    with pytest.raises(ExtractionError, match=r"shard 0, sample 's5-3'.*NaN or Inf") as info:
        run_extraction(manifest, [0], _options(model_dir, out), ProgressLog(stream))
    assert info.value.sample_id == "s5-3"
    assert not done_marker_path(out, 0).exists()
    assert [p.name for p in out.iterdir()] == ["eaglewatch_layout.json"]  # the partial file is removed
    failed = [json.loads(line) for line in stream.getvalue().splitlines()][-1]
    assert failed["event"] == "shard_failed" and failed["sample_id"] == "s5-3"


def test_token_ids_that_differ_from_the_manifest_are_refused():
    rows = [ShardSample("a", (5, 6, 7), (0, 1, 1)), ShardSample("b", (8, 9), (0, 1))]
    seen = torch.tensor([5, 6, 7, 8, 10])  # what reached the model for sample b differs at position 1
    last, aux = torch.zeros(5, 4), torch.zeros(5, 8)
    with pytest.raises(ExtractionError, match=r"shard 3, sample 'b'.*differ from the manifest's at position 1"):
        _check_batch(rows, last, aux, seen, True, 4, 2, 3)
    _check_batch(rows, last, aux, torch.tensor([5, 6, 7, 8, 9]), True, 4, 2, 3)  # equal ids pass


def test_wrong_state_shapes_are_refused():
    rows = [ShardSample("a", (5, 6, 7), (0, 1, 1))]
    with pytest.raises(ExtractionError, match=r"shard 0: .*sample 'a'.*expected \(3, 4\) / \(3, 8\)"):
        _check_batch(rows, torch.zeros(3, 4), torch.zeros(3, 4), torch.tensor([5, 6, 7]), True, 4, 2, 0)


def test_a_shard_whose_token_count_differs_from_the_manifest_is_refused(tiny_model, tmp_path):
    manifest = write_shards(tmp_path / "export", [make_samples(3, seed=9)], tokens_override={0: 5})
    with pytest.raises(InputError, match=r"shard 0 holds \d+ tokens but the manifest says 5"):
        _run(manifest, [0], _options(tiny_model, tmp_path / "hs"))


def test_ids_outside_the_vocabulary_are_refused_before_the_forward(tiny_model, tmp_path):
    rows = make_samples(2, seed=4)
    rows[1]["input_ids"][0] = 100_000
    manifest = write_shards(tmp_path / "export", [rows])
    with pytest.raises(ExtractionError, match=r"sample 's4-1': token id 100000 is outside the model's vocabulary"):
        _run(manifest, [0], _options(tiny_model, tmp_path / "hs"))


def test_unknown_shard_and_bad_layers_are_input_errors(tiny_model, two_shards, tmp_path):
    with pytest.raises(InputError, match=r"no shard 9; the manifest lists shards 0..1"):
        _run(two_shards, [9], _options(tiny_model, tmp_path / "hs"))
    with pytest.raises(InputError, match=r"\[8\] outside 0..7"):
        _run(two_shards, [0], _options(tiny_model, tmp_path / "hs", aux_layers=(1, LAYERS)))


def test_a_run_that_cannot_fit_is_refused_before_the_model_loads(tmp_path):
    manifest = write_shards(tmp_path / "export", [make_samples(2, seed=6)], tokens_override={0: 10**13})
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32}))
    # no weights in the folder: reaching the model load would fail differently
    with pytest.raises(InputError, match=r"not enough disk space for 1 shard\(s\) of hidden states: needs .* bytes\)"):
        _run(manifest, [0], _options(tmp_path / "model", tmp_path / "hs"))
    assert not done_marker_path(tmp_path / "hs", 0).exists()


def test_help_shows_an_example(repo_root):
    proc = subprocess.run(
        [sys.executable, "-m", "app.extract", "--help"], cwd=repo_root, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert "Example:" in proc.stdout and "--layer-convention" in proc.stdout and "--aux-layers 1,17,32" in proc.stdout


def test_bf16_states_are_stored_as_bf16_and_read_back(tiny_model, tiny_reference, two_shards, tmp_path):
    out = tmp_path / "hs"
    _run(two_shards, [1], _options(tiny_model, out, dtype="bf16"))
    saved = load_shard_output(shard_data_path(out, 1))
    assert read_output_metadata(shard_data_path(out, 1))["dtype"] == "bf16"
    sample = read_shard(read_manifest(two_shards).shard(1))[0]
    states = _direct(tiny_reference, list(sample.input_ids))
    assert saved[0]["hidden_states"].dtype == torch.bfloat16
    assert saved[0]["aux_hidden_states"].shape == (len(sample.input_ids), 3 * 64)
    # a bf16 forward against the fp32 one: close, not equal
    torch.testing.assert_close(saved[0]["hidden_states"].float(), states[-1][0], rtol=0.1, atol=0.1)
