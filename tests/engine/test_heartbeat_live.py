"""The heartbeat end to end: a real headless engine process, an attached source over its database.

The engine beats about once a second with its live figures; the attached viewer shows its in-flight and
limits while it runs, calls it gone within seconds of a SIGKILL (and hides the run keys), follows a rerun
back to running and on to DONE, where the numbers freeze.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.tui.db_source import AttachedSource
from app.tui.screens.dashboard import engine_gone, status_line
from tests.engine.test_headless import _config as headless_config


def _config(tmp_path: Path, sample_data: Path) -> Path:
    """test_headless's config (run "h" in h.db, the built-in simulator) at the demo's latency with a few
    random 429s, and a limit of at most 8, so a run of 120 samples lasts long enough to be killed mid-way."""
    path = headless_config(tmp_path, sample_data, faults='"429" = 0.02', latency_ms=300.0)
    path.write_text(path.read_text() + "\n[limits]\nconcurrency_initial = 4\nconcurrency_max = 8\n")
    return path


def _engine(cfg: Path, limit: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "run", "--headless", str(cfg), "--limit", str(limit)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until(pred, timeout: float, what: str, source: list) -> object:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if source[0] is None:
                source[0] = AttachedSource(source[1])
            last = source[0].record(None)
        except Exception as exc:  # the database is still being created by the engine
            last = exc
        if not isinstance(last, Exception) and pred(last):
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen in {timeout:g} s; last record: {last!r}")


def test_attached_viewer_sees_the_live_engine_its_crash_and_its_rerun_to_done(tmp_path, sample_data):
    cfg = _config(tmp_path, sample_data)
    db = tmp_path / "h.db"
    src: list = [None, db]
    n = 120
    proc = _engine(cfg, n)
    try:
        rec = _until(
            lambda s: s.engine == "running" and s.live is not None and s.live.in_flight > 0 and s.done >= 3,
            60,
            "a running engine with requests in flight",
            src,
        )
        # what only the engine knows comes from its heartbeat: in flight and the limits, per endpoint too
        live = rec.live
        assert 0 < live.in_flight <= live.concurrency_limit <= 8
        (ep,) = live.endpoints
        assert ep.name == "sim" and ep.concurrency_limit == live.concurrency_limit
        assert ep.limit_reason in ("growing", "at ceiling", "cooling down after 429", "latency rising")
        assert "RUNNING" in status_line(rec).plain
        # the ETA and the projection are the engine's (tokens still expected), not an average over the database
        assert rec.eta_s is not None and rec.eta_s > 0 and live.projected_cost_usd > rec.cost_usd
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        gone = _until(lambda s: s.engine == "gone", 5, "ENGINE GONE", src)
        assert time.monotonic() - killed < 5.5
        assert gone.state == "running" and engine_gone(gone)  # the row still says running: the face does not
        line = status_line(gone).plain
        assert "ENGINE GONE (last seen" in line and "RUNNING" not in line and "ETA" not in line
        assert gone.live is None and gone.finished is not None  # nothing is on the wire any more: figures frozen
        out = subprocess.run(
            [sys.executable, "-m", "app.cli", "status", "--db", str(db), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(out.stdout)["runs"][0]["engine"]["state"] == "gone", out.stderr
        text = subprocess.run(
            [sys.executable, "-m", "app.cli", "status", "--db", str(db)], capture_output=True, text=True, timeout=60
        ).stdout
        assert "ENGINE GONE (last seen" in text
        proc = _engine(cfg, n)
        _until(lambda s: s.engine == "running" and s.state == "running", 60, "the rerun engine running", src)
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        done = _until(lambda s: s.state == "done" and s.engine == "stopped", 10, "DONE after a clean exit", src)
        assert done.done + done.failed == n and not engine_gone(done)
        time.sleep(1.2)
        later = src[0].record(None)
        assert later.elapsed_s == done.elapsed_s and later.finished == done.finished  # frozen at DONE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if src[0] is not None:
            src[0].close()
