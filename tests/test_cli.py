"""The command line contract: every verb listed, an example at the end of each verb's help, exit codes,
and no library noise on stderr."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import VERBS, main

ALL_VERBS = (
    "demo",
    "run",
    "watch",
    "serve",
    "ingest",
    "status",
    "validate",
    "audit",
    "calibrate",
    "fidelity",
    "reprocess",
    "export",
    "vocab",
    "extract",
    "jobs",
    "eval",
    "eval-report",
    "simulate",
    "config",
)


SPOKEN = {"eval-report": "eval report"}


def eaglewatch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed console script (or the module when the script is not on this venv's bin)."""
    script = Path(sys.executable).parent / "eaglewatch"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_", "HF_", "TOKENIZERS_"))}
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_registry_has_every_verb() -> None:
    assert tuple(VERBS) == ALL_VERBS


def test_top_level_help_lists_every_verb_quietly() -> None:
    out = eaglewatch("--help")
    assert out.returncode == 0
    for verb in ALL_VERBS:
        assert re.search(rf"^\s+{verb}\s", out.stdout, re.M), f"{verb} missing from eaglewatch --help"
    assert out.stderr == ""


@pytest.mark.parametrize("verb", ALL_VERBS)
def test_each_verb_help_ends_with_an_example(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([verb, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out.rstrip()
    assert "\nExample:\n" in text, f"eaglewatch {verb} --help has no Example: block"
    example = text.rsplit("\nExample:\n", 1)[1]
    lines = [ln.strip() for ln in example.splitlines() if ln.strip()]
    spoken = SPOKEN.get(verb, verb)  # a deprecated spelling shows its new one
    assert any(ln.startswith(f"eaglewatch {spoken}") for ln in lines), f"no `eaglewatch {spoken} ...` in its example"


@pytest.mark.parametrize("verb", ["ingest", "status"])
def test_run_verbs_take_db_run_and_json(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([verb, "--help"])
    text = capsys.readouterr().out
    for flag in ("--db PATH", "--run NAME", "--json"):
        assert flag in text


def test_config_check_prints_the_effective_config_quietly(sample_data_dir: Path) -> None:
    out = eaglewatch("config", "check", str(sample_data_dir / "demo.toml"))
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert "[run]" in out.stdout and 'profile = "kimi-k2.5"' in out.stdout


def test_bad_input_exits_2_with_a_sentence_on_stderr(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[run\n")
    out = eaglewatch("config", "check", str(cfg))
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.startswith("eaglewatch config: error: ")
    assert "line 1, column 5: invalid TOML" in out.stderr
    assert "Traceback" not in out.stderr


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-verb"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["config", "frobnicate"])
    assert info.value.code == 2
    capsys.readouterr()


def test_bare_command_prints_help_and_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "verbs" in capsys.readouterr().out


def test_config_reference_verb_prints_the_generated_reference(capsys: pytest.CaptureFixture[str]) -> None:
    from app.config import config_reference_markdown

    assert main(["config", "reference"]) == 0
    assert capsys.readouterr().out == config_reference_markdown()


@pytest.mark.parametrize("verb", ["status", "export", "ingest", "run"])
def test_a_run_name_with_a_control_character_is_refused_at_the_command_line(tmp_path: Path, verb: str) -> None:
    extra = {
        "export": ["--format", "specforge", "--out", str(tmp_path / "o")],
        "ingest": ["cfg.toml"],
        "run": ["--headless", "cfg.toml"],
    }.get(verb, [])
    out = eaglewatch(verb, "--db", str(tmp_path / "none.db"), "--run", "a\n$(touch pwned)", *extra, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "--run: 'a\\n$(touch pwned)' contains a control character ('\\n' at position 1)" in out.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "none.db").exists()


def test_run_checks_the_config_inputs_before_ingesting(tmp_path: Path, sample_data_dir: Path) -> None:
    """`run` goes through the one ingest_config, whose inputs check fails before any sample is written."""
    import sqlite3

    text = (sample_data_dir / "demo.toml").read_text()
    cfg = tmp_path / "run.toml"
    cfg.write_text(text.replace('"prompts.openai.jsonl"', '"missing.jsonl"'))
    assert "missing.jsonl" in cfg.read_text()
    # the demo's relative paths resolve against sample_data: point the rest there
    cfg.write_text(cfg.read_text().replace('"missing.jsonl"', f'"{tmp_path / "missing.jsonl"}"'))
    for rel in ("reference.jsonl", "tokenizer", "prompts.sharegpt.jsonl", "prompts.specforge.jsonl"):
        cfg.write_text(cfg.read_text().replace(f'"{rel}"', f'"{sample_data_dir / rel}"'))
    db = tmp_path / "h.db"
    out = eaglewatch("run", "--headless", str(cfg), "--db", str(db), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "data.datasets[0].path:" in out.stderr and "missing.jsonl does not exist" in out.stderr
    assert "Traceback" not in out.stderr
    if db.exists():
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 0
        conn.close()


def test_eval_report_is_spoken_as_two_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["eval", "report", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: eaglewatch eval report ") and "--against NAME" in text and "--svg FILE" in text
    assert "deprecated" not in text.lower()
