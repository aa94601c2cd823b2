"""The run's mix as the store reads it and `status` prints it: per (dataset, category) the shares of prompts,
answers and loss tokens, reasoning and tool-call shares of its answers, its prompts' scripts; over a real run
database holding three datasets (tests.mix_run)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.store.queries import dataset_mix, mix_total
from tests.mix_run import MIX, build_mix_db


@pytest.fixture(scope="module")
def mix_db(tmp_path_factory) -> Path:
    return asyncio.run(build_mix_db(tmp_path_factory.mktemp("mix") / "mix.db"))


def _status(database: Path, *args: str, columns: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "status", "--db", str(database), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_mix_counts_each_dataset_and_category_as_written(mix_db: Path) -> None:
    conn = sqlite3.connect(mix_db)
    try:
        rows = {(r.dataset, r.category): r for r in dataset_mix(conn, 1)}
    finally:
        conn.close()
    assert {k: (r.prompts, r.answers, r.loss_tokens, r.reasoning, r.tool_calls) for k, r in rows.items()} == {
        ("kimi-tool-use", "kimi-tool-use"): (12, 8, 400, 0, 5),
        ("openthoughts", "code"): (8, 6, 1200, 6, 0),
        ("openthoughts", "math"): (4, 4, 600, 4, 0),
        ("ultrachat-200k-train-sft", "ultrachat-200k-train-sft"): (16, 12, 600, 3, 0),
    }
    assert rows[("kimi-tool-use", "kimi-tool-use")].languages == (("CJK", 8), ("Latin", 4))
    total = mix_total(tuple(rows.values()))
    assert (total.prompts, total.answers, total.loss_tokens) == (
        sum(p.prompts for p in MIX),
        sum(p.answers for p in MIX),
        sum(p.answers * p.tokens for p in MIX),
    )
    assert total.languages == (("Latin", 28), ("CJK", 8), ("Cyrillic", 4))
    assert rows[("openthoughts", "math")].label == "openthoughts · math"
    assert rows[("kimi-tool-use", "kimi-tool-use")].label == "kimi-tool-use"


def test_status_prints_the_mix_as_a_table_of_shares(mix_db: Path) -> None:
    shown = _status(mix_db)
    assert shown.returncode == 0, shown.stderr
    lines = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    assert (
        "mix of 40 prompts, 30 answers, 2,800 loss tokens (reasoning and tool calls: shares of the row's answers)"
        in (lines)
    )
    assert "dataset prompts answers loss tokens reasoning tool calls scripts" in lines
    assert "kimi-tool-use 30.0% 26.7% 14.3% 0.0% 62.5% CJK 67% · Latin 33%" in lines
    assert "openthoughts · code 20.0% 20.0% 42.9% 100.0% 0.0% Latin 100%" in lines
    assert "openthoughts · math 10.0% 13.3% 21.4% 100.0% 0.0% Cyrillic 100%" in lines
    assert "ultrachat-200k-train-sft 40.0% 40.0% 21.4% 25.0% 0.0% Latin 100%" in lines
    assert "all 100.0% 100.0% 100.0% 43.3% 16.7% Latin 70% · CJK 20% · Cyrillic 10%" in lines


def test_status_at_80_columns_folds_a_long_name_but_cuts_nothing(mix_db: Path) -> None:
    shown = _status(mix_db, columns=80)
    assert shown.returncode == 0, shown.stderr
    assert all(len(line) <= 80 for line in shown.stdout.splitlines())
    assert "…" not in shown.stdout
    table = shown.stdout.split("dataset", 1)[1].split("verdicts:", 1)[0]
    first_cells = "".join(line.split("  ")[0].strip() for line in table.splitlines()[1:])
    assert "ultrachat-200k-train-sft" in first_cells.replace(" ", "")


def test_status_json_and_text_show_the_same_mix(mix_db: Path) -> None:
    report = json.loads(_status(mix_db, "--json").stdout)["runs"][0]["mix"]
    assert [(m["dataset"], m["category"], m["prompts"]) for m in report] == [
        ("kimi-tool-use", "kimi-tool-use", 12),
        ("openthoughts", "code", 8),
        ("openthoughts", "math", 4),
        ("ultrachat-200k-train-sft", "ultrachat-200k-train-sft", 16),
    ]
    assert report[0]["tool_call_share"] == 0.625 and report[0]["languages"] == {"CJK": 8, "Latin": 4}
