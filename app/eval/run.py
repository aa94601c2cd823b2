"""The eval engine: a run config's prompts driven at the endpoints' capacity, every answer stored with the
server's acceptance figures as given.

It reuses the generation engine's pieces rather than being a second program: the prompts are ingested into the
run's `samples` by `app.engine.work.config_ingest` (resumable, checked at the boundary), the endpoints (clients,
built-in simulators, their `AdaptiveLimit`s) come from `app.engine.capacity.endpoints`, retries from
`app.providers.retry`, and every answer is one transaction through the one writer (`RunStore.write`,
`app.store.eval_ops`). Each prompt goes to each eval endpoint (the drafter endpoints and the baseline); a run
that stopped resumes with the pairs not answered yet.

The run is steered like a generation run (`app.engine.control.RunControl`): `pause` starts no new request (those in
flight finish) and `resume` goes on; in-process the monitor calls them, from another process a viewer queues them
in the `commands` table, which the run polls about twice a second while it beats its heartbeat (`engine_heartbeats`,
with its progress as `{"eval": {...}}`), so an attached viewer tells a live eval from a gone one.

An endpoint whose first answer carries no acceptance figures is named at once (an event and the `on_notice`
callback) with what to turn on; its requests are stored without figures and never averaged in as zero.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.config import RunConfig
from app.engine.capacity.endpoints import Endpoint, close_endpoints, open_endpoints
from app.engine.work.config_ingest import ingest_config
from app.errors import EaglewatchError, InputError
from app.eval.acceptance import VLLM_HINT, spec_figures
from app.eval.figures import is_loop
from app.providers.exceptions import ProviderError, RetryableError, SampleFatalError
from app.providers.retry import RetryPolicy, with_retries
from app.records import Completion
from app.store import eval_ops
from app.store.heartbeat import beat_op, stop_op, this_host
from app.store.rows import EvalRequestRow
from app.store.run_store import RunStore

OVERLOAD_STATUSES = (429, 503, 529)
AUTH_STATUSES = (401, 403)
MAX_OVERLOADS = 50  # load refusals one request waits out before they count as its attempts


class _Overloaded(Exception):
    """A 429/503/529: the request goes back in the queue (not an attempt; app.eval.run `EvalRun._drive`)."""

    def __init__(self, error: RetryableError) -> None:
        super().__init__(str(error))
        self.error = error


EXIT_STOPPED = 3  # app.errors: a run stopped by the provider


class EvalStopped(EaglewatchError):
    """The eval stopped at once: an endpoint refused the credentials (every request after it would fail too)."""

    exit_code = EXIT_STOPPED


STEER_POLL_S = 0.5  # how often the run takes viewers' commands and beats its heartbeat
PAUSED_REASON = "paused by the operator: no new request starts; requests in flight finish"


@dataclass
class EvalProgress:
    """What a face shows while an eval runs."""

    total: int = 0
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    paused: bool = False
    notices: list[str] = field(default_factory=list)

    def as_json(self) -> str:
        """The heartbeat's snapshot of an eval run (`{"eval": {...}}`: no generation reader takes it for its own)."""
        return json.dumps(
            {"eval": {k: getattr(self, k) for k in ("total", "done", "failed", "in_flight", "paused")}},
            separators=(",", ":"),
        )


def sampling_extra(config: RunConfig) -> dict[str, Any]:
    """The request fields an eval sends: its own sampling, over the run's [generation] values."""
    ev = config.eval
    assert ev is not None
    extra: dict[str, Any] = {"temperature": ev.temperature, "top_p": ev.top_p, "max_tokens": ev.max_tokens}
    if ev.top_k is not None:
        extra["top_k"] = ev.top_k
    if ev.thinking is not None:
        extra["chat_template_kwargs"] = {"enable_thinking": ev.thinking}
    return extra


