"""Whether each endpoint is there at all: connection failures counted, endpoints marked down and probed back up.

A request that gets no byte back (`app.providers.exceptions.EndpointUnreachable`: DNS, a refused or timed-out
connect, TLS, a reset before the response head) is a failure of the endpoint, not of the sample. Such a failure
is *free* for the sample (it does not use one of `generation.attempts`) unless the endpoint has answered since
that sample's own previous connection failure: then the endpoint works and this request is what fails, so it
counts like any other failed attempt (no sample can loop forever on an endpoint that answers others).

`EndpointHealth.failed` counts failures in a row with no answer between; at `limits.endpoint_down_after` the
endpoint is *down*: `EndpointSlots` gives it no request, and `HealthBook.watch` probes it (`ChatClient.probe`,
no tokens) after a backoff (PROBE_FIRST_S doubling to PROBE_CAP_S) until it answers, which brings it back up.
The Run pauses when every endpoint is down (samples pending, leases returned) and resumes when one comes back.
Pure state plus one watch coroutine; the Run wires it in (its hooks `_endpoint_down` / `_endpoint_up`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

PROBE_FIRST_S = 1.0  # the first probe of a down endpoint comes this long after it went down
PROBE_CAP_S = 60.0  # probes back off to at most one a minute
RETRY_BASE_S = 0.25  # a sample's wait after a free connection failure: base * 2**failures in a row, jittered
RETRY_CAP_S = 8.0


@dataclass
class EndpointHealth:
    """One endpoint's connection record. `answers` counts every answer (any HTTP response, or a probe that got
    one): a flight compares it with the count at its previous failure to tell whose fault a failure is."""

    name: str
    down_after: int
    failures: int = 0  # connection failures in a row, with no answer between
    answers: int = 0
    down: bool = False
    last_error: str | None = None
    probe_at: float = 0.0  # when a down endpoint is probed next (loop time)
    probe_backoff_s: float = PROBE_FIRST_S

    def answered(self) -> bool:
        """An answer came back (a response of any status, or a probe's). True when this brings a down endpoint up."""
        self.answers += 1
        self.failures = 0
        if not self.down:
            return False
        self.down, self.probe_backoff_s = False, PROBE_FIRST_S
        return True

    def failed(self, error: str, now: float) -> bool:
        """A connection failure. True when it marks the endpoint down (the `down_after`-th in a row)."""
        self.failures += 1
        self.last_error = error
        if self.down or self.failures < self.down_after:
            return False
        self.down = True
        self.probe_at, self.probe_backoff_s = now + PROBE_FIRST_S, PROBE_FIRST_S
        return True

    def probe_failed(self, error: str, now: float) -> None:
        """A probe of a down endpoint got no answer: try again after twice the wait (at most PROBE_CAP_S)."""
        self.last_error = error
        self.probe_backoff_s = min(PROBE_CAP_S, self.probe_backoff_s * 2.0)
        self.probe_at = now + self.probe_backoff_s

    def retry_delay(self, rng: random.Random | None = None) -> float:
        """How long a sample waits before its next request after a free connection failure (full jitter)."""
        ceiling = min(RETRY_CAP_S, RETRY_BASE_S * 2 ** max(0, self.failures - 1))
        return (rng or random).uniform(ceiling / 2, ceiling)


@dataclass
class HealthBook:
    """The run's endpoints' health, by endpoint index (the order of `[[endpoints]]`)."""

    items: list[EndpointHealth] = field(default_factory=list)
    _wake: asyncio.Event | None = None

    @classmethod
    def of(cls, names: list[str], down_after: int) -> HealthBook:
        """A book with every endpoint up."""
        return cls([EndpointHealth(name, down_after) for name in names])

    def up(self, index: int) -> bool:
        """Whether endpoint `index` may be sent requests."""
        return not self.items[index].down

    @property
    def all_down(self) -> bool:
        """True when no endpoint may be sent a request."""
        return bool(self.items) and all(h.down for h in self.items)

    def describe_down(self) -> str:
        """The down endpoints and their last errors, for an event or a pause reason."""
        return "; ".join(f"{h.name}: {h.last_error}" for h in self.items if h.down)

    def poke(self) -> None:
        """Tell the watcher an endpoint went down (it plans its probe)."""
        if self._wake is not None:
            self._wake.set()

    async def watch(
        self, probe: Callable[[int], Awaitable[str | None]], on_up: Callable[[int], Awaitable[None]]
    ) -> None:
        """Probe down endpoints when their backoff ends, forever: `probe(index)` returns None when the endpoint
        answered (`on_up(index)` is then awaited) or the sentence saying what failed. Cancel to stop."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while True:
            down = [(h.probe_at, i) for i, h in enumerate(self.items) if h.down]
            if not down:
                self._wake.clear()
                await self._wake.wait()
                continue
            when, index = min(down)
            wait = when - loop.time()
            if wait > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except TimeoutError:
                    pass
                continue
            health = self.items[index]
            error = await probe(index)
            if not health.down:
                continue  # a request's answer brought it up while the probe ran
            if error is None:
                health.answered()
                await on_up(index)
            else:
                health.probe_failed(error, loop.time())


# the start of a pause reason set when every endpoint is down: the run resumes by itself when one answers again
ENDPOINTS_DOWN = "every endpoint is down"


class EndpointGuard:
    """The engine's side of endpoint health: what `request_sample` calls on a connection failure and on an answer,
    the probes, and the operator's events. `note_error(index)` counts a connection failure in the endpoint's
    metrics; `slots` is the run's EndpointSlots (a slot is given back while a sample waits); `event(level, message)`
    tells the operator; `all_down(reason)` and `back(index)` are the Run's: pause, and resume after such a pause."""

    def __init__(
        self,
        book: HealthBook,
        names: list[str],
        clients: list[Any],
        slots: Any,
        *,
        note_error: Callable[[int], None],
        event: Callable[[str, str], Awaitable[None]],
        all_down: Callable[[str], None],
        back: Callable[[int], Awaitable[None]],
        rng: random.Random | None = None,
    ) -> None:
        self.book, self._names, self._clients, self._slots = book, names, clients, slots
        self._note_error, self._event, self._all_down, self._back = note_error, event, all_down, back
        self._rng = rng or random.Random()

    async def unreachable(self, flight: Any, exc: Exception) -> bool:
        """A request of `flight` reached no endpoint. True (after the slot is given back and a backoff waited)
        when the failure is the endpoint's; False when the endpoint has answered since this flight's previous
        connection failure there (this request counts as a failed attempt)."""
        index = flight.last
        health = self.book.items[index]
        seen = flight.unreachable_seen.get(index)
        free = seen is None or seen == health.answers
        flight.unreachable_seen[index] = health.answers
        if health.failed(str(exc), asyncio.get_running_loop().time()):
            self.book.poke()
            await self._event(
                "warning",
                f"endpoint {health.name} is down: {health.down_after} connection failures in a "
                f"row with no answer (last: {health.last_error}); its requests go to the other endpoints, "
                f"and it is probed again in {PROBE_FIRST_S:g} s, backing off to once every "
                f"{PROBE_CAP_S:g} s, until it answers",
            )
            if self.book.all_down:
                self._all_down(self.book.describe_down())
        if not free:
            return False  # a failed attempt: the retry loop counts and logs it
        self._note_error(index)
        if flight.index is not None:
            self._slots.release(flight.index)
            flight.index = None
        await asyncio.sleep(health.retry_delay(self._rng))
        return True

    def answered(self, index: int) -> None:
        """A response came back from endpoint `index` (of any status)."""
        if self.book.items[index].answered():
            asyncio.get_running_loop().create_task(self.up(index, "a request got an answer"))

    async def probe(self, index: int) -> str | None:
        """Ask endpoint `index` whether it answers (no tokens); None when it did, else what failed."""
        probe = getattr(self._clients[index], "probe", None)
        if probe is None:
            return None  # a client that cannot be probed is tried again by the next request
        try:
            return await probe()
        except Exception as exc:  # a probe must never end the watch
            return f"{type(exc).__name__}: {exc}"

    async def up(self, index: int, how: str = "a probe got an answer") -> None:
        """Endpoint `index` is back: serve waiting requests, tell the operator, let the Run resume."""
        self._slots.wake()
        await self._event("info", f"endpoint {self._names[index]} is back ({how}); requests go to it again")
        await self._back(index)

    async def watch(self) -> None:
        """Probe down endpoints until cancelled (HealthBook.watch)."""
        await self.book.watch(self.probe, self.up)
