"""The vLLM extractor backend (`python -m app.extract --backend vllm`, run by vLLM's own Python through its
hidden-states connector, app/extract/vllm_model.py) against the built-in one (transformers, fp32, CPU) on the tiny
Qwen3 vLLM serves: the same export ids, the same layers, the same layouts, the same done markers.

The tiny model has 2 decoder layers, so the layers are given in the "input" convention as 0,1,2 (embeddings, after
layer 0, after layer 1 = the last state before the norm): vLLM stores id 2 once (3 slots) and the backend fills both
the third aux slot and the last state from it. Per layer the norm ratio ||vllm|| / ||builtin|| and the max absolute
difference are printed; fp32 both sides, the same weights and the same sums in a different kernel order, so the
states agree to rounding: ratio within 1e-4 of 1 and max |diff| within 1e-4 of the layer's largest |value|
(the measured figures are ~1e-7; docs/jobs.md). Each trainer loader (SpecForge, Model-Optimizer) reads the vLLM
folders as it reads the built-in's; without the trainer venv those checks skip, as in tests/extract.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.extract.manifest import read_manifest
from app.extract.output import load_shard_output, read_done_marker, shard_data_path
from tests.extract.conftest import extraction_config, make_samples, write_shards
from tests.realserver.conftest import vllm_python

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(1200)

LAYERS = ["--aux-layers", "0,1,2", "--layer-convention", "input", "--dtype", "fp32", "--device", "cpu"]
NORM_RATIO_TOL = 1e-4
MAX_DIFF_TOL = 1e-4  # relative to the layer's largest |value| in that sample
ROOT = Path(__file__).resolve().parents[2]


def _python() -> str:
    python = vllm_python()
    if python is None or not os.path.exists(python):
        message = "VLLM TESTS NOT RUN: no vLLM environment (scripts/vllm_venv.sh, EAGLEWATCH_VLLM_PYTHON)"
        if os.environ.get("EAGLEWATCH_REQUIRE_VLLM"):
            pytest.fail(message.replace("NOT RUN", "REQUIRED but missing"))
        pytest.skip(message)
    return python


def _builtin(manifest: Path, model: Path, out: Path, layout: str) -> None:
    """The built-in extractor as one process (transformers, fp32, CPU)."""
    argv = [sys.executable, "-m", "app.extract", "--manifest", str(manifest), "--shard", "0", "--shard", "1"]
    argv += ["--model", str(model), "--out", str(out), "--layout", layout, *LAYERS]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]


def _vllm_job(python: str, manifest: Path, model: Path, base: Path, layout: str, monkeypatch, capsys) -> Path:
    """The vLLM backend as `eaglewatch extract` runs it: a job on the local executor, [extraction] backend = "vllm",
    its progress lines read by the job store, a done marker per shard; returns the output folder."""
    base.mkdir(parents=True)
    for key, value in {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}.items():
        monkeypatch.setenv(key, value)
    cfg = extraction_config(
        base,
        model,
        gpus=0,
        backend="vllm",
        python=python,
        layout=layout,
        aux_layers=[0, 1, 2],
        layer_convention="input",
    )
    capsys.readouterr()
    assert main(["extract", str(cfg), "--manifest", str(manifest), "--interval", "0.5", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in job["shards"]] == ["done", "done"], job
    samples = sum(e.samples for e in read_manifest(manifest).shards)
    assert (job["done_items"], job["total_items"]) == (samples, samples)
    return base / "hidden"


@pytest.fixture(scope="module")
def vllm_py() -> str:
    """vLLM's Python, or skip (fail under EAGLEWATCH_REQUIRE_VLLM) before any model is built."""
    return _python()


@pytest.fixture(scope="module")
def export(vllm_py, vllm_model_dir, tmp_path_factory) -> Path:
    vocab = json.loads((vllm_model_dir / "config.json").read_text())["vocab_size"]
    root = tmp_path_factory.mktemp("vllm-extract") / "export"
    return write_shards(root, [make_samples(5, seed=31, vocab=vocab), make_samples(3, seed=32, vocab=vocab)])


MADE: dict[str, tuple[Path, Path]] = {}


@pytest.fixture
def both(vllm_py, export, vllm_model_dir, tmp_path_factory, monkeypatch, capsys):
    """(layout) -> (built-in folder, vLLM folder), each layout extracted once per module."""
    python = vllm_py

    def get(layout: str) -> tuple[Path, Path]:
        if layout not in MADE:
            base = tmp_path_factory.mktemp(f"vllm-extract-{layout}")
            _builtin(export, vllm_model_dir, base / "builtin", layout)
            via_vllm = _vllm_job(python, export, vllm_model_dir, base / "job", layout, monkeypatch, capsys)
            MADE[layout] = (base / "builtin", via_vllm)
        return MADE[layout]

    return get