def request_row(
    run_id: int,
    work: eval_ops.EvalWork,
    endpoint: str,
    drafter: str | None,
    completion: Completion,
    config: RunConfig,
    template: dict[str, Any] | None = None,
) -> EvalRequestRow:
    """The stored row of one answer: ids, timings and the server's acceptance figures as given."""
    ev = config.eval
    assert ev is not None
    ids = tuple(completion.token_ids or ())
    n = len(ids) or completion.usage.completion_tokens
    total_s = completion.total_s
    ttft_s = completion.ttft_s
    itl_ms = (total_s - ttft_s) * 1000 / (n - 1) if ttft_s is not None and n > 1 else None
    spec = spec_figures(completion.raw)
    return EvalRequestRow(
        run_id=run_id,
        sample_pk=work.sample_pk,
        endpoint=endpoint,
        drafter=drafter,
        category=work.category,
        output_ids=ids,
        completion_tokens=n,
        ttft_ms=None if ttft_s is None else ttft_s * 1000,
        itl_ms=None if itl_ms is None else max(itl_ms, 0.0),
        latency_ms=total_s * 1000,
        tokens_per_s=n / total_s if total_s > 0 else None,
        spec_source=None if spec is None else spec.source,
        spec=None if spec is None else spec.spec,
        accepted=None if spec is None else spec.accepted,
        drafted=None if spec is None else spec.drafted,
        steps=None if spec is None else spec.steps,
        per_position=None if spec is None else spec.per_position,
        loop=bool(ids) and is_loop(ids, min_repeat=ev.loop_min_repeat, share=ev.loop_share),
        sampling=sampling_extra(config),
        created_at=time.time(),
        prompt_ids=completion.prompt_token_ids,
        template=template,
    )


