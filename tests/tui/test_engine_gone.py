"""The attached viewer over a run whose engine stopped beating: it says ENGINE GONE instead of RUNNING and
offers no run key (nothing would act on a queued command); a fresh beat brings the engine's numbers."""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path

from app.engine.record.codec import snapshot_to_json
from app.engine.record.snapshot import EndpointLive, LiveFigures
from app.store.heartbeat import beat_op
from app.tui.app import EaglewatchApp
from app.tui.db_source import AttachedSource
from tests.tui.test_screens import settle


def _beat(run_db: Path, *, age_s: float, snapshot: LiveFigures | None = None) -> None:
    conn = sqlite3.connect(run_db, isolation_level=None)
    try:
        run_id, state = conn.execute("SELECT id, state FROM runs").fetchone()
        assert state == "running"
        now = time.time() - age_s
        # another host, so only the beat's age tells (no pid check)
        beat_op(
            run_id,
            pid=4242,
            host="gpu-elsewhere",
            started_at=now - 60,
            now=now,
            snapshot_json=snapshot_to_json(snapshot) if snapshot else None,
        )(conn)
    finally:
        conn.close()


async def test_a_stale_heartbeat_reads_engine_gone_and_the_run_keys_are_off(run_db: Path) -> None:
    beaten = time.time()
    _beat(run_db, age_s=12.0)
    app = EaglewatchApp(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        line = str(app.screen.query_one("#run-status").render())
        late = time.time() - beaten  # a loaded machine takes seconds to start the app: the beat ages meanwhile
        seen = re.search(r"ENGINE GONE \(last seen (\d+) s ago\)", line)
        assert seen and 12 <= int(seen.group(1)) <= 12 + late + 1, line
        assert "RUNNING" not in line
        assert not app.check_action("toggle_pause", ()) and not app.check_action("pause_now", ())
        await pilot.press("p")
        await settle(pilot)
    assert sqlite3.connect(run_db).execute("SELECT COUNT(*) FROM commands").fetchone()[0] == 0


async def test_a_fresh_heartbeat_gives_the_engine_numbers_to_the_attached_face(run_db: Path) -> None:
    live = LiveFigures(
        "running",
        in_flight=7,
        waiting=2,
        concurrency_limit=9,
        eta_s=42.0,
        endpoints=(
            EndpointLive("sim", in_flight=7, waiting=2, concurrency_limit=9, limit_reason="at ceiling", capacity=9),
        ),
    )
    _beat(run_db, age_s=0.0, snapshot=live)
    src = AttachedSource(run_db)
    try:
        rec = src.record(None)
    finally:
        src.close()
    assert rec.engine == "running" and rec.finished is None and rec.live == live
    assert (rec.live.in_flight, rec.live.waiting, rec.live.concurrency_limit, rec.eta_s) == (7, 2, 9, 42.0)
    assert rec.total == 240  # the counts are the store's, whatever the beat says