def _compare(name: str, want, got) -> tuple[float, float]:
    """(norm ratio, max |diff| / max |want|) of one state, asserted within the fp32 tolerances."""
    want, got = want.to(torch.float64), got.to(torch.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    ratio = float(got.norm() / want.norm())
    diff = float((got - want).abs().max())
    scale = float(want.abs().max())
    assert abs(ratio - 1) <= NORM_RATIO_TOL, f"{name}: ||vllm||/||builtin|| = {ratio}"
    assert diff <= MAX_DIFF_TOL * scale, f"{name}: max |diff| {diff} against max |builtin| {scale}"
    return ratio, diff / scale


def test_vllm_states_equal_the_builtin_extractors(both, capsys):
    builtin, via_vllm = both("packed")
    worst: dict[str, list[float]] = {}
    for shard in (0, 1):
        want = load_shard_output(shard_data_path(builtin, shard))
        got = load_shard_output(shard_data_path(via_vllm, shard))
        assert [s["sample_id"] for s in got] == [s["sample_id"] for s in want]
        for w, g in zip(want, got, strict=True):
            assert torch.equal(g["input_ids"], w["input_ids"]) and torch.equal(g["loss_mask"], w["loss_mask"])
            hidden = w["hidden_states"].shape[-1]
            named = {"last (post-norm)": (w["hidden_states"], g["hidden_states"])}
            for k, layer in enumerate((0, 1, 2)):
                sl = slice(k * hidden, (k + 1) * hidden)
                named[f"aux {layer} (input conv.)"] = (w["aux_hidden_states"][:, sl], g["aux_hidden_states"][:, sl])
            for name, (a, b) in named.items():
                ratio, rel = _compare(f"{w['sample_id']} {name}", a, b)
                row = worst.setdefault(name, [1.0, 0.0])
                if abs(ratio - 1) > abs(row[0] - 1):  # the ratio farthest from 1
                    row[0] = ratio
                row[1] = max(row[1], rel)
        marker_b, marker_v = read_done_marker(builtin, shard), read_done_marker(via_vllm, shard)
        assert marker_b is not None and marker_v is not None
        for key in ("layout", "samples", "tokens", "bytes", "dtype", "aux_layers_input_convention"):
            assert marker_v[key] == marker_b[key], key
    with capsys.disabled():
        for name, (ratio, rel) in worst.items():
            print(f"\nvLLM vs built-in, {name}: worst norm ratio {ratio:.9f}, max |diff| / max |x| {rel:.2e}")


def test_specforge_reads_the_vllm_folder_as_the_builtins(both, tmp_path):
    from tests.export.trainers.env import run_consumer, trainer_site

    trainer_site()  # skips before the extraction when the trainer env is absent
    builtin, via_vllm = both("specforge")
    run_consumer("specforge-hs", builtin, result=tmp_path / "b.pt")
    run_consumer("specforge-hs", via_vllm, result=tmp_path / "v.pt")
    want, got = torch.load(tmp_path / "b.pt"), torch.load(tmp_path / "v.pt")
    assert sorted(got) == sorted(want)
    for name in want:
        for part in ("raw", "item"):
            assert sorted(got[name][part]) == sorted(want[name][part])
            for key, value in want[name][part].items():
                if value.is_floating_point():
                    _compare(f"specforge {name} {part}.{key}", value, got[name][part][key])
                else:
                    assert torch.equal(got[name][part][key], value), (name, part, key)


def test_modelopt_reads_the_vllm_folder_as_the_builtins(both, tmp_path):
    from tests.export.trainers.env import run_consumer, trainer_site

    trainer_site()
    builtin, via_vllm = both("modelopt")
    run_consumer("modelopt-hs", builtin, result=tmp_path / "b.pt")
    run_consumer("modelopt-hs", via_vllm, result=tmp_path / "v.pt")
    want, got = torch.load(tmp_path / "b.pt"), torch.load(tmp_path / "v.pt")
    assert sorted(got) == sorted(want)
    for cid in want:
        for key, value in want[cid].items():
            if torch.is_tensor(value) and value.is_floating_point():
                _compare(f"modelopt {cid} {key}", value, got[cid][key])
            elif torch.is_tensor(value):
                assert torch.equal(got[cid][key], value), (cid, key)
            else:
                assert got[cid][key] == value, (cid, key)
