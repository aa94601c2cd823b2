"""Reconstructs in worker processes (app.engine.fidelity.pool.ReconstructionPool, `[run] reconstruct_workers`): the same
results as in threads, field by field, over completions the real client parsed from the real simulator; a
worker killed with SIGKILL mid-run loses no paid response; workers leave a pinned parent's core for the
others."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path

import pytest

import app
from app.config import parse_config
from app.engine.fidelity.pool import (
    ReconstructionPool,
    ReconstructorRecipe,
    build_reconstructor,
    open_endpoint_reconstructor,
    worker_cores,
    worker_count,
)
from app.engine.fidelity.verify import LOGPROB_PROBE_FIELDS, EndpointReconstructor
from app.providers.client import ChatClient
from app.simulator.server import SimulatorServer
from app.tokens.fidelity_profile import FidelityProfile
from tests.engine.conftest import config_data, make_config, open_ingested, sample_inputs

N = 12


def _endpoint(name: str, personality: str, **sim) -> dict:
    options = {
        "latency_median_ms": 0.0,
        "latency_p95_ms": 0.0,
        "tokens_per_s": 0.0,
        "seed": 5,
        "personality": personality,
        "quirks": ["think_spaces"],
        **sim,
    }
    return {"name": name, "simulator": options, "timeout_s": 5.0, "max_concurrency": 8}


async def _completions(config, sample_data, stream: bool) -> list[tuple[object, object, str]]:
    """(completion, sample, endpoint) for N samples from each simulated server: vLLM (server output and prompt
    ids), OpenRouter with logprobs (ids from logprob bytes) and plain OpenRouter (text only)."""
    samples = sample_inputs(sample_data, N)
    out = []
    for ep in config.endpoints:
        async with SimulatorServer(
            ep.simulator, tokenizer_dir=sample_data / "tokenizer", reference=sample_data / "reference.jsonl"
        ) as sim:
            client = ChatClient(
                ep, config.generation.model_copy(update={"stream": stream}), None, base_url=sim.base_url
            )
            try:
                for s in samples:
                    c = await client.complete(
                        list(s.messages),
                        list(s.tools) if s.tools else None,
                        model=config.model.name,
                        extra=LOGPROB_PROBE_FIELDS if ep.simulator.logprobs else None,
                    )
                    out.append((c, s, ep.name))
            finally:
                await client.aclose()
    return out


@pytest.mark.parametrize("stream", [False, True])
async def test_processes_reconstruct_exactly_what_threads_reconstruct(tmp_path, sample_data, stream) -> None:
    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[
            _endpoint("vllm", "vllm"),
            _endpoint("or-logprobs", "openrouter", logprobs=True),
            _endpoint("or-text", "openrouter", logprobs=False),
        ],
    )
    got = await _completions(config, sample_data, stream)
    assert any(c.token_ids for c, _, _ in got) and any(c.content_logprobs for c, _, _ in got)
    assert any(c.prompt_token_ids for c, _, _ in got), "no prompt ids: the prompt check would go untested"
    base = build_reconstructor(config)
    # a learned profile for one endpoint: the worker must route to it as the engine's EndpointReconstructor does
    learned = FidelityProfile("or-text", None, config.model.profile, 7, {"empty_reasoning": {"dropped": 7}})
    endpoint_reconstructor = EndpointReconstructor(base, [learned])
    threads = await ReconstructionPool.open(endpoint_reconstructor, 0)
    procs = await ReconstructionPool.open(endpoint_reconstructor, 2)
    try:
        assert (threads.workers, procs.workers) == (0, 2), procs.describe()
        for measure in (False, True):
            a = await asyncio.gather(*(threads.reconstruct(c, s, ep, measure) for c, s, ep in got))
            b = await asyncio.gather(*(procs.reconstruct(c, s, ep, measure) for c, s, ep in got))
            assert len(a) == len(b) == len(got)
            for (_c, s, ep), x, y in zip(got, a, b):
                assert x == y, (ep, s.sample_id, measure)  # every field: ids, flags, verdict, measured, prompt check
            assert any(r.measured for r in b) == measure
            assert any(r.prompt_check is not None for r in b)
    finally:
        threads.close()
        procs.close()
    assert procs.cpu_s > 0 and procs.worker_cpu_s >= procs.cpu_s


def test_worker_count_follows_the_setting_and_the_cores() -> None:
    assert [worker_count("auto", n) for n in (1, 2, 3, 8, 64)] == [0, 1, 2, 4, 4]
    assert worker_count(0, 16) == 0 and worker_count(3, 1) == 3


def test_a_recipe_builds_the_reconstructor_it_was_taken_from(tmp_path, sample_data) -> None:
    """What a worker process builds from the recipe reconstructs as the engine's own EndpointReconstructor does: the
    same
    tokenizer files (checked by fingerprint), profile and learned fidelity profiles, routed the same way."""
    from app.records import Completion

    config = make_config(tmp_path, sample_data)
    learned = FidelityProfile("sim", None, config.model.profile, 7, {"empty_reasoning": {"dropped": 7}})
    endpoint_reconstructor = EndpointReconstructor(build_reconstructor(config), [learned])
    recipe = ReconstructorRecipe.of(endpoint_reconstructor)
    assert recipe.tokenizer_dir == str(sample_data / "tokenizer") and recipe.fidelity == (None, learned)
    built = recipe.build()
    assert built.learned == endpoint_reconstructor.learned == (("sim", ""),)
    s = sample_inputs(sample_data, 1)[0]
    c = Completion(content="hello", reasoning="", finish_reason="stop")
    for endpoint in ("sim", "other"):
        assert built.reconstruct(
            c, s.reference_ids, s.messages, s.tools, endpoint=endpoint, measure=False
        ) == endpoint_reconstructor.reconstruct(
            c, s.reference_ids, s.messages, s.tools, endpoint=endpoint, measure=False
        )


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not hasattr(os, "sched_setaffinity"), reason="needs 2 cores")
async def test_workers_leave_the_pinned_parents_core(tmp_path, sample_data) -> None:
    config = make_config(tmp_path, sample_data)
    endpoint_reconstructor, _ = await open_endpoint_reconstructor(
        build_reconstructor(config), config, tmp_path / "none.db"
    )
    before = os.sched_getaffinity(0)
    every = set(range(os.cpu_count()))
    if before != every:
        pytest.skip(f"this process may use cores {sorted(before)} of {sorted(every)}: a pin to one needs them all")
    engine_core = min(before)
    os.sched_setaffinity(0, {engine_core})
    try:
        assert worker_cores() == sorted(every - {engine_core})
        pool = await ReconstructionPool.open(endpoint_reconstructor, 1)
    finally:
        os.sched_setaffinity(0, before)
    try:
        assert pool.workers == 1 and len(pool.pids) == 1
        # the other cores: not the pinned event loop's core, where a worker slows both
        assert os.sched_getaffinity(pool.pids[0]) == every - {engine_core}
    finally:
        pool.close()
    assert worker_cores() == sorted(every)  # an unpinned engine: its workers may run anywhere


async def test_a_worker_killed_mid_run_loses_no_result(tmp_path, sample_data) -> None:
    from app.engine.run import Run

    n = 40
    data = config_data(
        tmp_path,
        sample_data,
        simulator={"latency_median_ms": 15.0, "latency_p95_ms": 30.0},
        limits={"concurrency_initial": 4, "concurrency_max": 4},
    )
    data["run"]["reconstruct_workers"] = 1
    config = parse_config(data, base_dir=tmp_path)
    store, _ = await open_ingested(config, sample_data, n)
    run = Run(config, store, reconstructor=build_reconstructor(config))
    try:
        await run.start()
        pool = run.reconstruction_pool
        assert pool is not None and pool.workers == 1, pool and pool.describe()
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while run.snapshot().done < 5:
            assert loop.time() < end, "no result reconstructed in a worker"
            await asyncio.sleep(0.01)
        os.kill(pool.pids[0], signal.SIGKILL)
        outcome = await asyncio.wait_for(run.wait(), 30)
        assert outcome.state == "done", outcome
        assert pool.workers == 0 and pool.broken
        died = [e for e in run.events_since(0) if "reconstruction worker process died" in e.message]
        assert len(died) == 1, [e.message for e in run.events_since(0)]
    finally:
        await asyncio.wait_for(run.close(), 10)  # shutdown does not hang on a broken pool
        await store.close()
    with sqlite3.connect(config.run.database) as conn:
        per_sample = conn.execute(
            "SELECT s.pk, COUNT(r.response_id) FROM samples s LEFT JOIN reconstructions r "
            "ON r.sample_pk = s.pk GROUP BY s.pk"
        ).fetchall()
        states = dict(conn.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())
    assert len(per_sample) == n and all(k == 1 for _, k in per_sample), per_sample
    assert states == {"done": n}, states


_HOLDER = r"""
import asyncio, sys
from app.config import parse_config
from app.engine.fidelity.pool import ReconstructionPool, build_reconstructor, open_endpoint_reconstructor
async def main():
    config = parse_config({"run": {"name": "t"},
                           "data": {"datasets": [{"path": sys.argv[1] + "/prompts.openai.jsonl"}]},
                           "model": {"name": "m", "tokenizer": sys.argv[1] + "/tokenizer"},
                           "endpoints": [{"name": "e", "base_url": "http://127.0.0.1:9"}]})
    endpoint_reconstructor, _ = await open_endpoint_reconstructor(build_reconstructor(config), config,
    config.run.database.parent / "no.db")
    pool = await ReconstructionPool.open(endpoint_reconstructor, 1)
    print(pool.pids[0], flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_a_killed_engines_workers_exit_and_free_its_pipes(tmp_path, sample_data) -> None:
    """Nothing shuts the pool down when the engine is killed: its worker must notice and exit, or it would
    keep the engine's stdout open (a supervisor reading it would wait forever)."""
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDER,
        str(sample_data),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(app.__file__).parents[1])},
    )
    worker = int((await asyncio.wait_for(proc.stdout.readline(), 60)).strip())
    os.kill(worker, 0)  # alive while the engine is
    proc.kill()
    assert await asyncio.wait_for(proc.stdout.read(), 10) == b""  # EOF: no worker holds the pipe any more
    await proc.wait()
    loop = asyncio.get_running_loop()
    end = loop.time() + 10
    while True:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        assert loop.time() < end, "the worker outlived its engine"
        await asyncio.sleep(0.05)


