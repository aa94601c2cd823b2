"""A Run: lease pending samples, send them to the endpoints, store every result, steer it live.

One asyncio task schedules: it leases samples in batches, checks pause, budget and the rate buckets,
waits for a slot on some endpoint (adaptive limit per endpoint, picked by weight) and starts one request
task per sample. A request task retries retryable errors itself (releasing its slot while it waits, so
each retry is paced under the current limit), passes the completion through the Reconstructor in a
thread pool, and stores response, reconstruction, cost and the sample's new state in one transaction.
A second task polls the `commands` table about once a second for attached viewers.

Crash safety comes from the store: a sample is `leased` until its result commits; a fresh engine expires
every lease of its own run at start (an exclusive lock file next to the database makes sure no other
engine is running it), so a SIGKILL loses at most the requests that were in flight.
"""

from __future__ import annotations

import asyncio
import fcntl
import math
import os
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.budget import BudgetGuard, Prices, cost_per_hour, estimate_prompt_tokens, projected_total
from app.engine.buckets import TokenBucket
from app.engine.limiter import AdaptiveLimit, LimitChange
from app.engine.metrics import EndpointMetrics
from app.engine.reconstruct import PassThroughReconstructor
from app.store import tallies
from app.store.queries import EventRow
from app.engine.slots import EndpointSlots
from app.engine.snapshot import MetricsSnapshot
from app.errors import EaglewatchError, InputError
from app.records import Completion

OVERLOAD_STATUSES = (429, 503, 529)
OVERLOAD_CLASSES = ("429", "rate_limited", "overloaded", "529")
COMMAND_POLL_S = 1.0


EngineEvent = EventRow  # an operator event as the engine wrote it (also in the `events` table)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How a run ended in this process: done (every sample ended) or paused (with the reason)."""

    state: str
    reason: str | None
    stopping_error: bool = False


def _expire_all_leases_op(run_id: int):
    """Every lease of this run back to pending: called only while holding the run's EngineLock, so no
    other engine can own a lease (what remains is from an engine that died)."""

    def op(conn) -> int:
        return conn.execute(
            "UPDATE samples SET state = 'pending', lease_expires = NULL, updated_at = ? "
            "WHERE run_id = ? AND state = 'leased'",
            (time.time(), run_id),
        ).rowcount

    return op


