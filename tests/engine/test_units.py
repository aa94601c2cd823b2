"""Specifications of the engine's pure parts: AIMD limit, token buckets, weights, windows, budget."""

from __future__ import annotations

from collections import Counter

import pytest

from app.engine.capacity.weights import WeightedRoundRobin
from app.engine.money.budget import BudgetGuard, Prices, projected_total
from app.engine.record.metrics import EndpointMetrics, Observations, RateWindow
from app.token_bucket import TokenBucket

# the adaptive limit's specification: tests/engine/test_limiter.py (it replaced an AIMD rule)


def test_bucket_allows_burst_then_paces_at_rate():
    b = TokenBucket(60, capacity=2, now=0.0)  # 1 per second
    assert b.try_take(1, 0.0) == 0.0
    assert b.try_take(1, 0.0) == 0.0
    wait = b.try_take(1, 0.0)
    assert wait > 0
    assert b.try_take(1, wait) == 0.0


def test_bucket_lets_a_large_take_through_then_repays_the_debt():
    b = TokenBucket(600, capacity=10, now=0.0)  # 10 per second
    assert b.try_take(50, 0.0) == 0.0  # level -40
    assert b.wait_s(0.0) == pytest.approx(4.0, abs=1e-6)
    b.adjust(-30, 0.0)  # the request used 30 fewer than estimated
    assert b.wait_s(0.0) == pytest.approx(1.0, abs=1e-6)


def test_bucket_rejects_a_non_positive_rate():
    with pytest.raises(ValueError):
        TokenBucket(0)


def test_round_robin_follows_weights_smoothly():
    rr = WeightedRoundRobin([3, 1])
    picks = [rr.pick() for _ in range(400)]
    assert Counter(picks) == {0: 300, 1: 100}
    assert all(picks[i : i + 4].count(1) == 1 for i in range(0, 400, 4))


def test_round_robin_skips_ineligible_endpoints():
    rr = WeightedRoundRobin([1, 1])
    assert {rr.pick([False, True]) for _ in range(10)} == {1}
    assert rr.pick([False, False]) is None


def test_rate_window_reports_10s_1m_5m_rates():
    w = RateWindow(started=0.0)
    for s in range(300):
        w.add(float(s), 10)  # one request per second, 10 tokens each
    r = w.rate(299.5)
    assert r.req_s_10s == pytest.approx(1.0)
    assert r.req_s_1m == pytest.approx(1.0)
    assert r.tok_s_5m == pytest.approx(10.0, rel=0.01)
    assert w.rate(400.0).req_s_10s == 0.0  # old buckets expire


def test_rate_window_history_has_one_value_per_10s_bucket():
    w = RateWindow(started=0.0)
    w.add(5.0, 100)
    h = w.history(15.0, buckets=3)
    assert h == (0.0, 10.0, 0.0)


def test_observations_are_bounded_and_windowed():
    o = Observations(cap=100)
    for i in range(1000):
        o.add(0.0, float(i))
    p50, p95 = o.quantiles(1.0)
    assert 900 <= p50 <= 1000 and p95 >= p50
    assert o.quantiles(1000.0) == (None, None)


def test_endpoint_metrics_count_and_give_the_live_figures():
    m = EndpointMetrics("a", 0.0)
    m.record_completion(1.0, 50, 0.2, 0.05, 0.01, truncated=True)
    m.record_error("rate_limited", final=False, retried=True)
    m.record_error("bad_request", final=True, retried=False)
    assert (m.completed, m.failed, m.retried) == (1, 1, 1)
    assert dict(m.errors) == {"rate_limited": 1, "bad_request": 1}
    s = m.snapshot(2.0, in_flight=3, limit=8, waiting=2)
    assert (s.name, s.in_flight, s.waiting, s.concurrency_limit) == ("a", 3, 2, 8)  # counts are the store's
    assert s.latency_p50_ms == pytest.approx(200.0) and s.rate.req_s_10s > 0


def test_budget_guard_refuses_a_request_that_could_cross():
    g = BudgetGuard(1.0, Prices(prompt_per_m=1.0, completion_per_m=10.0), max_tokens=10_000)
    worst = g.worst_case(1000)  # 0.001 + 0.1
    assert worst == pytest.approx(0.101)
    starts = 0
    while g.allows(worst):
        g.reserve(worst)
        starts += 1
    assert starts == 9
    g.settle(worst, 0.02)  # one finished far cheaper
    assert g.allows(worst)
    assert g.spent_usd == pytest.approx(0.02)


def test_budget_guard_without_prices_has_no_worst_case_to_reserve():
    # the engine refuses a budget without prices (test_control); the guard itself reserves nothing then
    g = BudgetGuard(None, None, max_tokens=100)
    assert g.worst_case(10) == 0.0 and g.allows(1e9)


def test_projection():
    assert projected_total(1.0, 10, 90) == pytest.approx(10.0)
    assert projected_total(0.0, 0, 10) is None
