"""The engine over real loopback HTTP (the simulator) and a real SQLite run store."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from app.engine.fidelity.pool import build_reconstructor
from app.engine.run import Run
from tests.engine.conftest import make_config, open_ingested


def _db(config):
    return sqlite3.connect(config.run.database)


async def _run_to_end(config, sample_data, n, **kw):
    store, run_id = await open_ingested(config, sample_data, n)
    run = Run(config, store, **kw)
    try:
        await run.start()
        outcome = await run.wait()
        snap = run.snapshot()
    finally:
        await run.close()
        await store.close()
    return outcome, snap


@pytest.mark.parametrize("stream", [False, True])
async def test_every_sample_is_done_once(tmp_path, sample_data, stream):
    config = make_config(tmp_path, sample_data, stream=stream)
    outcome, snap = await _run_to_end(config, sample_data, 40)
    assert outcome.state == "done"
    assert (snap.done, snap.failed, snap.counts.samples.pending) == (40, 0, 0)
    db = _db(config)
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT sample_pk) FROM responses").fetchone() == (40, 40)
    assert db.execute("SELECT state FROM runs").fetchone()[0] == "done"
    assert db.execute("SELECT COUNT(*) FROM reconstructions").fetchone()[0] == 0  # no reconstructor: text only


async def test_streamed_reasoning_and_tool_calls_are_stored(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, stream=True)
    outcome, _ = await _run_to_end(config, sample_data, 120)
    assert outcome.state == "done"
    db = _db(config)
    with_reasoning = db.execute(
        "SELECT COUNT(*) FROM responses WHERE reasoning IS NOT NULL AND reasoning != ''"
    ).fetchone()[0]
    calls = [json.loads(r[0]) for r in db.execute("SELECT tool_calls FROM responses WHERE tool_calls IS NOT NULL")]
    calls = [c for c in calls if c]
    assert with_reasoning > 0
    assert calls and all(c[0]["name"] and isinstance(c[0]["arguments"], str) for c in calls)


async def test_live_verdicts_use_the_reference_ids(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, stream=True)
    outcome, snap = await _run_to_end(config, sample_data, 40, reconstructor=build_reconstructor(config))
    assert outcome.state == "done"
    verdicts = dict(snap.counts.answers.verdicts)
    assert sum(verdicts.values()) == 40
    assert verdicts.get("exact", 0) + verdicts.get("bpe_equivalent", 0) >= 30  # a clean simulator replays the ids
    db = _db(config)
    assert db.execute("SELECT COUNT(*) FROM reconstructions WHERE reference_ids IS NOT NULL").fetchone()[0] == 40


async def test_requests_are_spread_over_endpoints_by_weight(tmp_path, sample_data):
    sim = {"latency_median_ms": 5.0, "latency_p95_ms": 5.0, "seed": 1}
    # the total pinned at 8 (min too): a loaded machine slows the in-process simulator, and the adaptive limit
    # would take that for a server slowing down and cut the total
    config = make_config(
        tmp_path,
        sample_data,
        limits={"concurrency_initial": 8, "concurrency_min": 8, "concurrency_max": 8},
        endpoints=[
            {"name": "big", "simulator": sim, "weight": 3.0, "max_concurrency": 64},
            {"name": "small", "simulator": sim, "weight": 1.0, "max_concurrency": 64},
        ],
    )
    outcome, snap = await _run_to_end(config, sample_data, 200)
    assert outcome.state == "done"
    per = dict(_db(config).execute("SELECT endpoint, COUNT(*) FROM responses GROUP BY endpoint").fetchall())
    assert per["big"] + per["small"] == 200
    assert 2.0 <= per["big"] / per["small"] <= 4.5
    assert [e.name for e in snap.live.endpoints] == ["big", "small"]
    assert [e.name for e in snap.counts.endpoints] == ["big", "small"]
    assert snap.live.concurrency_limit == 8


async def test_requests_per_minute_bucket_paces_the_run(tmp_path, sample_data):
    # 120/min: a burst of 20 (ten seconds' worth), then one every 0.5 s
    config = make_config(tmp_path, sample_data, limits={"requests_per_min": 120})
    store, _ = await open_ingested(config, sample_data, 24)
    run = Run(config, store)
    try:
        await run.start()
        t0 = time.monotonic()
        await run.wait()
        elapsed = time.monotonic() - t0
    finally:
        await run.close()
        await store.close()
    assert run.snapshot().done == 24
    assert elapsed >= 1.5  # the 4 requests past the burst waited for the bucket
