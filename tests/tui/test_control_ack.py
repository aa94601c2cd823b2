"""Run controls say whether the engine took them: a real headless engine process acknowledges p, P, resume and
c sent from an attached viewer; a frozen engine (SIGSTOP) or a run no engine ever ran gets the warning; an
in-process control says it applied directly. The pause-now question fits 80×24 and counts requests on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from app.tui.app import EaglewatchApp
from app.tui.db_source import AttachedSource
from app.tui.screens.confirm import ConfirmScreen, NumberScreen
from app.tui.screens.dashboard import DashboardScreen
from app.tui.steer import pause_now_question
from tests.engine.test_headless import _config as headless_config
from tests.tui.sources import LIVE, RECORD, MemorySource


def RecordingApp(source) -> EaglewatchApp:
    """The monitor, keeping every toast it shows in `toasts` (toasts expire from the screen)."""
    app = EaglewatchApp(source)
    app.toasts = []
    shown = app.notify

    def notify(message: str, **kwargs) -> None:
        app.toasts.append(message)
        shown(message, **kwargs)

    app.notify = notify
    return app


async def settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()
    await pilot.pause()


async def toast(pilot, needle: str, seconds: float = 15.0) -> str:
    """The first toast containing `needle`, waiting up to `seconds` for it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [t for t in pilot.app.toasts if needle in t]
        if found:
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no toast with {needle!r} in {seconds:g} s; toasts: {pilot.app.toasts}")


