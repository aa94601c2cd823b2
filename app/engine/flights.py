"""The samples in flight: one task each, from its first request to its settled outcome.

`Flights.start(flight)` runs one sample's task: `attempt.request_sample` (requests under the retry policy, the
ids reconstructed in the `ReconstructionPool`), then `Settler.settle` (the one place a sample ends in the store), then
the
forecast told how it ended; for a conversation's turn with turns after it, what its end made of them
(`WorkSource.after_turn`: the next turn ready, or the conversation ended) moves the counts and the forecast, and a
ready turn is leased at once (`on_ready`). The task gives back its slot once the outcome is stored (before a
conversation's next turn is read), and whatever happens; the limiter is told when the answer arrived
(`EndpointSlots.answered`), since a slot held while the result is stored is no longer at the provider. A
run-stopping error (a key refused, credits gone) pauses the run before any await, so the scheduler starts nothing
more; the first one tells the operator. `cancel` ends flights early (pause-now, close) and returns their leases;
`per_endpoint` counts them as
the snapshot shows them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from app.engine import interventions
from app.engine.attempt import Flight, request_sample
from app.engine.fidelity.verify import Reconstructed, ask_twin
from app.engine.settle import Settler
from app.engine.wiring import Capacity, Checking, Money, Sending, Signals, StoreSide
from app.engine.work.leases import TurnFollow
from app.providers.exceptions import RetryableError
from app.records import Completion
from app.store.run_store import StoreWriteError

# (reason) -> the run paused through the control path (`Run.pause`)
Pause = Callable[[str], Awaitable[None]]


class Flights:
    """The tasks of the samples in flight and what each one holds (its Flight)."""

    def __init__(
        self,
        *,
        store: StoreSide,
        capacity: Capacity,
        money: Money,
        signals: Signals,
        sending: Sending,
        checking: Checking,
        settler: Settler,
        pause: Pause,
    ) -> None:
        self._endpoints = capacity.endpoints
        self._slots = capacity.slots
        self._policy = sending.policy
        self._model = sending.model
        self._pool = checking.pool  # None: the text is stored as is (no reconstructor)
        self._think_ids: tuple[int | None, int | None] | None = None  # the profile's think tags' ids, once known
        self._guard = sending.guard  # endpoint health: connection failures and answers
        self._verifier = checking.verifier
        self._settler = settler
        self._forecast = money.forecast
        self._ledger = money.ledger
        self._source = store.source
        self._state = signals.state
        self._events = signals.events
        self._wake = signals.wake  # the scheduler's: set when the last flight ends
        self._pause = pause
        self._tasks: dict[asyncio.Task[None], Flight] = {}
        self.settled = asyncio.Event()  # set whenever a flight ends (the budget waits on it)
        # called when a settled turn made the next turn of its conversation ready (the scheduler's work_returned)
        self.on_ready: Callable[[], None] | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, flight: Flight) -> None:
        """Run `flight` in its own task (its slot and budget reservation are already taken)."""
        task = asyncio.create_task(self._fly(flight), name=f"eaglewatch-sample-{flight.sample.pk}")
        self._tasks[task] = flight

    def pks(self) -> list[int]:
        """The samples in flight."""
        return [f.sample.pk for f in self._tasks.values()]

    def per_endpoint(self) -> tuple[list[int], list[int]]:
        """Per endpoint: requests on the wire (a slot held, no response yet) and samples waiting (to retry,
        or with a response being reconstructed and stored), so the tile and the endpoint rows count the same."""
        wire = [0] * len(self._endpoints)
        waiting = [0] * len(self._endpoints)
        for f in self._tasks.values():
            if f.index is not None and not f.settling:
                wire[f.index] += 1
            elif 0 <= f.last < len(waiting):
                waiting[f.last] += 1
        return wire, waiting

    async def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every flight to end; False when some are still going."""
        if not self._tasks:
            return True
        _, late = await asyncio.wait(list(self._tasks), timeout=timeout)
        return not late

    async def cancel(self, reason: str, *, settling: bool = False) -> None:
        """Cancel the requests in flight (with settling=True also results not yet stored) and return their leases."""
        chosen = [(t, f) for t, f in self._tasks.items() if settling or not f.settling]
        if not chosen:
            return
        for t, _ in chosen:
            t.cancel()
        await asyncio.gather(*(t for t, _ in chosen), return_exceptions=True)
        pks = [f.sample.pk for _, f in chosen]
        try:
            await self._source.release(pks)
        except StoreWriteError:
            pass  # they stay leased under this host: the next start returns them
        self._ledger.counts.released(len(pks))
        await self._events.add(
            "warning",
            "run",
            f"cancelled {len(pks)} in-flight requests ({reason}); their samples return to pending. "
            "Providers may still bill for requests they had started.",
        )

    # ---- one flight ------------------------------------------------------------------------------

    async def _fly(self, f: Flight) -> None:
        """A request task: whatever happens ends in a settled Outcome (or a cancellation that returns the lease)."""
        try:
            outcome = await request_sample(
                f,
                endpoints=self._endpoints,
                slots=self._slots,
                policy=self._policy,
                model=self._model,
                reconstruct=self._reconstruct,
                on_retry=self._on_retry,
                request_extra=lambda index: self._verifier.request_extra(index, f.sample),
                on_first_token=self._forecast.first_token,
                on_unreachable=self._guard.unreachable,
                on_answered=self._guard.answered,
            )
            # before any await: the scheduler must not start another request after a run-stopping error
            first_stop = outcome.kind == "stopping" and self._state.stop_for_error(
                f"{outcome.error_class}: {outcome.message}"
            )
            await self._settler.settle(f, outcome)
            if f.index is not None:  # stored: the slot takes the next request while a conversation's next turn
                self._slots.release(f.index, answered=f.settling)  # is read below
                f.index = None
            self._forecast.ended(f, outcome, self._ledger.pricing)
            if f.sample.conversation_id is not None and outcome.kind in ("done", "failed"):
                await self._followed(f)
            if first_stop:
                await self._events.add(
                    "error",
                    "endpoint",
                    f"{self._endpoints[f.last].name}: {outcome.error} — the "
                    "run is paused so the queue is not burnt; fix the cause (key, credits, "
                    "permissions) and resume",
                )
                await self._pause(self._state.reason or "run-stopping error")
        except asyncio.CancelledError:
            self._ledger.budget.settle(f.reserved_usd, 0.0)
            self._forecast.requeued(f)
            raise
        except Exception as exc:  # settle records every outcome (or returns the lease); what failed came after it
            await self._events.add(
                "error",
                "sample",
                f"sample {f.sample.sample_id!r} (pk {f.sample.pk}): the engine "
                f"failed after settling it ({type(exc).__name__}: {exc}); the run goes on",
            )
        finally:
            if f.index is not None:
                self._slots.release(f.index, answered=f.settling)
                f.index = None
            task = asyncio.current_task()
            if task is not None:
                self._tasks.pop(task, None)
            self.settled.set()
            if not self._tasks:
                self._wake.set()
                self._state.check_idle(0)

    async def _followed(self, f: Flight) -> None:
        """A conversation's turn ended: move the counts and the forecast by what its end made of the turns after
        it (stored in the same transaction), and have the scheduler lease a ready turn at once."""
        if not f.sample.turns_after:  # its conversation's last turn
            self._forecast.followed(f.sample, 0, 0)
            return
        try:
            follow = await self._source.after_turn(f.sample)
        except Exception:  # a read the database refused: the counts are read afresh when the queue runs dry
            follow = TurnFollow(ready=1)
        self._ledger.counts.followed(follow.ready, follow.skipped)
        self._forecast.followed(f.sample, follow.ready, follow.skipped)
        if follow.ready and self.on_ready is not None:
            self.on_ready()

    async def _reconstruct(self, completion: Completion, f: Flight) -> Reconstructed:
        """The ids of one answer, reconstructed in the pool; a probe also asks the trusted twin (when the run has one
        and
        the answer carries no true ids) and teaches the verifier what the endpoint did to the text."""
        if self._pool is None:
            return Reconstructed(None, None)
        endpoint = self._endpoints[f.last].name
        twin = None
        if self._verifier.wants_twin(f.last, f.probe, completion):
            twin = await ask_twin(self._verifier, self._endpoints, f.sample, self._model)
        reconstructed = await self._pool.reconstruct(completion, f.sample, endpoint, f.probe, twin)
        reconstructed = self._with_interventions(completion, reconstructed, self._endpoints[f.last].config.extra)
        self._verifier.learn(endpoint, completion, reconstructed, f.probe)
        for note in self._verifier.pending_notes():
            await self._events.add("warning", "fidelity", note)
        return reconstructed

    def _with_interventions(
        self, completion: Completion, reconstructed: Reconstructed, fields: dict | None
    ) -> Reconstructed:
        """`reconstructed` with the answer's ledger of server interventions, each one flagged on its reconstruction
        (`intervened:<kind>`: the export leaves the sample out by default)."""
        assert self._pool is not None  # called after a reconstruction
        if self._think_ids is None:
            r = self._pool.endpoint_reconstructor
            self._think_ids = (
                r.tokenizer.special_id(r.profile.think_open),
                r.tokenizer.special_id(r.profile.think_close),
            )
        rec, check = reconstructed.reconstruction, reconstructed.prompt_check
        found = interventions.ledger(
            completion.interventions,
            interventions.measured(
                completion,
                fields,
                output_ids=rec.output_ids if rec is not None else None,
                think_open=self._think_ids[0],
                think_close=self._think_ids[1],
                prompt_check=check,
            ),
        )
        if not found:
            return reconstructed
        if rec is not None:
            flags = tuple(dict.fromkeys(interventions.flag_of(i.kind) for i in found))
            rec = dataclasses.replace(rec, flags=tuple(rec.flags) + flags)
        return dataclasses.replace(reconstructed, reconstruction=rec, interventions=found)

    async def _on_retry(self, f: Flight, exc: RetryableError) -> None:
        self._forecast.resent(f)  # its output counts again from nothing
        await self._settler.on_retry(f, exc)
