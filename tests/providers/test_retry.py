"""Backoff with full jitter, Retry-After obeyed, on_retry reported, only the success is returned."""

from __future__ import annotations

import random

import pytest

from app.providers import ChatClient, RetryableError, RetryPolicy, SampleFatalError, with_retries
from app.providers.retry import backoff_delay, delay_for
from app.simulator import SimulatorOptions, SimulatorServer
from tests.providers.support import Endpoint, Generation, user


def test_full_jitter_stays_under_the_exponential_ceiling():
    policy = RetryPolicy(base_s=0.5, cap_s=8.0)
    rng = random.Random(1)
    for n, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        draws = [backoff_delay(n, policy, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in draws)
        assert max(draws) > ceiling * 0.8  # jitter spreads over the whole range


def test_retry_after_wins_over_backoff_and_is_capped():
    policy = RetryPolicy(retry_after_cap_s=60.0)
    assert delay_for(RetryableError("x", retry_after_s=5.0), 3, policy) == 5.0
    assert delay_for(RetryableError("x", retry_after_s=600.0), 0, policy) == 60.0
    assert 0.0 <= delay_for(RetryableError("x"), 0, policy) <= 0.5


async def test_retries_until_success_and_reports_each_retry():
    outcomes = [RetryableError("busy", error_class="429", retry_after_s=2.0), RetryableError("boom"), "ok"]
    seen, slept = [], []

    async def attempt():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def fake_sleep(s):
        slept.append(s)

    result = await with_retries(
        attempt, RetryPolicy(attempts=5), sleep=fake_sleep, on_retry=lambda n, e, d: seen.append((n, e.error_class, d))
    )
    assert result == "ok"
    assert [s[:2] for s in seen] == [(1, "429"), (2, "retryable")]
    assert slept[0] == 2.0 and seen[0][2] == 2.0


async def test_gives_up_after_the_configured_attempts():
    calls = 0

    async def attempt():
        nonlocal calls
        calls += 1
        raise RetryableError("down", error_class="5xx")

    async def no_sleep(_):
        pass

    with pytest.raises(RetryableError):
        await with_retries(attempt, RetryPolicy(attempts=3), sleep=no_sleep)
    assert calls == 3


async def test_fatal_errors_are_not_retried():
    calls = 0

    async def attempt():
        nonlocal calls
        calls += 1
        raise SampleFatalError("bad request", error_class="400")

    with pytest.raises(SampleFatalError):
        await with_retries(attempt, RetryPolicy(attempts=5))
    assert calls == 1


async def test_against_a_flaky_simulator_only_the_success_is_counted(tok, reference):
    options = SimulatorOptions(faults={"429": 0.4, "500": 0.2}, seed=3)
    retries = []
    async with SimulatorServer(options, tokenizer=tok, reference=reference[0], retry_after_s=0) as sim:
        async with ChatClient(Endpoint(), Generation(), "k", base_url=sim.base_url) as client:
            completions = []
            for _i in range(10):
                completions.append(
                    await with_retries(
                        lambda: client.complete(user("plain"), model="kimi"),
                        RetryPolicy(attempts=20, base_s=0.001, cap_s=0.002),
                        on_retry=lambda n, e, d: retries.append(e.error_class),
                    )
                )
        failures = sim.counters["429"] + sim.counters["500"]
        assert sim.counters["ok"] == 10
    assert len(retries) == failures > 0
    assert set(retries) <= {"429", "5xx"}
    # one billed completion per sample: the failed attempts returned nothing to account
    assert sum(c.usage.cost_usd for c in completions) == pytest.approx(10 * completions[0].usage.cost_usd)


@pytest.mark.parametrize("stream", [False, True])
async def test_mixed_fault_storm_at_concurrency_completes_every_request(tok, reference, stream):
    import asyncio
    import collections

    faults = {
        "429": 0.05,
        "500": 0.05,
        "503": 0.05,
        "reset": 0.05,
        "malformed": 0.05,
        "truncate": 0.05,
        "stream_error": 0.05,
        "keepalive": 0.2,
    }
    classes = collections.Counter()
    async with SimulatorServer(
        SimulatorOptions(faults=faults, seed=9), tokenizer=tok, reference=reference[0], retry_after_s=0
    ) as sim:
        async with ChatClient(
            Endpoint(max_concurrency=64), Generation(stream=stream), "k", base_url=sim.base_url
        ) as client:

            async def one(i):
                return await with_retries(
                    lambda: client.complete(user("tools" if i % 2 else "plain"), model="kimi"),
                    RetryPolicy(attempts=30, base_s=0.001, cap_s=0.002),
                    on_retry=lambda n, e, d: classes.update([e.error_class]),
                )

            completions = await asyncio.gather(*(one(i) for i in range(200)))
        assert (
            sim.counters["ok"] + sim.counters["malformed"] + sim.counters["truncate"] + sim.counters["stream_error"]
            >= 200
        )
    assert all(c.finish_reason in ("stop", "tool_calls") for c in completions)
    assert {c.content for c in completions} == {"Hello! ünï 中文 here.", "Checking."}
    assert set(classes) <= {"429", "5xx", "unreachable", "malformed", "stream"}
    assert classes["429"] and classes["5xx"] and classes["unreachable"]