async def test_workers_that_cannot_start_leave_the_reconstructions_to_threads(
    tmp_path, sample_data, monkeypatch
) -> None:
    """A worker whose tokenizer is not the engine's (the files changed under it) fails at start: the pool says
    so once and reconstructs in threads, with the same result."""
    import dataclasses

    config = make_config(tmp_path, sample_data)
    endpoint_reconstructor, _ = await open_endpoint_reconstructor(
        build_reconstructor(config), config, tmp_path / "none.db"
    )
    real = ReconstructorRecipe.of(endpoint_reconstructor)
    monkeypatch.setattr(
        ReconstructorRecipe, "of", classmethod(lambda cls, r: dataclasses.replace(real, fingerprint="x"))
    )
    told: list[tuple[str, str]] = []

    async def tell(level: str, message: str) -> None:
        told.append((level, message))

    pool = await ReconstructionPool.open(endpoint_reconstructor, 1, tell)
    try:
        assert pool.workers == 0 and len(told) == 1 and told[0][0] == "warning", told
        assert "did not start" in told[0][1] and "tokenizer files changed" in told[0][1]
        s = sample_inputs(sample_data, 1)[0]
        from app.records import Completion

        c = Completion(content="hello", reasoning="think", finish_reason="stop")
        assert await pool.reconstruct(c, s, "sim", False) == endpoint_reconstructor.reconstruct(
            c, s.reference_ids, s.messages, s.tools, endpoint="sim", measure=False
        )
    finally:
        pool.close()


