"""One sample's requests, from its first try to an `Outcome`: done, failed, released or stopping.

`request_sample` sends the sample (retrying retryable errors under the one retry policy,
`app.providers.retry.with_retries`, with the slot given back while it waits), reconstructs the token ids of a
success, and turns whatever happened into an Outcome: it never raises except on cancellation. The
engine settles the Outcome in one place (`app.engine.settle.Settler.settle`). The slot stays held from the
request until the engine has stored the result, so finished-but-unstored responses count against the
in-flight bound.

A request that reached no endpoint (`EndpointUnreachable`) goes to `on_unreachable` first: when that says the
failure was the endpoint's (app.engine.health.endpoint_health), the request is sent again without using one of the
sample's attempts; otherwise it is a failed attempt like any other. `on_answered(index)` hears of every
response that came back from endpoint `index`, whatever its status.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from app.engine.capacity.endpoints import Endpoint
from app.engine.capacity.limiter import Ticket
from app.engine.capacity.slots import EndpointSlots
from app.engine.fidelity.verify import Reconstructed
from app.providers.exceptions import (
    EndpointUnreachable,
    ProviderError,
    RetryableError,
    RunStoppingError,
    SampleFatalError,
)
from app.providers.retry import RetryPolicy, with_retries
from app.records import Completion, ErrorClass, Reconstruction, Verdict
from app.store.store_records import LeasedSample
from app.tokens.prompt_check import PromptCheck

OutcomeKind = Literal["done", "failed", "released", "stopping"]
# (completion, flight) -> the reconstructed ids, verdict, text-path measurement and prompt check
# (app.engine.fidelity.verify)
Reconstruct = Callable[[Completion, "Flight"], Awaitable[Reconstructed]]
# endpoint index -> (the request's extra body fields, whether it is a probe); default: the endpoint's `extra`
RequestExtra = Callable[[int], "tuple[dict | None, bool]"]


@dataclass
class Flight:
    """One sample in flight: the slot it holds (endpoint index, None while it waits to retry), the budget
    it reserved and how many requests the sample has cost so far (over every lease)."""

    sample: LeasedSample
    reserved_usd: float
    index: int | None
    tries: int = 0
    last: int = 0  # the endpoint of the latest request
    billed_usd: float = 0.0  # what failed earlier requests of this flight were billed
    unrecorded_usd: float = 0.0  # what the last request was charged, kept until its outcome is recorded
    settling: bool = False  # a response arrived: pause-now leaves it to be reconstructed and stored
    probe: bool = False  # the latest request asked for true ids (app.engine.fidelity.verify): its text path is measured
    ticket: Ticket | None = None  # the limiter's ticket of the latest request (its level and epoch)
    # endpoint index -> its answer count at this flight's latest connection failure there (endpoint_health)
    unreachable_seen: dict[int, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tries = self.sample.tries


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a sample's requests ended. `attempt` is the sample's number of the last request (0: none sent);
    `cost_usd` what a failed last request was billed; `unexpected` marks an error that is not a provider's
    (a bug or bad data), which the operator sees as an event naming the sample."""

    kind: OutcomeKind
    attempt: int
    completion: Completion | None = None
    reconstruction: Reconstruction | None = None
    verdict: Verdict | None = None
    error: ProviderError | None = None
    error_class: str | None = None
    message: str | None = None
    cost_usd: float = 0.0
    unexpected: bool = False
    measured: str | None = None  # the text-path verdict of a probe with true ids (app.engine.fidelity.verify)
    prompt_check: PromptCheck | None = None  # when the server returned prompt ids


# Called before each retry's wait with the failed attempt: the engine counts it, cuts the limit on overload,
# gives back the slot and logs the attempt with its cost.
OnRetry = Callable[[Flight, RetryableError], Awaitable[None]]
# A request reached no endpoint: True when it was the endpoint's failure (the slot is given back, the wait done,
# and the request is sent again without using an attempt); False to count it as a failed attempt.
OnUnreachable = Callable[[Flight, EndpointUnreachable], Awaitable[bool]]


