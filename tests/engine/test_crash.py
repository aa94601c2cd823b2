"""Crash safety: SIGKILL the engine process at random moments, resume, and account for every sample."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.simulator.options import SimulatorOptions
from app.simulator.server import SimulatorServer
from app.store.run_store import RunStore
from tests.engine.conftest import config_data, make_config, open_ingested, sample_inputs

WORKER = Path(__file__).with_name("engine_process.py")
OK = "content IS NOT NULL AND error_class IS NULL"

# (fault kind, streamed) for the storm's rounds: each round draws one mix and a new simulator seed
FAULT_MIXES = [
    ({"500": 0.05}, False),
    ({"429": 0.1}, False),
    ({"reset": 0.05}, False),
    ({"malformed": 0.05}, False),
    ({"truncate": 0.05, "stream_error": 0.05}, True),
    ({"502": 0.05, "503": 0.05}, True),
]


def _start(cfg_path: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(cfg_path), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "started", proc.stderr.read()
    return proc


async def test_sigkill_storm_with_new_faults_and_seeds_loses_nothing_committed_and_duplicates_nothing(
    tmp_path, sample_data
):
    n, rounds = 300, 15
    store, _ = await open_ingested(make_config(tmp_path, sample_data), sample_data, n)
    await store.close()
    db_path = str(tmp_path / "run.db")
    cfg_path = tmp_path / "config.json"
    rng = random.Random(20261201)
    done_before = 0
    kinds_seen = set()
    for r in range(rounds):
        faults, stream = FAULT_MIXES[r % len(FAULT_MIXES)]
        kinds_seen.update(faults)
        data = config_data(
            tmp_path,
            sample_data,
            stream=stream,
            faults=faults,
            simulator={"latency_median_ms": 300.0, "latency_p95_ms": 450.0, "seed": 1000 + r},
            limits={"concurrency_initial": 8, "concurrency_max": 8},
        )
        cfg_path.write_text(json.dumps(data))
        proc = _start(cfg_path)
        time.sleep(rng.uniform(0.1, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        db = sqlite3.connect(db_path)
        done_now = db.execute("SELECT COUNT(*) FROM samples WHERE state = 'done'").fetchone()[0]
        db.close()
        assert done_now >= done_before  # nothing committed is ever lost
        done_before = done_now
    assert done_before < n, "the kills came too late to test anything"
    assert len(kinds_seen) >= 6
    proc = _start(cfg_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    engine_spent = float(out.split("spent=")[1])

    db = sqlite3.connect(db_path)
    states = dict(db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())
    assert states.get("pending", 0) == states.get("leased", 0) == 0
    done = states["done"]
    assert done >= n - states.get("failed", 0) and done + states.get("failed", 0) == n
    # every done sample exactly once
    assert db.execute(f"SELECT COUNT(*), COUNT(DISTINCT sample_pk) FROM responses WHERE {OK}").fetchone() == (
        done,
        done,
    )
    # tries never pass generation.attempts, whatever the kills did
    assert db.execute("SELECT MAX(tries) FROM samples").fetchone()[0] <= data["generation"]["attempts"]
    # the ledger: the run's total is the sum over stored responses, each priced from its own usage
    ledger = db.execute("SELECT SUM(cost_usd) FROM responses").fetchone()[0]
    priced = db.execute(
        f"SELECT SUM(prompt_tokens * 0.6 + completion_tokens * 2.5) / 1e6 FROM responses WHERE {OK}"
    ).fetchone()[0]
    assert ledger == pytest.approx(priced, rel=1e-9)
    assert engine_spent == pytest.approx(ledger, rel=1e-9)


async def test_sigkill_at_concurrency_256_loses_at_most_the_in_flight_bound(tmp_path, sample_data):
    """The simulator lives in this process (a real loopback server that survives the kill) and counts every
    answer it gave; whatever was answered but not stored when the engine died is lost, and must be at most
    the in-flight limit, even with the reconstruction pool slower than the provider."""
    limit, n = 256, 4000
    sim = SimulatorServer(
        SimulatorOptions(latency_median_ms=150.0, latency_p95_ms=200.0, seed=9),
        tokenizer_dir=sample_data / "tokenizer",
        reference=sample_data / "reference.jsonl",
    )
    await sim.start()
    try:
        data = config_data(
            tmp_path,
            sample_data,
            endpoints=[{"name": "sim", "base_url": sim.base_url, "timeout_s": 10, "max_concurrency": limit}],
            limits={"concurrency_initial": limit, "concurrency_min": limit, "concurrency_max": limit},
        )
        cfg_path = tmp_path / "config.json"
        cfg_path.write_text(json.dumps(data))
        config = make_config(tmp_path, sample_data)
        store = await RunStore.open(config.run.database)
        run_id = await store.ensure_run(config.run.name, config.redacted())
        base = sample_inputs(sample_data)
        await store.ingest(
            run_id,
            [
                dataclasses.replace(base[i % len(base)], sample_id=f"{base[i % len(base)].sample_id}-{i}")
                for i in range(n)
            ],
        )
        await store.close()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), str(cfg_path), "--reconstruct", stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert (await proc.stdout.readline()).strip() == b"started"
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while sim.counters["ok"] < 3 * limit:  # well into the run: a backlog has had time to form
            assert loop.time() < end and proc.returncode is None
            await asyncio.sleep(0.02)
        proc.kill()
        await proc.wait()
        # every connection of the dead engine closed on the server's side: each request that reached it has been
        # counted (or its handler cancelled before it answered)
        end = loop.time() + 30
        while sim._runner.server.connections:
            assert loop.time() < end, "the simulator still holds the killed engine's connections"
            await asyncio.sleep(0.02)
        answered = sim.counters["ok"]
    finally:
        await sim.close()
    db = sqlite3.connect(tmp_path / "run.db")
    stored = db.execute(f"SELECT COUNT(*) FROM responses WHERE {OK}").fetchone()[0]
    assert stored < n, "the run ended before the kill"
    lost = answered - stored
    print(f"answered={answered} stored={stored} lost={lost}")
    assert 0 <= lost <= limit, f"{lost} answered responses lost (limit {limit})"
