"""A Run: lease pending samples, send them to the endpoints, store every result, steer it live.

The Run is the scheduler over small parts: `endpoints` builds the clients (starting simulators, reading
keys), `attempt.request_sample` carries one sample from its first request to an Outcome (done | failed |
released | stopping), `settle.Settler` records that Outcome in one place, `SampleCounts` mirrors the
store's counts, `StoreGate` retries writes the database refuses for a while, `EventLog` keeps the operator's
events, and the store (`RunStore`) holds every statement. One asyncio task schedules: it leases samples in batches, checks pause, budget and the rate
buckets, waits for a slot on some endpoint (adaptive limit per endpoint, picked by weight) and starts one
request task per sample; the slot is held until the result is stored. Three more tasks poll the `commands`
table (attached viewers), keep the leases (extension and expiry) and write the engine's heartbeat with its
live snapshot about once a second (`app.store.heartbeat`: what attached viewers and `status` show, and how
they tell a crashed engine).

Crash safety comes from the store: a sample is `leased` until its result commits, and a SIGKILL loses at
most the requests in flight (finished-but-unstored results hold their slot). Leases carry an owner
(host:pid): a starting engine (holding the lock file next to the database, so no other engine on this host
runs the run) returns this host's leases at once; while it runs it extends its own leases every lease_s/3
and returns any lease past its expiry (an engine elsewhere that stopped) to pending.

Why this module is ~600 lines: what is left is one state machine (run state, lease queue, flights, pause,
the store's health) whose parts read and change the same few fields; split further, each part would take
the Run's internals as arguments.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.config import RunConfig
from app.engine.attempt import Flight, Outcome, request_sample
from app.engine.budget import BudgetGuard, Prices, cost_per_hour, estimate_prompt_tokens
from app.token_bucket import TokenBucket
from app.engine.counts import SampleCounts
from app.engine.eta import Projector
from app.engine.endpoint_health import ENDPOINTS_DOWN, EndpointGuard, HealthBook
from app.engine.endpoints import CompletionClient, Endpoint, Endpoints, close_endpoints, open_endpoints, set_total_limit
from app.engine.events import EngineEvent, EventLog
from app.engine.lock import EngineLock
from app.engine.metrics import EndpointMetrics
from app.engine.quality import QualityDecision
from app.engine.rebuild_pool import (CompletionReconstructor, PassThroughReconstructor, RebuildPool, open_rebuilder,
                                    rebuild)
from app.engine.settle import Settler
from app.engine.slots import EndpointSlots
from app.engine.snapshot import MetricsSnapshot
from app.engine.verify import Rebuilt, Verifier, seed_from_store
from app.engine.writes import StoreGate, disk_full_advice
from app.errors import InputError
from app.engine.snapshot_codec import snapshot_to_json
from app.providers.exceptions import RetryableError
from app.providers.pricing import cost_of, prices_at_start, resolve_pricing
from app.providers.retry import RetryPolicy
from app.records import Completion
from app.store.heartbeat import BEAT_INTERVAL_S, beat_op, stop_op, this_host
from app.store.store_records import LeasedSample
from app.store.run_store import RunStore, StoreWriteError

COMMAND_POLL_S = 1.0
_CHARS_PER_TOKEN = 4  # prompt JSON characters per token, for the ETA's projection (not for the budget)
_PROJECT_EVERY_S = 1.0  # the ETA is projected afresh at most this often (a projection costs 2-20 ms)
CLOSE_GRACE_S = 30.0  # how long close() waits for finished results to be stored before giving them up

__all__ = ["EngineEvent", "EngineLock", "Run", "RunOutcome"]


# The reason a pause sent through the commands table (an attached viewer, `watch`/`serve --control`) carries:
# a headless engine stays alive through such a pause, waiting for that viewer's resume.
VIEWER_PAUSE = "operator (attached viewer)"


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How a run ended in this process: done (every sample ended) or paused (with the reason)."""

    state: str
    reason: str | None
    stopping_error: bool = False


