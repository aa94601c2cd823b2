"""The Reconstructor the engine uses: `app.tokens.Reconstructor` for the run's tokenizer and profile, wrapped
at start in `app.engine.fidelity.verify.EndpointReconstructor` with the endpoints' learned fidelity profiles, and where
it runs.

A `Run` built without a reconstructor (benchmarks of the request path alone, tests of scheduling) opens no pool:
the response text is stored as is and no reconstruction row is written.

`ReconstructionPool` runs the reconstructions off the event loop: in worker processes (`[run] reconstruct_workers`; auto
when
the machine has a core to spare) or in two threads of the engine's process. Reconstructing is pure CPU in Python
and the tokenizer, so threads share the event loop's core and GIL; a process gets its own (the cores a pinned
engine leaves free, `worker_cores`). Each worker builds its EndpointReconstructor once from a `ReconstructorRecipe`
(tokenizer
folder, profile, fidelity profiles) and gets per call only what the reconstruction reads (the completion without its
raw body, the reference ids, the messages and tools only when the prompt check needs them). The engine talks
to each worker over a socket pair read and written by the event loop itself (length-prefixed pickles, no
executor threads: their hand-offs cost the loop's core GIL switches and added milliseconds to each trip).
Each worker has at most IN_FLIGHT batches in flight: a worker with room gets a result at once (the end of
the loop's turn), and while all are full the results that arrive gather into the next batches. A worker
that dies (its socket ends) loses nothing: the calls it held are reconstructed in threads, and so is the rest of
the run, with one operator event.

A huge answer (over BIG_RECONSTRUCT_CHARS of text) is reconstructed in a lane of its own, one thread of the engine's
process (the tokenizers encode with the GIL released), never in a worker's batch: a 4 MB answer takes its
tokenizer about 10 s, and in a worker it would hold up every small result queued behind it for that long.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import multiprocessing.context
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

from app.engine.fidelity.verify import EndpointReconstructor, Reconstructed
from app.errors import InputError
from app.records import Completion
from app.tokens import Reconstructor, get_profile, load_tokenizer

if TYPE_CHECKING:  # types only: kept out of the worker processes' start
    from app.config import RunConfig
    from app.tokens.fidelity_profile import FidelityProfile
    from app.tokens.profile import Profile

AUTO_MAX_WORKERS = 4  # reconstruction is ~0.4 ms of a ~1 ms request: a few processes keep up with one loop
# results per batch, and batches in flight per worker: while one is reconstructed the next ones wait in the worker's
# socket, so the trips overlap its work; small batches keep results (and the slots they hold) flowing back a
# few at a time instead of in convoys of 30 (bench/engine.py --ratios at c=64: 8 x 4 gave 1,800 req/s where
# 32 x 2 gave 1,700 and 64 x 1 1,500)
BATCH_MAX = 8
IN_FLIGHT = 4
START_TIMEOUT_S = 120.0  # a worker's start: interpreter, imports, the tokenizer (0.2-0.4 s measured)
BIG_RECONSTRUCT_CHARS = 256 * 1024  # text of an answer past which it is reconstructed in the big lane (module doc)


def reconstruction_size(completion: Completion) -> int:
    """Characters of text a reconstruction of `completion` encodes (reasoning, content, tool names and arguments)."""
    return (
        len(completion.content)
        + len(completion.reasoning or "")
        + sum(len(c.arguments) + len(c.name) for c in completion.tool_calls)
    )


class ReconstructionSample(Protocol):
    """What a reconstruction reads of a sample (`app.store.store_records.LeasedSample`, or a `SampleInput`)."""

    @property
    def reference_ids(self) -> tuple[int, ...] | None: ...

    @property
    def messages(self) -> list[dict[str, Any]]: ...

    @property
    def tools(self) -> list[Any] | None: ...


def build_reconstructor(config: RunConfig) -> Reconstructor:
    """The tokens package's Reconstructor for the config's tokenizer and profile (a tiktoken model gets the
    profile's pre-tokeniser pattern). A tokenizer that fails to load is an operator error."""
    profile = get_profile(config.model.profile)
    return Reconstructor(profile, load_tokenizer(config.model.tokenizer, profile.pretokenizer_pattern))


async def open_endpoint_reconstructor(
    reconstructor: Reconstructor, config: RunConfig, db_path: Path
) -> tuple[EndpointReconstructor, list[str]]:
    """An EndpointReconstructor over `reconstructor` with the stored fidelity profiles of the config's endpoints
    (app.store.profile_store), and one sentence per profile loaded: for reconstructions outside a run (benchmarks,
    tests); a run opens its own with priors and live learning (app.engine.fidelity.verify.open_verification)."""
    from app.store.profile_store import load_profiles

    names = {e.name for e in config.endpoints}
    stored = await asyncio.to_thread(load_profiles, db_path, config.model.profile) if db_path.exists() else []
    profiles = [p for p in stored if p.endpoint in names]
    notes = [
        f"{p.endpoint}{f' / {p.provider}' if p.provider else ''}: applying the learned fidelity profile "
        f"({p.probes} probes) to reconstructions from text"
        for p in profiles
    ]
    return EndpointReconstructor(reconstructor, profiles), notes


async def open_reconstruction_pool(
    endpoint_reconstructor: EndpointReconstructor | None,
    config: RunConfig,
    on_event: Callable[[str, str, str], Awaitable[None]],
) -> ReconstructionPool | None:
    """Where a Run reconstructs ids: a ReconstructionPool (`[run] reconstruct_workers`) over `endpoint_reconstructor`
    (the run's, from
    `app.engine.fidelity.verify.open_verification`), its start told to the operator through `on_event(level, kind,
    message)`; None without one (no reconstructor: the text is stored as is)."""
    if endpoint_reconstructor is None:
        return None
    pool = await ReconstructionPool.open(
        endpoint_reconstructor, config.run.reconstruct_workers, lambda level, message: on_event(level, "run", message)
    )
    await on_event("info", "run", f"token ids are reconstructed in {pool.describe()}")
    return pool


@dataclass(frozen=True)
class ReconstructorRecipe:
    """What builds the engine's EndpointReconstructor in a worker process (picklable, a few KB): the tokenizer folder
    (loaded with the profile's pre-tokeniser pattern, as `build_reconstructor` does), the profile, and the
    fidelity profiles (the run's own first, None when it has none). `fingerprint` checks that the worker
    loaded the same tokenizer files."""

    tokenizer_dir: str
    profile: Profile
    fingerprint: str
    fidelity: tuple[FidelityProfile | None, ...]

    @classmethod
    def of(cls, endpoint_reconstructor: EndpointReconstructor) -> ReconstructorRecipe:
        """The recipe of the engine's EndpointReconstructor (its tokenizer's folder, profile and fidelity profiles)."""
        return cls(
            str(endpoint_reconstructor.tokenizer.path),
            endpoint_reconstructor.profile,
            endpoint_reconstructor.tokenizer.fingerprint,
            endpoint_reconstructor.fidelity_profiles,
        )

    def build(self) -> EndpointReconstructor:
        """The EndpointReconstructor this recipe describes (loads the tokenizer: once per worker)."""
        tok = load_tokenizer(self.tokenizer_dir, self.profile.pretokenizer_pattern)
        if tok.fingerprint != self.fingerprint:
            raise InputError(f"{self.tokenizer_dir}: the tokenizer files changed since the engine loaded them")
        base = Reconstructor(self.profile, tok, self.fidelity[0])
        return EndpointReconstructor(base, [p for p in self.fidelity[1:] if p is not None])


# (completion without raw, reference ids, messages, tools, endpoint, measure, a trusted twin's answer or None):
# one reconstruction's inputs
_Call = tuple[
    Completion, tuple[int, ...] | None, Sequence[dict[str, Any]], Sequence[Any] | None, str, bool, Completion | None
]


@overload
def _light(completion: Completion) -> Completion: ...
@overload
def _light(completion: Completion | None) -> Completion | None: ...
def _light(completion: Completion | None) -> Completion | None:
    return replace(completion, raw=None) if completion is not None and completion.raw is not None else completion


def _call_of(
    completion: Completion,
    sample: ReconstructionSample,
    endpoint: str,
    measure: bool,
    *,
    light: bool,
    twin: Completion | None = None,
) -> _Call:
    """One reconstruction's inputs; `light` (crossing to a process) drops what the reconstruction never reads: the raw
    bodies, and the messages and tools unless the server returned prompt ids to check them against."""
    if not light:
        return completion, sample.reference_ids, sample.messages, sample.tools, endpoint, measure, twin
    checks = completion.prompt_token_ids is not None
    return (
        _light(completion),
        sample.reference_ids,
        sample.messages if checks else (),
        sample.tools if checks else None,
        endpoint,
        measure,
        _light(twin),
    )


def _run_call(endpoint_reconstructor: EndpointReconstructor, call: _Call) -> Reconstructed:
    """The reconstruction itself, the same in a thread and in a worker process: the ids reconstructed, probes' text path
    measured (against a trusted twin's ids when the answer has none), prompt ids checked."""
    completion, reference_ids, messages, tools, endpoint, measure, twin = call
    return endpoint_reconstructor.reconstruct(
        completion, reference_ids, messages, tools, endpoint=endpoint, measure=measure, twin=twin
    )


def worker_cores() -> list[int]:
    """The cores the reconstruction workers run on: the machine's cores the engine's process is not pinned to, when
    it is pinned and some are left (the event loop keeps its core to itself: a worker beside it on the same
    core slows both, measured 0.68x against 0.47x of the engine alone in bench/engine.py, and a floating
    worker lands there often enough to give 0.59x), else every core."""
    every = set(range(os.cpu_count() or 1))
    try:
        rest = every - os.sched_getaffinity(0)
    except (AttributeError, OSError):
        rest = set()
    return sorted(rest or every)


def _init_worker(
    recipe: ReconstructorRecipe, cores: Sequence[int], engine_pid: int
) -> EndpointReconstructor | Exception:
    """Worker start: leave the parent's CPU pin for `cores` (`worker_cores`: a parent pinned to one core would
    keep its workers on it, which is what processes are for avoiding), watch the engine, then build the
    EndpointReconstructor once (or return why it could not be built)."""
    for choice in (cores, range(os.cpu_count() or 1)):
        try:
            os.sched_setaffinity(0, choice)
            break
        except (AttributeError, OSError, ValueError):
            pass  # not Linux, or the cores are not ours to take (a cpuset): the next choice, or where we are
    # Ctrl-C in a terminal reaches the whole process group: the engine decides how the run stops, and its
    # workers end with their sockets (not with a KeyboardInterrupt traceback over the operator's screen)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):
        pass  # not the main thread (the in-process test path): nothing to ignore
    # one reconstruction at a time per worker: the tokenizers library's thread pool would only take turns on the
    # worker's cores with it (an operator's own setting is kept)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threading.Thread(
        target=_watch_engine, args=(engine_pid, os.getppid()), name="eaglewatch-engine-watch", daemon=True
    ).start()
    # an error is kept for the hello, which carries it to the engine's event
    try:
        endpoint_reconstructor = recipe.build()
    except Exception as exc:
        return exc
    try:  # one reconstruction of nothing much: its lazy imports and first-call costs (6 ms) are paid at start
        warm = Completion(content="warm", reasoning="up", finish_reason="stop")
        _run_call(endpoint_reconstructor, (warm, None, [], None, "", False, None))
    except Exception:
        pass  # a real call will say what is wrong
    return endpoint_reconstructor


