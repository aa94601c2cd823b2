"""Settling a sample's Outcome: the one place its requests end in the store, the counts, the budget and the metrics.

`Settler.settle` stores a paid response whatever else went wrong (done, or failed with the reason when its
ids could not be reconstructed), a failure with its error named, or a stopped sample's lease given back; every
write goes through the StoreGate, so a database that refuses writes for a while delays the result but never
drops it. `Settler.on_retry` books a failed request that will be retried. The slot is given back by the
request task once this returns.

A sample never stays leased: when its outcome cannot be recorded (a value the row codecs refuse, a write that
fails for a lasting reason), `settle` records it as a failed attempt with that error named, back to pending
while the sample has attempts left, else failed, and the lease is released in the same turn; when even that
cannot be written it returns the lease (`RunStore.release`) and tells the operator. Every charge is
`app.engine.money.budget.charge`: max(reported, list price), never NaN, infinite or negative.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import orjson

from app.config import RunConfig
from app.engine.attempt import Flight, Outcome
from app.engine.capacity.endpoints import Endpoint
from app.engine.capacity.limiter import LimitChange, Ticket, limiter_latency
from app.engine.capacity.slots import EndpointSlots
from app.engine.fidelity.quality import QualityDecision
from app.engine.fidelity.verify import Verifier
from app.engine.health.events import EventLog
from app.engine.health.writes import StoreGate
from app.engine.money.budget import Charge, CostNotes, charge, estimate_prompt_tokens
from app.engine.money.ledger import Ledger
from app.providers.exceptions import ProviderError, RetryableError
from app.providers.wire import TEXT_REPLACED
from app.records import Completion, ErrorClass, Usage
from app.store.run_store import RunStore
from app.store.store_records import LeasedSample, ResultRecord
from app.token_bucket import TokenBucket
from app.tokens.flags import REPLACEMENT_CHAR

OVERLOAD_STATUSES = (429, 503, 529)
# an overload answered under another status (a 529 or 503 is caught by its status): the rate-limit class
OVERLOAD_CLASSES: frozenset[str] = frozenset({ErrorClass.RATE_LIMITED})


def capped_raw(completion: Completion, max_bytes: int) -> Completion:
    """The completion with its raw body replaced by a note of its size when the body is over `max_bytes`."""
    if completion.raw is None:
        return completion
    try:
        size = len(orjson.dumps(completion.raw))
    except (TypeError, ValueError):
        return completion
    if size <= max_bytes:
        return completion
    note = {"omitted": f"raw body of {size} bytes is over run.keep_raw_max_bytes ({max_bytes})", "bytes": size}
    return dataclasses.replace(completion, raw=note)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settler:
    """What settling touches, every part named; built by the Run once its endpoints, slots and buckets exist.
    The `ledger` holds the budget, the prices (config, variant rules, or GET /models at start), the sample counts,
    the run's metrics and its verdict and strategy tallies."""

    config: RunConfig
    store: RunStore
    run_id: int
    gate: StoreGate
    events: EventLog
    ledger: Ledger
    endpoints: list[Endpoint]
    slots: EndpointSlots
    # live fidelity (app.engine.fidelity.verify): tallies measured results; `on_decision` acts on the gate's decisions
    verifier: Verifier
    on_decision: Callable[[QualityDecision], None]
    attempts: int  # requests a sample may cost (the run's retry policy): an unrecordable outcome's last one fails it
    tok_bucket: TokenBucket | None = None  # tokens per minute: corrected by what a request really used
    tokenizer_fingerprint: str = ""
    cost_notes: CostNotes = dataclasses.field(default_factory=CostNotes)  # costs a provider reported wrongly

    async def settle(self, f: Flight, o: Outcome) -> None:
        """Record an Outcome (see the module doc); returns once the store has it. Never leaves the sample leased:
        an outcome that cannot be recorded ends as a failed attempt naming why (`_unrecorded`)."""
        if not f.settling and f.index is not None:
            self.slots.answered(f.index)  # its slot is held until stored, no longer on the wire
        f.settling = True
        s, ep = f.sample, self.endpoints[f.last]
        try:
            if o.completion is not None:
                await self._paid(f, o, ep)
            elif o.kind == "failed":
                await self._failed(f, o, ep)
            else:  # stopping or released: the lease goes back, the attempt is logged with its cost
                await self._released(f, o, ep)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._unrecorded(f, o, ep, exc)
            return
        if o.unexpected:
            await self.events.add(
                "error",
                "sample",
                f"sample {s.sample_id!r} ({s.dataset}) failed: {o.error_class}: {o.message}"[:1000]
                + " — the run goes on; fix the input and reprocess or "
                "re-ingest it",
            )

    async def _failed(self, f: Flight, o: Outcome, ep: Endpoint) -> None:
        s = f.sample
        if isinstance(o.error, RetryableError):
            self.note_overload(ep, o.error, f.ticket)
        if o.attempt:
            self.note_error(ep, o.error_class or ErrorClass.ERROR, final=True, retried=False)
        cost = self._bill(f, o.error.usage if o.error is not None else None, o.cost_usd, ep)
        await self.gate.commit(
            lambda: self.store.record_failure(
                self.run_id,
                s.pk,
                o.error_class or ErrorClass.ERROR,
                o.message or "",
                final=True,
                cost_usd=cost,
                endpoint=ep.name if o.attempt else None,
                attempt=o.attempt or None,
            )
        )
        self.ledger.counts.ended("failed")

    async def _released(self, f: Flight, o: Outcome, ep: Endpoint) -> None:
        s = f.sample
        if f.index is not None:
            self.slots.release(f.index, answered=f.settling)
            f.index = None
        self.note_error(ep, o.error_class or ErrorClass.ERROR, final=False, retried=False)
        cost = self._bill(f, o.error.usage if o.error is not None else None, o.cost_usd, ep)
        if isinstance(o.error, ProviderError) and o.attempt:
            await self.gate.commit(
                lambda: self.store.log_attempt(
                    self.run_id, s.pk, o.attempt, ep.name, cost, o.error_class or ErrorClass.ERROR, o.message or ""
                )
            )
        await self.gate.commit(lambda: self.store.release(self.run_id, [s.pk]))
        self.ledger.counts.released()

    async def _unrecorded(self, f: Flight, o: Outcome, ep: Endpoint, exc: Exception) -> None:
        """The outcome could not be recorded: store a failed attempt naming why (back to pending while the sample
        has attempts left, else failed), with what was charged, in one write; failing that, return the lease."""
        s = f.sample
        if f.index is not None:
            self.slots.release(f.index, answered=f.settling)
            f.index = None
        if f.reserved_usd:  # failed before its charge replaced the reservation: free it (nothing was charged)
            self.ledger.budget.settle(f.reserved_usd, 0.0)
            f.reserved_usd = 0.0
        final = f.tries - f.sample.tries_forgiven >= self.attempts
        message = f"its outcome ({o.kind}) could not be recorded: {type(exc).__name__}: {exc}"[:1000]
        cost = f.unrecorded_usd
        try:
            await self.gate.commit(
                lambda: self.store.record_failure(
                    self.run_id,
                    s.pk,
                    "unrecordable",
                    message,
                    final=final,
                    cost_usd=cost,
                    endpoint=ep.name if o.attempt else None,
                    attempt=o.attempt or None,
                )
            )
        except asyncio.CancelledError:
            raise
        except Exception as second:
            try:
                await self.gate.commit(lambda: self.store.release(self.run_id, [s.pk]))
                self.ledger.counts.released()
                fate = "its lease was returned, so it is sent again later"
            except asyncio.CancelledError:
                raise
            except Exception:
                fate = "the database refused to return its lease too; the next start returns it"
            await self.events.add(
                "error",
                "sample",
                f"sample {s.sample_id!r}: {message}; recording that failed as "
                f"well ({type(second).__name__}: {second}); {fate}",
            )
            return
        if final:
            self.ledger.counts.ended("failed")
        else:
            self.ledger.counts.released()
        await self.events.add(
            "error",
            "sample",
            f"sample {s.sample_id!r} ({s.dataset}): {message}; "
            + ("it is failed (no attempts left)" if final else "it goes back to pending for another attempt"),
        )

    def _bill(self, f: Flight, usage: Usage | None, reported_usd: float, ep: Endpoint) -> float:
        """Charge the flight's last request (budget.charge) and return the amount to record with it."""
        c = charge(usage, self.ledger.pricing, reported_usd if reported_usd else None)
        self._cost_problem(c, f, ep)
        self._charge(f, c.usd)
        f.unrecorded_usd = c.usd
        return c.usd

    def _cost_problem(self, c: Charge, f: Flight, ep: Endpoint) -> None:
        if c.problem is None:
            return
        text = self.cost_notes.note(c, f.sample.sample_id, ep.name)
        if text is not None:
            self.events.note("warning", "budget", text)
            asyncio.get_running_loop().create_task(self.events.flush())

    async def _paid(self, f: Flight, o: Outcome, ep: Endpoint) -> None:
        s, completion = f.sample, o.completion
        assert completion is not None  # a paid outcome carries its completion
        cost = self._bill(f, completion.usage, 0.0, ep)
        keep = self.config.run.keep_raw
        if keep:
            completion = capped_raw(completion, self.config.run.keep_raw_max_bytes)
        rec = o.reconstruction
        if rec is not None and completion.wire_flags:
            # what the boundary did to the text travels with the ids: replaced text is suspect (the export drops it)
            extra = tuple(completion.wire_flags) + (
                (REPLACEMENT_CHAR,)
                if TEXT_REPLACED in completion.wire_flags and REPLACEMENT_CHAR not in rec.flags
                else ()
            )
            rec = dataclasses.replace(rec, flags=tuple(rec.flags) + extra)
        state = "done" if o.kind == "done" else "failed"
        # shielded: a cancellation must not abandon a result that is already being committed
        result = ResultRecord(
            self.run_id,
            s.pk,
            o.attempt,
            ep.name,
            completion,
            cost,
            rec,
            o.verdict,
            s.reference_ids,
            state,
            profile=self.config.model.profile,
            tokenizer=self.tokenizer_fingerprint,
            keep_raw=keep,
            error_class=o.error_class,
            error=o.message,
            prompt_check=o.prompt_check.status if o.prompt_check is not None else None,
            prompt_first_diff=o.prompt_check.first_diff if o.prompt_check is not None else None,
        )
        await self.gate.commit(lambda: asyncio.shield(self.store.record_result(result)))
        self.ledger.counts.ended(state)
        self._verify(f, o, ep)
        self._account(ep, completion, cost, s, f)
        if o.verdict is not None:
            self.ledger.verdicts[o.verdict.category] += 1
        if o.reconstruction is not None:
            self.ledger.strategies[o.reconstruction.strategy] += 1

    def _verify(self, f: Flight, o: Outcome, ep: Endpoint) -> None:
        """Count a stored result's measurement and prompt check; hand the gate's decisions to the Run at once
        (before anything awaits, so the scheduler leases nothing more after a pause decision)."""
        assert o.completion is not None  # only stored results are verified
        seen = self.verifier.observe(
            ep.name, o.completion.provider, f.sample.pk, f.sample.sample_id, o.measured, o.prompt_check
        )
        if seen.prompt_event is not None:
            self.events.note("warning", "prompt", seen.prompt_event)
            asyncio.get_running_loop().create_task(self.events.flush())
        for d in seen.decisions:
            self.on_decision(d)

    async def on_retry(self, f: Flight, exc: RetryableError) -> None:
        """A failed request that will be retried: count it, cut the limit on overload, give back the slot while
        waiting, and log the attempt with what it was billed."""
        ep = self.endpoints[f.last]
        self.note_overload(ep, exc, f.ticket)  # before the release wakes a waiter
        if f.index is not None:
            self.slots.release(f.index)
            f.index = None
        self.note_error(ep, exc.error_class, final=False, retried=True)
        c = charge(exc.usage, self.ledger.pricing, exc.cost_usd or None)
        self._cost_problem(c, f, ep)
        if c.usd:
            self.ledger.budget.settle(0.0, c.usd)
            f.billed_usd += c.usd
        await self.gate.commit(
            lambda: self.store.log_attempt(self.run_id, f.sample.pk, f.tries, ep.name, c.usd, exc.error_class, str(exc))
        )

    def _charge(self, f: Flight, cost: float) -> None:
        """Replace the flight's reservation with its last request's cost; report spending beyond the reservation."""
        budget = self.ledger.budget
        over = f.billed_usd + cost - f.reserved_usd
        budget.settle(f.reserved_usd, cost)
        f.reserved_usd = 0.0
        if over > 1e-12 and budget.budget_usd is not None:
            first = budget.overshoot_usd == 0.0
            budget.overshoot_usd += over
            if first:
                self.events.note(
                    "warning",
                    "budget",
                    f"sample {f.sample.sample_id!r} cost ${over:.6f} more than its reserved worst "
                    f"case: [pricing] for {self.config.model.name!r} is below what the provider bills (or retries "
                    "were billed), so the budget can be passed by such overshoots",
                )
                asyncio.get_running_loop().create_task(self.events.flush())

    def _account(self, ep: Endpoint, completion: Completion, cost: float, s: LeasedSample, f: Flight) -> None:
        if self.tok_bucket is not None:
            used = completion.usage.prompt_tokens + completion.usage.completion_tokens
            est = estimate_prompt_tokens(s.messages, s.tools) + self.config.generation.max_tokens
            self.tok_bucket.adjust(used - est, asyncio.get_running_loop().time())
        saturated = self.slots.waiting > 0 or ep.limit.on_wire >= ep.limit.limit
        # the limiter's signals: the request's ticket (its level) and its latency, TTFT when streaming (a
        # queueing server's first byte waits for a batch slot), on the loop's clock, as the slots take it
        change = ep.limit.on_success(
            saturated, ticket=f.ticket, latency_s=limiter_latency(completion), now=asyncio.get_running_loop().time()
        )
        if change is not None:
            self.slots.wake()
            if change.new < change.old:
                self._limit_event(ep, change)
        now = time.monotonic()
        for m in (ep.metrics, self.ledger.total_metrics):
            m.record_completion(
                now,
                completion.usage.completion_tokens,
                completion.total_s,
                completion.ttft_s,
                cost,
                completion.truncated,
            )

    def note_overload(self, ep: Endpoint, exc: RetryableError, ticket: Ticket | None = None) -> None:
        """Tell the endpoint's limiter of a 429/503/529 with the request's ticket and Retry-After (it cuts, or
        answers with the level, or forgives noise) and tell the operator of a cut."""
        if exc.status in OVERLOAD_STATUSES or exc.error_class in OVERLOAD_CLASSES:
            change = ep.limit.on_overload(asyncio.get_running_loop().time(), exc.retry_after_s, ticket=ticket)
            if change is not None:
                self._limit_event(ep, change)

    def _limit_event(self, ep: Endpoint, change: LimitChange) -> None:
        msg = f"{ep.name}: concurrency reduced from {change.old} to {change.new} ({change.reason}"
        msg += f"; retrying in {change.cooldown_s:g}s)" if change.cooldown_s else ")"
        asyncio.get_running_loop().create_task(self.events.add("warning", "concurrency", msg))

    def note_error(self, ep: Endpoint, error_class: str, *, final: bool, retried: bool) -> None:
        """Count an error in the endpoint's and the run's metrics."""
        for m in (ep.metrics, self.ledger.total_metrics):
            m.record_error(error_class, final=final, retried=retried)
