"""The Reconstructor the engine uses: `app.tokens.Reconstructor` for the run's tokenizer and profile, wrapped
at start in `app.engine.verify.Rebuilder` with the endpoints' learned fidelity profiles, and where it runs.

`PassThroughReconstructor` is what a `Run` built without one uses (benchmarks of the request path alone, tests
of scheduling): the response text is stored as is and no reconstruction row is written.

`RebuildPool` runs the rebuilds off the event loop: in worker processes (`[run] rebuild_workers`; auto when
the machine has a core to spare) or in two threads of the engine's process. Rebuilding is pure CPU in Python
and the tokenizer, so threads share the event loop's core and GIL; a process gets its own. Each worker builds
its Rebuilder once from a `RebuildRecipe` (tokenizer folder, profile, fidelity profiles) and gets per call only
what the rebuild reads (the completion without its raw body, the reference ids, the messages and tools only
when the prompt check needs them). Each worker has at most IN_FLIGHT batches in flight: a worker with room
gets a result at once (the end of the loop's turn), and while all are full the results that arrive gather
into the next batch (one pickle and one pipe round trip for several results, and no timer adding latency). A worker that dies (BrokenProcessPool) loses nothing: the
calls it held are rebuilt in threads, and so is the rest of the run, with one operator event.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from app.records import Completion, Reconstruction, Verdict

AUTO_MAX_WORKERS = 4  # reconstruction is ~0.4 ms of a ~1 ms request: a few processes keep up with one loop
BATCH_MAX = 32  # results per pickled batch (bounds the latency one slow rebuild adds to its neighbours)
# batches in flight per worker: a second one waits in the worker's pipe while the first is rebuilt, so the
# trips to and from the worker (2-5 ms each on a loaded 2-core machine) overlap its work (measured +3-5%)
IN_FLIGHT = 2


class CompletionReconstructor(Protocol):
    """What the engine needs to rebuild a response's token ids (`app.tokens.Reconstructor`)."""

    def process(self, completion: Completion, reference_ids: tuple[int, ...] | None) -> tuple[Reconstruction | None, Verdict | None]: ...


class PassThroughReconstructor:
    """Stores text only: no reconstruction, verdict `unchecked`."""

    def process(self, completion: Completion, reference_ids: tuple[int, ...] | None) -> tuple[Reconstruction | None, Verdict | None]:
        """Return (None, None): nothing rebuilt, nothing compared."""
        return None, None


def build_reconstructor(config: Any) -> Any:
    """The tokens package's Reconstructor for the config's tokenizer and profile (a tiktoken model gets the
    profile's pre-tokeniser pattern). A tokenizer that fails to load is an operator error."""
    from app.tokens import Reconstructor, get_profile, load_tokenizer

    profile = get_profile(config.model.profile)
    return Reconstructor(profile, load_tokenizer(config.model.tokenizer, profile.pretokenizer_pattern))


async def open_rebuilder(reconstructor: Any, config: Any, db_path: Path) -> tuple[Any, list[str]]:
    """The engine's Rebuilder over `reconstructor` with the stored fidelity profiles of the config's endpoints
    (app.store.fidelity), and one sentence per profile loaded. A PassThroughReconstructor (or anything that is
    not a tokens Reconstructor) is returned as is."""
    from app.engine.verify import Rebuilder

    if isinstance(reconstructor, Rebuilder) or not hasattr(reconstructor, "measure_text_path"):
        return reconstructor, []
    from app.store.fidelity import load_profiles

    names = {e.name for e in config.endpoints}
    stored = await asyncio.to_thread(load_profiles, db_path, config.model.profile) if db_path.exists() else []
    profiles = [p for p in stored if p.endpoint in names]
    notes = [f"{p.endpoint}{f' / {p.provider}' if p.provider else ''}: applying the learned fidelity profile "
             f"({p.probes} probes) to rebuilds from text" for p in profiles]
    return Rebuilder(reconstructor, profiles), notes


