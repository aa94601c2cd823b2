"""The scheduler: one task that takes work from a `WorkSource` and starts flights while the run may send.

It keeps a queue of leased items and leases the next batch in the background while the queue is no longer than the
run's in-flight limit (so the queue never runs dry; a source that had nothing is asked again after 0.5 s or when
work comes back). For the item at the head of the queue, in order: the run must be running and the store writing;
the budget must allow the request's worst case (else it waits for flights to settle, or pauses the run with an
event when none is left to settle); the requests/min and tokens/min buckets must have room; some endpoint must
have a slot (`EndpointSlots.acquire_ticket`, adaptive limit per endpoint, picked by weight). Then the budget
reservation is taken and the flight started (`Flights.start`). When the queue is empty, nothing is in flight and the
source has nothing left pending or leased, the run is done.

The order in which items start is the source's (`WorkSource.lease`): the scheduler keeps it.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from app.config import RunConfig
from app.engine.attempt import Flight
from app.engine.money.budget import estimate_prompt_tokens
from app.engine.wiring import Capacity, Money, Signals, StoreSide
from app.store.run_store import StoreWriteError
from app.store.store_records import LeasedSample

EMPTY_RETRY_S = 0.5  # a source that leased nothing is asked again after this long (or when work comes back)


class FlightStarter(Protocol):
    """What the scheduler needs of the flights (`app.engine.flights.Flights`): start one, count them, and an
    event set whenever one ends (set the scheduler's wake when the last one ends)."""

    settled: asyncio.Event

    def start(self, flight: Flight) -> None: ...

    def __len__(self) -> int: ...


class Scheduler:
    """The lease queue, the background lease, and the loop that starts flights (module doc)."""

    def __init__(
        self,
        *,
        config: RunConfig,
        store: StoreSide,
        flights: FlightStarter,
        capacity: Capacity,
        money: Money,
        signals: Signals,
        pause: Callable[[str], Awaitable[None]],
        lease_batch: int | None = None,
    ) -> None:
        self._model = config.model.name
        self._max_tokens = config.generation.max_tokens
        self._source = store.source
        self._flights = flights
        self._slots = capacity.slots
        self._ledger = money.ledger
        self._forecast = money.forecast
        self._state = signals.state
        self._gate = store.gate
        self._events = signals.events
        self._wake = signals.wake  # set by whoever may have given the scheduler something to do
        self._pause = pause  # (reason) -> the run paused through the control path
        self._requests = capacity.requests  # requests per minute (None: no limit)
        self._tokens = capacity.tokens  # prompt + max_tokens per minute (None: no limit)
        self._lease_batch = lease_batch  # None: twice the in-flight limit, 16 to 512
        self._queue: deque[LeasedSample] = deque()
        self._prefetch: asyncio.Future[list[LeasedSample]] | None = None
        self._empty_at = -1e9  # when the source last leased nothing (loop clock)
        # bumped when work becomes ready (a turn's parent stored, leases returned): a lease that started before
        # and came back empty does not hold the next one back (a chain of turns would idle EMPTY_RETRY_S a turn)
        self._ready_seq = 0
        self._lease_seq = 0

    def queued_pks(self) -> list[int]:
        """The items leased and not yet started."""
        return [s.pk for s in self._queue]

    def work_returned(self) -> None:
        """Work became ready (expired leases returned, a conversation's next turn made pending by its parent's
        result): lease at once, not after the empty-source pause."""
        self._ready_seq += 1
        self._empty_at = -1e9
        self._wake.set()

    def _total_limit(self) -> int:
        return sum(lim.limit for lim in self._slots.limits)

    async def run(self) -> None:
        """Schedule until cancelled; an error of its own pauses the run with an operator event (never a silent
        stall) and lets `Run.wait` return."""
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._state.hold("paused", f"engine error: {exc}"[:200])
            try:
                await self._events.add(
                    "error",
                    "run",
                    f"the scheduler stopped: {exc!r}; the run can be resumed by "
                    "running it again once the cause is fixed",
                )
                await self._state.set("paused", self._state.reason)
            finally:
                self._state.idle.set()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._state.running or self._gate.blocked is not None:
                # paused, or the store cannot write: start nothing (results already held keep retrying)
                self._state.check_idle(len(self._flights))
                await self._nap(EMPTY_RETRY_S)
                continue
            self._absorb_prefetch()
            limit = self._total_limit()
            if len(self._queue) <= limit and self._prefetch is None and loop.time() - self._empty_at > EMPTY_RETRY_S:
                lease = functools.partial(self._source.lease, self._lease_batch or max(16, min(512, 2 * limit)))
                self._lease_seq = self._ready_seq
                self._prefetch = asyncio.ensure_future(self._gate.commit(lease))
            if not self._queue:
                if self._prefetch is not None:
                    await asyncio.wait({self._prefetch})
                    self._absorb_prefetch()
                if not self._queue:
                    if not self._flights and self._prefetch is None:
                        await self._finish_if_ended()
                        if not self._state.running:
                            continue
                    await self._nap(EMPTY_RETRY_S)
                    continue
            sample = self._queue[0]
            prompt_est = estimate_prompt_tokens(sample.messages, sample.tools)
            budget = self._ledger.budget
            worst = budget.worst_case(prompt_est)
            if not budget.allows(worst):
                if self._flights:
                    self._flights.settled.clear()
                    await self._flights.settled.wait()
                    continue
                await self._events.add("warning", "budget", self._ledger.stop_message(worst, self._model))
                await self._pause("budget reached")
                continue
            if not await self._wait_buckets(loop, prompt_est):
                continue
            index, ticket = await self._slots.acquire_ticket()
            # A pause (or pause-now) while we waited for a slot may have emptied or refilled the queue.
            if not self._state.running or not self._queue or self._queue[0] is not sample:
                self._slots.release(index)
                continue
            self._queue.popleft()
            budget.reserve(worst)
            self._forecast.started(sample, prompt_est)
            self._flights.start(Flight(sample, worst, index, ticket=ticket))

    async def _nap(self, timeout: float) -> None:
        """Wait for a wake-up or `timeout` (asyncio.wait: unlike 3.11's wait_for it never swallows a cancel)."""
        self._wake.clear()
        waiter = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()

    def _absorb_prefetch(self) -> None:
        """Move a finished background lease into the queue (leases are fetched ahead so the queue never runs dry)."""
        fut = self._prefetch
        if fut is None or not fut.done():
            return
        self._prefetch = None
        leased = fut.result()  # a lasting store error ends the scheduler with an operator event
        if not leased:
            if self._lease_seq == self._ready_seq:  # nothing became ready while it leased
                self._empty_at = asyncio.get_running_loop().time()
            return
        self._queue.extend(leased)
        self._ledger.counts.leased(len(leased))

    async def _wait_buckets(self, loop: asyncio.AbstractEventLoop, prompt_est: int) -> bool:
        """Take the request from the rate buckets, waiting while they are empty; False when the run stopped
        running meanwhile."""
        for bucket, amount in ((self._requests, 1), (self._tokens, prompt_est + self._max_tokens)):
            if bucket is None:
                continue
            while True:
                wait = bucket.try_take(amount, loop.time())
                if wait == 0.0:
                    break
                await asyncio.sleep(min(wait, 1.0))
                if not self._state.running:
                    return False
        return True

    async def _finish_if_ended(self) -> None:
        """Read the source's counts; when nothing is pending or leased, the run is done."""
        counts = await self._source.counts()
        self._ledger.counts.reset(counts)
        if counts.get("pending", 0) == 0 and counts.get("leased", 0) == 0:
            if counts.get("waiting", 0):  # cannot happen: a turn is made ready or skipped with its parent's end
                await self._events.add(
                    "warning",
                    "run",
                    f"{counts['waiting']} conversation turns wait on parents "
                    "that ended without readying or skipping them; they are left waiting",
                )
            await self._state.end()
            done, failed = counts.get("done", 0), counts.get("failed", 0)
            await self._events.add("info", "run", f"run finished: {done} done, {failed} failed")
            self._state.finish()

    async def release_queue(self) -> None:
        """Give back the items leased and not started (pause, close); a store that refuses keeps them queued
        (resume uses them, a restart returns them)."""
        if self._prefetch is not None:
            await asyncio.wait({self._prefetch})
            try:
                self._absorb_prefetch()
            except Exception:
                pass
        if not self._queue:
            return
        pks = [s.pk for s in self._queue]
        try:
            await self._source.release(pks)
        except StoreWriteError:
            return  # kept queued: resume uses them, a restart returns them
        self._queue.clear()
        self._ledger.counts.released(len(pks))
