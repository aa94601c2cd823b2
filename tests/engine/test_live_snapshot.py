"""What the engine's record says while it runs: the projection from tokens still expected, the limiter's
reason and capacity per endpoint (pinned by the operator), and in-flight that means on the wire."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.run import Run
from tests.engine.conftest import make_config, open_ingested, until


async def test_projected_cost_at_a_quarter_done_is_within_15_percent_of_the_final_cost(tmp_path, sample_data):
    # the demo's latency and streaming pace: long samples finish last, so an average over the finished ones
    # (the old projection) is low early; the projector counts the tokens still expected
    config = make_config(tmp_path, sample_data, stream=True, limits={"concurrency_initial": 16, "concurrency_max": 16},
                         simulator={"latency_median_ms": 200.0, "latency_p95_ms": 600.0, "tokens_per_s": 2000.0})
    n = 200
    store, _ = await open_ingested(config, sample_data, n)
    run = Run(config, store)
    try:
        await run.start()
        await until(lambda: run.snapshot().done >= n // 4, 60)
        early = run.snapshot()
        await asyncio.wait_for(run.wait(), 120)
        final = run.snapshot()
    finally:
        await run.close()
        await store.close()
    assert final.state == "done" and final.live.eta_s == 0.0
    assert final.live.projected_cost_usd == pytest.approx(final.cost_usd)  # the engine's spend is the store's ledger
    assert early.eta_s is not None and early.eta_s > 0
    assert abs(early.live.projected_cost_usd - final.cost_usd) <= 0.15 * final.cost_usd, (
        early.live.projected_cost_usd, final.cost_usd)
    assert final.live.in_flight == 0 and final.live.waiting == 0


async def test_endpoint_rows_carry_the_limit_reason_and_an_operator_limit_is_pinned(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, limits={"concurrency_initial": 2, "concurrency_max": 32},
                         simulator={"latency_median_ms": 50.0, "latency_p95_ms": 80.0})
    store, _ = await open_ingested(config, sample_data, 300)
    run = Run(config, store)
    try:
        await run.start()
        await until(lambda: run.snapshot().done >= 10, 30)
        (ep,) = run.snapshot().live.endpoints
        assert ep.limit_reason == "growing" and ep.capacity is None  # slow start: nothing refused yet
        await run.set_concurrency(5)
        await until(lambda: run.snapshot().done >= 40, 30)
        live = run.snapshot().live
        (ep,) = live.endpoints
        assert ep.limit_reason == "pinned" and ep.concurrency_limit == 5 == live.concurrency_limit
        # on the wire never exceeds the limit, in the tile and in the row alike
        assert live.in_flight == ep.in_flight <= 5 and live.waiting == ep.waiting
        await run.pause(now=True)
    finally:
        await run.close()
        await store.close()