class Run:
    """One run of a config over a store; the engine's implementation of `RunControl`."""

    def __init__(
        self,
        config: RunConfig,
        store: RunStore,
        *,
        reconstructor: CompletionReconstructor | None = None,
        db_path: Path | None = None,
        resume_paused: bool = False,
        clients: Mapping[str, CompletionClient] | None = None,
        lease_batch: int | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.reconstructor: CompletionReconstructor = reconstructor or PassThroughReconstructor()
        tok = getattr(self.reconstructor, "tokenizer", None)
        self._tokenizer_fingerprint = str(getattr(tok, "fingerprint", "") or "")
        self.db_path = Path(db_path or store.path or config.run.database)
        self.resume_paused = resume_paused
        self._given_clients = dict(clients or {})
        self._lease_batch = lease_batch
        self.policy = retry_policy or RetryPolicy(attempts=config.generation.attempts)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.run_id: int | None = None
        self.state = "idle"
        self.state_reason: str | None = None
        self.stopping_error = False
        self._lock = EngineLock(self.db_path, config.run.name)
        self._eps = Endpoints()
        self._slots: EndpointSlots | None = None
        self._queue: deque[LeasedSample] = deque()
        self._prefetch: asyncio.Future[list[LeasedSample]] | None = None
        self._lease_empty_at = -1e9
        self._flights: dict[asyncio.Task, Flight] = {}
        self._main: list[asyncio.Task] = []
        self._wake = asyncio.Event()
        self._settled = asyncio.Event()
        self._finished = asyncio.Event()
        self._idle = asyncio.Event()
        self._pool: RebuildPool | None = None  # where rebuilds run (app.engine.rebuild_pool; the bench reads it)
        self._state_dirty = False
        self._t0 = time.time()
        self._m0 = time.monotonic()
        self._ended_m: float | None = None  # when the run reached DONE: elapsed and $/h freeze there
        self.total_metrics = EndpointMetrics("all", self._m0)
        self._counts = SampleCounts()
        self._verdicts: Counter[str] = Counter()
        self._strategies: Counter[str] = Counter()
        self._spent_at_start = 0.0
        self._req_bucket: TokenBucket | None = None
        self._tok_bucket: TokenBucket | None = None
        self._gate = StoreGate(self._on_store_change)
        self.events = EventLog(store, self._gate)
        self._settler: Settler | None = None
        self._guard: EndpointGuard | None = None  # endpoint health: down endpoints skipped and probed back up
        self._pause_pending = False  # the state says paused, the pause() that returns the leases is still to run
        self._verifier = Verifier.of(config)
        # a variant (":floor", ":nitro", ...) takes its base model's price unless priced itself
        prices, _ = resolve_pricing(config.model.name, config.pricing)
        self.pricing = prices
        self.budget = BudgetGuard(
            config.limits.budget_usd,
            Prices(prices.prompt_per_m, prices.completion_per_m) if prices else None,
            config.generation.max_tokens,
        )
        # the ETA and projected cost from the tokens still expected (app.engine.eta)
        self._projector = Projector(self.budget.prices, max_tokens=config.generation.max_tokens,
                                    stream=config.generation.stream)
        self._projected: tuple[float, float | None, float | None] | None = None  # (when, ETA, cost) last projected

    @property
    def _endpoints(self) -> list[Endpoint]:
        return self._eps.items

    # ---- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the run's lock, recover leases, start simulators and clients, and begin scheduling."""
        self._lock.acquire()
        try:
            await self._start()
        except BaseException:
            await self._teardown()
            raise

    async def _start(self) -> None:
        cfg = self.config
        self.run_id = self.events.run_id = await self.store.ensure_run(cfg.run.name, cfg.redacted())
        recovered = await self.store.recover_leases(self.run_id, socket.gethostname())
        if recovered:
            await self._event("info", "run", f"{recovered} leased samples from an earlier engine returned to pending")
        self._counts.reset(await self.store.counts(self.run_id))
        self._spent_at_start = await self.store.spent_usd(self.run_id)
        self.budget.spent_usd = self._spent_at_start
        for dataset, (n, chars) in (await self.store.open_prompt_sizes(self.run_id)).items():
            # ~4 JSON characters per prompt token (estimate_prompt_tokens' 2 is a deliberate worst case)
            self._projector.add_pending(dataset, chars // max(1, n) // _CHARS_PER_TOKEN, n)
        lengths = await self.store.finished_output_lengths(self.run_id)
        for dataset, stats in (await self.store.finished_output_stats(self.run_id)).items():
            # a resumed run projects from what it learned before
            self._projector.seed(dataset, *stats, lengths=lengths.get(dataset, ()))
        verdicts, strategies = await self.store.outcome_counts(self.run_id)
        self._verdicts, self._strategies = Counter(verdicts), Counter(strategies)
        stored_state, stored_reason = await self.store.run_state(self.run_id)
        now = asyncio.get_running_loop().time()
        if cfg.limits.requests_per_min:
            self._req_bucket = TokenBucket(cfg.limits.requests_per_min, now=now)
        if cfg.limits.tokens_per_min:
            self._tok_bucket = TokenBucket(cfg.limits.tokens_per_min, now=now)
        self._eps = await open_endpoints(cfg, started=self._m0, clients=self._given_clients, on_event=self._event,
                                         vocab_size=getattr(getattr(self.reconstructor, "tokenizer", None), "vocab_size",
                                                            None))
        await self._settle_prices()
        health = HealthBook.of([e.name for e in self._endpoints], cfg.limits.endpoint_down_after)
        self._slots = EndpointSlots([e.limit for e in self._endpoints], [e.config.weight for e in self._endpoints],
                                    up=health.up)
        self._settler = Settler(
            cfg, self.store, self.run_id, self._gate, self.events, self._counts, self.budget, self._endpoints,
            self._slots, self.total_metrics, self._verdicts, self._strategies, self._tok_bucket,
            self._tokenizer_fingerprint, self.pricing)
        self._settler.attempts = self.policy.attempts
        self._guard = EndpointGuard(
            health, [e.name for e in self._endpoints], [e.client for e in self._endpoints], self._slots,
            note_error=lambda i: self._settler.note_error(self._endpoints[i], "unreachable", final=False, retried=True),
            event=lambda level, message: self._event(level, "endpoint", message),
            all_down=self._endpoints_down, back=self._endpoint_back)
        await self._start_verify()
        if not isinstance(self.reconstructor, PassThroughReconstructor):
            self._pool = await RebuildPool.open(self.reconstructor, cfg.run.rebuild_workers,
                                                lambda level, message: self._event(level, "run", message))
            await self._event("info", "run", f"token ids are rebuilt in {self._pool.describe()}")
        if stored_state == "paused" and not self.resume_paused:
            self.state, self.state_reason = "paused", stored_reason or "paused before restart"
            await self._event("info", "run", f"run is paused ({self.state_reason}); resume to continue")
        else:
            await self._set_state("running", None)
            await self._event("info", "run", f"engine started (pid {os.getpid()}) with {len(self._endpoints)} endpoint(s)")
        self._main = [
            asyncio.create_task(self._schedule(), name="eaglewatch-schedule"),
            asyncio.create_task(self._poll_commands(), name="eaglewatch-commands"),
            asyncio.create_task(self._keep_leases(), name="eaglewatch-leases"),
            asyncio.create_task(self._beat(), name="eaglewatch-heartbeat"),
            asyncio.create_task(self._guard.watch(), name="eaglewatch-endpoint-health"),
        ]

    async def _settle_prices(self) -> None:
        """Prices for the budget guard and the cost of each result: the config's, else an endpoint's GET /models;
        a budget with no price anywhere is refused (the guard could not know what a request may cost)."""
        cfg = self.config
        quote = await prices_at_start(cfg.model.name, cfg.pricing, {e.name: e.client for e in self._endpoints
                                                                    if hasattr(e.client, "fetch_pricing")})
        if quote.pricing is not None and self.pricing is None:
            self.pricing = quote.pricing
            self.budget.prices = Prices(quote.pricing.prompt_per_m, quote.pricing.completion_per_m)
            self._projector.prices = self.budget.prices
        if quote.source != "config":
            await self._event("info" if quote.pricing is not None else "warning", "budget", quote.describe())
        if cfg.limits.budget_usd is not None and self.budget.prices is None:
            raise InputError(
                f"limits.budget_usd is {cfg.limits.budget_usd:g} but no price is known for {cfg.model.name!r} "
                "(no [pricing] entry for it or its base model, and no endpoint's GET /models lists it): the budget "
                "guard cannot know what a request may cost before it is billed; add "
                f"[pricing.\"{cfg.model.name}\"] prompt_per_m and completion_per_m (the worst case you accept), "
                "or drop the budget"
            )

    async def wait(self) -> RunOutcome:
        """Wait until every sample has ended, or the run is paused with nothing in flight."""
        await self._idle.wait()
        return self.outcome

    async def wait_finished(self) -> None:
        """Wait until every sample has ended (a paused run keeps waiting for resume)."""
        await self._finished.wait()

    @property
    def outcome(self) -> RunOutcome:
        """The run's state now, as a RunOutcome."""
        return RunOutcome(self.state, self.state_reason, self.stopping_error)

    async def close(self, *, cancel_in_flight: bool = True) -> None:
        """Stop scheduling; cancel (or let finish) in-flight requests, release leases, free the lock.

        Results already received are stored first (up to CLOSE_GRACE_S while the database refuses writes)."""
        for t in self._main:
            t.cancel()
        for t in self._main:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._main = []
        if cancel_in_flight:
            await self._cancel_in_flight(reason="engine closing")
        if self._flights:
            _, late = await asyncio.wait(list(self._flights), timeout=CLOSE_GRACE_S)
            if late:
                await self._cancel_in_flight(reason="the database refused writes at close", settling=True)
        await self._release_queue()
        if self.state == "running":
            # Viewers attached to the database must not show a live run that no engine drives.
            await self._set_state("paused", "engine stopped")
        await self._stop_beating()
        await self._teardown()

    async def _teardown(self) -> None:
        await close_endpoints(self._eps)
        if self._slots is not None:
            self._slots.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._lock.release()

    # ---- control (RunControl) --------------------------------------------------------------------

    async def pause(self, now: bool = False, reason: str = "operator") -> None:
        """Lease nothing new; with now=True also cancel in-flight requests (providers may still bill)."""
        if self.state == "done":
            return
        await self._set_state("paused", reason)
        await self._event("info", "run", f"run paused ({reason})")
        await self._release_queue()
        if now:
            await self._cancel_in_flight(reason=reason)
        self._wake.set()
        self._check_idle()

    async def resume(self) -> None:
        """Continue leasing after a pause (operator, budget, run-stopping error or a full disk)."""
        if self.state != "paused":
            return
        self.stopping_error = False
        # not idle from the moment the state says running: a headless engine that sees "running" waits on
        # `wait()` again, which must not return at once (the engine closed, its run left "engine stopped")
        self._idle.clear()
        await self._set_state("running", None)
        await self._event("info", "run", "run resumed")
        self._wake.set()

    async def set_concurrency(self, limit: int) -> None:
        """Set the total in-flight limit, spread over the endpoints by weight and clamped to min/max."""
        total = set_total_limit(self._endpoints, limit)
        await self._event("info", "concurrency", f"concurrency set to {total} by the operator")
        if self._slots is not None:
            self._slots.wake()

    async def retry_failed(self) -> int:
        """Put the failed samples back to pending with a fresh allowance of attempts (`RunStore.retry_failed`, one
        transaction) and schedule them, also after the run had ended; returns how many."""
        n = await self._gate.commit(lambda: self.store.retry_failed(self.run_id))
        self._counts.reset(await self.store.counts(self.run_id))
        await self._event("info", "run", f"{n} failed samples put back to pending, each with a fresh allowance of "
                          f"{self.config.generation.attempts} attempts (generation.attempts)")
        if n and self.state == "done":
            self._ended_m = None
            self._finished.clear()
            self._idle.clear()
            await self._set_state("running", None)
        self._lease_empty_at = -1e9
        self._wake.set()
        return n

    async def apply_command(self, verb: str, args: dict) -> None:
        """Carry out one control command from the `commands` table (pause, resume, set_concurrency, retry_failed)."""
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
                await self._event("warning", "run", f"set_concurrency needs a limit of at least 1, got {args!r}; ignored")
                return
            await self.set_concurrency(limit)
        else:
            await self._event("warning", "run", f"unknown operator command {verb!r} ignored")

    # ---- scheduling ------------------------------------------------------------------------------

    def _total_limit(self) -> int:
        return sum(ep.limit.limit for ep in self._endpoints)

    async def _schedule(self) -> None:
        try:
            await self._schedule_loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never stall silently: tell the operator and let wait() return
            self.state, self.state_reason = "paused", f"engine error: {exc}"[:200]
            try:
                await self._event("error", "run", f"the scheduler stopped: {exc!r}; the run can be resumed by "
                                  "running it again once the cause is fixed")
                await self._set_state("paused", self.state_reason)
            finally:
                self._idle.set()

    async def _schedule_loop(self) -> None:
        loop = asyncio.get_running_loop()
        lease_s = self.config.limits.lease_s
        while True:
            if self.state != "running" or self._gate.blocked is not None:
                # paused, or the store cannot write: start nothing (results already held keep retrying)
                self._check_idle()
                await self._nap(0.5)
                continue
            self._absorb_prefetch()
            if len(self._queue) <= self._total_limit() and self._prefetch is None \
                    and loop.time() - self._lease_empty_at > 0.5:
                n = self._lease_batch or max(16, min(512, 2 * self._total_limit()))
                self._prefetch = asyncio.ensure_future(
                    self._gate.commit(lambda: self.store.lease(self.run_id, n, lease_s, self.owner)))
            if not self._queue:
                if self._prefetch is not None:
                    await asyncio.wait({self._prefetch})
                    self._absorb_prefetch()
                if not self._queue:
                    if not self._flights and self._prefetch is None:
                        await self._finish_if_ended()
                        if self.state != "running":
                            continue
                    await self._nap(0.5)
                    continue
            sample = self._queue[0]
            prompt_est = estimate_prompt_tokens(sample.messages, sample.tools)
            worst = self.budget.worst_case(prompt_est)
            if not self.budget.allows(worst):
                if self._flights:
                    self._settled.clear()
                    await self._settled.wait()
                    continue
                await self._event("warning", "budget", self._budget_message(worst))
                await self.pause(reason="budget reached")
                continue
            if not await self._wait_buckets(loop, prompt_est):
                continue
            index, ticket = await self._slots.acquire_ticket()
            # A pause (or pause-now) while we waited for a slot may have emptied or refilled the queue.
            if self.state != "running" or not self._queue or self._queue[0] is not sample:
                self._slots.release(index)
                continue
            self._queue.popleft()
            self.budget.reserve(worst)
            flight = Flight(sample, worst, index, ticket=ticket)
            self._projector.started(sample.pk, sample.dataset, 2 * (prompt_est - 16) // _CHARS_PER_TOKEN,
                                    time.monotonic())
            task = asyncio.create_task(self._fly(flight), name=f"eaglewatch-sample-{sample.pk}")
            self._flights[task] = flight

    async def _nap(self, timeout: float) -> None:
        """Wait for a wake-up or `timeout` (asyncio.wait: unlike 3.11's wait_for it never swallows a cancel)."""
        self._wake.clear()
        waiter = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()

    def _budget_message(self, worst: float) -> str:
        budget, spent = self.config.limits.budget_usd or 0.0, self.budget.spent_usd
        over = self.budget.overshoot_usd
        if spent > budget + 1e-12:
            return (f"budget ${budget:.4f} passed: spent ${spent:.4f}, ${over:.4f} beyond what was reserved "
                    f"(responses cost more than [pricing] predicts for {self.config.model.name!r}, or failed "
                    "requests were billed); correct the prices, raise limits.budget_usd and resume")
        return (f"budget ${budget:.4f} reached: spent ${spent:.4f}, the next request could cost up to ${worst:.4f}; "
                "raise limits.budget_usd and resume to continue")

    def _absorb_prefetch(self) -> None:
        """Move a finished background lease into the queue (leases are fetched ahead so the queue never runs dry)."""
        fut = self._prefetch
        if fut is None or not fut.done():
            return
        self._prefetch = None
        leased = fut.result()  # a lasting store error ends the scheduler with an operator event
        if not leased:
            self._lease_empty_at = asyncio.get_running_loop().time()
            return
        self._queue.extend(leased)
        self._counts.leased(len(leased))

    async def _wait_buckets(self, loop: asyncio.AbstractEventLoop, prompt_est: int) -> bool:
        for bucket, amount in ((self._req_bucket, 1), (self._tok_bucket, prompt_est + self.config.generation.max_tokens)):
            if bucket is None:
                continue
            while True:
                wait = bucket.try_take(amount, loop.time())
                if wait == 0.0:
                    break
                await asyncio.sleep(min(wait, 1.0))
                if self.state != "running":
                    return False
        return True

    # ---- one sample: request, then settle --------------------------------------------------------

    async def _fly(self, f: Flight) -> None:
        """A request task: whatever happens ends in a settled Outcome (or a cancellation that returns the lease)."""
        try:
            outcome = await request_sample(
                f, endpoints=self._endpoints, slots=self._slots, policy=self.policy, model=self.config.model.name,
                reconstruct=self._reconstruct, on_retry=self._on_retry,
                request_extra=self._verifier.request_extra, on_first_token=self._first_token,
                on_unreachable=self._guard.unreachable, on_answered=self._guard.answered,
            )
            first_stop = self._stop_leasing(outcome)
            await self._settler.settle(f, outcome)
            self._project(f, outcome)
            if first_stop:
                await self._event("error", "endpoint", f"{self._endpoints[f.last].name}: {outcome.error} — the run is "
                                  "paused so the queue is not burnt; fix the cause (key, credits, permissions) and resume")
                await self.pause(reason=self.state_reason)
        except asyncio.CancelledError:
            self.budget.settle(f.reserved_usd, 0.0)
            self._projector.requeued(f.sample.pk, time.monotonic())
            raise
        except Exception as exc:  # settle records every outcome (or returns the lease); what failed came after it
            await self._event("error", "sample", f"sample {f.sample.sample_id!r} (pk {f.sample.pk}): the engine failed "
                              f"after settling it ({type(exc).__name__}: {exc}); the run goes on")
        finally:
            if f.index is not None:
                self._slots.release(f.index)
                f.index = None
            self._flights.pop(asyncio.current_task(), None)
            self._settled.set()
            if not self._flights:
                self._wake.set()
                self._check_idle()

    async def _on_retry(self, f: Flight, exc: RetryableError) -> None:
        self._projector.resent(f.sample.pk, time.monotonic())  # its output counts again from nothing
        await self._settler.on_retry(f, exc)

    def _first_token(self, f: Flight) -> None:
        self._projector.first_token(f.sample.pk, time.monotonic())

    def _project(self, f: Flight, o: Outcome) -> None:
        """Tell the projector how a sample ended: answered (its tokens and time), failed, or back to pending."""
        now = time.monotonic()
        c = o.completion
        if c is not None:
            cost = cost_of(c.usage, self.pricing)
            self._projector.finished(f.sample.pk, c.usage.completion_tokens, c.total_s, c.ttft_s, cost, now)
        elif o.kind == "failed":
            self._projector.dropped(f.sample.pk, now)
        else:
            self._projector.requeued(f.sample.pk, now)

    async def _reconstruct(self, completion: Completion, f: Flight) -> Rebuilt:
        return await rebuild(self._pool, self.reconstructor, completion, f, self._endpoints[f.last].name)

    # ---- live fidelity and the quality gate (app.engine.verify) ----------------------------------

    async def _start_verify(self) -> None:
        """Wrap the reconstructor with the endpoints' stored fidelity profiles; let the Settler feed the gate."""
        self.reconstructor, notes = await open_rebuilder(self.reconstructor, self.config, self.db_path)
        for note in notes:
            await self._event("info", "fidelity", note)
        await seed_from_store(self._verifier, self.db_path, self.config.run.name)
        self._settler.verifier, self._settler.on_decision = self._verifier, self._on_quality

    def _on_quality(self, d: QualityDecision) -> None:
        """A gate decision: pause at once (before the scheduler leases more), or note the route-around."""
        loop = asyncio.get_running_loop()
        if d.action == "pause" and self.state == "running":
            self.state, self.state_reason = "paused", f"quality gate: {d.endpoint}" + (
                f" / {d.provider}" if d.provider else "") + f" corrupt rate {d.rate:.1%}"
            self._pause_pending = True
            loop.create_task(self._quality_pause(d))
        elif d.action == "route_around":
            loop.create_task(self._event("warning", "quality", d.message))

    async def _quality_pause(self, d: QualityDecision) -> None:
        try:
            await self._event("error", "quality", d.message)
            await self.pause(reason=self.state_reason or "quality gate")
        finally:
            self._pause_pending = False
            self._check_idle()

    def _endpoints_down(self, why: str) -> None:
        """Every endpoint is down: pause at once (nothing more is leased) and cancel what waits on them; the
        samples stay pending. The run resumes by itself when a probe gets an answer (`_endpoint_back`)."""
        if self.state == "running":
            self.state, self.state_reason = "paused", f"{ENDPOINTS_DOWN} ({why})"[:300]
            self._pause_pending = True
            asyncio.get_running_loop().create_task(self._endpoints_down_pause(why))

    async def _endpoints_down_pause(self, why: str) -> None:
        try:
            await self._event("error", "endpoint", f"{ENDPOINTS_DOWN} ({why}): the run is paused and its samples "
                              "stay pending; it resumes by itself when a probe gets an answer, or run it again once "
                              "the endpoint is back (check base_url, the network, or start the server)")
            await self.pause(now=True, reason=self.state_reason or ENDPOINTS_DOWN)
        finally:
            self._pause_pending = False
            self._check_idle()

    async def _endpoint_back(self, index: int) -> None:
        if self.state == "paused" and (self.state_reason or "").startswith(ENDPOINTS_DOWN):
            await self.resume()

    def _stop_leasing(self, o: Outcome) -> bool:
        """A run-stopping error: pause before any await lets the scheduler start another request. True for the
        first such error (which tells the operator)."""
        if o.kind != "stopping" or self.state != "running":
            return False
        self.state, self.state_reason = "paused", f"{o.error_class}: {o.message}"[:200]
        self.stopping_error = True
        return True

    async def _cancel_in_flight(self, reason: str, *, settling: bool = False) -> None:
        """Cancel the requests in flight (with settling=True also results not yet stored) and return their leases."""
        chosen = [(t, f) for t, f in self._flights.items() if settling or not f.settling]
        if not chosen:
            return
        for t, _ in chosen:
            t.cancel()
        await asyncio.gather(*(t for t, _ in chosen), return_exceptions=True)
        pks = [f.sample.pk for _, f in chosen]
        try:
            await self.store.release(self.run_id, pks)
        except StoreWriteError:
            pass  # they stay leased under this host: the next start returns them
        self._counts.released(len(pks))
        await self._event(
            "warning", "run",
            f"cancelled {len(pks)} in-flight requests ({reason}); their samples return to pending. "
            "Providers may still bill for requests they had started.",
        )

    async def _release_queue(self) -> None:
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
            await self.store.release(self.run_id, pks)
        except StoreWriteError:
            return  # kept queued: resume uses them, a restart returns them
        self._queue.clear()
        self._counts.released(len(pks))

    async def _finish_if_ended(self) -> None:
        counts = await self.store.counts(self.run_id)
        self._counts.reset(counts)
        if counts.get("pending", 0) == 0 and counts.get("leased", 0) == 0:
            self._ended_m = time.monotonic()
            await self._set_state("done", None)
            done, failed = counts.get("done", 0), counts.get("failed", 0)
            await self._event("info", "run", f"run finished: {done} done, {failed} failed")
            self._finished.set()
            self._idle.set()

    def _check_idle(self) -> None:
        if self._pause_pending:  # paused in a hurry, its leases not yet returned: idle once pause() is through
            return
        if self.state == "done" or (self.state == "paused" and not self._flights):
            self._idle.set()

    async def _poll_commands(self) -> None:
        while True:
            await asyncio.sleep(COMMAND_POLL_S)
            if self._gate.blocked is not None:
                continue
            try:
                commands = await self.store.take_commands(self.run_id)
            except StoreWriteError:
                continue  # the next poll tries again; a lasting refusal shows in the results' writes
            except Exception as exc:  # a transient database error must not kill the engine
                await self._event("warning", "run", f"could not read operator commands: {exc}")
                continue
            for cmd in commands:
                await self.apply_command(cmd.verb, cmd.args or {})

    async def _keep_leases(self) -> None:
        """The lease heartbeat: extend this engine's leases and return expired ones, every lease_s/3."""
        lease_s = self.config.limits.lease_s
        period = max(0.05, min(lease_s / 3.0, 30.0))
        while True:
            await asyncio.sleep(period)
            if self._gate.blocked is not None:
                continue
            mine = [f.sample.pk for f in self._flights.values()] + [s.pk for s in self._queue]
            try:
                expired = await self.store.keep_leases(self.run_id, mine, lease_s, self.owner)
            except StoreWriteError:
                continue
            if expired:
                self._counts.released(expired)
                self._lease_empty_at = -1e9
                self._wake.set()
                await self._event("warning", "run", f"{expired} leases expired (held longer than lease_s = {lease_s:g}s "
                                  "by an engine that stopped); their samples return to pending")

    # ---- the heartbeat ----------------------------------------------------------------------------

    def _beat_op(self, *, final: bool):
        snap = snapshot_to_json(self.snapshot())
        if final:
            return stop_op(self.run_id, pid=os.getpid(), now=time.time(), snapshot_json=snap)
        return beat_op(self.run_id, pid=os.getpid(), host=this_host(), started_at=self._t0, now=time.time(),
                       snapshot_json=snap)

    async def _beat(self) -> None:
        """Write the heartbeat with the live snapshot about once a second, so attached viewers and `status`
        show this engine's numbers and can tell a crash (app.store.heartbeat). Through the StoreGate: a store
        that refuses writes delays a beat (each retry writes a fresh one) and never ends this task."""
        while True:
            try:
                await self._gate.commit(lambda: self.store.write(self._beat_op(final=False)))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a lasting store error: say so once a minute at most, keep beating
                self.events.note("warning", "store", f"could not write the engine heartbeat: {exc}")
                await asyncio.sleep(60.0)
            await asyncio.sleep(BEAT_INTERVAL_S)

    async def _stop_beating(self) -> None:
        """A clean close: the final snapshot and `stopped_at`, so readers say 'exited', not 'gone'."""
        if self.run_id is None:
            return
        try:
            await self.store.write(self._beat_op(final=True))
        except Exception:
            pass  # readers then call it gone once the beats are stale: still true enough

    # ---- the store's health ----------------------------------------------------------------------

    def _on_store_change(self, error: StoreWriteError | None) -> None:
        loop = asyncio.get_running_loop()
        if error is None:
            loop.create_task(self._store_recovered())
            self._wake.set()
            return
        if error.kind == "full":
            advice = disk_full_advice(self.db_path)
            if self.state == "running":
                self.state, self.state_reason = "paused", f"disk full: {advice}"[:300]
                self._state_dirty = True
            self.events.note("error", "store", f"{advice}. The run is paused; finished results are held and "
                               "stored as soon as the disk has room")
        else:
            self.events.note("warning", "store", f"the database refuses writes ({error}); leasing is paused and "
                               "finished results are held until it writes again")

    async def _store_recovered(self) -> None:
        self.events.note("info", "store", "the database writes again; held results are being stored")
        if self._state_dirty:
            await self._set_state(self.state, self.state_reason)
        await self.events.flush()
        self._check_idle()

    # ---- state and events ------------------------------------------------------------------------

    async def _set_state(self, state: str, reason: str | None) -> None:
        self.state, self.state_reason = state, reason
        if self.run_id is None:
            return
        try:
            await self.store.set_run_state(self.run_id, state, reason)
            self._state_dirty = False
        except StoreWriteError:
            self._state_dirty = True  # written when the store recovers

    async def _event(self, level: str, kind: str, message: str) -> None:
        await self.events.add(level, kind, message)

    def events_since(self, after_id: int) -> list[EngineEvent]:
        """Events this engine wrote after `after_id` (the latest 1,000 are kept in memory)."""
        return self.events.since(after_id)

    # ---- metrics ---------------------------------------------------------------------------------

    def _flight_counts(self) -> tuple[list[int], list[int]]:
        """Per endpoint: requests on the wire (a slot held, no response yet) and samples waiting (to retry,
        or with a response being rebuilt and stored), so the tile and the endpoint rows count the same."""
        wire = [0] * len(self._endpoints)
        waiting = [0] * len(self._endpoints)
        for f in self._flights.values():
            if f.index is not None and not f.settling:
                wire[f.index] += 1
            elif 0 <= f.last < len(waiting):
                waiting[f.last] += 1
        return wire, waiting

    @staticmethod
    def _loop_now() -> float | None:
        """The event loop's clock (the limiter's), or None off the loop (the limiter then uses its last)."""
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return None

    def _projection(self, now: float, spent: float, remaining: int) -> tuple[float | None, float | None]:
        """ETA and projected total cost from the tokens still expected over the concurrency held (the limit
        while nothing is held, e.g. paused); (0, spent) once nothing remains."""
        if not remaining:
            return 0.0, spent
        last = self._projected
        if last is not None and 0.0 <= now - last[0] < _PROJECT_EVERY_S:  # 4 Hz polling: recompute once a second
            eta = None if last[1] is None else max(0.0, last[1] - (now - last[0]))
            return eta, last[2]
        held = self._projector.concurrency(now)
        p = self._projector.project(now, spent, concurrency=held if held >= 1.0 else float(self._total_limit()),
                                    ceiling=self._growth_ceiling())
        self._projected = (now, p.eta_s, p.projected_cost_usd)
        return p.eta_s, p.projected_cost_usd

    def _growth_ceiling(self) -> int | None:
        """Where the endpoints' limits are headed while one still grows (slow start: its maximum; recovery: its
        proven ceiling), the others at their limit; None when none grows (the ETA then holds what is in flight)."""
        now = self._loop_now()
        total, growing = 0, False
        for ep in self._endpoints:
            lim = ep.limit
            if lim.reason(now) == "growing":
                growing = True
                total += lim.maximum if lim.capacity_estimate is None else max(lim.limit, lim.capacity_estimate)
            else:
                total += lim.limit
        return total if growing else None

    def snapshot(self) -> MetricsSnapshot:
        """An immutable view of the run now (no I/O; cheap enough for 4 Hz polling)."""
        now = time.monotonic()
        elapsed = (self._ended_m if self.state == "done" and self._ended_m is not None else now) - self._m0
        wire, waiting = self._flight_counts()
        loop_now = self._loop_now()
        eps = tuple(
            ep.metrics.snapshot(now, wire[i], ep.limit.limit, waiting=waiting[i],
                                limit_reason=ep.limit.reason(loop_now), capacity=ep.limit.capacity_estimate)
            for i, ep in enumerate(self._endpoints))
        tot = self.total_metrics
        lat50, lat95 = tot.latency_ms.quantiles(now)
        t50, t95 = tot.ttft_ms.quantiles(now)
        rate = tot.rates.rate(now)
        c = self._counts
        total, remaining = c.total, c.remaining
        spent = self.budget.spent_usd
        eta, projected = self._projection(now, spent, remaining)
        return MetricsSnapshot(
            run_name=self.config.run.name, state=self.state, state_reason=self.state_reason,
            started_at=self._t0, elapsed_s=elapsed, eta_s=eta, total=total,
            pending=c["pending"], leased=c["leased"], done=c["done"], failed=c["failed"],
            skipped=c["skipped"], truncated=tot.truncated, retried=tot.retried,
            in_flight=sum(wire), waiting=sum(waiting), concurrency_limit=self._total_limit(), rate=rate,
            throughput_history=tot.rates.history(now), latency_p50_ms=lat50, latency_p95_ms=lat95,
            ttft_p50_ms=t50, ttft_p95_ms=t95, errors_by_class=tuple(sorted(tot.errors.items())),
            cost_usd=spent, cost_per_hour=cost_per_hour(spent - self._spent_at_start, elapsed),
            projected_cost_usd=projected,
            budget_usd=self.config.limits.budget_usd,
            verdicts=tuple(sorted(self._verdicts.items())), strategies=tuple(sorted(self._strategies.items())),
            endpoints=eps, fidelity=self._verifier.views(),
            prompt_checks=tuple(sorted(self._verifier.prompt_checks.items())),
        )