async def test_a_closed_pools_workers_exit_while_the_engine_lives(tmp_path, sample_data) -> None:
    """close() never waits, yet its workers go: each reads the end of its socket and exits (no pool thread is
    left to tell it, and the engine it watches is still alive)."""
    config = make_config(tmp_path, sample_data)
    endpoint_reconstructor, _ = await open_endpoint_reconstructor(
        build_reconstructor(config), config, tmp_path / "none.db"
    )
    pool = await ReconstructionPool.open(endpoint_reconstructor, 2)
    assert pool.workers == 2, pool.describe()
    s = sample_inputs(sample_data, 1)[0]
    from app.records import Completion

    c = Completion(content="hello", reasoning="think", finish_reason="stop")
    assert await pool.reconstruct(c, s, "sim", False) == endpoint_reconstructor.reconstruct(
        c, s.reference_ids, s.messages, s.tools, endpoint="sim", measure=False
    )
    pids = pool.pids
    pool.close()
    loop = asyncio.get_running_loop()
    end = loop.time() + 10
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            assert loop.time() < end, f"worker {pid} outlived its closed pool"
            await asyncio.sleep(0.02)


_NO_GUARD = r"""
import asyncio, os, sys
with open(sys.argv[2], "a") as f:  # the script's top level: it must run once, in this process only
    f.write(f"{os.getpid()}\n")
from app.config import parse_config
from app.engine.fidelity.pool import ReconstructionPool, build_reconstructor, open_endpoint_reconstructor
async def main():
    config = parse_config({"run": {"name": "t"},
                           "data": {"datasets": [{"path": sys.argv[1] + "/prompts.openai.jsonl"}]},
                           "model": {"name": "m", "tokenizer": sys.argv[1] + "/tokenizer"},
                           "endpoints": [{"name": "e", "base_url": "http://127.0.0.1:9"}]})
    endpoint_reconstructor, _ = await open_endpoint_reconstructor(build_reconstructor(config), config,
    config.run.database.parent / "no.db")
    said = []
    async def on_event(level, message):
        said.append(message)
    pool = await ReconstructionPool.open(endpoint_reconstructor, 1, on_event=on_event)
    print(pool.workers, len(said), flush=True)
    pool.close()
asyncio.run(main())
"""