async def until_state(pilot, state: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        snap = pilot.app.last_record
        if snap is not None and snap.state == state:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the run did not show {state!r} in {seconds:g} s (last: {pilot.app.last_record!r})")


def _engine(tmp_path: Path, sample_data: Path, n: int = 120) -> tuple[subprocess.Popen, Path]:
    """A headless engine over the built-in simulator, slow enough (1 s requests, at most 4 at once) to steer."""
    cfg = headless_config(tmp_path, sample_data, latency_ms=1000.0)
    cfg.write_text(cfg.read_text() + "\n[limits]\nconcurrency_initial = 4\nconcurrency_max = 4\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "run", "--headless", str(cfg), "--limit", str(n)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, tmp_path / "h.db"


def _wait_running(db: Path, proc: subprocess.Popen, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            source = AttachedSource(db)
            try:
                rec = source.record(None)
            finally:
                source.close()
            if rec.engine == "running" and rec.live is not None and rec.live.in_flight > 0:
                return
        except Exception:  # the engine is still creating the database
            pass
        time.sleep(0.2)
    raise AssertionError("the headless engine did not start running")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=10)


@contextlib.asynccontextmanager
async def viewer_over_engine(tmp_path: Path, sample_data: Path):
    """(engine process, its database, an attached 80×24 monitor, its pilot) once the engine runs; the engine
    is killed afterwards."""
    proc, db = _engine(tmp_path, sample_data)
    try:
        _wait_running(db, proc)
        app = RecordingApp(AttachedSource(db))
        async with app.run_test(size=(80, 24)) as pilot:
            await until_state(pilot, "running")
            yield proc, db, app, pilot
    except BaseException:
        if proc.poll() is not None:  # the engine ended on its own: what it said is the clue
            print("engine exit", proc.returncode, proc.stderr.read()[-4000:])
        raise
    finally:
        _stop(proc)


async def test_a_live_engine_acknowledges_every_control_sent_from_an_attached_viewer(tmp_path, sample_data_dir) -> None:
    async with viewer_over_engine(tmp_path, sample_data_dir) as (proc, db, app, pilot):
        await pilot.press("p")
        assert "pause sent to the engine" in await toast(pilot, "pause sent")
        said = await toast(pilot, "pause acknowledged by the engine (")
        assert said.endswith("s): nothing new is leased; requests in flight finish")
        await until_state(pilot, "paused")
        await pilot.press("p")
        await toast(pilot, "resume acknowledged by the engine (")
        await until_state(pilot, "running")
        await pilot.press("c")
        await settle(pilot)
        assert isinstance(app.screen, NumberScreen)
        await pilot.press(*["backspace"] * 4, "2", "enter")
        await toast(pilot, "concurrency limit 2 acknowledged by the engine (")
        await until_state(pilot, "running")
        await pilot.press("P")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        assert "on the wire" in str(app.screen.query_one("#confirm-question").render())
        await pilot.press("y")
        await toast(pilot, "pause now acknowledged by the engine (")
        await until_state(pilot, "paused")
        assert not [t for t in app.toasts if "not acknowledged" in t]
        assert proc.poll() is None  # every control, pause-now included, kept the engine running
        rows = sqlite3.connect(db).execute("SELECT verb, done_at IS NOT NULL FROM commands ORDER BY id").fetchall()
        assert rows == [("pause", 1), ("resume", 1), ("set_concurrency", 1), ("pause", 1)]


async def test_a_frozen_engine_leaves_the_command_unacknowledged_and_the_viewer_warns(
    tmp_path, sample_data_dir
) -> None:
    async with viewer_over_engine(tmp_path, sample_data_dir) as (proc, db, app, pilot):
        proc.send_signal(signal.SIGSTOP)  # alive but taking nothing, and no more beats
        await pilot.press("p")
        await toast(pilot, "pause sent")
        said = await toast(pilot, "pause not acknowledged after 5 s")
        assert "is the engine running? (last heartbeat " in said and "stays queued" in said
        assert not [t for t in app.toasts if "acknowledged by the engine" in t]
        rows = sqlite3.connect(db).execute("SELECT verb, done_at FROM commands").fetchall()
        assert rows == [("pause", None)]  # still queued: a resumed or rerun engine takes it


async def test_a_run_no_engine_ever_ran_says_so_when_nothing_takes_the_command(run_db: Path) -> None:
    app = RecordingApp(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        await until_state(pilot, "running")
        await pilot.press("p")
        said = await toast(pilot, "pause not acknowledged after 5 s")
        assert "no engine has run this yet (no heartbeat)" in said


async def test_in_process_controls_say_they_applied_directly() -> None:
    source = MemorySource()
    app = RecordingApp(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await until_state(pilot, "running")
        await pilot.press("p")
        said = await toast(pilot, "pause applied by the engine in this process")
        assert source.commands == [("pause",)] and "sent" not in said


def test_the_pause_now_question_counts_requests_on_the_wire_not_leased() -> None:
    rec = replace(
        RECORD,
        counts=replace(RECORD.counts, samples=replace(RECORD.counts.samples, leased=36)),
        live=replace(LIVE, in_flight=9, waiting=3),
    )
    question = pause_now_question(rec)
    assert "cancel the 9 requests on the wire" in question and "36" not in question
    assert "3 samples waiting" in question and question.endswith("providers may still bill them.")
    assert "1 request on the wire" in pause_now_question(replace(rec, live=replace(LIVE, in_flight=1, waiting=0)))


async def test_the_pause_now_confirmation_fits_80_by_24_whole() -> None:
    source = MemorySource()
    source._set(in_flight=9, waiting=3)
    app = RecordingApp(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await until_state(pilot, "running")
        assert isinstance(app.screen, DashboardScreen)
        await pilot.press("P")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        label = app.screen.query_one("#confirm-question")
        box = app.screen.query_one("#confirm-box")
        assert box.region.right <= 80 and box.region.bottom <= 24
        assert label.region.right <= box.region.right and label.size.width <= 64
        drawn = " ".join(
            " ".join(seg.text for seg in strip).strip() for strip in app.screen._compositor.render_strips()
        ).replace("█", " ")
        words = " ".join(drawn.split())
        assert pause_now_question(source._record) in words  # every word on screen, the billing warning too


async def test_a_resumed_engine_is_not_idle_once_its_state_says_running(tmp_path, sample_data_dir) -> None:
    # A headless engine paused from a viewer waits for the state to say running, then waits on `wait()` again:
    # were the run still idle at that moment, `wait()` returned at once and the engine closed mid-run.
    from app.config import apply_overrides, load_config
    from app.engine.run import VIEWER_PAUSE, Run
    from app.store.run_store import RunStore
    from tests.engine.conftest import sample_inputs

    config = apply_overrides(load_config(sample_data_dir / "demo.toml"), {"run.database": str(tmp_path / "r.db")})
    store = await RunStore.open(config.run.database)
    engine = None
    try:
        run_id = await store.ensure_run(config.run.name, config.redacted())
        await store.ingest(run_id, sample_inputs(sample_data_dir, 40))
        engine = Run(config, store, db_path=config.run.database)
        await engine.start()
        await engine.apply_command("pause", {})
        await asyncio.wait_for(engine.wait(), 30)  # paused with nothing in flight: idle
        assert (engine.state, engine.state_reason) == ("paused", VIEWER_PAUSE)
        resuming = asyncio.create_task(engine.apply_command("resume", {}))
        while engine.state != "running":
            await asyncio.sleep(0)
        waiter = asyncio.create_task(engine.wait())
        answered = engine.snapshot().done
        deadline = asyncio.get_running_loop().time() + 30
        # until the resumed run has answered one more sample (it went on), or wait() returned (too early)
        while not waiter.done() and engine.snapshot().done == answered:
            assert asyncio.get_running_loop().time() < deadline, "the resumed run answered nothing in 30 s"
            await asyncio.sleep(0.02)
        assert not waiter.done(), "wait() returned while the resumed run was going on"
        waiter.cancel()
        await resuming
    finally:
        if engine is not None:
            await engine.close(cancel_in_flight=True)
        await store.close()