def _watch_engine(engine_pid: int, parent: int) -> None:
    """Exit when the engine is gone (killed: nothing shuts the pool down), even mid-reconstruct or should its end
    of the socket outlive it in another process (the socket's EOF is the usual word): a lingering worker keeps
    the engine's stdout and stderr open."""
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


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(len(payload).to_bytes(4, "little") + payload)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            return None  # the engine closed its end (or died)
        got += k
    return bytes(buf)


def _worker_main(recipe: ReconstructorRecipe, cores: Sequence[int], engine_pid: int, sock: socket.socket) -> None:
    """A worker process: start (`_init_worker`), say hello (its pid and the CPU its start took, or why its
    EndpointReconstructor could not be built), then reconstruct each batch that arrives until the engine closes the
    socket."""
    endpoint_reconstructor = _init_worker(recipe, cores, engine_pid)
    with sock:
        try:
            if isinstance(endpoint_reconstructor, Exception):
                _send_frame(sock, _dumps_exception(endpoint_reconstructor))
                return
            _send_frame(sock, pickle.dumps((True, (os.getpid(), time.process_time())), pickle.HIGHEST_PROTOCOL))
            while True:
                head = _recv_exactly(sock, 4)
                body = _recv_exactly(sock, int.from_bytes(head, "little")) if head else None
                if body is None:
                    return
                out, cpu = _worker_batch(endpoint_reconstructor, pickle.loads(body))
                try:
                    reply = pickle.dumps((True, (out, cpu, time.process_time())), pickle.HIGHEST_PROTOCOL)
                except Exception as exc:  # a result that does not pickle: the engine reconstructs the batch itself
                    reply = _dumps_exception(exc)
                _send_frame(sock, reply)
        except OSError:
            return  # the engine is gone


