"""Pause, resume, pause-now, budget, the command table, the run lock, and the API key's secrecy."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

from app.engine.record.reads import read_record
from app.engine.run import Run
from app.errors import EaglewatchError
from app.simulator.options import SimulatorOptions
from app.simulator.server import SimulatorServer
from app.store.queries import connect_readonly
from tests.engine.conftest import beats_after, make_config, open_ingested, run_to_end

SLOW = {"latency_median_ms": 40.0, "latency_p95_ms": 60.0}


async def _until(pred, timeout=20.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


def _states(config):
    db = sqlite3.connect(config.run.database)
    return dict(db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())


async def test_pause_lets_in_flight_finish_then_resume_completes_exactly_once(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, simulator=SLOW)
    store, _ = await open_ingested(config, sample_data, 60)
    run = Run(config, store)
    try:
        await run.start()
        await _until(lambda: run.snapshot().done >= 5)
        await run.pause()
        outcome = await asyncio.wait_for(run.wait(), 10)
        assert outcome.state == "paused" and outcome.reason == "operator"
        paused_done = run.snapshot().done
        assert run.snapshot().live.in_flight == 0
        states = _states(config)
        assert states.get("leased", 0) == 0 and states["done"] == paused_done < 60
        await beats_after(config.run.database, time.time())  # the engine goes on, paused
        assert run.snapshot().done == paused_done and run.snapshot().live.in_flight == 0  # nothing new while paused
        assert _states(config) == states
        await run.resume()
        await asyncio.wait_for(run.wait_finished(), 30)
    finally:
        await run.close()
        await store.close()
    db = sqlite3.connect(config.run.database)
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT sample_pk) FROM responses").fetchone() == (60, 60)


async def test_pause_now_cancels_in_flight_and_releases_their_leases(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, simulator={"latency_median_ms": 3000.0, "latency_p95_ms": 3000.0})
    store, _ = await open_ingested(config, sample_data, 20)
    run = Run(config, store)
    try:
        await run.start()
        await _until(lambda: run.snapshot().live.in_flight >= 8)
        await run.pause(now=True)
        await asyncio.wait_for(run.wait(), 5)
        assert run.snapshot().live.in_flight == 0
    finally:
        await run.close()
        await store.close()
    assert _states(config) == {"pending": 20}
    db = sqlite3.connect(config.run.database)
    assert db.execute("SELECT SUM(attempts) FROM samples").fetchone()[0] == 0  # a cancelled lease is not an attempt
    warnings = [r[0] for r in db.execute("SELECT message FROM events WHERE level = 'warning'")]
    assert any("may still bill" in m for m in warnings)


async def test_paused_state_survives_a_restart(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, simulator=SLOW)
    store, _ = await open_ingested(config, sample_data, 20)
    run = Run(config, store)
    await run.start()
    await run.pause()
    await run.wait()
    await run.close()
    run = Run(config, store)
    try:
        await run.start()
        # idle: the scheduler has looked at the stored state (paused) and leased nothing; then it goes on, paused
        outcome = await asyncio.wait_for(run.wait(), 10)
        await beats_after(config.run.database, time.time())
        assert run.state == "paused" and outcome.state == "paused"
        assert _states(config).get("leased", 0) == 0
        await run.resume()
        await asyncio.wait_for(run.wait_finished(), 30)
    finally:
        await run.close()
        await store.close()
    assert _states(config) == {"done": 20}


async def test_budget_pauses_before_spending_could_cross_it(tmp_path, sample_data):
    budget = 0.02
    config = make_config(tmp_path, sample_data, limits={"budget_usd": budget}, generation={"max_tokens": 1024})
    _, outcome = await run_to_end(config, sample_data, 300)
    assert outcome.state == "paused" and outcome.reason == "budget reached"
    db = sqlite3.connect(config.run.database)
    spent = db.execute("SELECT SUM(cost_usd) FROM responses").fetchone()[0]
    assert 0 < spent <= budget
    assert _states(config)["done"] < 300
    # one pause event; a warning may come first when a response costs more than its reserved worst case
    # (the simulator does not cut responses at max_tokens, so it can bill past the reservation)
    assert (
        db.execute("SELECT COUNT(*) FROM events WHERE kind = 'budget' AND message LIKE 'budget $%'").fetchone()[0] == 1
    )


async def test_attached_viewer_commands_steer_the_engine(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, simulator={"latency_median_ms": 250.0, "latency_p95_ms": 300.0})
    store, run_id = await open_ingested(config, sample_data, 300)
    run = Run(config, store)
    try:
        await run.start()
        await store.enqueue_command(run_id, "set_concurrency", {"limit": 3})
        await store.enqueue_command(run_id, "pause", {})
        outcome = await asyncio.wait_for(run.wait(), 10)
        assert outcome.state == "paused"
        assert run.snapshot().live.concurrency_limit == 3
        await store.enqueue_command(run_id, "resume", {})
        await _until(lambda: run.state == "running", 5)
    finally:
        await run.close()
        await store.close()


async def test_a_second_engine_on_the_same_run_is_refused(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, simulator=SLOW)
    store, _ = await open_ingested(config, sample_data, 5)
    first = Run(config, store)
    await first.start()
    try:
        with pytest.raises(EaglewatchError, match="already running this run"):
            await Run(config, store).start()
    finally:
        await first.close()
        await store.close()


async def _live_and_stored(config, sample_data, n):
    """Run n samples to the end; the engine's last record and the one the database gives afterwards."""
    store, _ = await open_ingested(config, sample_data, n)
    run = Run(config, store)
    try:
        await run.start()
        await run.wait()
        live = run.snapshot()
    finally:
        await run.close()
        await store.close()
    return live, read_record(connect_readonly(config.run.database), "t")


