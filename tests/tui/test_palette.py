"""The command palette offers only what would act (the keys' own rule), and a screenshot is saved even on an
account without ~/Downloads."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from app.engine.record.codec import snapshot_to_json
from app.engine.record.snapshot import LiveFigures
from app.store.heartbeat import beat_op
from app.tui.app import EaglewatchApp
from app.tui.db_source import AttachedSource
from tests.tui.test_screens import settle

RUN_KEYS = {"Pause or resume the run", "Pause now", "Set concurrency limit"}


def _titles(app: EaglewatchApp) -> set[str]:
    return {c.title for c in app.get_system_commands(app.screen)}


@contextmanager
def _live_engine(run_db: Path):
    """An engine on another host that beats once a second, as a real one does, while the block runs: the viewer
    takes the run for live however long the app takes to start (a single beat goes stale after 4 s)."""
    stop = threading.Event()

    def beat() -> None:
        conn = sqlite3.connect(run_db, isolation_level=None)
        try:
            run_id = conn.execute("SELECT id FROM runs").fetchone()[0]
            started = time.time() - 60
            while True:
                beat_op(
                    run_id,
                    pid=4242,
                    host="gpu-elsewhere",
                    started_at=started,
                    now=time.time(),
                    snapshot_json=snapshot_to_json(LiveFigures("running")),
                )(conn)
                if stop.wait(1.0):
                    return
        finally:
            conn.close()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


async def test_the_palette_offers_run_controls_only_while_they_would_act(run_db: Path) -> None:
    with _live_engine(run_db):
        app = EaglewatchApp(AttachedSource(run_db))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            deadline = time.monotonic() + 20
            while not _titles(app) >= RUN_KEYS and time.monotonic() < deadline:  # the first snapshot may be late
                await pilot.pause(0.1)
            assert _titles(app) >= RUN_KEYS  # a running run with a live engine
    conn = sqlite3.connect(run_db, isolation_level=None)
    conn.execute("UPDATE runs SET state = 'done'")
    conn.close()
    app = EaglewatchApp(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.last_record is not None and app.last_record.state == "done"
        assert not RUN_KEYS & _titles(app)  # nothing to pause on a DONE run
        assert "Mismatches" in _titles(app)


async def test_a_screenshot_without_a_downloads_folder_goes_to_the_working_directory(
    run_db: Path, tmp_path: Path, monkeypatch
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    app = EaglewatchApp(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.action_screenshot()
        for _ in range(100):  # the driver writes the file in a thread
            if list(work.glob("*.svg")):
                break
            await pilot.pause(0.05)
    saved = list(work.glob("*.svg"))
    assert len(saved) == 1 and "<svg" in saved[0].read_text()[:400]
    assert not (home / "Downloads").exists()