def _dumps_exception(exc: BaseException) -> bytes:
    """(False, exc) pickled; an exception that does not pickle goes as a RuntimeError naming it."""
    try:
        return pickle.dumps((False, exc), pickle.HIGHEST_PROTOCOL)
    except Exception:
        return pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")), pickle.HIGHEST_PROTOCOL)


def _worker_batch(
    endpoint_reconstructor: EndpointReconstructor, batch: tuple[list[FidelityProfile], list[_Call]]
) -> tuple[list[tuple[bool, Reconstructed | Exception]], float]:
    """Take the batch's fidelity profiles (learned since the last batch: the EndpointReconstructor uses them from now
    on),
    then reconstruct each call: ([(ok, Reconstructed or the exception)], the reconstructions' CPU seconds). One call's
    error
    does not fail its neighbours."""
    profiles, calls = batch
    for fp in profiles:
        endpoint_reconstructor.set_profile(fp)
    out: list[tuple[bool, Reconstructed | Exception]] = []
    t0 = time.thread_time()
    for call in calls:
        try:
            out.append((True, _run_call(endpoint_reconstructor, call)))
        except Exception as exc:  # re-raised in the engine, where the in-thread path would have raised it
            out.append((False, exc))
    return out, time.thread_time() - t0


def worker_count(setting: int | Literal["auto"], cores: int | None = None) -> int:
    """Worker processes for `[run] reconstruct_workers`: N as given (0: threads); auto: one per core beyond the
    event loop's (at most AUTO_MAX_WORKERS) when the machine has 2 or more cores, else 0. Cores are the
    machine's (os.cpu_count), not the engine's affinity: workers leave a pinned parent's core."""
    if setting != "auto":
        return max(0, int(setting))
    n = (os.cpu_count() or 1) if cores is None else cores
    return min(AUTO_MAX_WORKERS, n - 1) if n >= 2 else 0


