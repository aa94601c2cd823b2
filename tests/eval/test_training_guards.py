"""The guards that need the drafter's training data, end to end: a real export (`--eval-fraction`) of a real
SQLite run, `eaglewatch eval` against the simulator on loopback with `[eval] training` and `[eval] d2t`, and the
`eval report` verb (Markdown, SVG, gates per category, `--against`)."""

from __future__ import annotations

import asyncio
import json
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.commands.eval import EXIT_BELOW_MIN
from app.config import SimulatorOptions
from app.eval.training import TrainingData, read_d2t
from app.export import EVAL_DIR, Export, ExportOptions
from app.simulator.server import SimulatorServer
from tests.export.conftest import build_run_db

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"


@pytest.fixture(scope="module")
def training(tmp_path_factory, sample_reference, sample_tokenizer_dir) -> Path:
    """An sglang-raw export of a finished generation run, with an eval split."""
    sample_cases = json.loads((SAMPLE / "reference_cases.json").read_text(encoding="utf-8"))
    root = tmp_path_factory.mktemp("training")
    built = build_run_db(root / "gen.db", sample_reference, sample_tokenizer_dir, sample_cases, limit=100)
    Export(built.db, root / "out", "sglang-raw", ExportOptions(eval_fraction=0.15)).run()
    return root / "out"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class Spec:
    """A vLLM-personality simulator reporting acceptance `per_position` on loopback."""

    def __init__(self, per_position: tuple[float, ...]) -> None:
        options = SimulatorOptions(
            reference=SAMPLE / "reference.jsonl", personality="vllm", latency_median_ms=0, latency_p95_ms=0,
            spec_acceptance=list(per_position), logprobs=False,
        )  # fmt: skip
        self.server = SimulatorServer(
            options, tokenizer_dir=SAMPLE / "tokenizer", reference=SAMPLE / "reference.jsonl",
            model="moonshotai/kimi-k2.5", profile="kimi-k2.5",
        )  # fmt: skip

    async def __aenter__(self) -> str:
        await self.server.start()
        return self.server.base_url

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()


def write_config(
    tmp_path: Path, base_url: str, *, training: Path, name: str = "eval-a", datasets: str = "", extra: str = ""
) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f"""
[run]
name = "{name}"
database = "{tmp_path / "e.db"}"
{datasets}
[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{SAMPLE / "tokenizer"}"
[[endpoints]]
name = "spec"
base_url = "{base_url}"
server = "vllm"
timeout_s = 20
[limits]
concurrency_max = 8
[eval]
drafter = "test/{name}"
max_tokens = 4096
bootstrap = 200
training = "{training}"
{extra}
"""
    )
    return path


async def _main(argv: list[str]) -> int:
    return await asyncio.to_thread(main, argv)


def test_the_export_writes_what_eval_reads(training) -> None:
    manifest = json.loads((training / "manifest.json").read_text())
    assert manifest["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": None, "thinking": None}
    train, held = _lines(training / "prompts.jsonl"), _lines(training / EVAL_DIR / "prompts.jsonl")
    assert train and held and not {r["id"] for r in train} & {r["id"] for r in held}
    assert all("messages" not in r for r in train) and all(r["messages"] and r["category"] for r in held)
    data = TrainingData.load(training)
    assert data.prompt_hashes == {r["prompt_hash"] for r in train}


async def test_training_makes_the_eval_split_the_prompts_and_sampling_differs_is_said(training, tmp_path, capsys):
    held = _lines(training / EVAL_DIR / "prompts.jsonl")
    async with Spec((0.8, 0.6, 0.4)) as url:
        config = write_config(tmp_path, url, training=training)  # temperature 0 against the data's 1.0
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["endpoints"]["spec"]["answered"] == len(held)
    assert set(report["endpoints"]["spec"]["by_category"]) == {r["category"] for r in held}
    (said,) = [v for v in report["verdicts"] if v["verdict"] == "sampling differs"]
    assert said["level"] == "warning" and "temperature 0.0 in the eval against 1.0 in training" in said["message"]
    assert report["training"]["overlapping_prompts"] == 0 and report["overlap_excluded"] == 0


async def test_sampling_like_the_training_data_raises_no_verdict(training, tmp_path, capsys):
    async with Spec((0.8, 0.6, 0.4)) as url:
        config = write_config(tmp_path, url, training=training, extra="temperature = 1.0")
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [v["verdict"] for v in report["verdicts"]] == []


