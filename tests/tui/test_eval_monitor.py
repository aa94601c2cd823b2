"""The eval monitor at 80x24 over real eval runs (the eval engine against the built-in simulator with vLLM's
per-request `detailed` acceptance, a real SQLite file): the dashboard shows the run's figures, Enter on a request
opens its output with the accepted and rejected drafts coloured, and `p` pauses and resumes an eval running in
another process (through the `commands` table) and one hosted in this process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from app.config import load_config
from app.eval.live import ACCEPTED, REJECTED
from app.eval.run import EvalRun
from app.store import queries
from app.tui.eval_app import EvalApp
from app.tui.eval_source import in_process_eval_source, open_eval_attached
from app.tui.screens.eval_dashboard import SPAN_STYLES, RequestScreen, RequestsScreen, output_text
from widgets.metric_tile import MetricTile

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_data"
N = 16
SIZE = (80, 24)


def write_config(tmp_path: Path, *, latency_ms: float = 0.0, in_flight: int = 8, n: int = N) -> Path:
    path = tmp_path / "eval.toml"
    sim = f"""personality = "vllm"
spec_acceptance = [0.9, 0.6, 0.3]
latency_median_ms = {latency_ms}
latency_p95_ms = {latency_ms}
seed = 3
logprobs = false"""
    path.write_text(
        f"""