def _mp_context() -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    """forkserver where there is one (Linux): a clean single-threaded process forks the workers, so nothing
    of the engine's running event loop, threads or SQLite connections is copied into them (fork would); else
    spawn. The fork server is started once per interpreter. Measured start of one worker (imports and the
    tokenizer): 0.18-0.21 s with the sample HF tokenizer, 0.36-0.39 s with Kimi K2.5's tiktoken (spawn: 0.21 /
    0.39 s). The workers are started with the main module hidden (`_main_hidden`), so a script that runs the
    engine needs no `if __name__ == "__main__":` guard."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


@contextmanager
def _main_hidden() -> Iterator[None]:
    """While workers start: multiprocessing imports the parent's main module in every child it starts (and in
    the fork server) to find what was defined there, which runs a script's top level again unless the script
    has the `if __name__ == "__main__":` guard. A script without it would run its whole run a second time in
    the worker, sending requests and spending money. The workers need nothing from it (their target is in
    this module), so the main module's file and spec are out of sight while they start."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


@dataclass
class _Worker:
    """One worker process as the engine sees it: its socket's streams and the batches sent to it (answered in
    order, oldest first)."""

    proc: BaseProcess
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pid: int = 0
    sent: deque = field(default_factory=deque)  # of list[tuple[_Call, asyncio.Future]]
    profiles: list[FidelityProfile] = field(default_factory=list)  # to send with its next batch