async def test_eval_prompts_that_were_trained_on_are_flagged_and_left_out(training, tmp_path, capsys):
    held = _lines(training / EVAL_DIR / "prompts.jsonl")
    trained = [r for r in _lines(training / "data" / "sglang_raw.jsonl")][:3]
    extra = tmp_path / "also-trained.jsonl"
    # the same prompts with other whitespace: the export's normalisation still matches them
    extra.write_text(
        "".join(
            json.dumps({"id": f"dup-{i}", "messages": [{**m, "content": f"  {m['content']}\n"} for m in r["messages"]]})
            + "\n"
            for i, r in enumerate(trained)
        )
    )
    datasets = f"""[data]
[[data.datasets]]
path = "{training / EVAL_DIR / "prompts.jsonl"}"
columns = {{category = "category"}}
[[data.datasets]]
path = "{extra}"
"""
    async with Spec((0.8, 0.6, 0.4)) as url:
        config = write_config(tmp_path, url, training=training, datasets=datasets, extra="temperature = 1.0")
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (said,) = [v for v in report["verdicts"] if v["verdict"] == "eval/training overlap"]
    assert said["message"].startswith(f"3 of {len(held) + 3} eval prompts are also in the training data")
    assert "dup-0" in said["message"]
    assert report["overlap_excluded"] == 3
    assert report["overall"]["figures"]["requests"] + report["overall"]["loops"] == len(held)
    assert "also-trained" not in report["overall"]["by_category"]


