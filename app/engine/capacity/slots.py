"""Request slots over several endpoints: each endpoint's adaptive limit, picked by weight.

`EndpointSlots.acquire_ticket()` waits until some endpoint can start a request (a free slot, no cooldown)
and returns its index with the limiter's `Ticket` (the request's level, start and epoch, which the outcome
gives back to the limiter; `acquire()` returns the index alone); among the endpoints that can, the pick follows the
weights (smooth weighted round
robin). An endpoint its health marks down (`app.engine.health.endpoint_health`) gets no request; when it comes back,
`wake()` serves the waiters. Waiters are served first come, first served; a cooldown's end wakes them with a timer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from app.engine.capacity.limiter import AdaptiveLimit, Ticket
from app.engine.capacity.weights import WeightedRoundRobin


class EndpointSlots:
    """The in-flight slots of all endpoints of a run."""

    def __init__(
        self, limits: list[AdaptiveLimit], weights: list[float], up: Callable[[int], bool] | None = None
    ) -> None:
        self.limits = limits
        self._up = up  # endpoint index -> whether it may be sent requests (None: always)
        self._rr = WeightedRoundRobin(weights)
        self._waiters: deque[asyncio.Future[tuple[int, Ticket]]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _pick(self, now: float) -> tuple[int, Ticket] | None:
        up = self._up
        i = self._rr.pick([lim.can_start(now) and (up is None or up(k)) for k, lim in enumerate(self.limits)])
        if i is None:
            return None
        return i, self.limits[i].take(now)

    async def acquire(self) -> int:
        """Wait for a slot on some endpoint and return that endpoint's index (the slot is taken)."""
        return (await self.acquire_ticket())[0]

    async def acquire_ticket(self) -> tuple[int, Ticket]:
        """Wait for a slot on some endpoint; return its index and the limiter's ticket for the request."""
        if not self._waiters:
            got = self._pick(self._now())
            if got is not None:
                return got
        fut: asyncio.Future[tuple[int, Ticket]] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._arm_timer()
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result()[0])  # granted just as we were cancelled: give it back
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def answered(self, index: int) -> None:
        """A request holding a slot of endpoint `index` has its answer: it keeps the slot until its result is
        stored, but no longer counts as on the wire (`AdaptiveLimit.mark_answered`), so the next request may go
        to the provider while this one's result is reconstructed and stored (waiters are served now)."""
        self.limits[index].mark_answered()
        self.wake()

    def release(self, index: int, answered: bool = False) -> None:
        """Give back a slot of endpoint `index` (`answered`: its request was marked answered) and hand free slots
        to waiters."""
        self.limits[index].release(answered)
        self.wake()

    def wake(self) -> None:
        """Serve waiters while some endpoint can start (after a release, a limit change or a cooldown)."""
        now = self._now()
        while self._waiters:
            fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            got = self._pick(now)
            if got is None:
                break
            self._waiters.popleft()
            fut.set_result(got)
        self._arm_timer()

    def _arm_timer(self) -> None:
        if not self._waiters or self._timer is not None:
            return
        now = self._now()
        ends = [lim.cooldown_until for lim in self.limits if lim.cooldown_until > now and lim.has_room()]
        if ends:
            self._timer = asyncio.get_running_loop().call_later(min(ends) - now + 0.001, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.wake()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
