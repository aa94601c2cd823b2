"""A run of whole conversations in the text faces: `eaglewatch run --headless` counts its conversations on the
progress line, `eaglewatch status` prints them (conversations and turns) and `status --json` gains a
`conversations` object, every number the database's (`app.store.queries.conversation_counts`)."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.store import queries
from app.store.run_store import RunStore
from app.store.store_records import SampleInput


def _config(tmp_path: Path, sample_data: Path) -> Path:
    """sample_data's 10 openai-messages conversations (40 turns; conv-oa-03 diverges at turn 2 under the stop
    policy) over the built-in simulator replaying each turn's reference."""
    text = f"""
[run]
name = "conv"
database = "{tmp_path / "conv.db"}"

[data]
reference = "{sample_data / "conversations.reference.jsonl"}"

[[data.datasets]]
path = "{sample_data / "conversations.openai.jsonl"}"
regenerate = "all"
on_tool_divergence = "stop"

[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{sample_data / "tokenizer"}"

[[endpoints]]
name = "sim"
timeout_s = 10.0

[endpoints.simulator]
latency_median_ms = 0.0
latency_p95_ms = 0.0
seed = 1

[generation]
max_tokens = 4096
stream = false

[pricing."moonshotai/kimi-k2.5"]
prompt_per_m = 0.6
completion_per_m = 2.5
"""
    path = tmp_path / "conv.toml"
    path.write_text(text)
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def headless(tmp_path_factory, sample_data_dir: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """The database and the finished `run --headless` process (its stderr is not a terminal: plain lines)."""
    tmp_path = tmp_path_factory.mktemp("headless-conversations")
    config = _config(tmp_path, sample_data_dir)
    done = _cli("run", "--headless", str(config))
    assert done.returncode == 0, done.stderr
    return tmp_path / "conv.db", done


def _counts(database: Path):
    conn = sqlite3.connect(database)
    try:
        run_id = conn.execute("SELECT id FROM runs").fetchone()[0]
        return queries.conversation_counts(conn, run_id), queries.run_counts(conn, run_id).samples
    finally:
        conn.close()


def test_the_headless_progress_line_counts_conversations(headless) -> None:
    database, done = headless
    conv, samples = _counts(database)
    assert (conv.total, conv.done, conv.diverged, conv.open) == (10, 9, 1, 0)
    lines = [line for line in done.stderr.splitlines() if " progress " in line]
    assert lines, done.stderr
    # the last line: samples ended of all, then the conversations done of all and the diverged one
    ended = samples.done + samples.failed + samples.skipped
    assert re.search(
        rf" progress +{ended}/{samples.total} conv {conv.done}/{conv.total} done · {conv.diverged} "
        rf"diverged · avg ",
        lines[-1],
    ), lines[-1]


def test_status_prints_the_conversations_and_their_turns(headless) -> None:
    database, _ = headless
    conv, _ = _counts(database)
    shown = _cli("status", "--db", str(database))
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # rich wraps long lines between words
    t = conv.turns
    assert (
        f"conversations: {conv.done}/{conv.total} done · {conv.open} open · {conv.diverged} diverged · "
        f"{conv.failed} failed · {conv.truncated} truncated · {conv.off_policy_turns} off-policy turns"
    ) in text
    assert (
        f"turns: {t['done']} done · {t['leased']} in flight · {t['pending']} pending · {t['waiting']} waiting on "
        f"parent · {t['failed']} failed · {t['skipped']} skipped"
    ) in text
    assert (t["done"], t["skipped"]) == (36, 4)


def test_status_json_gains_a_conversations_object(headless) -> None:
    database, _ = headless
    conv, _ = _counts(database)
    shown = _cli("status", "--db", str(database), "--json")
    assert shown.returncode == 0, shown.stderr
    got = json.loads(shown.stdout)["runs"][0]["conversations"]
    assert got == {
        "total": conv.total,
        "done": conv.done,
        "open": conv.open,
        "diverged": conv.diverged,
        "failed": conv.failed,
        "truncated": conv.truncated,
        "ended_skipped": conv.ended_skipped,
        "not_started": conv.not_started,
        "in_flight": conv.in_flight,
        "waiting_on_parent": conv.waiting_on_parent,
        "turns": conv.turns,
        "off_policy_turns": conv.off_policy_turns,
    }
    assert (got["total"], got["done"], got["diverged"], got["turns"]["done"]) == (10, 9, 1, 36)


async def test_a_run_without_conversations_has_no_conversations_in_status(tmp_path: Path) -> None:
    database = tmp_path / "single.db"
    store = await RunStore.open(database)
    try:
        run_id = await store.ensure_run("single")
        await store.ingest(
            run_id, [SampleInput(f"s{i}", "chat", [{"role": "user", "content": "hi"}], None, None) for i in range(3)]
        )
    finally:
        await store.close()
    text = _cli("status", "--db", str(database))
    assert text.returncode == 0 and "conversations" not in text.stdout and "turns:" not in text.stdout
    report = json.loads(_cli("status", "--db", str(database), "--json").stdout)
    assert report["runs"][0]["conversations"] is None and report["runs"][0]["samples"] == 3