def _safetensors(path: Path, name: str, values: np.ndarray) -> None:
    data = values.astype("<i8").tobytes()
    header = json.dumps({name: {"dtype": "I64", "shape": [len(values)], "data_offsets": [0, len(data)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def test_d2t_is_read_from_npy_safetensors_and_a_checkpoint_folder(tmp_path) -> None:
    chosen = np.array([3, 7, 8, 20])
    d2t = chosen - np.arange(4)
    np.save(tmp_path / "d2t-4.npy", d2t)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _safetensors(ckpt / "model.safetensors", "d2t", d2t)
    assert read_d2t(tmp_path / "d2t-4.npy") == read_d2t(ckpt) == {3, 7, 8, 20}


async def test_a_draft_vocabulary_that_misses_the_outputs_is_said_and_a_full_one_is_not(training, tmp_path, capsys):
    np.save(tmp_path / "tiny.npy", np.zeros(8, dtype=np.int64))  # the draft vocabulary is ids 0..7
    async with Spec((0.8, 0.6, 0.4)) as url:
        config = write_config(
            tmp_path, url, training=training, extra=f'temperature = 1.0\nd2t = "{tmp_path / "tiny.npy"}"'
        )
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        (said,) = [v for v in report["verdicts"] if v["verdict"] == "draft vocabulary coverage"]
        assert "of the eval's" in said["message"] and report["draft_vocabulary"]["draft_vocab_size"] == 8
        assert report["draft_vocabulary"]["coverage"] < 0.9
        full = tmp_path / "full.safetensors"
        _safetensors(full, "model.d2t", np.zeros(200_000, dtype=np.int64))
        config = write_config(
            tmp_path, url, training=training, name="eval-b", extra=f'temperature = 1.0\nd2t = "{full}"'
        )
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["draft_vocabulary"]["coverage"] == 1.0
    assert "draft vocabulary coverage" not in [v["verdict"] for v in report["verdicts"]]


async def test_eval_report_writes_markdown_and_svg_and_gates_per_category(training, tmp_path, capsys):
    async with Spec((0.5, 0.3, 0.1)) as url:
        config = write_config(tmp_path, url, training=training, extra="temperature = 1.0")
        assert await _main(["eval", "--headless", str(config)]) == 0
    capsys.readouterr()
    db, md, svg = str(tmp_path / "e.db"), tmp_path / "r.md", tmp_path / "r.svg"
    argv = ["eval", "report", "--db", db, "--markdown", str(md), "--svg", str(svg), "--min-acceptance", "prompts=9"]
    assert await _main(argv) == EXIT_BELOW_MIN
    out = capsys.readouterr()
    assert "gate failed: category 'prompts': mean acceptance length" in out.err and "prompts=9.0" in out.err
    assert "| spec | prompts |" in md.read_text() and "## Verdicts" in md.read_text()
    ET.fromstring(svg.read_text())
    assert (
        await _main(["eval", "report", "--db", db, "--min-acceptance", "prompts=1.01", "--min-acceptance", "1.01"]) == 0
    )
    assert "deprecated" not in capsys.readouterr().err
    assert await _main(["eval-report", "--db", db]) == 0
    assert "eval-report: deprecated, say `eaglewatch eval report`" in capsys.readouterr().err


async def test_against_compares_two_drafters_runs_paired_by_prompt(training, tmp_path, capsys):
    async with Spec((0.2, 0.1, 0.0)) as weak, Spec((0.9, 0.8, 0.7)) as strong:
        a = write_config(tmp_path, weak, training=training, name="weak", extra="temperature = 1.0")
        b = write_config(tmp_path, strong, training=training, name="strong", extra="temperature = 1.0")
        assert await _main(["eval", "--headless", str(a)]) == 0
        assert await _main(["eval", "--headless", str(b)]) == 0
    capsys.readouterr()
    db = str(tmp_path / "e.db")
    assert await _main(["eval", "report", "--db", db, "--run", "strong", "--against", "weak", "--json"]) == 0
    ab = json.loads(capsys.readouterr().out)["against"]
    held = len(_lines(training / EVAL_DIR / "prompts.jsonl"))
    assert ab["paired"] and ab["pairs"] <= held and ab["pairs"] >= held - 2  # loops, if any, are left out
    assert ab["a"].startswith("strong") and ab["difference"] < 0 and ab["difference_ci95"][1] < 0
    assert await _main(["eval", "report", "--db", db, "--run", "strong", "--against", "weak"]) == 0
    assert "A/B weak (test/weak) vs strong (test/strong)" in capsys.readouterr().out


def test_a_top_k_the_training_data_did_not_use_is_a_sampling_difference(tmp_path) -> None:
    from app.eval.training import sampling_verdict

    data = TrainingData(tmp_path, {"temperature": 1.0, "top_p": 1.0, "top_k": None, "thinking": True}, frozenset())
    same = {"temperature": 1.0, "top_p": 1.0, "chat_template_kwargs": {"enable_thinking": True}}
    assert sampling_verdict([same, same], data) is None
    said = sampling_verdict([same, {**same, "top_k": 1}], data)
    assert said is not None and "top_k 1, unset (the server's default) in the eval against unset" in said["message"]
    said = sampling_verdict([{**same, "chat_template_kwargs": {"enable_thinking": False}}], data)
    assert said is not None and "thinking False in the eval against True in training" in said["message"]


async def test_the_configs_category_gate_fails_the_eval_with_exit_4(training, tmp_path, capsys):
    async with Spec((0.5, 0.3, 0.1)) as url:
        config = write_config(
            tmp_path, url, training=training, extra="temperature = 1.0\nmin_acceptance = {prompts = 9.0}"
        )
        assert await _main(["eval", "--headless", str(config)]) == EXIT_BELOW_MIN
    assert "gate failed: category 'prompts'" in capsys.readouterr().err


async def test_a_training_folder_gone_at_report_time_is_a_verdict_not_a_failure(training, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(training, copy)
    async with Spec((0.5, 0.3, 0.1)) as url:
        config = write_config(tmp_path, url, training=copy, extra="temperature = 1.0")
        assert await _main(["eval", "--headless", str(config)]) == 0
    capsys.readouterr()
    shutil.rmtree(copy)
    assert await _main(["eval", "report", "--db", str(tmp_path / "e.db"), "--json"]) == 0
    (said,) = json.loads(capsys.readouterr().out)["verdicts"]
    assert said["verdict"] == "training data unreadable" and "manifest.json: cannot be read" in said["message"]


def test_a_training_folder_that_is_no_export_stops_the_eval_before_any_request(training, tmp_path, capsys):
    not_an_export = tmp_path / "nothing"
    not_an_export.mkdir()
    datasets = f"""[data]
[[data.datasets]]
path = "{training / EVAL_DIR / "prompts.jsonl"}"
"""
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", training=not_an_export, datasets=datasets)
    assert main(["eval", "--headless", str(config)]) == 2
    assert "manifest.json: cannot be read" in capsys.readouterr().err
    assert not (tmp_path / "e.db").exists()


async def test_two_drafter_endpoints_and_a_baseline_get_an_ab_row_and_paired_speedups(training, tmp_path, capsys):
    async with Spec((0.2, 0.1, 0.0)) as weak, Spec((0.9, 0.8, 0.7)) as strong, Spec(()) as plain:
        config = write_config(tmp_path, weak, training=training, extra='temperature = 1.0\nbaseline = "plain"')
        text = config.read_text().replace(
            "[limits]",
            f'[[endpoints]]\nname = "strong"\nbase_url = "{strong}"\nserver = "vllm"\n'
            f'[[endpoints]]\nname = "plain"\nbase_url = "{plain}"\nserver = "vllm"\n[limits]',
        )
        config.write_text(text)
        assert await _main(["eval", "--headless", str(config), "--json", "--markdown", str(tmp_path / "r.md")]) == 0
    report = json.loads(capsys.readouterr().out)
    held = len(_lines(training / EVAL_DIR / "prompts.jsonl"))
    assert set(report["endpoints"]) == {"spec", "strong"} and report["baseline"]["answered"] == held
    for ep in report["endpoints"].values():
        assert ep["speedup"]["pairs"] == held and ep["speedup"]["speedup_ci95"] is not None
    (ab,) = report["ab"]
    assert (ab["a"], ab["b"], ab["paired"]) == ("spec", "strong", True) and ab["difference_ci95"][0] > 0
    md = (tmp_path / "r.md").read_text()
    assert "## A/B" in md and "| spec | strong |" in md and "(baseline)" in md
