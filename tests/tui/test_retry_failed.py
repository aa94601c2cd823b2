"""The monitor's R (and its palette command) puts a run's failed samples back to pending through the run's control,
after asking: in-process it applies at once, attached it queues the `retry_failed` command the engine takes."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace

from app.engine.run import Run
from app.tui.app import EaglewatchApp
from app.tui.db_source import AttachedControl
from app.tui.screens.confirm import ConfirmScreen
from tests.engine.conftest import make_config, open_ingested
from tests.tui.sources import MemorySource
from tests.tui.test_control_ack import RecordingApp, settle, toast, until_state


async def test_r_asks_then_puts_the_failed_samples_back_through_the_runs_control() -> None:
    source = MemorySource()
    app = RecordingApp(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await until_state(pilot, "running")
        await pilot.press("R")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        assert "Put the 12 failed samples back to pending" in str(app.screen.query_one("#confirm-question").render())
        await pilot.press("y")
        await toast(pilot, "retry failed samples applied by the engine in this process")
        assert source.commands == [("retry_failed",)]


async def test_r_and_its_palette_command_are_offered_only_while_samples_have_failed() -> None:
    source = MemorySource()
    app = EaglewatchApp(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await until_state(pilot, "running")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Retry failed samples" in titles and app.check_action("retry_failed", ())
        counts = source._record.counts
        source._record = replace(source._record, counts=replace(counts, samples=replace(counts.samples, failed=0)))
        for _ in range(100):  # the dashboard's next poll brings the record to the app
            if app.last_record.failed == 0:
                break
            await asyncio.sleep(0.05)
        assert not app.check_action("retry_failed", ())
        assert "Retry failed samples" not in [c.title for c in app.get_system_commands(app.screen)]
        await pilot.press("R")
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmScreen) and source.commands == []


async def test_an_attached_viewers_retry_reaches_the_engine_through_the_commands_table(tmp_path, sample_data_dir):
    config = make_config(tmp_path, sample_data_dir, faults={"400": 1.0})
    store, run_id = await open_ingested(config, sample_data_dir, 4)
    run = Run(config, store)
    control = AttachedControl(config.run.database, run_id)
    try:
        await run.start()
        await asyncio.wait_for(run.wait(), 30)
        assert run.snapshot().failed == 4
        await control.retry_failed()  # what R sends from an attached viewer
        ack = await control.acknowledgement(control.last_command, timeout_s=15)
        assert ack.taken
    finally:
        await control.aclose()
        await run.close()
        await store.close()
    conn = sqlite3.connect(config.run.database)
    assert conn.execute("SELECT verb FROM commands").fetchall() == [("retry_failed",)]
    assert (
        conn.execute(
            "SELECT COUNT(*) FROM events WHERE message LIKE '4 failed samples put back to pending%'"
        ).fetchone()[0]
        == 1
    )
    assert conn.execute("SELECT MIN(tries_forgiven) FROM samples").fetchone()[0] == 1  # the earlier try forgiven