class ReconstructionPool:
    """Where the engine's reconstructions run (module doc): worker processes, or two threads. Event loop only.

    `cpu_s`: CPU seconds of the reconstructions themselves (either mode); `worker_cpu_s`: the worker processes' whole
    CPU (reconstructions, unpickling, sockets); `start_s`: seconds the workers took to start; `workers`: processes in
    use now (0: threads)."""

    def __init__(
        self,
        endpoint_reconstructor: EndpointReconstructor,
        on_event: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.endpoint_reconstructor = endpoint_reconstructor
        self._on_event = on_event
        self._threads: ThreadPoolExecutor | None = None
        self._big: ThreadPoolExecutor | None = None  # the lane of huge answers (module doc)
        self._procs: list[_Worker] = []
        self._pending: list[tuple[_Call, asyncio.Future]] = []
        self._flushing = False
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
    async def open(
        cls,
        endpoint_reconstructor: EndpointReconstructor,
        setting: int | Literal["auto"] = "auto",
        on_event: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> ReconstructionPool:
        """A pool for `endpoint_reconstructor` with `[run] reconstruct_workers` = `setting`; worker processes are
        started
        (each builds the EndpointReconstructor again from its `ReconstructorRecipe`) before it returns. When they fail
        to start,
        the pool uses threads (the failure is reported through `on_event`)."""
        pool = cls(endpoint_reconstructor, on_event)
        n = worker_count(setting)
        if not n:
            return pool
        recipe = ReconstructorRecipe.of(endpoint_reconstructor)
        t0 = time.monotonic()
        started: list[_Worker] = []
        try:
            ctx, cores = _mp_context(), worker_cores()
            for _ in range(n):
                mine, theirs = socket.socketpair()
                try:
                    proc = ctx.Process(
                        target=_worker_main,
                        args=(recipe, cores, os.getpid(), theirs),
                        daemon=True,
                        name="eaglewatch-reconstruct",
                    )
                    with _main_hidden():  # (the first start also starts the fork server)
                        await asyncio.to_thread(proc.start)
                finally:
                    theirs.close()  # the worker holds its own copy: EOF here when it dies
                reader, writer = await asyncio.open_connection(sock=mine)
                started.append(_Worker(proc, reader, writer))
            hellos = await asyncio.wait_for(asyncio.gather(*(_read_reply(w.reader) for w in started)), START_TIMEOUT_S)
            for w, (ok, value) in zip(started, hellos):
                if not ok:
                    raise value
                w.pid, start_cpu = value
                pool._child_start_cpu[w.pid] = start_cpu
        except Exception as exc:
            for w in started:
                _stop(w)
            if isinstance(exc, TimeoutError):
                exc = TimeoutError(f"no word from them in {START_TIMEOUT_S:g} s")
            elif isinstance(exc, asyncio.IncompleteReadError):
                exc = BrokenProcessPool("a worker exited before it was ready (see its error above on stderr)")
            await pool._tell(
                "warning",
                f"token ids are reconstructed in threads: the {n} reconstruction worker process(es) "
                f"did not start ({type(exc).__name__}: {exc})",
            )
            return pool
        pool._procs, pool.workers, pool.pids = started, n, tuple(sorted(w.pid for w in started))
        for w in started:
            pool._spawn(pool._read_loop(w))
        pool.start_s = time.monotonic() - t0
        return pool

    async def reconstruct(
        self,
        completion: Completion,
        sample: ReconstructionSample,
        endpoint: str,
        measure: bool,
        twin: Completion | None = None,
    ) -> Reconstructed:
        """The Reconstructed of one result of `sample` from `endpoint` (`measure`: a probe; `twin`: a trusted server's
        greedy answer to compare it with)."""
        if reconstruction_size(completion) > BIG_RECONSTRUCT_CHARS:
            if self._big is None:
                self._big = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reconstruct-big")
            return await self._in_threads(
                _call_of(completion, sample, endpoint, measure, light=False, twin=twin), self._big
            )
        if not self._procs:
            return await self._in_threads(_call_of(completion, sample, endpoint, measure, light=False, twin=twin))
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((_call_of(completion, sample, endpoint, measure, light=True, twin=twin), fut))
        self._kick()
        return await fut

    def update_profile(self, fp: FidelityProfile) -> None:
        """Reconstruct fp's endpoint and provider with fidelity profile `fp` from now on: here (threads, and the
        reconstructions of a dead worker's calls) at once, in each worker process with its next batch (a batch already
        sent is reconstructed with what its worker had)."""
        self.endpoint_reconstructor.set_profile(fp)
        for w in self._procs:
            w.profiles = [p for p in w.profiles if (p.endpoint, p.provider) != (fp.endpoint, fp.provider)] + [fp]

    def _room(self) -> int:
        return sum(IN_FLIGHT - len(w.sent) for w in self._procs)

    def _kick(self) -> None:
        """Send what is pending once a worker is free (at the end of this turn of the loop, so the turn's
        other results join the batch); while every worker is busy, results gather into the next batch."""
        if self._pending and not self._flushing and (self._room() > 0 or not self._procs):
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if not self._procs:  # given up meanwhile: what is pending is reconstructed here
            pending, self._pending = self._pending, []
            for call, fut in pending:
                self._spawn(self._reconstruct_here([(call, fut)]))
            return
        free = self._room()
        if free <= 0 or not self._pending:
            return
        size = min(BATCH_MAX, math.ceil(len(self._pending) / free))
        while self._pending:
            w = min(self._procs, key=lambda x: len(x.sent))
            if len(w.sent) >= IN_FLIGHT:
                break
            batch, self._pending = self._pending[:size], self._pending[size:]
            try:
                w.writer.write(_frame((w.profiles, [c for c, _ in batch])))
            except Exception:  # a call that does not pickle (or a closed socket): reconstructed here
                self._spawn(self._reconstruct_here(batch))
                continue
            w.profiles = []
            w.sent.append(batch)

    async def _read_loop(self, w: _Worker) -> None:
        """Settle the worker's batches as its answers arrive; its socket's end is its death."""
        try:
            while True:
                ok, value = await _read_reply(w.reader)
                batch = w.sent.popleft()
                if not ok:  # its answer did not pickle: this batch is reconstructed here
                    self._spawn(self._reconstruct_here(batch))
                else:
                    out, cpu, child_cpu = value
                    self.cpu_s += cpu
                    self._child_cpu[w.pid] = child_cpu
                    for (done, r), (_, fut) in zip(out, batch):
                        if fut.done():
                            continue  # its flight was cancelled meanwhile
                        if done:
                            fut.set_result(r)
                        else:
                            fut.set_exception(r)
                self._kick()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # EOF, a reset socket, an answer that does not unpickle: the worker is lost
            if w in self._procs:
                await asyncio.to_thread(w.proc.join, 1.0)  # its exit code, for the operator
                code = w.proc.exitcode
                await self._give_up(
                    BrokenProcessPool(f"worker {w.pid} ended (exit code {code}; {type(exc).__name__}: {exc})")
                )

    async def _give_up(self, exc: BaseException) -> None:
        """A worker died: the rest of the run reconstructs in threads (told once; its calls are not lost)."""
        procs, self._procs = self._procs, []
        self.broken, self.workers = f"{type(exc).__name__}: {exc}", 0
        for w in procs:
            _stop(w)
            while w.sent:
                self._spawn(self._reconstruct_here(w.sent.popleft()))
        self._kick()
        await self._tell(
            "warning",
            "a reconstruction worker process died; token ids are reconstructed in threads of the "
            f"engine's process for the rest of this run (no result was lost): {self.broken}",
        )

    async def _reconstruct_here(self, batch: list[tuple[_Call, asyncio.Future]]) -> None:
        for call, fut in batch:
            if fut.done():
                continue
            try:
                r = await self._in_threads(call)
            except Exception as err:
                if not fut.done():
                    fut.set_exception(err)
            else:
                if not fut.done():
                    fut.set_result(r)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _in_threads(self, call: _Call, executor: ThreadPoolExecutor | None = None) -> Reconstructed:
        if executor is None:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="reconstruct")
            executor = self._threads

        def timed() -> Reconstructed:
            t = time.thread_time()
            try:
                return _run_call(self.endpoint_reconstructor, call)
            finally:
                self.cpu_s += time.thread_time() - t  # float += under the GIL; two threads rarely collide

        return await asyncio.get_running_loop().run_in_executor(executor, timed)

    async def _tell(self, level: str, message: str) -> None:
        if self._on_event is not None:
            await self._on_event(level, message)

    def describe(self) -> str:
        """Where reconstructions run, for the operator: '2 worker processes (started in 0.41 s)' or 'threads'."""
        if not self._procs:
            return "threads of the engine's process" + (f" ({self.broken})" if self.broken else "")
        return f"{self.workers} worker process{'es' if self.workers != 1 else ''} (started in {self.start_s:.2f} s)"

    def close(self) -> None:
        """Stop the workers and threads without waiting for them (reconstructions still queued are dropped: their
        flights are being cancelled or have settled). A worker exits when its socket closes."""
        for t in list(self._tasks):
            t.cancel()
        procs, self._procs = self._procs, []
        for w in procs:
            _stop(w)
        for lane in (self._threads, self._big):
            if lane is not None:
                lane.shutdown(wait=False, cancel_futures=True)
        self._threads = self._big = None


def _frame(value: tuple[list[FidelityProfile], list[_Call]]) -> bytes:
    payload = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    return len(payload).to_bytes(4, "little") + payload


async def _read_reply(reader: asyncio.StreamReader) -> tuple[bool, Any]:
    """(True, the worker's hello or a batch's answer) or (False, the exception it sent)."""
    head = await reader.readexactly(4)
    return pickle.loads(await reader.readexactly(int.from_bytes(head, "little")))


def _stop(w: _Worker) -> None:
    """Close the engine's end of a worker's socket: the worker reads EOF and exits (after its batch)."""
    try:
        w.writer.close()
    except Exception:
        pass  # already closed, or the loop is closing
