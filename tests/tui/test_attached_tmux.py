"""The attached viewer in a real terminal (tmux, 80x24) over a headless engine: it shows the engine's live
numbers, says ENGINE GONE within seconds of a SIGKILL, and follows a rerun of the engine to DONE."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from tests.engine.test_heartbeat_live import _config, _engine
from tests.tui.test_demo_tmux import Terminal, pytestmark  # noqa: F401  (skipped without tmux)


def _wait_db(db: Path, timeout: float = 60.0) -> None:
    """Until the engine has created the run (the viewer needs the run's row to open)."""
    import sqlite3

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            try:
                conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
                try:
                    if conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0] > 0:
                        return
                finally:
                    conn.close()
            except sqlite3.Error:
                pass
        time.sleep(0.2)
    raise AssertionError("the engine wrote no response")


def test_watch_says_engine_gone_after_a_sigkill_and_follows_the_rerun_to_done(tmp_path: Path, sample_data_dir: Path):
    cfg = _config(tmp_path, sample_data_dir)
    db = tmp_path / "h.db"
    proc = _engine(cfg, 120)
    term = None
    try:
        _wait_db(db)
        term = Terminal(f"ew-attach-{os.getpid()}", f"{sys.executable} -m app.cli watch --no-mouse {db}", 80, 24)
        screen = term.wait_for(r"RUNNING\s+h ", timeout=25)
        # from the heartbeat: the engine's own count (the compact tile at 80 columns says "flight N/M")
        term.wait_for(r"flight [1-9]\d*/\d+", timeout=15)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        screen = term.wait_for(r"ENGINE GONE \(last seen \d+ s ago\)", timeout=6)
        assert time.monotonic() - killed < 6.0
        assert "RUNNING" not in screen and "ETA" not in screen
        proc = _engine(cfg, 120)
        term.wait_for(r"RUNNING\s+h ", timeout=60)
        term.wait_for(r"DONE\s+h · 120/120", timeout=180)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if term is not None:
            term.close()
