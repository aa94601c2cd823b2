"""The operator's hand on a running engine: the engine's implementation of `app.engine.control.RunControl`.

`Steering` pauses (leasing nothing new, giving back the queue; pause-now also cancels the requests in flight),
resumes and sets the concurrency limit, and carries out the commands attached viewers write to the `commands`
table (`poll_commands`, about once a second). The quality gate's decisions arrive here too (`on_quality`): a pause
decision stops the scheduler at once and pauses with the gate's message; a route-around is told to the operator.
`Run` delegates its control methods to it.
"""

from __future__ import annotations

import asyncio

from app.engine.capacity.endpoints import set_total_limit
from app.engine.fidelity.quality import QualityDecision
from app.engine.flights import Flights
from app.engine.health.endpoint_health import ENDPOINTS_DOWN
from app.engine.scheduler import Scheduler
from app.engine.wiring import Capacity, Money, Signals, StoreSide
from app.engine.work.counts import SampleCounts
from app.store.run_store import StoreWriteError

COMMAND_POLL_S = 1.0
# The reason a pause sent through the commands table (an attached viewer, `watch`/`serve --control`) carries:
# a headless engine stays alive through such a pause, waiting for that viewer's resume.
VIEWER_PAUSE = "operator (attached viewer)"


class Steering:
    """Pause, resume, the concurrency limit and the commands table of one started run."""

    def __init__(
        self,
        *,
        store: StoreSide,
        capacity: Capacity,
        money: Money,
        signals: Signals,
        scheduler: Scheduler,
        flights: Flights,
        attempts: int,
    ) -> None:
        self._store = store.store
        self._run_id = store.run_id
        self._state = signals.state
        self._scheduler = scheduler
        self._flights = flights
        self._endpoints = capacity.endpoints
        self._slots = capacity.slots
        self._gate = store.gate
        self._events = signals.events
        self._wake = signals.wake  # the scheduler's
        self._counts: SampleCounts = money.ledger.counts
        self._attempts = attempts  # generation.attempts: the fresh allowance retry_failed gives
        self._forecast = money.forecast  # told of samples put back to pending (the ETA counts them again)

    async def pause(self, now: bool = False, reason: str = "operator") -> None:
        """Lease nothing new; with now=True also cancel in-flight requests (providers may still bill)."""
        if self._state.current == "done":
            return
        await self._state.set("paused", reason)
        await self._events.add("info", "run", f"run paused ({reason})")
        await self._scheduler.release_queue()
        if now:
            await self._flights.cancel(reason=reason)
        self._wake.set()
        self._state.check_idle(len(self._flights))

    async def resume(self) -> None:
        """Continue leasing after a pause (operator, budget, run-stopping error or a full disk)."""
        if self._state.current != "paused":
            return
        self._state.stopping_error = False
        # not idle from the moment the state says running: a headless engine that sees "running" waits on
        # `wait()` again, which must not return at once (the engine closed, its run left "engine stopped")
        self._state.idle.clear()
        await self._state.set("running", None)
        await self._events.add("info", "run", "run resumed")
        self._wake.set()

    async def set_concurrency(self, limit: int) -> None:
        """Set the total in-flight limit, spread over the endpoints by weight and clamped to min/max."""
        total = set_total_limit(self._endpoints, limit)
        await self._events.add("info", "concurrency", f"concurrency set to {total} by the operator")
        self._slots.wake()

    async def retry_failed(self) -> int:
        """Put the failed samples back to pending with a fresh allowance of attempts (`RunStore.retry_failed`, one
        transaction) and schedule them, also after the run had ended; returns how many."""
        n = await self._gate.commit(lambda: self._store.retry_failed(self._run_id))
        self._counts.reset(await self._store.counts(self._run_id))
        if n:
            await self._forecast.recount_pending(self._store, self._run_id)
        await self._events.add(
            "info",
            "run",
            f"{n} failed samples put back to pending, each with a fresh allowance of "
            f"{self._attempts} attempts (generation.attempts)",
        )
        if n and self._state.current == "done":
            self._state.ended_m = None
            self._state.finished.clear()
            self._state.idle.clear()
            await self._state.set("running", None)
        self._scheduler.work_returned()
        return n

    async def apply_command(self, verb: str, args: dict) -> None:
        """Carry out one control command from the `commands` table (pause, resume, set_concurrency,
        retry_failed)."""
        if verb == "retry_failed":
            await self.retry_failed()
            return
        if verb == "pause":
            await self.pause(now=bool(args.get("now", False)), reason=VIEWER_PAUSE)
        elif verb == "resume":
            await self.resume()
        elif verb == "set_concurrency":
            try:
                limit = int(args.get("limit", 0))
            except (TypeError, ValueError):
                limit = 0
            if limit < 1:
                await self._events.add(
                    "warning", "run", f"set_concurrency needs a limit of at least 1, got {args!r}; ignored"
                )
                return
            await self.set_concurrency(limit)
        else:
            await self._events.add("warning", "run", f"unknown operator command {verb!r} ignored")

    async def poll_commands(self) -> None:
        """Carry out the commands attached viewers write, about once a second, until cancelled."""
        while True:
            await asyncio.sleep(COMMAND_POLL_S)
            if self._gate.blocked is not None:
                continue
            try:
                commands = await self._store.take_commands(self._run_id)
            except StoreWriteError:
                continue  # the next poll tries again; a lasting refusal shows in the results' writes
            except Exception as exc:  # a transient database error must not kill the engine
                await self._events.add("warning", "run", f"could not read operator commands: {exc}")
                continue
            for cmd in commands:
                await self.apply_command(cmd.verb, cmd.args or {})

    def on_quality(self, d: QualityDecision) -> None:
        """A quality-gate decision: pause at once (before the scheduler leases more), or note the route-around."""
        loop = asyncio.get_running_loop()
        if d.action == "pause" and self._state.running:
            self._state.hold(
                "paused",
                f"quality gate: {d.endpoint}"
                + (f" / {d.provider}" if d.provider else "")
                + f" corrupt rate {d.rate:.1%}",
            )
            self._state.pause_pending = True
            loop.create_task(self._quality_pause(d))
        elif d.action == "route_around":
            loop.create_task(self._events.add("warning", "quality", d.message))

    async def _quality_pause(self, d: QualityDecision) -> None:
        try:
            await self._events.add("error", "quality", d.message)
            await self.pause(reason=self._state.reason or "quality gate")
        finally:
            self._state.pause_pending = False
            self._state.check_idle(len(self._flights))

    def endpoints_down(self, why: str) -> None:
        """Every endpoint is down (app.engine.health.endpoint_health): pause at once (nothing more is leased) and cancel
        what waits on them; the samples stay pending. The run resumes by itself when a probe gets an answer
        (`endpoint_back`)."""
        if self._state.running:
            self._state.hold("paused", f"{ENDPOINTS_DOWN} ({why})"[:300])
            self._state.pause_pending = True
            asyncio.get_running_loop().create_task(self._endpoints_down_pause(why))

    async def _endpoints_down_pause(self, why: str) -> None:
        try:
            await self._events.add(
                "error",
                "endpoint",
                f"{ENDPOINTS_DOWN} ({why}): the run is paused and its samples "
                "stay pending; it resumes by itself when a probe gets an answer, or run it again "
                "once the endpoint is back (check base_url, the network, or start the server)",
            )
            await self.pause(now=True, reason=self._state.reason or ENDPOINTS_DOWN)
        finally:
            self._state.pause_pending = False
            self._state.check_idle(len(self._flights))

    async def endpoint_back(self, index: int) -> None:
        """An endpoint answered again: resume a run that every endpoint being down had paused."""
        if self._state.current == "paused" and (self._state.reason or "").startswith(ENDPOINTS_DOWN):
            await self.resume()
