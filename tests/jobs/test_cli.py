"""`eaglewatch extract` and `eaglewatch jobs` end to end (local executor, fake extractor as a command template)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.cli import main

from .conftest import FAKE


def _setup(tmp_path: Path, ctl: Path, extra: str = "") -> Path:
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(
        json.dumps(
            {
                "format": "eagle3-shards",
                "version": 1,
                "shards": [{"index": i, "path": f"shard_{i:05d}.jsonl", "samples": 2, "tokens": 40} for i in range(3)],
            }
        )
    )
    command = [sys.executable, str(FAKE), "--shard", "{shard}", "--out", "{out}", "--ctl", str(ctl)]
    if extra:
        command += extra.split()
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"""
[run]
name = "t"
database = "{tmp_path / "run.db"}"
output_dir = "{tmp_path}"

[data]
[[data.datasets]]
path = "prompts.jsonl"

[model]
name = "m"
tokenizer = "tok"

[[endpoints]]
name = "e"
base_url = "http://127.0.0.1:9"

[extraction]
executor = "local"
extractor = "command"
command = {json.dumps(command)}
output_dir = "{tmp_path / "hidden"}"
gpus = 0
""")
    return cfg


def test_dry_run_prints_each_shards_argv_and_starts_nothing(tmp_path, ctl, capsys):
    cfg = _setup(tmp_path, ctl)
    assert main(["extract", str(cfg), "--manifest", str(tmp_path / "shards"), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["executor"] == "local"
    assert plan["shards"]["2"][-5:] == ["2", "--out", str(tmp_path / "hidden"), "--ctl", str(ctl)]
    assert not (tmp_path / "run.db").exists()


def test_extract_runs_the_job_and_jobs_lists_it(tmp_path, ctl, capsys):
    cfg = _setup(tmp_path, ctl, "--fail 1")
    db = str(tmp_path / "run.db")
    rc = main(["extract", str(cfg), "--manifest", str(tmp_path / "shards"), "--slots", "2", "--interval", "0.05"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "shard 1 exited with code 3" in err and "shard_1.err" in err

    assert main(["jobs", "--db", db]) == 0
    listing = capsys.readouterr().out
    assert "t-extract" in listing and "2/3 (1 failed)" in listing

    assert main(["jobs", "--db", db, "1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in shown["shards"]] == ["done", "failed", "done"]
    assert shown["shards"][1]["exit_code"] == 3

    # retry: shard 1 fails on purpose every time, so stand in for a repaired run by writing its marker;
    # the retried shard is then trusted done without running again
    (tmp_path / "hidden" / "shard_1.done").write_text("repaired\n")
    assert main(["jobs", "--db", db, "retry", "1"]) == 0
    assert main(["extract", str(cfg), "--job", "1", "--interval", "0.05"]) == 0
    assert "job 1 t-extract: done" in capsys.readouterr().err


def test_jobs_cancel_from_the_command_line(tmp_path, ctl, capsys):
    (ctl / "hold_all").touch()
    cfg = _setup(tmp_path, ctl)
    db = str(tmp_path / "run.db")
    assert main(["extract", str(cfg), "--manifest", str(tmp_path / "shards"), "--detach"]) == 0
    assert main(["jobs", "--db", db, "cancel", "1"]) == 0
    assert "cancelled" in capsys.readouterr().out
    assert main(["jobs", "--db", db, "1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "cancelled" and {s["state"] for s in shown["shards"]} == {"cancelled"}


def test_jobs_on_a_missing_database_is_a_sentence(tmp_path, capsys):
    assert main(["jobs", "--db", str(tmp_path / "nope.db")]) == 2
    assert "no such database" in capsys.readouterr().err