[run]
name = "ev"
database = "{tmp_path / "e.db"}"
[data]
reference = "{SAMPLE / "reference.jsonl"}"
[[data.datasets]]
path = "{SAMPLE / "prompts.openai.jsonl"}"
format = "openai-messages"
limit = {n}
[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{SAMPLE / "tokenizer"}"
[[endpoints]]
name = "spec"
timeout_s = 20
[endpoints.simulator]
{sim}
[[endpoints]]
name = "base"
timeout_s = 20
[endpoints.simulator]
personality = "vllm"
latency_median_ms = {latency_ms}
latency_p95_ms = {latency_ms}
[generation]
stream = true
[limits]
concurrency_initial = {in_flight}
concurrency_max = {in_flight}
[eval]
drafter = "test/drafter"
baseline = "base"
max_tokens = 4096
dead_after = 4
bootstrap = 100
"""
    )
    return path


@pytest.fixture
async def finished_eval(tmp_path: Path) -> Path:
    config = load_config(write_config(tmp_path))
    await EvalRun(config).run()
    return tmp_path / "e.db"


async def until(pilot, check, seconds: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
        await pilot.pause()
    raise AssertionError(f"not reached in {seconds:g} s: {what}")


def report_of(db: Path) -> dict:
    from app.eval.report import stored_report

    conn = queries.connect_readonly(db)
    try:
        return stored_report(conn, queries.resolve_run(conn, None))
    finally:
        conn.close()


def fits(screen, size=SIZE) -> list[str]:
    """Every visible widget of the screen that sticks out of it."""
    out = []
    for w in screen.query("*"):
        if w.display and w.region.area and (w.region.right > size[0] or w.region.bottom > size[1]):
            out.append(f"{w!r} {w.region}")
    return out


async def test_the_dashboard_shows_the_runs_figures_at_80x24(finished_eval: Path) -> None:
    report = report_of(finished_eval)
    want = report["endpoints"]["spec"]["figures"]["mean_acceptance_length"]
    app = EvalApp(open_eval_attached(finished_eval, None, readonly=True))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.dashboard
        await until(pilot, lambda: screen.last is not None and screen.report is not None, what="a poll and a report")
        await pilot.pause()
        status = str(screen.query_one("#eval-status", Static).render())
        assert "DONE" in status and f"{2 * N}/{2 * N}" in status
        tile = "\n".join(screen.query_one("#tile-acceptance", MetricTile)._shown or ())
        assert f"spec τ {want:.2f}" in tile and "base (base) tok/s" in tile
        ci = report["endpoints"]["spec"]["figures"]["mean_acceptance_length_ci95"]
        assert f"CI {ci[0]:.2f}-{ci[1]:.2f}" in tile and "×" in tile  # the speedup over the baseline
        bars = screen.query_one("#tile-positions", MetricTile)._shown or ()
        shares = report["endpoints"]["spec"]["figures"]["per_position_acceptance"]
        assert [line.split()[0] for line in bars] == ["p1", "p2", "p3"]
        assert [line.split()[-1] for line in bars] == [f"{100 * s:.0f}%" for s in shares]
        categories = screen.query_one("#eval-categories", DataTable)
        assert categories.row_count == len(report["endpoints"]["spec"]["by_category"]) > 0
        guards = str(screen.query_one("#eval-guards", Static).render())
        assert ("no verdicts" in guards) == (not report["verdicts"])
        assert fits(screen) == []
        for wid in ("#eval-plot", "#eval-guards", "#eval-categories", "#eval-events", "#tile-positions"):
            assert screen.query_one(wid).region.height >= 2, wid


async def test_enter_on_a_request_opens_its_output_with_draft_spans(finished_eval: Path) -> None:
    app = EvalApp(open_eval_attached(finished_eval, None, readonly=True))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.dashboard.last is not None, what="a poll")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RequestsScreen), what="the requests screen")
        table = app.screen.query_one("#requests-table", DataTable)
        await until(pilot, lambda: table.row_count == 2 * N, what="the requests")
        while table.get_row_at(table.cursor_row)[2] != "spec":  # the newest may be the baseline's
            await pilot.press("down")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RequestScreen) and app.screen.output is not None)
        out = app.screen.output
        assert out.detailed and out.decoded and out.endpoint == "spec"
        kinds = {kind for _, kind in out.pieces}
        assert ACCEPTED in kinds and REJECTED in kinds
        styles = {str(span.style) for span in output_text(out).spans}
        assert {SPAN_STYLES[ACCEPTED], SPAN_STYLES[REJECTED]} <= styles
        shown = app.screen.query_one("#request-text", Static).render()
        assert {"ansi_green bold", "ansi_red bold"} <= {str(span.style) for span in shown.spans}
        assert fits(app.screen) == []
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, RequestsScreen))


def stored(db: Path) -> int:
    conn = queries.connect_readonly(db, check=False)
    try:
        return conn.execute("SELECT COUNT(*) FROM eval_requests").fetchone()[0]
    finally:
        conn.close()


async def test_pause_and_resume_reach_an_eval_in_another_process(tmp_path: Path) -> None:
    config = write_config(tmp_path, latency_ms=250, in_flight=2, n=12)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "eval", "--headless", str(config)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    db = tmp_path / "e.db"
    try:
        deadline = time.monotonic() + 60
        while not (db.exists() and _kind(db) == "eval" and stored(db) > 0):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            await asyncio.sleep(0.1)
        app = EvalApp(open_eval_attached(db, None, readonly=False))
        async with app.run_test(size=SIZE) as pilot:
            screen = app.dashboard
            await until(pilot, lambda: screen.last is not None and screen.last.status.state == "running")
            await pilot.press("p")
            await until(pilot, lambda: screen.last.status.state == "paused", what="paused")
            # in-flight requests finish; then nothing new starts
            await until(pilot, lambda: screen.last.status.in_flight == 0, what="nothing in flight")
            held = stored(db)
            assert held < 24 and "PAUSED" in str(screen.query_one("#eval-status", Static).render())
            for _ in range(10):  # two engine polls of the commands table and then some
                await asyncio.sleep(0.15)
                assert stored(db) == held
            await pilot.press("p")
            await until(pilot, lambda: screen.last.status.state == "done", seconds=60, what="done")
        assert proc.wait(timeout=60) == 0, proc.communicate()
        assert stored(db) == 24
        events = [e.message for e in _events(db)]
        assert any("paused by the operator" in m for m in events) and "resumed by the operator" in events
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _kind(db: Path) -> str | None:
    try:
        conn = queries.connect_readonly(db, check=False)
    except Exception:
        return None
    try:
        row = conn.execute("SELECT kind FROM runs LIMIT 1").fetchone()
        return row[0] if row else None
    except Exception:
        return None
    finally:
        conn.close()


def _events(db: Path):
    conn = queries.connect_readonly(db, check=False)
    try:
        return queries.events_tail(conn, 1, 100)
    finally:
        conn.close()


async def test_pause_and_resume_an_eval_hosted_in_this_process(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, latency_ms=200, in_flight=2, n=10))
    engine = EvalRun(config)
    task = asyncio.create_task(engine.run())
    try:
        while not engine.run_id:
            assert not task.done()
            await asyncio.sleep(0.02)
        app = EvalApp(in_process_eval_source(config.run.database, config.run.name, engine))
        async with app.run_test(size=SIZE) as pilot:
            screen = app.dashboard
            await until(pilot, lambda: screen.last is not None and screen.last.status.state == "running")
            await pilot.press("p")
            await until(pilot, lambda: engine.progress.paused and engine.progress.in_flight == 0, what="paused")
            await until(pilot, lambda: screen.last.status.state == "paused" and screen.last.status.in_flight == 0)
            held = engine.progress.done
            for _ in range(6):
                await asyncio.sleep(0.1)
                assert engine.progress.done == held
            await pilot.press("p")
            await asyncio.wait_for(task, 60)
        assert engine.state == "done" and engine.progress.done == 20
        assert json.loads(json.dumps(engine.progress.as_json()))
    finally:
        if not task.done():
            task.cancel()