class EvalRun:
    """One eval run over `config` (which must have an [eval] table). `await run()` returns the run's id."""

    def __init__(
        self,
        config: RunConfig,
        *,
        on_progress: Callable[[EvalProgress], None] | None = None,
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        if config.eval is None:
            raise InputError(
                f"{config.source or 'the config'}: has no [eval] table; add one (at least `drafter = ...`) "
                "to run an eval"
            )
        self.config = config
        self.eval = config.eval
        self.progress = EvalProgress()
        self._on_progress = on_progress
        self._on_notice = on_notice
        self._checked: set[str] = set()
        self.run_id = 0
        self._stop: EvalStopped | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._windows: dict[str, _CounterWindows] = {}
        self._tokenizer: Any = None
        self._overloads: dict[tuple[str, int], int] = {}
        self.state = "idle"  # idle | running | paused | done | failed
        self._store: RunStore | None = None
        self._go = asyncio.Event()
        self._go.set()
        self._started_at = time.time()

    # --- RunControl: the monitor's keys in-process, the `commands` table from another process ---------------
    async def pause(self, now: bool = False) -> None:
        """Start no new request; those in flight finish (`now` is the same for an eval: nothing is cancelled)."""
        if self.progress.paused or self.state not in ("running", "idle"):
            return
        self._go.clear()
        self.progress.paused = True
        self.state = "paused"
        if self._store is not None and self.run_id:
            await self._store.set_run_state(self.run_id, "paused", PAUSED_REASON)
            await self._store.add_event(self.run_id, "info", "run", PAUSED_REASON)
        self._tick()

    async def resume(self) -> None:
        """Go on starting requests after a pause."""
        if not self.progress.paused:
            return
        self.progress.paused = False
        self.state = "running"
        self._go.set()
        if self._store is not None and self.run_id:
            await self._store.set_run_state(self.run_id, "running")
            await self._store.add_event(self.run_id, "info", "run", "resumed by the operator")
        self._tick()

    async def set_concurrency(self, limit: int) -> None:
        """Not offered for an eval (each endpoint's adaptive limit sets its own): said as an event."""
        if self._store is not None and self.run_id:
            await self._store.add_event(
                self.run_id, "warning", "run", f"set_concurrency {limit} ignored: an eval's endpoints set their own"
            )

    async def retry_failed(self) -> None:
        """An eval retries its failed requests when it is run again: said as an event."""
        if self._store is not None and self.run_id:
            await self._store.add_event(
                self.run_id, "info", "run", "failed eval requests are retried when the eval is run again"
            )

    async def _steer(self, store: RunStore) -> None:
        """Take viewers' commands and beat the heartbeat, about twice a second, until cancelled."""
        pid, host = os.getpid(), this_host()
        while True:
            try:
                for cmd in await store.take_commands(self.run_id):
                    if cmd.verb == "pause":
                        await self.pause()
                    elif cmd.verb == "resume":
                        await self.resume()
                    elif cmd.verb == "set_concurrency":
                        await self.set_concurrency(int((cmd.args or {}).get("limit", 0) or 0))
                    elif cmd.verb == "retry_failed":
                        await self.retry_failed()
                    else:
                        await store.add_event(self.run_id, "warning", "run", f"unknown command {cmd.verb!r} ignored")
                await store.write(
                    beat_op(
                        self.run_id,
                        pid=pid,
                        host=host,
                        started_at=self._started_at,
                        now=time.time(),
                        snapshot_json=self.progress.as_json(),
                    )
                )
            except Exception as exc:  # a transient database error must not stop the eval
                if self._on_notice is not None:
                    self._on_notice(f"could not read operator commands: {exc}")
            await asyncio.sleep(STEER_POLL_S)

    async def _notice(self, store: RunStore, level: str, message: str) -> None:
        self.progress.notices.append(message)
        await store.add_event(self.run_id, level, "eval", message)
        if self._on_notice is not None:
            self._on_notice(message)

    def _tick(self) -> None:
        if self._on_progress is not None:
            self._on_progress(self.progress)

    async def run(self) -> int:
        config = self.config
        targets = config.eval_endpoints() + ([self.eval.baseline] if self.eval.baseline else [])
        store = await RunStore.open(config.run.database)
        self._store = store
        steering: asyncio.Task[None] | None = None
        try:
            await ingest_config(store, config)
            self.run_id = await store.ensure_run(config.run.name, config.redacted())
            run_id = self.run_id
            await store.write(lambda conn: eval_ops.mark_eval_run(conn, run_id))
            work = await store.read(lambda conn: eval_ops.eval_work(conn, run_id, targets))
            self.progress.total = len(work)
            self._tick()
            await store.set_run_state(run_id, "running")
            self.state = "running"
            steering = asyncio.create_task(self._steer(store))
            endpoints = await open_endpoints(config, started=time.time())
            try:
                live = {ep.name: ep for ep in endpoints.items}
                for name in self.eval.raw_completion_endpoints:
                    live[name] = _raw_endpoint(live[name])
                    endpoints.items.append(live[name])
                for name in targets:
                    if name != self.eval.baseline and live[name].config.base_url:
                        self._windows[name] = await _CounterWindows.open(
                            run_id, name, str(live[name].config.base_url), self.eval.counter_window_requests
                        )
                await asyncio.gather(
                    *(self._drive(store, live[name], [w for w in work if w.endpoint == name]) for name in targets)
                )
                if self._stop is not None:
                    raise self._stop
                for windows in self._windows.values():
                    await windows.close(store)
            finally:
                for windows in self._windows.values():
                    await windows.aclose()
                await close_endpoints(endpoints)
            self.state = "done" if self.progress.failed == 0 else "failed"
            self.progress.paused = False
            await store.set_run_state(
                run_id,
                self.state,
                None if self.progress.failed == 0 else f"{self.progress.failed} requests failed",
            )
        except EvalStopped as exc:
            await store.set_run_state(self.run_id, "failed", str(exc))
            raise
        except BaseException:
            self.state = "paused"
            if self.run_id:
                await store.set_run_state(
                    self.run_id, "paused", "the eval stopped before its end; run it again to resume"
                )
            raise
        finally:
            if steering is not None:
                steering.cancel()
                await asyncio.gather(steering, return_exceptions=True)
                await store.write(
                    stop_op(self.run_id, pid=os.getpid(), now=time.time(), snapshot_json=self.progress.as_json())
                )
            self._store = None
            await store.close()
        return self.run_id

    async def _drive(self, store: RunStore, ep: Endpoint, work: list[eval_ops.EvalWork]) -> None:
        """Send `work` to one endpoint, as many at once as its adaptive limit allows. A request the server refuses
        for load (429/503/529) gives its slot back and goes back in the queue after its Retry-After, so the limit,
        not a sleeping request, holds the endpoint's capacity (it is not counted as an attempt, up to
        MAX_OVERLOADS times)."""
        wake = asyncio.Event()
        queue = collections.deque(work)
        waiting = 0  # refused for load, waiting out their Retry-After
        tasks: set[asyncio.Task[None]] = set()
        drafter = None if ep.name == self.eval.baseline else self.eval.drafter
        loop = asyncio.get_running_loop()

        def requeue(item: eval_ops.EvalWork, delay_s: float) -> None:
            nonlocal waiting
            waiting += 1

            def back() -> None:
                nonlocal waiting
                waiting -= 1
                queue.append(item)
                wake.set()

            loop.call_later(max(0.0, delay_s), back)

        while self._stop is None and (queue or tasks or waiting):
            if queue and not self._go.is_set():  # paused: nothing new starts; requests in flight finish
                try:
                    await asyncio.wait_for(self._go.wait(), 0.05)
                except TimeoutError:
                    pass
                continue
            if queue and ep.limit.can_start(time.monotonic()):
                item = queue.popleft()
                ticket = ep.limit.take(time.monotonic())
                self.progress.in_flight += 1
                task = asyncio.create_task(self._one(store, ep, item, drafter, ticket, wake, requeue))
                tasks.add(task)
                self._tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(self._tasks.discard)
                continue
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), 0.05)
            except TimeoutError:
                pass
        if tasks:
            # a task cancelled by `_halt` ends as CancelledError; any other failure is raised as before
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                    raise result

    async def _one(self, store, ep: Endpoint, item, drafter, ticket, wake: asyncio.Event, requeue) -> None:  # noqa: ANN001
        config = self.config
        policy = RetryPolicy(attempts=config.generation.attempts)
        answered = False
        key = (ep.name, item.sample_pk)

        async def attempt() -> Completion:
            try:
                return await ep.client.complete(
                    item.messages, item.tools, model=config.model.name, extra=sampling_extra(config)
                )
            except RetryableError as exc:
                if exc.status in OVERLOAD_STATUSES and self._overloads.get(key, 0) < MAX_OVERLOADS:
                    raise _Overloaded(exc) from None
                raise

        try:
            started = time.monotonic()
            try:
                completion = await with_retries(attempt, policy)
            except _Overloaded as refused:
                ep.limit.mark_answered()
                answered = True
                self._overloads[key] = self._overloads.get(key, 0) + 1
                ep.limit.on_overload(time.monotonic(), refused.error.retry_after_s, ticket=ticket)
                requeue(item, refused.error.retry_after_s or 1.0)
                return
            except ProviderError as exc:
                ep.limit.mark_answered()
                answered = True
                if exc.status in AUTH_STATUSES and not isinstance(exc, SampleFatalError):
                    self._halt(ep, exc)
                    return
                row = EvalRequestRow(
                    run_id=self.run_id,
                    sample_pk=item.sample_pk,
                    endpoint=ep.name,
                    drafter=drafter,
                    category=item.category,
                    error=f"{type(exc).__name__}: {exc}",
                    created_at=time.time(),
                )
                await store.write(lambda conn: eval_ops.record_eval_request(conn, row))
                self.progress.failed += 1
                return
            ep.limit.mark_answered()
            answered = True
            ep.limit.on_success(
                ticket=ticket, latency_s=completion.ttft_s or (time.monotonic() - started), now=time.monotonic()
            )
            template = self._template(item, completion)
            row = request_row(self.run_id, item, ep.name, drafter, completion, config, template)
            await store.write(lambda conn: eval_ops.record_eval_request(conn, row))
            windows = self._windows.get(ep.name)
            if windows is not None:
                await windows.answered(store)
            if ep.name not in self._checked:
                self._checked.add(ep.name)
                if drafter is not None and row.spec_source is None:
                    windows = self._windows.get(ep.name)
                    counted = (
                        " Its /metrics has the spec-decode counters: their deltas per window are stored and "
                        "reported apart (server-wide, not per request)."
                        if windows is not None and windows.counting
                        else ""
                    )
                    await self._notice(
                        store,
                        "warning",
                        f"{ep.name}: its first answer carries no acceptance figures (speculative decoding off, or "
                        f"per-request metrics not enabled); its requests are stored without figures and never "
                        f"averaged in as zero. To measure: {VLLM_HINT}.{counted}",
                    )
            self.progress.done += 1
        finally:
            self.progress.in_flight -= 1
            ep.limit.release(answered=answered)
            wake.set()
            self._tick()

    def _halt(self, ep: Endpoint, exc: ProviderError) -> None:
        """Stop the whole eval at the first refused credential: every other request would be refused too."""
        if self._stop is not None:
            return
        url = ep.config.base_url or "its simulator"
        key = ep.config.api_key_env
        fix = (
            f"check the key in ${key} (and that it may use model {self.config.model.name!r})"
            if key
            else "the endpoint needs an API key: set api_key_env to the variable that holds it"
        )
        self._stop = EvalStopped(
            f"endpoint {ep.name!r} ({url}) refused the eval's requests with HTTP {exc.status} ({exc}); the eval "
            f"stopped at once, the answers so far are kept. To fix: {fix}, then run `eaglewatch eval` again"
        )
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()

    def _template(self, item: eval_ops.EvalWork, completion: Completion) -> dict[str, Any] | None:
        """The template guard's finding for an answer that carries the server's prompt ids (None: agree or none)."""
        if completion.prompt_token_ids is None:
            return None
        from app.eval.template import template_finding

        if self._tokenizer is None:
            from app.tokens.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.model.tokenizer)
        return template_finding(
            self._tokenizer,
            self.config.model.profile,
            item.messages,
            item.tools,
            completion.prompt_token_ids,
            thinking=self.eval.thinking is not False,
        )