async def test_the_stored_record_agrees_with_the_engine(tmp_path, sample_data):
    live, rec = await _live_and_stored(make_config(tmp_path, sample_data), sample_data, 30)
    assert (rec.state, rec.done, rec.total, rec.failed) == ("done", live.done, 30, 0)
    assert rec.counts == live.counts  # one source for the counts: the store's tallies
    assert rec.finished is not None and rec.finished.req_s > 0 and rec.finished.percentiles.latency_p50_ms is not None
    assert [e.name for e in rec.counts.endpoints] == ["sim"] and rec.counts.endpoints[0].completed == 30


SECRET = "sk-or-v1-SECRETSECRET0123456789abcdef"


@pytest.mark.parametrize("server_key", [SECRET, "sk-another-key"])
async def test_api_key_never_reaches_database_events_or_errors(tmp_path, sample_data, monkeypatch, caplog, server_key):
    monkeypatch.setenv("EW_TEST_KEY", SECRET)
    sim = SimulatorServer(
        SimulatorOptions(faults={"500": 0.2, "malformed": 0.1}, seed=2),
        tokenizer_dir=sample_data / "tokenizer",
        reference=sample_data / "reference.jsonl",
        api_key=server_key,
        retry_after_s=0.01,
    )
    await sim.start()
    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[{"name": "sim", "base_url": sim.base_url, "api_key_env": "EW_TEST_KEY", "timeout_s": 5}],
    )
    store, _ = await open_ingested(config, sample_data, 20)
    run = Run(config, store)
    try:
        await run.start()
        outcome = await asyncio.wait_for(run.wait(), 30)
        texts = [repr(e) for e in run.events_since(0)] + [repr(run.snapshot()), repr(run.endpoints[0].client)]
    finally:
        await run.close()
        await store.close()
        await sim.close()
    assert outcome.state == ("done" if server_key == SECRET else "paused")
    raw = b"".join(p.read_bytes() for p in tmp_path.rglob("run.db*") if p.is_file())
    assert SECRET.encode() not in raw
    assert all(SECRET not in t for t in texts)
    assert SECRET not in caplog.text


async def test_failed_and_retried_per_endpoint_count_final_failures_and_requests_tried_again(tmp_path, sample_data):
    """`failed` is samples that failed for good at that endpoint, `retried` the failed requests tried again: the
    store counts them for every face as the engine's own metrics count them."""
    config = make_config(tmp_path, sample_data, faults={"500": 0.35}, generation={"attempts": 2}, simulator={"seed": 5})
    store, _ = await open_ingested(config, sample_data, 60)
    run = Run(config, store)
    try:
        await run.start()
        await run.wait()
        metrics = run.endpoints[0].metrics  # what the engine counted as it settled each request
    finally:
        await run.close()
        await store.close()
    rec = read_record(connect_readonly(config.run.database), "t")
    (ep,) = rec.counts.endpoints
    assert metrics.failed > 0 and metrics.retried > metrics.failed  # both kinds happened
    assert (ep.completed, ep.failed, ep.retried) == (metrics.completed, metrics.failed, metrics.retried)
    assert dict(ep.errors_by_class) == dict(metrics.errors)
    assert (rec.failed, rec.counts.retried) == (metrics.failed, metrics.retried)