async def test_a_script_without_a_main_guard_runs_once_and_gets_its_workers(tmp_path, sample_data) -> None:
    """multiprocessing imports the parent's main module in the workers it starts: a script that runs the engine
    without `if __name__ == "__main__":` would run a second time in its worker (a whole run again, paid for).
    The pool starts its workers with the main module hidden: the script runs once and the workers start."""
    import sys

    script, marker = tmp_path / "no_guard.py", tmp_path / "ran.txt"
    script.write_text(_NO_GUARD)
    # every process the script starts (the fork server, its worker) inherits this tag: the test waits for them all
    tag = {"EAGLEWATCH_TEST_PROCESS_TAG": str(marker)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        str(sample_data),
        str(marker),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(app.__file__).parents[1]), **tag},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out.decode().split() == ["1", "0"], (out, err.decode()[-2000:])  # one worker process, no fallback
    # a stray re-run in a worker or the fork server would have written by the time each of them has ended
    loop = asyncio.get_running_loop()
    end = loop.time() + 30
    while left := _tagged_processes(tag):
        assert loop.time() < end, f"processes the script started are still there: {left}"
        await asyncio.sleep(0.05)
    assert marker.read_text().split() == [str(proc.pid)]


def _tagged_processes(tag: dict[str, str]) -> list[int]:
    """Pids of the processes whose environment holds `tag` (one name and value)."""
    import psutil

    ((name, value),) = tag.items()
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(name) == value and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found