class EngineLock:
    """An exclusive lock file per (database, run): a second engine on the same run is refused."""

    def __init__(self, db_path: Path, run_name: str) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_name)
        self.path = Path(f"{db_path}.{safe}.lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise EaglewatchError naming the holder's pid."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise EaglewatchError(
                f"another engine (pid {holder}) is already running this run ({self.path} is locked); "
                "attach to it with 'eaglewatch watch' or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class _Endpoint:
    """What the engine keeps per endpoint: its client, limit and metrics."""

    def __init__(self, config: Any, client: Any, limit: AdaptiveLimit, started: float) -> None:
        self.config = config
        self.name: str = config.name
        self.client = client
        self.limit = limit
        self.metrics = EndpointMetrics(config.name, started)


class Run:
    """One run of a config over a store; implements `RunControl` in-process."""

    def __init__(
        self,
        config: Any,
        store: Any,
        *,
        reconstructor: Any | None = None,
        db_path: Path | None = None,
        resume_paused: bool = False,
        clients: dict[str, Any] | None = None,
        lease_batch: int | None = None,
        retry_policy: Any | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.reconstructor = reconstructor or PassThroughReconstructor()
        tok = getattr(self.reconstructor, "tokenizer", None)
        self._tokenizer_fingerprint = str(getattr(tok, "fingerprint", "") or "")
        self.db_path = Path(db_path or getattr(store, "path", None) or config.run.database)
        self.resume_paused = resume_paused
        self._given_clients = clients or {}
        self._lease_batch = lease_batch
        self._retry_policy = retry_policy
        self.run_id: int | None = None
        self.state = "idle"
        self.state_reason: str | None = None
        self.stopping_error = False
        self._lock = EngineLock(self.db_path, config.run.name)
        self._endpoints: list[_Endpoint] = []
        self._slots: EndpointSlots | None = None
        self._simulators: list[Any] = []
        self._queue: deque[Any] = deque()
        self._prefetch: asyncio.Future | None = None
        self._lease_empty_at = -1e9
        self._tasks: set[asyncio.Task] = set()
        self._inflight_pks: dict[asyncio.Task, int] = {}
        self._main: list[asyncio.Task] = []
        self._wake = asyncio.Event()
        self._settled = asyncio.Event()
        self._finished = asyncio.Event()
        self._idle = asyncio.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._events: deque[EngineEvent] = deque(maxlen=1000)
        self._event_seq = 0
        self._t0 = time.time()
        self._m0 = time.monotonic()
        self.total_metrics = EndpointMetrics("all", self._m0)
        self._counts: Counter[str] = Counter()
        self._verdicts: Counter[str] = Counter()
        self._strategies: Counter[str] = Counter()
        self._spent_at_start = 0.0
        self._req_bucket: TokenBucket | None = None
        self._tok_bucket: TokenBucket | None = None
        lim = config.limits
        prices = config.pricing.get(config.model.name)
        self.budget = BudgetGuard(
            lim.budget_usd,
            Prices(prices.prompt_per_m, prices.completion_per_m) if prices else None,
            config.generation.max_tokens,
        )

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
        self.run_id = await self.store.ensure_run(cfg.run.name, cfg.redacted())
        recovered = await self.store.write(_expire_all_leases_op(self.run_id))
        if recovered:
            await self._event("info", "run", f"{recovered} leased samples from an earlier engine returned to pending")
        self._counts = Counter(await self.store.counts(self.run_id))
        self._spent_at_start = await self.store.spent_usd(self.run_id)
        self.budget.spent_usd = self._spent_at_start
        await self._load_verdict_counts()
        stored_state, stored_reason = await self._stored_state()
        loop = asyncio.get_running_loop()
        now = loop.time()
        if cfg.limits.requests_per_min:
            self._req_bucket = TokenBucket(cfg.limits.requests_per_min, now=now)
        if cfg.limits.tokens_per_min:
            self._tok_bucket = TokenBucket(cfg.limits.tokens_per_min, now=now)
        await self._open_endpoints()
        if self.reconstructor is not None and not isinstance(self.reconstructor, PassThroughReconstructor):
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="reconstruct")
        if stored_state == "paused" and not self.resume_paused:
            self.state, self.state_reason = "paused", stored_reason or "paused before restart"
            await self._event("info", "run", f"run is paused ({self.state_reason}); resume to continue")
        else:
            await self._set_state("running", None)
            await self._event("info", "run", f"engine started (pid {os.getpid()}) with {len(self._endpoints)} endpoint(s)")
        self._main = [
            asyncio.create_task(self._schedule(), name="eaglewatch-schedule"),
            asyncio.create_task(self._poll_commands(), name="eaglewatch-commands"),
        ]

    async def _open_endpoints(self) -> None:
        cfg = self.config
        lim = cfg.limits
        total_w = sum(e.weight for e in cfg.endpoints)
        limits = []
        for ep in cfg.endpoints:
            share = ep.weight / total_w
            # the configured min/max bound the run's total; each endpoint gets its weight's share
            maximum = max(1, min(ep.max_concurrency, math.ceil(lim.concurrency_max * share)))
            minimum = min(max(1, math.floor(lim.concurrency_min * share)), maximum)
            initial = max(minimum, round(lim.concurrency_initial * share))
            limit = AdaptiveLimit(initial, minimum, maximum)
            client = self._given_clients.get(ep.name)
            if client is None:
                client = await self._make_client(ep)
            self._endpoints.append(_Endpoint(ep, client, limit, self._m0))
            limits.append(limit)
        self._slots = EndpointSlots(limits, [e.weight for e in cfg.endpoints])

    async def _make_client(self, ep: Any) -> Any:
        from app.providers.client import ChatClient

        if ep.simulator is not None:
            from app.simulator.server import SimulatorServer

            cfg = self.config
            kwargs = {}
            if cfg.pricing.get(cfg.model.name) is not None:
                kwargs["pricing"] = cfg.pricing[cfg.model.name]
            server = SimulatorServer(
                ep.simulator, tokenizer_dir=cfg.model.tokenizer,
                reference=ep.simulator.reference or cfg.data.reference, model=cfg.model.name,
                profile=cfg.model.profile, **kwargs,
            )
            await server.start()
            self._simulators.append(server)
            ep = ep.model_copy(update={"base_url": server.base_url, "simulator": None})
            await self._event("info", "endpoint", f"{ep.name}: built-in simulator listening on {server.base_url}")
        api_key = None
        if ep.api_key_env:
            api_key = os.environ.get(ep.api_key_env)
            if not api_key:
                raise InputError(
                    f"endpoint {ep.name!r}: the environment variable {ep.api_key_env} named by api_key_env is "
                    "not set or empty; export it before starting the run"
                )
        return ChatClient(ep, self.config.generation, api_key)

    async def wait(self) -> RunOutcome:
        """Wait until every sample has ended, or the run is paused with nothing in flight."""
        await self._idle.wait()
        return self.outcome

    async def wait_finished(self) -> None:
        """Wait until every sample has ended (a paused run keeps waiting for resume)."""
        await self._finished.wait()

    @property
    def outcome(self) -> RunOutcome:
        return RunOutcome(self.state, self.state_reason, self.stopping_error)

    async def close(self, *, cancel_in_flight: bool = True) -> None:
        """Stop scheduling; cancel (or let finish) in-flight requests, release leases, free the lock."""
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
        elif self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self._release_queue()
        if self.state == "running":
            # Viewers attached to the database must not show a live run that no engine drives.
            self.state, self.state_reason = "paused", "engine stopped"
            try:
                await self.store.set_run_state(self.run_id, "paused", self.state_reason)
            except Exception:
                pass
        await self._teardown()

    async def _teardown(self) -> None:
        for ep in self._endpoints:
            aclose = getattr(ep.client, "aclose", None)
            if aclose is not None and ep.name not in self._given_clients:
                try:
                    await aclose()
                except Exception:
                    pass
        for server in self._simulators:
            try:
                await server.close()
            except Exception:
                pass
        self._simulators = []
        if self._slots is not None:
            self._slots.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._lock.release()

    # ---- control (RunControl) --------------------------------------------------------------------

    async def pause(self, now: bool = False, reason: str = "operator") -> None:
        """Lease nothing new; with now=True also cancel in-flight requests (providers may still bill)."""
        if self.state in ("done",):
            return
        await self._set_state("paused", reason)
        await self._event("info", "run", f"run paused ({reason})")
        await self._release_queue()
        if now:
            await self._cancel_in_flight(reason=reason)
        self._wake.set()
        self._check_idle()

    async def resume(self) -> None:
        """Continue leasing after a pause (operator, budget or run-stopping error)."""
        if self.state != "paused":
            return
        self.stopping_error = False
        await self._set_state("running", None)
        await self._event("info", "run", "run resumed")
        self._idle.clear()
        self._wake.set()

    async def set_concurrency(self, limit: int) -> None:
        """Set the total in-flight limit, spread over the endpoints by weight and clamped to min/max."""
        total_w = sum(e.config.weight for e in self._endpoints)
        parts = []
        for ep in self._endpoints:
            parts.append(ep.limit.set_limit(max(1, round(limit * ep.config.weight / total_w))))
        await self._event("info", "concurrency", f"concurrency set to {sum(parts)} by the operator")
        if self._slots is not None:
            self._slots.wake()

    async def job_command(self, job_id: int, verb: str) -> None:
        """Extraction jobs are steered by the jobs runner, not the generation engine."""
        await self._event("warning", "job", f"job {job_id}: '{verb}' must be sent to the jobs runner, not the engine")

    # ---- scheduling ------------------------------------------------------------------------------

    def _total_limit(self) -> int:
        return sum(ep.limit.limit for ep in self._endpoints)

    async def _schedule(self) -> None:
        try:
            await self._schedule_loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never stall silently: tell the operator and let wait() return
            self.state, self.state_reason = "failed", f"engine error: {exc}"[:200]
            try:
                await self._event("error", "run", f"the scheduler stopped: {exc!r}; the run can be resumed by "
                                  "running it again once the cause is fixed")
                await self.store.set_run_state(self.run_id, "paused", self.state_reason)
            finally:
                self._idle.set()

    async def _schedule_loop(self) -> None:
        loop = asyncio.get_running_loop()
        lease_s = self.config.limits.lease_s
        while True:
            if self.state != "running":
                self._check_idle()
                self._wake.clear()
                await self._wake.wait()
                continue
            self._absorb_prefetch()
            if len(self._queue) <= self._total_limit() and self._prefetch is None \
                    and loop.time() - self._lease_empty_at > 0.5:
                n = self._lease_batch or max(16, min(512, 2 * self._total_limit()))
                self._prefetch = asyncio.ensure_future(self.store.lease(self.run_id, n, lease_s))
            if not self._queue:
                if self._prefetch is not None:
                    await asyncio.wait({self._prefetch})
                    self._absorb_prefetch()
                if not self._queue:
                    if not self._tasks and self._prefetch is None:
                        await self._finish_if_ended()
                        if self.state != "running":
                            continue
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), 0.5)
                    except TimeoutError:
                        pass
                    continue
            sample = self._queue[0]
            prompt_est = estimate_prompt_tokens(sample.messages, sample.tools)
            worst = self.budget.worst_case(prompt_est)
            if not self.budget.allows(worst):
                if self._tasks:
                    self._settled.clear()
                    await self._settled.wait()
                    continue
                spent = self.budget.spent_usd
                await self._event(
                    "warning", "budget",
                    f"budget ${self.config.limits.budget_usd:.4f} reached: spent ${spent:.4f}, the next request "
                    f"could cost up to ${worst:.4f}; raise limits.budget_usd and resume to continue",
                )
                await self.pause(reason="budget reached")
                continue
            if not await self._wait_buckets(loop, prompt_est):
                continue
            index = await self._slots.acquire()
            # A pause (or pause-now) while we waited for a slot may have emptied or refilled the queue.
            if self.state != "running" or not self._queue or self._queue[0] is not sample:
                self._slots.release(index)
                continue
            self._queue.popleft()
            self.budget.reserve(worst)
            task = asyncio.create_task(self._request(sample, index, worst, prompt_est))
            self._tasks.add(task)
            self._inflight_pks[task] = sample.pk

    def _absorb_prefetch(self) -> None:
        """Move a finished background lease into the queue (leases are fetched ahead so the queue never runs dry)."""
        fut = self._prefetch
        if fut is None or not fut.done():
            return
        self._prefetch = None
        leased = fut.result()
        if not leased:
            self._lease_empty_at = asyncio.get_running_loop().time()
            return
        self._queue.extend(leased)
        self._counts["pending"] -= len(leased)
        self._counts["leased"] += len(leased)

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

    async def _request(self, sample: Any, index: int, reserved: float, prompt_est: int) -> None:
        loop = asyncio.get_running_loop()
        from app.providers.errors import RetryableError, RunStoppingError, SampleFatalError
        from app.providers.retry import RetryPolicy, delay_for

        policy = self._retry_policy or RetryPolicy(attempts=self.config.generation.attempts)
        ep = self._endpoints[index]
        slot_held = True
        settled = False
        try:
            for n in range(policy.attempts):
                ep = self._endpoints[index]
                try:
                    completion = await ep.client.complete(
                        sample.messages, sample.tools, model=self.config.model.name, extra=ep.config.extra or None
                    )
                except RetryableError as exc:
                    self._note_overload(ep, exc, loop.time())  # before the release wakes a waiter
                    self._release_slot(index)
                    slot_held = False
                    final = n + 1 >= policy.attempts
                    self._note_error(ep, exc.error_class, final=final, retried=not final)
                    if exc.cost_usd:
                        self.budget.settle(0.0, exc.cost_usd)
                    if final:
                        self.budget.settle(reserved, 0.0)
                        settled = True
                        await self.store.record_failure(
                            self.run_id, sample.pk, exc.error_class, str(exc), final=True, cost_usd=exc.cost_usd,
                            endpoint=ep.name, attempt=sample.attempts,
                        )
                        self._counts["leased"] -= 1
                        self._counts["failed"] += 1
                        return
                    await self._log_attempt(sample.pk, sample.attempts, ep.name, exc)
                    await asyncio.sleep(delay_for(exc, n, policy))
                    index = await self._slots.acquire()
                    slot_held = True
                    continue
                except SampleFatalError as exc:
                    self._release_slot(index)
                    slot_held = False
                    self._note_error(ep, exc.error_class, final=True, retried=False)
                    self.budget.settle(reserved, exc.cost_usd)
                    settled = True
                    await self.store.record_failure(
                        self.run_id, sample.pk, exc.error_class, str(exc), final=True, cost_usd=exc.cost_usd,
                        endpoint=ep.name, attempt=sample.attempts,
                    )
                    self._counts["leased"] -= 1
                    self._counts["failed"] += 1
                    return
                except RunStoppingError as exc:
                    first = self.state == "running"
                    if first:  # stop leasing before any await lets the scheduler start another request
                        self.state, self.state_reason = "paused", f"{exc.error_class}: {exc}"[:200]
                        self.stopping_error = True
                    self._release_slot(index)
                    slot_held = False
                    self._note_error(ep, exc.error_class, final=False, retried=False)
                    self.budget.settle(reserved, exc.cost_usd)
                    settled = True
                    await self._log_attempt(sample.pk, sample.attempts, ep.name, exc)
                    await self.store.release(self.run_id, [sample.pk])
                    self._counts["leased"] -= 1
                    self._counts["pending"] += 1
                    if first:
                        await self._event(
                            "error", "endpoint",
                            f"{ep.name}: {exc} — the run is paused so the queue is not burnt; fix the cause "
                            "(key, credits, permissions) and resume",
                        )
                        await self.pause(reason=self.state_reason)
                    return
                # success
                saturated = self._slots.waiting > 0 or ep.limit.in_flight >= ep.limit.limit
                self._release_slot(index)
                slot_held = False
                change = ep.limit.on_success(saturated)
                if change is not None:
                    self._slots.wake()
                settled = True  # _store_result settles the reservation with the real cost
                await self._store_result(sample, ep, completion, reserved)
                return
        except asyncio.CancelledError:
            if slot_held:
                self._release_slot(index)
            if not settled:
                self.budget.settle(reserved, 0.0)
            raise
        finally:
            task = asyncio.current_task()
            self._tasks.discard(task)
            self._inflight_pks.pop(task, None)
            self._settled.set()
            if not self._tasks:
                self._wake.set()
                self._check_idle()

    async def _store_result(self, sample: Any, ep: _Endpoint, completion: Completion, reserved: float) -> None:
        from app.providers.pricing import cost_of

        cost = cost_of(completion.usage, self.config.pricing.get(self.config.model.name))
        if self._pool is not None:
            loop = asyncio.get_running_loop()
            reconstruction, verdict = await loop.run_in_executor(
                self._pool, self.reconstructor.process, completion, sample.reference_ids
            )
        else:
            reconstruction, verdict = self.reconstructor.process(completion, sample.reference_ids)
        truncated = completion.truncated
        self.budget.settle(reserved, cost)
        # shielded: a pause-now cancellation must not abandon a result that is already being committed
        await asyncio.shield(self.store.record_result(
            self.run_id, sample.pk, sample.attempts, ep.name, completion, cost,
            reconstruction, verdict, sample.reference_ids,
            profile=self.config.model.profile, tokenizer=self._tokenizer_fingerprint,
        ))
        if self._tok_bucket is not None:
            used = completion.usage.prompt_tokens + completion.usage.completion_tokens
            est = estimate_prompt_tokens(sample.messages, sample.tools) + self.config.generation.max_tokens
            self._tok_bucket.adjust(used - est, asyncio.get_running_loop().time())
        now = time.monotonic()
        for m in (ep.metrics, self.total_metrics):
            m.record_completion(now, completion.usage.completion_tokens, completion.total_s, completion.ttft_s,
                                cost, truncated)
        self._counts["leased"] -= 1
        self._counts["done"] += 1
        if verdict is not None:
            self._verdicts[verdict.category] += 1
        if reconstruction is not None:
            self._strategies[reconstruction.strategy] += 1

    def _release_slot(self, index: int) -> None:
        self._slots.release(index)

    def _note_overload(self, ep: _Endpoint, exc: Any, now: float) -> None:
        if exc.status in OVERLOAD_STATUSES or exc.error_class in OVERLOAD_CLASSES:
            change = ep.limit.on_overload(now, exc.retry_after_s)
            if change is not None:
                self._limit_event(ep, change)

    def _limit_event(self, ep: _Endpoint, change: LimitChange) -> None:
        msg = f"{ep.name}: concurrency reduced from {change.old} to {change.new} (retrying in {change.cooldown_s:g}s)"
        asyncio.get_running_loop().create_task(self._event("warning", "concurrency", msg))

    def _note_error(self, ep: _Endpoint, error_class: str, *, final: bool, retried: bool) -> None:
        for m in (ep.metrics, self.total_metrics):
            m.record_error(error_class, final=final, retried=retried)

    async def _cancel_in_flight(self, reason: str) -> None:
        tasks = list(self._tasks)
        if not tasks:
            return
        pks = [self._inflight_pks[t] for t in tasks if t in self._inflight_pks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if pks:
            await self.store.release(self.run_id, pks)
            self._counts["leased"] -= len(pks)
            self._counts["pending"] += len(pks)
            await self._event(
                "warning", "run",
                f"cancelled {len(pks)} in-flight requests ({reason}); their samples return to pending. "
                "Providers may still bill for requests they had started.",
            )

    async def _release_queue(self) -> None:
        if self._prefetch is not None:
            await asyncio.wait({self._prefetch})
            self._absorb_prefetch()
        if not self._queue:
            return
        pks = [s.pk for s in self._queue]
        self._queue.clear()
        await self.store.release(self.run_id, pks)
        self._counts["leased"] -= len(pks)
        self._counts["pending"] += len(pks)

    async def _finish_if_ended(self) -> None:
        counts = await self.store.counts(self.run_id)
        self._counts = Counter(counts)
        if counts.get("pending", 0) == 0 and counts.get("leased", 0) == 0:
            await self._set_state("done", None)
            done, failed = counts.get("done", 0), counts.get("failed", 0)
            await self._event("info", "run", f"run finished: {done} done, {failed} failed")
            self._finished.set()
            self._idle.set()

    def _check_idle(self) -> None:
        if self.state == "done" or (self.state == "paused" and not self._tasks):
            self._idle.set()

    async def _poll_commands(self) -> None:
        while True:
            await asyncio.sleep(COMMAND_POLL_S)
            try:
                commands = await self.store.take_commands(self.run_id)
            except Exception as exc:  # a transient database error must not kill the engine
                await self._event("warning", "run", f"could not read operator commands: {exc}")
                continue
            for cmd in commands:
                await self.apply_command(cmd.verb, cmd.args or {})

    async def apply_command(self, verb: str, args: dict) -> None:
        """Carry out one control command from the `commands` table."""
        if verb == "pause":
            await self.pause(now=bool(args.get("now", False)))
        elif verb == "resume":
            await self.resume()
        elif verb == "set_concurrency":
            await self.set_concurrency(int(args.get("limit", args.get("value", 0)) or 0))
        else:
            await self._event("warning", "run", f"unknown operator command {verb!r} ignored")

    # ---- state and events ------------------------------------------------------------------------

    async def _set_state(self, state: str, reason: str | None) -> None:
        self.state, self.state_reason = state, reason
        await self.store.set_run_state(self.run_id, state, reason)

    async def _event(self, level: str, kind: str, message: str) -> None:
        self._event_seq += 1
        self._events.append(EngineEvent(self._event_seq, time.time(), level, kind, message))
        if self.run_id is not None:
            await self.store.add_event(self.run_id, level, kind, message)

    def events_since(self, after_id: int) -> list[EngineEvent]:
        """Events this engine wrote after `after_id` (the latest 1,000 are kept in memory)."""
        return [e for e in self._events if e.id > after_id]

    async def _stored_state(self) -> tuple[str | None, str | None]:
        run_id = self.run_id
        row = await self.store.read(
            lambda conn: conn.execute("SELECT state, reason FROM runs WHERE id = ?", (run_id,)).fetchone()
        )
        return (row[0], row[1]) if row else (None, None)

    async def _load_verdict_counts(self) -> None:
        run_id = self.run_id

        def fn(conn):
            return tallies.verdict_counts(conn, run_id), tallies.strategy_counts(conn, run_id)

        v, s = await self.store.read(fn)
        self._verdicts, self._strategies = Counter(v), Counter(s)

    async def _log_attempt(self, pk: int, attempt: int, endpoint: str, exc: Any) -> None:
        """Log a failed attempt (with what it was billed) without changing the sample's state."""
        row = (self.run_id, pk, attempt, endpoint, float(exc.cost_usd or 0.0), exc.error_class, str(exc)[:2000], time.time())

        def op(conn) -> None:
            conn.execute(
                "INSERT INTO responses (run_id, sample_pk, attempt, endpoint, cost_usd, error_class, error, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )

        await self.store.write(op)

    # ---- metrics ---------------------------------------------------------------------------------

    def snapshot(self) -> MetricsSnapshot:
        """An immutable view of the run now (no I/O; cheap enough for 4 Hz polling)."""
        now = time.monotonic()
        elapsed = now - self._m0
        eps = tuple(ep.metrics.snapshot(now, ep.limit.in_flight, ep.limit.limit) for ep in self._endpoints)
        tot = self.total_metrics
        lat50, lat95 = tot.latency_ms.quantiles(now)
        t50, t95 = tot.ttft_ms.quantiles(now)
        rate = tot.rates.rate(now)
        c = self._counts
        total = sum(max(0, v) for v in c.values())
        remaining = max(0, c["pending"]) + max(0, c["leased"])
        speed = rate.req_s_1m or rate.req_s_10s
        eta = remaining / speed if speed > 0 and remaining else (0.0 if not remaining else None)
        spent = self.budget.spent_usd
        return MetricsSnapshot(
            run_name=self.config.run.name, state=self.state, state_reason=self.state_reason,
            started_at=self._t0, elapsed_s=elapsed, eta_s=eta, total=total,
            pending=max(0, c["pending"]), leased=max(0, c["leased"]), done=c["done"], failed=c["failed"],
            skipped=c["skipped"], truncated=tot.truncated, retried=tot.retried,
            in_flight=len(self._tasks), concurrency_limit=self._total_limit(), rate=rate,
            throughput_history=tot.rates.history(now), latency_p50_ms=lat50, latency_p95_ms=lat95,
            ttft_p50_ms=t50, ttft_p95_ms=t95, errors_by_class=tuple(sorted(tot.errors.items())),
            cost_usd=spent, cost_per_hour=cost_per_hour(spent - self._spent_at_start, elapsed),
            projected_cost_usd=projected_total(spent, c["done"], remaining),
            budget_usd=self.config.limits.budget_usd,
            verdicts=tuple(sorted(self._verdicts.items())), strategies=tuple(sorted(self._strategies.items())),
            endpoints=eps,
        )