@dataclass(frozen=True)
class RebuildRecipe:
    """What builds the engine's Rebuilder in a worker process (picklable, a few KB): the tokenizer folder
    (loaded with the profile's pre-tokeniser pattern, as `build_reconstructor` does), the profile, and the
    fidelity profiles (the run's own first, None when it has none). `fingerprint` checks that the worker
    loaded the same tokenizer files."""

    tokenizer_dir: str
    profile: Any  # app.tokens.Profile
    fingerprint: str
    fidelity: tuple[Any, ...]

    @classmethod
    def of(cls, reconstructor: Any) -> "RebuildRecipe | None":
        """The recipe of an `app.engine.verify.Rebuilder` over a tokenizer loaded from a folder; None for
        anything else (a test's reconstructor, a wrapper), which then rebuilds in threads."""
        from app.engine.verify import Rebuilder

        path = getattr(getattr(reconstructor, "tokenizer", None), "path", None)
        if not isinstance(reconstructor, Rebuilder) or path is None:
            return None
        return cls(str(path), reconstructor.profile, str(getattr(reconstructor.tokenizer, "fingerprint", "")),
                   reconstructor.fidelity_profiles)

    def build(self) -> Any:
        """The Rebuilder this recipe describes (loads the tokenizer: once per worker)."""
        from app.engine.verify import Rebuilder
        from app.errors import InputError
        from app.tokens import Reconstructor, load_tokenizer

        tok = load_tokenizer(self.tokenizer_dir, self.profile.pretokenizer_pattern)
        if str(getattr(tok, "fingerprint", "")) != self.fingerprint:
            raise InputError(f"{self.tokenizer_dir}: the tokenizer files changed since the engine loaded them")
        base = Reconstructor(self.profile, tok, self.fidelity[0])
        return Rebuilder(base, self.fidelity[1:])


# (completion without raw, reference ids, messages, tools, endpoint, measure): one rebuild's inputs
_Call = tuple[Completion, Any, Any, Any, str, bool]


def _call_of(completion: Completion, sample: Any, endpoint: str, measure: bool, *, light: bool) -> _Call:
    """One rebuild's inputs; `light` (crossing to a process) drops what the rebuild never reads: the raw
    body, and the messages and tools unless the server returned prompt ids to check them against."""
    if not light:
        return completion, sample.reference_ids, sample.messages, sample.tools, endpoint, measure
    checks = completion.prompt_token_ids is not None
    return (replace(completion, raw=None) if completion.raw is not None else completion, sample.reference_ids,
            sample.messages if checks else (), sample.tools if checks else None, endpoint, measure)


def _run_call(reconstructor: Any, call: _Call) -> Any:
    """The rebuild itself, the same in a thread and in a worker process: a Rebuilder measures probes' text
    path and checks prompt ids; any other reconstructor just processes."""
    from app.engine.verify import Rebuilder, Rebuilt

    completion, reference_ids, messages, tools, endpoint, measure = call
    if isinstance(reconstructor, Rebuilder):
        return reconstructor.rebuild(completion, reference_ids, messages, tools, endpoint=endpoint, measure=measure)
    return Rebuilt(*reconstructor.process(completion, reference_ids))


_WORKER: Any = None  # the worker process's Rebuilder (built once by _init_worker), or why it could not be


def worker_cores() -> list[int]:
    """The cores the rebuild workers run on: the machine's cores the engine's process is not pinned to, when
    it is pinned and some are left (the event loop keeps its core to itself: a worker beside it on the same
    core slows both, measured 0.68x against 0.47x of the engine alone in bench/engine.py, and a floating
    worker lands there often enough to give 0.59x), else every core."""
    every = set(range(os.cpu_count() or 1))
    try:
        rest = every - os.sched_getaffinity(0)
    except (AttributeError, OSError):
        rest = set()
    return sorted(rest or every)