def _raw_endpoint(ep: Endpoint) -> Endpoint:
    """`ep` with its client replaced by one that sends the raw prompt to /v1/completions (no chat template)."""
    import dataclasses

    from app.engine.capacity.endpoints import _api_key
    from app.providers.completions import RawCompletionClient

    return dataclasses.replace(ep, client=RawCompletionClient(ep.config, _api_key(ep.config)))


class _CounterWindows:
    """One endpoint's Prometheus counter windows: scraped at the start, after every `every` answers and at the
    end; each window's deltas stored (`eval_windows`). An endpoint without the counters gets none."""

    def __init__(self, run_id: int, endpoint: str, base_url: str, every: int, client: Any, first: Any) -> None:
        self.run_id, self.endpoint, self.base_url, self.every = run_id, endpoint, base_url, every
        self._client = client
        self._last = first
        self._since = time.time()
        self._answers = 0
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, run_id: int, endpoint: str, base_url: str, every: int) -> _CounterWindows:
        import httpx

        from app.eval.counters import scrape

        client = httpx.AsyncClient()
        return cls(run_id, endpoint, base_url, every, client, await scrape(client, base_url))

    @property
    def counting(self) -> bool:
        """Whether the endpoint's /metrics had the spec-decode counters at the start."""
        return self._last is not None

    async def answered(self, store: RunStore) -> None:
        self._answers += 1
        if self._last is not None and self._answers >= self.every:
            await self.close(store)

    async def close(self, store: RunStore) -> None:
        """Close the current window: scrape, store the deltas since the last scrape, start the next window."""
        from app.eval.counters import scrape

        if self._last is None:
            return
        async with self._lock:
            answers, self._answers = self._answers, 0
            if answers == 0:
                return
            now = await scrape(self._client, self.base_url)
            if now is None:
                return
            delta = now.minus(self._last)
            window = eval_ops.EvalWindow(
                self.run_id, self.endpoint, self._since, time.time(), answers, delta.drafts, delta.draft_tokens,
                delta.accepted, delta.per_position,
            )  # fmt: skip
            self._last, self._since = now, window.ended_at
            await store.write(lambda conn: eval_ops.record_eval_window(conn, window))

    async def aclose(self) -> None:
        await self._client.aclose()