async def request_sample(
    flight: Flight,
    *,
    endpoints: list[Endpoint],
    slots: EndpointSlots,
    policy: RetryPolicy,
    model: str,
    reconstruct: Reconstruct,
    on_retry: OnRetry,
    request_extra: RequestExtra | None = None,
    on_first_token: Callable[[Flight], None] | None = None,
    on_unreachable: OnUnreachable | None = None,
    on_answered: Callable[[int], None] | None = None,
) -> Outcome:
    """Send `flight.sample` until it succeeds or fails for good, and reconstruct its ids; see the module doc.
    `on_first_token(flight)`: a streamed request's first token arrived (the ETA's clock for that sample)."""
    sample = flight.sample
    counted = flight.tries - sample.tries_forgiven  # an operator's retry of failed samples forgave the earlier ones
    left = policy.attempts - counted
    if left <= 0:
        return Outcome(
            "failed",
            flight.tries,
            error_class=ErrorClass.ATTEMPTS_EXHAUSTED,
            message=f"{counted} requests sent over earlier leases; generation.attempts is {policy.attempts}",
        )

    async def once() -> Completion:
        if flight.index is None:
            flight.index, flight.ticket = await slots.acquire_ticket()
        ep = endpoints[flight.index]
        flight.last = flight.index
        flight.tries += 1
        if request_extra is None:
            extra, flight.probe = ep.config.extra or None, False
        else:
            extra, flight.probe = request_extra(flight.index)
        try:
            if on_first_token is None:
                completion = await ep.client.complete(sample.messages, sample.tools, model=model, extra=extra)
            else:
                completion = await ep.client.complete(
                    sample.messages,
                    sample.tools,
                    model=model,
                    extra=extra,
                    on_first_token=lambda: on_first_token(flight),
                )
        except ProviderError as exc:
            if on_answered is not None and getattr(exc, "answered", False):
                on_answered(flight.last)
            raise
        if on_answered is not None:
            on_answered(flight.last)
        return completion

    async def send() -> Completion:
        while True:
            try:
                return await once()
            except EndpointUnreachable as exc:
                if on_unreachable is None or not await on_unreachable(flight, exc):
                    raise
                flight.tries -= 1  # the endpoint's failure, not the sample's: sent again, no attempt used

    async def retrying(_n: int, exc: RetryableError, _delay: float) -> None:
        await on_retry(flight, exc)

    try:
        completion = await with_retries(send, dataclasses.replace(policy, attempts=left), on_retry=retrying)
    except asyncio.CancelledError:
        raise
    except RunStoppingError as exc:
        return Outcome(
            "stopping", flight.tries, error=exc, error_class=exc.error_class, message=str(exc), cost_usd=exc.cost_usd
        )
    except (RetryableError, SampleFatalError) as exc:
        return Outcome(
            "failed", flight.tries, error=exc, error_class=exc.error_class, message=str(exc), cost_usd=exc.cost_usd
        )
    except Exception as exc:  # not a provider error: a bug or bad data; the sample fails, the run goes on
        return Outcome(
            "failed",
            flight.tries,
            error_class=ErrorClass.INTERNAL,
            message=f"{type(exc).__name__}: {exc}",
            unexpected=True,
        )
    flight.settling = True
    if flight.index is not None:
        slots.answered(flight.index)  # off the wire: the limiter's levels count what the provider holds
    try:
        reconstructed = await reconstruct(completion, flight)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # e.g. a reference id beyond the vocabulary: the paid response is still stored
        return Outcome(
            "failed",
            flight.tries,
            completion=completion,
            error_class=ErrorClass.RECONSTRUCT,
            message=f"{type(exc).__name__}: {exc}",
            unexpected=True,
        )
    if reconstructed.interventions:  # the ledger travels with the answer to the store
        completion = dataclasses.replace(completion, interventions=reconstructed.interventions)
    return Outcome(
        "done",
        flight.tries,
        completion=completion,
        reconstruction=reconstructed.reconstruction,
        verdict=reconstructed.verdict,
        measured=reconstructed.measured,
        prompt_check=reconstructed.prompt_check,
    )
