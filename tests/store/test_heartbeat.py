"""The engine heartbeat: a reader tells a running engine from a stopped or crashed one, from the database alone."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.engine.record.codec import live_from_json, snapshot_to_json
from app.engine.record.snapshot import EndpointLive, LiveFigures, Rate, RunRecord
from app.store.count_records import RunCounts, SampleStates
from app.store.db import migrate
from app.store.heartbeat import Heartbeat, beat_op, liveness, process_alive, read_heartbeat, stop_op, this_host


@pytest.fixture
def db(tmp_path: Path) -> sqlite3.Connection:
    path = tmp_path / "run.db"
    migrate(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'r', 0, 0)")
    yield conn
    conn.close()


def _hb(**kw) -> Heartbeat:
    base = dict(run_id=1, pid=1, host="gpu-1", started_at=100.0, beat_at=200.0, stopped_at=None, snapshot_json=None)
    base.update(kw)
    return Heartbeat(**base)


def test_a_beat_is_read_back_with_its_snapshot(db: sqlite3.Connection) -> None:
    beat_op(1, pid=4242, host="gpu-1", started_at=100.0, now=150.0, snapshot_json='{"x":1}')(db)
    beat_op(1, pid=4242, host="gpu-1", started_at=100.0, now=151.0, snapshot_json='{"x":2}')(db)
    assert read_heartbeat(db, 1) == Heartbeat(1, 4242, "gpu-1", 100.0, 151.0, None, '{"x":2}')


def test_a_clean_exit_is_stopped_and_a_restart_clears_it(db: sqlite3.Connection) -> None:
    beat_op(1, pid=10, host="h", started_at=1.0, now=2.0, snapshot_json=None)(db)
    stop_op(1, pid=10, now=3.0, snapshot_json='{"final":true}')(db)
    hb = read_heartbeat(db, 1)
    assert hb.stopped_at == 3.0 and hb.snapshot_json == '{"final":true}'
    assert liveness(hb, 10.0, host="h").state == "stopped"
    beat_op(1, pid=11, host="h", started_at=20.0, now=21.0, snapshot_json=None)(db)
    hb = read_heartbeat(db, 1)
    assert hb.stopped_at is None and hb.pid == 11


def test_an_old_engine_stopping_does_not_mark_a_newer_one_stopped(db: sqlite3.Connection) -> None:
    beat_op(1, pid=11, host="h", started_at=20.0, now=21.0, snapshot_json=None)(db)
    stop_op(1, pid=10, now=22.0, snapshot_json=None)(db)  # pid 10 lost the row to pid 11
    assert read_heartbeat(db, 1).stopped_at is None


def test_fresh_beats_from_another_host_are_running() -> None:
    live = liveness(_hb(beat_at=200.0), 202.0, host="laptop")
    assert live.state == "running" and live.alive


def test_stale_beats_are_a_gone_engine_whose_text_says_when_it_was_last_seen() -> None:
    live = liveness(_hb(beat_at=200.0, pid=4242), 212.0, host="laptop")
    assert live.state == "gone" and not live.alive
    assert live.text == "ENGINE GONE (last seen 12 s ago, pid 4242 on gpu-1)"


def test_no_row_means_no_engine_ever_ran() -> None:
    assert liveness(None, 0.0).state == "never"


def test_a_sigkilled_engine_on_this_host_is_gone_before_its_beats_go_stale(db: sqlite3.Connection) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        now = time.time()
        beat_op(1, pid=proc.pid, host=this_host(), started_at=now, now=now, snapshot_json=None)(db)
        assert liveness(read_heartbeat(db, 1), now).state == "running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert not process_alive(proc.pid)
        assert liveness(read_heartbeat(db, 1), now + 0.5).state == "gone"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_live_figures_survive_the_json_round_trip_and_the_counts_stay_home() -> None:
    live = LiveFigures(
        state="running",
        state_reason=None,
        started_at=99.0,
        in_flight=9,
        waiting=2,
        concurrency_limit=24,
        rate=Rate(req_s_10s=3.5, tok_s_10s=900.0),
        latency_p95_ms=6400.0,
        eta_s=120.0,
        projected_cost_usd=2.5,
        endpoints=(
            EndpointLive(name="sim", in_flight=9, concurrency_limit=24, limit_reason="at ceiling", capacity=24),
        ),
    )
    record = RunRecord("demo", "running", RunCounts(samples=SampleStates(pending=288, done=12)), live=live)
    text = snapshot_to_json(record)
    assert live_from_json(text) == live
    assert "288" not in text  # a reader takes the counts from the store's tallies, never from a beat


def test_a_newer_writer_with_unknown_fields_still_decodes() -> None:
    text = snapshot_to_json(LiveFigures("done"))[:-1] + ',"from_the_future":1}'
    assert live_from_json(text) == LiveFigures("done")


def test_a_torn_or_foreign_beat_is_refused() -> None:
    for text in ('{"x":1}', "[1, 2]", '{"state": "running"'):
        with pytest.raises((ValueError, TypeError, KeyError)):
            live_from_json(text)
