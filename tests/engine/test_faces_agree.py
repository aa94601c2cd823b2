"""Every face reports the same numbers: one run with retries, final failures, an engine SIGKILLed and restarted,
and an attached viewer; `status --json`, `fidelity --json`, the attached record, the in-process record and the
export summary, compared while the run is paused (exactly), while it runs (within what can change between two
reads: counts only grow) and after it (exactly, then again once the engine has exited).

Real parts: a headless engine process over the built-in simulator (killed with SIGKILL), then the run's engine
in this process (`open_run`, as the TUI hosts it), the two DataSources the TUI reads, and the CLI verbs.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from app.commands.run import progress_line
from app.config import load_config
from app.engine.record.snapshot import RunRecord, state_words
from app.engine.session import open_run
from app.records import VERDICTS
from app.tui.db_source import AttachedSource, InProcessSource
from app.tui.screens.dashboard import endpoint_rows, status_line

N = 90


def _config(tmp_path: Path, sample_data: Path) -> Path:
    """Two simulated endpoints: `sim` with random 500s (retried) and 400s (a sample fails at once), half its
    requests probes with logprobs (measured answers); `quirky` re-serialises tool arguments and splits UTF-8
    (corrupt and suspect answers). References for every sample, so verdicts are judged."""
    path = tmp_path / "run.toml"
    path.write_text(f"""
[run]
name = "faces"
database = "{tmp_path / "faces.db"}"

[data]
reference = "{sample_data / "reference.jsonl"}"

[[data.datasets]]
path = "{sample_data / "prompts.openai.jsonl"}"
limit = {N}