def _init_worker(recipe: RebuildRecipe, cores: Sequence[int], engine_pid: int) -> None:
    """Worker start: leave the parent's CPU pin for `cores` (`worker_cores`: a parent pinned to one core would
    keep its workers on it, which is what processes are for avoiding), watch the engine, then build the
    Rebuilder once."""
    global _WORKER
    for choice in (cores, range(os.cpu_count() or 1)):
        try:
            os.sched_setaffinity(0, choice)
            break
        except (AttributeError, OSError, ValueError):
            pass  # not Linux, or the cores are not ours to take (a cpuset): the next choice, or where we are
    # one rebuild at a time per worker: the tokenizers library's thread pool would only take turns on the
    # worker's cores with it (an operator's own setting is kept)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threading.Thread(target=_watch_engine, args=(engine_pid, os.getppid()), name="eaglewatch-engine-watch",
                     daemon=True).start()
    # an error is kept for the start-up ping, which carries it to the engine's event (an initializer that
    # raises only breaks the pool, with no word of why)
    try:
        _WORKER = recipe.build()
    except Exception as exc:
        _WORKER = exc


def _watch_engine(engine_pid: int, parent: int) -> None:
    """Exit when the engine is gone (killed: nothing shuts the pool down). A ProcessPoolExecutor worker holds
    both ends of its call queue, so it would wait forever, keeping the engine's stdout and stderr open."""
    while True:
        time.sleep(0.25)
        if os.getppid() != parent:  # the fork server (or the engine, with spawn) died: we were re-parented
            os._exit(0)
        try:
            os.kill(engine_pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except OSError:
            pass  # alive, but not ours to signal
        try:
            with open(f"/proc/{engine_pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[-1].split()[0] == b"Z":  # killed, not yet reaped
                    os._exit(0)
        except (OSError, IndexError):
            pass  # no /proc (not Linux): the checks above


def _worker_ping() -> tuple[int, float]:
    """Nothing, once the worker has started (the pool's start-up is paid at the run's start): its pid and
    the CPU seconds its start took; the start's error if its Rebuilder could not be built."""
    if isinstance(_WORKER, Exception):
        raise _WORKER
    return os.getpid(), time.process_time()


def _worker_batch(calls: list[_Call]) -> tuple[list[tuple[bool, Any]], float, int, float]:
    """Rebuild each call: ([(ok, Rebuilt or the exception)], the rebuilds' CPU seconds, pid, the worker's
    whole CPU seconds so far). One call's error does not fail its neighbours."""
    if isinstance(_WORKER, Exception):
        raise _WORKER  # (the ping failed first: this worker gets no batch)
    out: list[tuple[bool, Any]] = []
    t0 = time.thread_time()
    for call in calls:
        try:
            out.append((True, _run_call(_WORKER, call)))
        except Exception as exc:  # re-raised in the engine, where the in-thread path would have raised it
            out.append((False, exc))
    return out, time.thread_time() - t0, os.getpid(), time.process_time()


def worker_count(setting: Any, cores: int | None = None) -> int:
    """Worker processes for `[run] rebuild_workers`: N as given (0: threads); auto: one per core beyond the
    event loop's (at most AUTO_MAX_WORKERS) when the machine has 2 or more cores, else 0. Cores are the
    machine's (os.cpu_count), not the engine's affinity: workers leave a pinned parent's core."""
    if setting != "auto":
        return max(0, int(setting))
    n = (os.cpu_count() or 1) if cores is None else cores
    return min(AUTO_MAX_WORKERS, n - 1) if n >= 2 else 0


def _mp_context() -> Any:
    """forkserver where there is one (Linux): a clean single-threaded process forks the workers, so nothing
    of the engine's running event loop, threads or SQLite connections is copied into them (fork would); else
    spawn. The fork server is started once per interpreter. Measured start of one worker (imports and the
    tokenizer): 0.18-0.21 s with the sample HF tokenizer, 0.36-0.39 s with Kimi K2.5's tiktoken (spawn: 0.21 /
    0.39 s). Both import the main module in the worker: a script that runs the engine needs the usual
    `if __name__ == "__main__":` guard (without it the workers fail to start and the run rebuilds in threads)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class RebuildPool:
    """Where the engine's rebuilds run (module doc): worker processes, or two threads. Event loop only.

    `cpu_s`: CPU seconds of the rebuilds themselves (either mode); `worker_cpu_s`: the worker processes' whole
    CPU (rebuilds, unpickling, pipes); `start_s`: seconds the workers took to start; `workers`: processes in
    use now (0: threads)."""

    def __init__(self, reconstructor: Any, on_event: Callable[[str, str], Awaitable[None]] | None = None) -> None:
        self.reconstructor = reconstructor
        self._on_event = on_event
        self._threads: ThreadPoolExecutor | None = None
        self._procs: ProcessPoolExecutor | None = None
        self._pending: list[tuple[_Call, asyncio.Future]] = []
        self._flushing = False
        self._inflight = 0  # batches sent and not yet back (at most IN_FLIGHT per worker)
        self._tasks: set[asyncio.Task] = set()
        self._child_cpu: dict[int, float] = {}  # pid -> CPU seconds at its last batch
        self._child_start_cpu: dict[int, float] = {}  # pid -> CPU seconds its start took
        self.workers = 0
        self.start_s = 0.0
        self.cpu_s = 0.0
        self.pids: tuple[int, ...] = ()
        self.broken: str | None = None  # why the processes were given up (None: they were not)

    @property
    def worker_cpu_s(self) -> float:
        """The worker processes' CPU seconds after their start, as of each one's last batch."""
        return sum(max(0.0, cpu - self._child_start_cpu.get(pid, 0.0)) for pid, cpu in self._child_cpu.items())

    @property
    def start_cpu_s(self) -> float:
        """CPU seconds the workers' starts took (interpreter, imports, the tokenizer)."""
        return sum(self._child_start_cpu.values())

    @classmethod
    async def open(cls, reconstructor: Any, setting: Any = "auto",
                   on_event: Callable[[str, str], Awaitable[None]] | None = None) -> "RebuildPool":
        """A pool for `reconstructor` with `[run] rebuild_workers` = `setting`; worker processes are started
        (and their Rebuilders built) before it returns. Processes need a `RebuildRecipe`; without one, or
        when they fail to start, the pool uses threads (the failure is reported through `on_event`)."""
        pool = cls(reconstructor, on_event)
        n = worker_count(setting)
        recipe = RebuildRecipe.of(reconstructor) if n else None
        if recipe is None:
            return pool
        t0 = time.monotonic()
        cores = worker_cores()
        procs = ProcessPoolExecutor(n, mp_context=_mp_context(), initializer=_init_worker,
                                    initargs=(recipe, cores, os.getpid()))
        loop = asyncio.get_running_loop()
        try:
            pings = await asyncio.gather(*(loop.run_in_executor(procs, _worker_ping) for _ in range(n)))
        except Exception as exc:
            procs.shutdown(wait=False, cancel_futures=True)
            await pool._tell("warning", f"token ids are rebuilt in threads: the {n} rebuild worker process(es) "
                             f"did not start ({type(exc).__name__}: {exc})")
            return pool
        pool._child_start_cpu = {pid: cpu for pid, cpu in pings}  # a worker that took two pings: the later
        pool._procs, pool.workers, pool.pids = procs, n, tuple(sorted(pool._child_start_cpu))
        pool.start_s = time.monotonic() - t0
        return pool

    async def rebuild(self, completion: Completion, sample: Any, endpoint: str, measure: bool) -> Any:
        """The `app.engine.verify.Rebuilt` of one result of `sample` from `endpoint` (`measure`: a probe)."""
        if self._procs is None:
            return await self._in_threads(_call_of(completion, sample, endpoint, measure, light=False))
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((_call_of(completion, sample, endpoint, measure, light=True), fut))
        self._kick()
        return await fut

    def _kick(self) -> None:
        """Send what is pending once a worker is free (at the end of this turn of the loop, so the turn's
        other results join the batch); while every worker is busy, results gather into the next batch."""
        if self._pending and not self._flushing and self._inflight < IN_FLIGHT * max(1, self.workers):
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        free = IN_FLIGHT * max(1, self.workers) - self._inflight
        if free <= 0 or not self._pending:
            return
        size = min(BATCH_MAX, math.ceil(len(self._pending) / free))
        for _ in range(free):
            batch, self._pending = self._pending[:size], self._pending[size:]
            if not batch:
                break
            self._inflight += 1
            t = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[_Call, asyncio.Future]]) -> None:
        try:
            await self._send_batch(batch)
        finally:
            self._inflight -= 1
            self._kick()

    async def _send_batch(self, batch: list[tuple[_Call, asyncio.Future]]) -> None:
        calls = [c for c, _ in batch]
        try:
            if self._procs is None:
                raise BrokenProcessPool(self.broken or "closed")
            out, cpu, pid, child_cpu = await asyncio.get_running_loop().run_in_executor(self._procs, _worker_batch,
                                                                                        calls)
        except Exception as exc:  # a dead worker, or a result that did not pickle: rebuild here instead
            if isinstance(exc, BrokenProcessPool) and self._procs is not None:
                await self._give_up(exc)
            for call, fut in batch:
                try:
                    r = await self._in_threads(call)
                except Exception as err:
                    if not fut.done():
                        fut.set_exception(err)
                else:
                    if not fut.done():
                        fut.set_result(r)
            return
        self.cpu_s += cpu
        self._child_cpu[pid] = child_cpu
        for (ok, r), (_, fut) in zip(out, batch):
            if fut.done():
                continue  # its flight was cancelled meanwhile
            if ok:
                fut.set_result(r)
            else:
                fut.set_exception(r)

    async def _give_up(self, exc: BaseException) -> None:
        """A worker died: the rest of the run rebuilds in threads (told once; its calls are not lost)."""
        procs, self._procs = self._procs, None
        self.broken, self.workers = f"{type(exc).__name__}: {exc}", 0
        if procs is not None:
            procs.shutdown(wait=False, cancel_futures=True)
        await self._tell("warning", "a rebuild worker process died; token ids are rebuilt in threads of the "
                         f"engine's process for the rest of this run (no result was lost): {self.broken}")

    async def _in_threads(self, call: _Call) -> Any:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="reconstruct")

        def timed() -> Any:
            t = time.thread_time()
            try:
                return _run_call(self.reconstructor, call)
            finally:
                self.cpu_s += time.thread_time() - t  # float += under the GIL; two threads rarely collide

        return await asyncio.get_running_loop().run_in_executor(self._threads, timed)

    async def _tell(self, level: str, message: str) -> None:
        if self._on_event is not None:
            await self._on_event(level, message)

    def describe(self) -> str:
        """Where rebuilds run, for the operator: '2 worker processes (started in 0.41 s)' or 'threads'."""
        if self._procs is None:
            return "threads of the engine's process" + (f" ({self.broken})" if self.broken else "")
        return f"{self.workers} worker process{'es' if self.workers != 1 else ''} (started in {self.start_s:.2f} s)"

    def close(self) -> None:
        """Stop the workers and threads without waiting for them (rebuilds still queued are dropped: their
        flights are being cancelled or have settled)."""
        for t in list(self._tasks):
            t.cancel()
        if self._procs is not None:
            self._procs.shutdown(wait=False, cancel_futures=True)
            self._procs = None
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None


async def rebuild(pool: RebuildPool | None, reconstructor: Any, completion: Completion, flight: Any, endpoint: str) -> Any:
    """Rebuild one result in `pool` (off the event loop; inline without one) as an `app.engine.verify.Rebuilt`:
    a Rebuilder measures the text path of probes and checks the prompt ids; any other reconstructor just
    processes."""
    if pool is None:
        return _run_call(reconstructor, _call_of(completion, flight.sample, endpoint, flight.probe, light=False))
    return await pool.rebuild(completion, flight.sample, endpoint, flight.probe)
