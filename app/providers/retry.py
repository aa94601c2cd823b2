"""Retry one request with exponential backoff and full jitter, honouring the server's Retry-After.

Only `RetryableError` is retried; `SampleFatalError` and `RunStoppingError` pass straight through.
Cost is never double-counted: a failed attempt returns no Completion, so only the successful attempt's
usage is ever accounted. A failed attempt the provider did bill carries it in `error.cost_usd`; the
engine records that once per attempt (`RunStore.log_attempt` from `on_retry`, `RunStore.record_failure` for
the last). `with_retries` is the engine's one retry loop (`app.engine.attempt.request_sample`).
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from app.providers.exceptions import RetryableError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`attempts` in total (1 = no retry); backoff `base_s * 2**n` capped at `cap_s`, full jitter.

    A server's Retry-After is obeyed up to `retry_after_cap_s` (a longer wait is cut to the cap).
    """

    attempts: int = 5
    base_s: float = 0.5
    cap_s: float = 8.0
    retry_after_cap_s: float = 120.0


def backoff_delay(retry_index: int, policy: RetryPolicy, rng: random.Random | None = None) -> float:
    """Full-jitter delay before retry number `retry_index` (0 = first retry): uniform(0, min(cap, base*2^n))."""
    ceiling = min(policy.cap_s, policy.base_s * (2 ** max(retry_index, 0)))
    return (rng or random).uniform(0.0, ceiling)


def delay_for(error: RetryableError, retry_index: int, policy: RetryPolicy, rng: random.Random | None = None) -> float:
    """The wait before the next attempt: the server's Retry-After when given (capped), else backoff."""
    if error.retry_after_s is not None:
        return min(max(error.retry_after_s, 0.0), policy.retry_after_cap_s)
    return backoff_delay(retry_index, policy, rng)


OnRetry = Callable[[int, RetryableError, float], object]


async def with_retries(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    on_retry: OnRetry | None = None,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """Await `attempt()` up to `policy.attempts` times; re-raise the last RetryableError when all fail.

    `on_retry(attempt_number, error, delay_s)` (sync or async) runs before each wait, so the engine
    can count retries and cut its concurrency limit on 429 / overload.
    """
    attempts = max(1, policy.attempts)
    for n in range(attempts):
        try:
            return await attempt()
        except RetryableError as error:
            if n + 1 >= attempts:
                raise
            delay = delay_for(error, n, policy, rng)
            if on_retry is not None:
                result = on_retry(n + 1, error, delay)
                if inspect.isawaitable(result):
                    await result
            await sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