[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{sample_data / "tokenizer"}"

[[endpoints]]
name = "sim"
timeout_s = 10.0
probe_fraction = 0.5

[endpoints.simulator]
latency_median_ms = 150.0
latency_p95_ms = 250.0
seed = 4
logprobs = true
faults = {{ "500" = 0.12, "400" = 0.06 }}

[[endpoints]]
name = "quirky"
weight = 0.4
timeout_s = 10.0

[endpoints.simulator]
latency_median_ms = 150.0
latency_p95_ms = 250.0
seed = 9
quirks = ["json_reserialised", "replacement_char"]

[generation]
max_tokens = 4096
stream = true
attempts = 3

[limits]
concurrency_initial = 4
concurrency_max = 4

[pricing."moonshotai/kimi-k2.5"]
prompt_per_m = 0.6
completion_per_m = 2.5
""")
    return path


def _cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _done(db: Path) -> int:
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT COUNT(*) FROM samples WHERE state = 'done'").fetchone()[0]
    except sqlite3.OperationalError:  # the engine is still creating the schema
        return 0
    finally:
        conn.close()


def assert_status_agrees(status: dict, rec: RunRecord) -> None:
    """`status --json` of the run says what the record says, number for number."""
    (run,) = status["runs"]
    c, a = rec.counts, rec.counts.answers
    assert run["states"] == c.samples.as_dict() and run["samples"] == rec.total
    assert run["cost_usd"] == round(c.cost_usd, 6) and run["requests"] == c.requests
    assert run["retried"] == c.retried and run["errors_by_class"] == dict(c.errors_by_class)
    assert run["failed_by_class"] == dict(c.failed_by_class)
    assert run["verdicts"] == dict(a.verdicts) and set(run["verdicts"]) == {str(v) for v in VERDICTS}
    assert run["verification"] == a.verification()
    assert (run["truncated"], run["suspects"], run["answers"]) == (a.truncated, a.suspects, a.answers)
    assert run["measured"]["n"] == a.measured and run["measured"]["matched"] == a.measured_matched
    assert [(e["name"], e["completed"], e["failed"], e["retried"]) for e in run["endpoints"]] == [
        (e.name, e.completed, e.failed, e.retried) for e in c.endpoints
    ]
    assert run["words"] == state_words(rec).text


def assert_fidelity_agrees(fidelity: dict, rec: RunRecord, status: dict | None = None) -> None:
    """`fidelity --json`'s rows are the record's answers per endpoint and provider; `status --json` names each
    endpoint × provider verified / prior only / unverified in the same words."""
    rows = {(r["endpoint"], r["provider"]): r for r in fidelity["rows"]}
    if status is not None:
        (run,) = status["runs"]
        trust = {(t["endpoint"], t["provider"]): (t["state"], t["text"], t["probes"]) for t in run["trust"]}
        assert trust == {k: (r["state"], r["text"], r["probes"]) for k, r in rows.items()} and trust
    providers = {(p.endpoint, p.provider): p.answers for p in rec.counts.providers}
    assert set(rows) == set(providers)
    for key, a in providers.items():
        r = rows[key]
        assert (
            r["samples"],
            r["verification"],
            r["measured"],
            r["exact"],
            r["benign"],
            r["truncated"],
            r["corrupt"],
            r["suspects"],
        ) == (
            a.answers,
            a.verification(),
            a.measured,
            a.measured_exact,
            a.measured_benign,
            a.measured_truncated,
            dict(a.measured_corrupt),
            a.suspects,
        ), key
    assert sum(r["samples"] for r in rows.values()) == rec.counts.answers.answers


def assert_faces_agree(in_process: RunRecord, attached: RunRecord) -> None:
    """The TUI's two faces: the same counts, state, words, and the same endpoint rows and figures."""
    assert in_process.counts == attached.counts
    assert (in_process.state, in_process.state_reason) == (attached.state, attached.state_reason)
    assert state_words(in_process) == state_words(attached)
    assert in_process.finished == attached.finished
    if in_process.finished is None:  # live: what only the engine knows is its own in both (the beat carries it)
        mine, theirs = in_process.live, attached.live
        assert (mine.in_flight, mine.waiting, mine.concurrency_limit) == (
            theirs.in_flight,
            theirs.waiting,
            theirs.concurrency_limit,
        )
        keep = (0, 1, 2, 3, 7)  # the columns not measured over a moving window: name, done, failed, flight, cost
        assert [[r[i] for i in keep] for r in endpoint_rows(in_process)] == [
            [r[i] for i in keep] for r in endpoint_rows(attached)
        ]
    else:
        assert endpoint_rows(in_process) == endpoint_rows(attached)
        assert status_line(in_process).plain == status_line(attached).plain


async def _until(pred, timeout: float = 60.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while True:
        value = await pred()
        if value:
            return value
        assert time.monotonic() < end, f"{what} not reached in {timeout:g} s"
        await asyncio.sleep(0.1)


async def test_every_face_reports_the_same_numbers_through_a_crash_a_restart_and_the_end(tmp_path, sample_data):
    cfg_path = _config(tmp_path, sample_data)
    db = tmp_path / "faces.db"

    # 1. a headless engine process, SIGKILLed mid-run: its answers and failures are the run's, not lost
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "run", "--headless", str(cfg_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while _done(db) < 15:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the headless engine did not get going"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    done_by_the_first = _done(db)
    assert 15 <= done_by_the_first < N, "the kill came too late to test a restart"

    # 2. the run restarted in this process, as the TUI hosts it; an attached viewer over the same database
    config = load_config(cfg_path)
    attached = AttachedSource(db)
    try:
        async with open_run(config) as opened:
            run = opened.run
            in_process = InProcessSource(run=run, config=config)

            async def records() -> tuple[RunRecord, RunRecord]:
                mine = await asyncio.to_thread(in_process.record, in_process.live_figures())
                return mine, await asyncio.to_thread(attached.record, None)

            # while it runs: read in-process, then attached, then in-process again; counts only grow between reads
            await _until(lambda: _async(attached.record(None).engine == "running"), what="the engine's first beat")
            before = await asyncio.to_thread(in_process.record, in_process.live_figures())
            theirs = await asyncio.to_thread(attached.record, None)
            after = await asyncio.to_thread(in_process.record, in_process.live_figures())
            for field in ("done", "failed", "total"):
                assert getattr(before, field) <= getattr(theirs, field) <= getattr(after, field), field
            assert before.counts.requests <= theirs.counts.requests <= after.counts.requests
            # the restarted run's endpoints count the killed engine's answers too
            assert sum(e.completed for e in theirs.counts.endpoints) >= done_by_the_first

            # paused, with nothing in flight: every face, exactly
            await run.pause()
            await run.wait()

            async def paused_everywhere():
                mine, other = await records()
                beat_caught_up = (
                    other.live is not None
                    and other.live.state == "paused"
                    and other.live.in_flight == mine.live.in_flight == 0
                    and other.live.waiting == mine.live.waiting
                )
                return (mine, other) if beat_caught_up and other.counts == mine.counts else None

            mine, other = await _until(paused_everywhere, what="the attached face to show the pause")
            assert mine.state == "paused" and mine.done + mine.failed < N
            assert_faces_agree(mine, other)
            assert run.snapshot().counts == mine.counts  # the engine's own record (the headless line's): exact
            assert mine.counts.retried > 0 and mine.failed > 0  # retries and final failures both happened
            status = await asyncio.to_thread(_cli, "status", "--db", str(db), "--json")
            assert_status_agrees(status, mine)
            assert_fidelity_agrees(await asyncio.to_thread(_cli, "fidelity", "--db", str(db), "--json"), mine, status)

            # to the end: the faces agree on the finished run while its engine is still here
            await run.resume()
            await asyncio.wait_for(run.wait_finished(), 180)

            async def finished_everywhere():
                mine, other = await records()
                return (mine, other) if other.state == "done" and other.counts == mine.counts else None

            mine, other = await _until(finished_everywhere, what="the attached face to show the end")
            assert mine.finished is not None and mine.done + mine.failed == N
            assert_faces_agree(mine, other)
            end = mine
            own = progress_line(run.snapshot())  # the headless line of the engine's own record at the end
            assert own.startswith("avg ") and "in flight" not in own and f"failed {end.failed} · ⚠ FINISHED" in own
            a = end.counts.answers  # every kind the faces count happened, so no comparison is of zeros
            assert (
                min(a.verified, a.checked, a.measured, a.suspects, a.truncated, end.counts.retried, end.failed) > 0
            ), a
        # 3. the engine has exited: the attached face shows the same finished record, no live figure
        gone = await asyncio.to_thread(attached.record, None)
        assert gone.engine == "stopped" and gone.live is None
        assert gone.counts == end.counts and gone.finished == end.finished and gone.elapsed_s == end.elapsed_s
        words = state_words(gone)
        assert words.label == "⚠ FINISHED WITH FAILURES" and f"{end.failed}/{N} failed" in words.detail
        assert "DONE" not in status_line(gone).plain and "ETA" not in status_line(gone).plain
        line = progress_line(gone)  # the headless progress line: the same record, the same words
        assert f"failed {end.failed}" in line and "FINISHED WITH FAILURES" in line and "in flight" not in line
        assert_status_agrees(await asyncio.to_thread(_cli, "status", "--db", str(db), "--json"), gone)
        assert_fidelity_agrees(await asyncio.to_thread(_cli, "fidelity", "--db", str(db), "--json"), gone)
    finally:
        attached.close()

    # 4. the export summary: everything kept, every exported sample is a done one, with the record's
    # verification classes; only truncated answers dropped, the skipped count is the record's truncated
    a = end.counts.answers
    kept = await asyncio.to_thread(
        _cli,
        "export",
        "--db",
        str(db),
        "--format",
        "sglang-raw",
        "--out",
        str(tmp_path / "all"),
        "--json",
        "--keep-mismatches",
        "--keep-truncated",
        "--keep-roundtrip-failed",
        "--keep-suspect",
    )
    assert kept["exported"] + sum(kept["skipped"].values()) == end.done == a.answers
    assert kept["skipped"] == {} and kept["verified"] == a.verified
    sources = kept["ids_sources"]
    assert sources.get("text", 0) + sources.get("reference", 0) == a.checked + a.unchecked
    cut = await asyncio.to_thread(
        _cli,
        "export",
        "--db",
        str(db),
        "--format",
        "sglang-raw",
        "--out",
        str(tmp_path / "cut"),
        "--json",
        "--keep-mismatches",
        "--keep-roundtrip-failed",
        "--keep-suspect",
    )
    assert sum(cut["skipped"].values()) == cut["skipped"].get("truncated", 0) == a.truncated


async def _async(value):
    return value
