"""A Run: lease pending samples, send them to the endpoints, store every result, steer it live.

`Run` is the composition root and the public face (start, wait, close, the `RunControl` methods, snapshot,
events). It builds the engine's parts, each a class with its own state in its own module, wired by named
arguments: `RunState` (the run's state and why; `run_state`), `Ledger` (budget, prices, counts, tallies; `ledger`),
`Forecast` (ETA and projected cost; `forecast`), the endpoints (`endpoints`), the work source and the lease upkeep
(`SampleLeases` and `LeaseKeeper`; `leases`), the `Scheduler` (lease queue, budget, rate buckets, slots;
`scheduler`), the `Flights` (one task per sample: request, settle, forecast; `flights`), the `Settler` (the one
place a sample ends; `settle`), `Steering` (pause, resume, concurrency, the commands table; `steering`), the
`HeartbeatWriter` (`health.heartbeat`), `StoreHealth` (a store that refuses writes; `health.store_health`) and the
`ReconstructionPool` (where ids are reconstructed; `fidelity.pool`). Five tasks run once started: the scheduler, the
command poll, the lease keeper, the heartbeat and the endpoint guard's watch (`EndpointGuard.watch`: a dead endpoint).

Crash safety comes from the store: a sample is `leased` until its result commits, and a SIGKILL loses at
most the requests in flight (finished-but-unstored results hold their slot). Leases carry an owner
(host:pid): a starting engine (holding the lock file next to the database, so no other engine on this host
runs the run) returns this host's leases at once; while it runs it extends its own leases every lease_s/3
and returns any lease past its expiry (an engine elsewhere that stopped) to pending.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.config import RunConfig
from app.engine.capacity.endpoints import (
    CompletionClient,
    Endpoint,
    Endpoints,
    close_endpoints,
    open_endpoints,
    total_limit,
)
from app.engine.capacity.slots import EndpointSlots
from app.engine.fidelity.pool import ReconstructionPool, open_reconstruction_pool
from app.engine.fidelity.quality import QualityDecision
from app.engine.fidelity.verify import EndpointReconstructor, Verifier, open_verification, save_profiles
from app.engine.flights import Flights
from app.engine.health.endpoint_health import EndpointGuard, HealthBook
from app.engine.health.events import EngineEvent, EventLog
from app.engine.health.heartbeat import HeartbeatWriter
from app.engine.health.lock import EngineLock
from app.engine.health.store_health import StoreHealth
from app.engine.health.writes import StoreGate
from app.engine.money.budget import BudgetGuard, cost_per_hour
from app.engine.money.forecast import Forecast, loop_now
from app.engine.money.ledger import Ledger
from app.engine.record.snapshot import IN_PROCESS, LiveFigures, RunRecord
from app.engine.scheduler import Scheduler
from app.engine.settle import Settler
from app.engine.steering import VIEWER_PAUSE, Steering
from app.engine.wiring import Capacity, Checking, Money, Sending, Signals, StoreSide
from app.engine.work.counts import follower_of
from app.engine.work.leases import LeaseKeeper, SampleLeases
from app.engine.work.run_state import RunOutcome, RunState
from app.providers.pricing import ModelPricing
from app.providers.retry import RetryPolicy
from app.records import ErrorClass
from app.store.count_records import RunCounts
from app.store.run_store import RunStore, StoreWriteError
from app.token_bucket import TokenBucket
from app.tokens import Reconstructor
from app.tokens.fidelity_profile import FidelityProfile

CLOSE_GRACE_S = 30.0  # how long close() waits for finished results to be stored before giving them up

__all__ = ["VIEWER_PAUSE", "EngineEvent", "EngineLock", "Run", "RunOutcome"]


@dataclass(frozen=True, slots=True)
class _Started:
    """The parts `start()` builds over the opened endpoints."""

    slots: EndpointSlots
    flights: Flights
    scheduler: Scheduler
    steering: Steering
    keeper: LeaseKeeper
    heartbeat: HeartbeatWriter
    guard: EndpointGuard


class Run:
    """One run of a config over a store; the engine's implementation of `RunControl`."""

    def __init__(
        self,
        config: RunConfig,
        store: RunStore,
        *,
        reconstructor: Reconstructor | None = None,
        db_path: Path | None = None,
        resume_paused: bool = False,
        clients: Mapping[str, CompletionClient] | None = None,
        lease_batch: int | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.reconstructor = reconstructor  # None: the text is stored as is, no ids reconstructed
        self.db_path = Path(db_path or store.path or config.run.database)
        self.resume_paused = resume_paused
        self.policy = retry_policy or RetryPolicy(attempts=config.generation.attempts)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._clients = dict(clients or {})
        self._lease_batch = lease_batch
        self._lock = EngineLock(self.db_path, config.run.name)
        self._eps = Endpoints()
        self._state = RunState(store=store)
        self._ledger = Ledger(config=config, started_m=self._state.started_m)
        self._forecast = Forecast(
            prices=self._ledger.budget.prices, max_tokens=config.generation.max_tokens, stream=config.generation.stream
        )
        self._verifier = Verifier.of(config)
        self._wake = asyncio.Event()  # the scheduler's wake-up: set by the parts that may give it work
        self._gate = StoreGate(self._store_changed)
        self.events = EventLog(store, self._gate)
        self._health = StoreHealth(state=self._state, events=self.events, db_path=self.db_path, wake=self._wake)
        self._pool: ReconstructionPool | None = None
        self._live: _Started | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ---- what faces, tests and benchmarks read ---------------------------------------------------

    @property
    def run_id(self) -> int | None:
        return self._state.run_id

    @property
    def state(self) -> str:
        return self._state.current

    @property
    def state_reason(self) -> str | None:
        return self._state.reason

    @property
    def stopping_error(self) -> bool:
        return self._state.stopping_error

    @property
    def outcome(self) -> RunOutcome:
        """The run's state now, as a RunOutcome."""
        return self._state.outcome

    @property
    def budget(self) -> BudgetGuard:
        return self._ledger.budget

    @property
    def pricing(self) -> ModelPricing | None:
        """The run's list prices: the config's (variant rules), or an endpoint's GET /models at start."""
        return self._ledger.pricing

    @property
    def endpoints(self) -> list[Endpoint]:
        """The live endpoints, in the config's order (none before start)."""
        return self._eps.items

    @property
    def reconstruction_pool(self) -> ReconstructionPool | None:
        """Where reconstructions run (None: no reconstructor, or closed)."""
        return self._pool

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
        cfg, store, events = self.config, self.store, self.events
        run_id = self._state.run_id = events.run_id = await store.ensure_run(cfg.run.name, cfg.redacted())
        recovered = await store.recover_leases(run_id, socket.gethostname())
        if recovered:
            await events.add("info", "run", f"{recovered} leased samples from an earlier engine returned to pending")
        await self._ledger.load(store, run_id)
        await self._forecast.load(store, run_id)
        stored_state, stored_reason = await store.run_state(run_id)
        vocab = self.reconstructor.tokenizer.vocab_size if self.reconstructor is not None else None
        self._eps = await open_endpoints(
            cfg, started=self._state.started_m, clients=self._clients, on_event=events.add, vocab_size=vocab
        )
        await self._ledger.quote_prices(cfg, self.endpoints, events.add)
        self._forecast.prices = self._ledger.budget.prices
        # the endpoints' servers identified, their prior, stored and (as probes come in) learned fidelity profiles
        endpoint_reconstructor, notes = await open_verification(
            self._verifier, self.reconstructor, cfg, self.db_path, self.endpoints
        )
        for level, note in notes:
            await events.add(level, "fidelity", note)
        self._verifier.on_profile = self._on_profile
        # a pass-through (not a tokens Reconstructor, returned unwrapped) has nothing the pool could call: no pool,
        # the text is stored as is
        self._pool = await open_reconstruction_pool(
            endpoint_reconstructor if isinstance(endpoint_reconstructor, EndpointReconstructor) else None,
            cfg,
            events.add,
        )
        self._live = live = self._wire(run_id)
        await self._save_profiles(list(self._verifier.profiles.values()))
        if stored_state == "paused" and not self.resume_paused:
            self._state.current, self._state.reason = "paused", stored_reason or "paused before restart"  # as stored
            await events.add("info", "run", f"run is paused ({self._state.reason}); resume to continue")
        else:
            await self._state.set("running", None)
            await events.add(
                "info", "run", f"engine started (pid {os.getpid()}) with {len(self.endpoints)} endpoint(s)"
            )
        self._tasks = [
            asyncio.create_task(live.scheduler.run(), name="eaglewatch-schedule"),
            asyncio.create_task(live.steering.poll_commands(), name="eaglewatch-commands"),
            asyncio.create_task(live.keeper.run(), name="eaglewatch-leases"),
            asyncio.create_task(live.heartbeat.run(), name="eaglewatch-heartbeat"),
            asyncio.create_task(live.guard.watch(), name="eaglewatch-endpoint-health"),
        ]

    def _wire(self, run_id: int) -> _Started:
        """Build the parts that work over the opened endpoints (and the rate buckets, on the loop's clock)."""
        cfg, eps, state, events, gate = self.config, self.endpoints, self._state, self.events, self._gate
        lim, now = cfg.limits, asyncio.get_running_loop().time()
        requests = TokenBucket(lim.requests_per_min, now=now) if lim.requests_per_min else None
        tokens = TokenBucket(lim.tokens_per_min, now=now) if lim.tokens_per_min else None
        health = HealthBook.of([e.name for e in eps], lim.endpoint_down_after)
        slots = EndpointSlots([e.limit for e in eps], [e.config.weight for e in eps], up=health.up)
        source = SampleLeases(store=self.store, run_id=run_id, lease_s=cfg.limits.lease_s, owner=self.owner)
        settler = Settler(
            config=cfg,
            store=self.store,
            run_id=run_id,
            gate=gate,
            events=events,
            ledger=self._ledger,
            endpoints=eps,
            slots=slots,
            verifier=self._verifier,
            on_decision=self._on_quality,
            attempts=self.policy.attempts,
            tok_bucket=tokens,
            tokenizer_fingerprint=self.reconstructor.tokenizer.fingerprint if self.reconstructor else "",
        )
        # endpoint health: a dead endpoint's requests go to the others; all down pauses the run until one answers
        guard = EndpointGuard(
            health,
            [e.name for e in eps],
            [e.client for e in eps],
            slots,
            note_error=lambda i: settler.note_error(eps[i], ErrorClass.UNREACHABLE, final=False, retried=True),
            event=lambda level, message: events.add(level, "endpoint", message),
            all_down=lambda why: steering.endpoints_down(why),
            back=lambda index: steering.endpoint_back(index),
        )
        # the bundles the orchestration's parts share (app.engine.wiring), built once per started run
        side = StoreSide(self.store, run_id, gate, source)
        capacity = Capacity(eps, slots, requests, tokens)
        money = Money(self._ledger, self._forecast)
        signals = Signals(state, events, self._wake)
        flights = Flights(
            store=side,
            capacity=capacity,
            money=money,
            signals=signals,
            sending=Sending(self.policy, cfg.model.name, guard),
            checking=Checking(self._pool, self._verifier),
            settler=settler,
            pause=self._pause_for,
        )
        scheduler = Scheduler(
            config=cfg,
            store=side,
            flights=flights,
            capacity=capacity,
            money=money,
            signals=signals,
            pause=self._pause_for,
            lease_batch=self._lease_batch,
        )
        flights.on_ready = scheduler.work_returned  # a turn's parent stored: lease it now
        steering = Steering(
            store=side,
            capacity=capacity,
            money=money,
            signals=signals,
            scheduler=scheduler,
            flights=flights,
            attempts=cfg.generation.attempts,
        )
        keeper = LeaseKeeper(
            source=source,
            lease_s=cfg.limits.lease_s,
            held=lambda: flights.pks() + scheduler.queued_pks(),
            on_returned=scheduler.work_returned,
            gate=gate,
            counts=self._ledger.counts,
            events=events,
        )
        heartbeat = HeartbeatWriter(
            store=self.store,
            gate=gate,
            events=events,
            run_id=run_id,
            started_at=state.started_at,
            snapshot=self.snapshot,
        )
        return _Started(slots, flights, scheduler, steering, keeper, heartbeat, guard)

    async def wait(self) -> RunOutcome:
        """Wait until every sample has ended, or the run is paused with nothing in flight."""
        await self._state.idle.wait()
        return self.outcome

    async def wait_finished(self) -> None:
        """Wait until every sample has ended (a paused run keeps waiting for resume)."""
        await self._state.finished.wait()

    async def close(self, *, cancel_in_flight: bool = True) -> None:
        """Stop scheduling; cancel (or let finish) in-flight requests, release leases, free the lock.

        Results already received are stored first (up to CLOSE_GRACE_S while the database refuses writes)."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        live = self._live
        if live is not None:
            if cancel_in_flight:
                await live.flights.cancel(reason="engine closing")
            if not await live.flights.wait(CLOSE_GRACE_S):
                await live.flights.cancel(reason="the database refused writes at close", settling=True)
            await live.scheduler.release_queue()
        await self._save_profiles(self._verifier.learned_profiles())
        if self._state.running:
            # Viewers attached to the database must not show a live run that no engine drives.
            await self._state.set("paused", "engine stopped")
        if live is not None:
            await live.heartbeat.stop()
        await self._teardown()

    async def _teardown(self) -> None:
        await close_endpoints(self._eps)
        if self._live is not None:
            self._live.slots.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._lock.release()

    # ---- control (RunControl, carried out by Steering) --------------------------------------------

    @property
    def _steering(self) -> Steering:
        if self._live is None:
            raise RuntimeError(f"run {self.config.run.name!r} is not started: call start() before steering it")
        return self._live.steering

    async def pause(self, now: bool = False, reason: str = "operator") -> None:
        """Lease nothing new; with now=True also cancel in-flight requests (providers may still bill)."""
        await self._steering.pause(now, reason)

    async def resume(self) -> None:
        """Continue leasing after a pause (operator, budget, run-stopping error or a full disk)."""
        await self._steering.resume()

    async def set_concurrency(self, limit: int) -> None:
        """Set the total in-flight limit, spread over the endpoints by weight and clamped to min/max."""
        await self._steering.set_concurrency(limit)

    async def apply_command(self, verb: str, args: dict) -> None:
        """Carry out one control command from the `commands` table (pause, resume, set_concurrency, retry_failed)."""
        await self._steering.apply_command(verb, args)

    async def retry_failed(self) -> int:
        """Put the failed samples back to pending with a fresh allowance of attempts and schedule them, also after
        the run had ended; returns how many (`Steering.retry_failed`)."""
        return await self._steering.retry_failed()

    async def _pause_for(self, reason: str) -> None:
        await self.pause(reason=reason)

    def _on_profile(self, fp: FidelityProfile) -> None:
        """A learned profile that changes what reconstructions do: to the reconstruction workers (or threads) and
        the store."""
        if self._pool is not None:
            self._pool.update_profile(fp)
        asyncio.get_running_loop().create_task(self._save_profiles([fp]))

    async def _save_profiles(self, profiles: list[FidelityProfile]) -> None:
        """Keep learned profiles in the run database (the next run starts from them)."""
        if not profiles or self.run_id is None:
            return
        fingerprint = self.reconstructor.tokenizer.fingerprint if self.reconstructor is not None else ""
        try:
            await self._gate.commit(lambda: save_profiles(self.store, profiles, fingerprint))
        except Exception as exc:  # the profiles are learned again by the next run's probes
            self.events.note("warning", "fidelity", f"could not store the learned fidelity profiles: {exc}")

    def _on_quality(self, d: QualityDecision) -> None:
        self._steering.on_quality(d)

    def _store_changed(self, error: StoreWriteError | None) -> None:
        self._health.changed(error)

    # ---- what the operator sees ------------------------------------------------------------------

    def events_since(self, after_id: int) -> list[EngineEvent]:
        """Events this engine wrote after `after_id` (the latest 1,000 are kept in memory)."""
        return self.events.since(after_id)

    def snapshot(self) -> RunRecord:
        """The run's record now: this engine's live figures (no I/O) and the store's counts as last read
        (app.engine.work.counts: re-read in a thread after the database changed while the run runs, at once
        while it does not, so a paused or finished run's record is exact). Cheap enough for 4 Hz polling."""
        now = time.monotonic()
        endpoints, ledger = self.endpoints, self._ledger
        n = len(endpoints)
        wire, waiting = self._live.flights.per_endpoint() if self._live is not None else ([0] * n, [0] * n)
        clock = loop_now()
        eps = tuple(
            ep.metrics.snapshot(
                now,
                wire[i],
                ep.limit.limit,
                waiting=waiting[i],
                limit_reason=ep.limit.reason(clock),
                capacity=ep.limit.capacity_estimate,
            )
            for i, ep in enumerate(endpoints)
        )
        tot = ledger.total_metrics
        lat50, lat95 = tot.latency_ms.quantiles(now)
        t50, t95 = tot.ttft_ms.quantiles(now)
        spent = ledger.budget.spent_usd
        eta, projected = self._forecast.eta_and_cost(now, spent, ledger.counts.remaining, endpoints)
        live = LiveFigures(
            state=self.state,
            state_reason=self.state_reason,
            started_at=self._state.started_at,
            in_flight=sum(wire),
            waiting=sum(waiting),
            concurrency_limit=total_limit(endpoints),
            rate=tot.rates.rate(now),
            latency_p50_ms=lat50,
            latency_p95_ms=lat95,
            ttft_p50_ms=t50,
            ttft_p95_ms=t95,
            cost_per_hour=cost_per_hour(spent - ledger.spent_at_start, self._state.elapsed_s(now)),
            eta_s=eta,
            projected_cost_usd=projected,
            endpoints=eps,
        )
        counts = RunCounts()
        if self.run_id is not None:
            follower = follower_of(self, self.db_path, self.run_id)
            counts = follower.counts(
                background=self.state == "running" and self._live is not None and len(self._live.flights) > 0
            )
        return RunRecord(
            run_name=self.config.run.name,
            state=self.state,
            counts=counts,
            state_reason=self.state_reason,
            engine=IN_PROCESS,
            engine_text=f"engine pid {os.getpid()} in this process",
            live=live,
            budget_usd=self.config.limits.budget_usd,
            read_at=time.time(),
        )
