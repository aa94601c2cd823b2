"""A database that refuses writes for a while (another process's lock, a full disk) loses nothing billed.

Over a real loopback simulator, a real SQLite file, a second real process holding the write lock and a
real tmpfs filled to the last byte. The cost ledger must equal what the provider billed, seen by the client.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from app.engine.run import Run
from app.providers.client import ChatClient
from app.simulator.options import SimulatorOptions
from app.simulator.server import SimulatorServer
from app.store.run_store import RunStore
from tests.engine.conftest import make_config, sample_inputs
from tests.engine.conftest import until as _until


class BillingClient:
    """The real ChatClient, summing what the provider billed for every response it returned."""

    def __init__(self, inner: ChatClient) -> None:
        self.inner = inner
        self.billed = 0.0
        self.responses = 0

    async def complete(self, *args, **kwargs):
        out = await self.inner.complete(*args, **kwargs)
        self.billed += out.usage.cost_usd or 0.0
        self.responses += 1
        return out


async def _setup(tmp_path, sample_data, db_path: Path, n: int, *, busy_timeout_s: float = 10.0):
    sim = SimulatorServer(
        SimulatorOptions(latency_median_ms=60.0, latency_p95_ms=80.0, seed=4),
        tokenizer_dir=sample_data / "tokenizer",
        reference=sample_data / "reference.jsonl",
    )
    await sim.start()
    config = make_config(
        tmp_path,
        sample_data,
        limits={"concurrency_initial": 8, "concurrency_max": 8},
        endpoints=[{"name": "sim", "base_url": sim.base_url, "timeout_s": 5}],
    )
    config = config.model_copy(update={"run": config.run.model_copy(update={"database": db_path})})
    store = await RunStore.open(db_path, busy_timeout_s=busy_timeout_s)
    run_id = await store.ensure_run(config.run.name, config.redacted())
    await store.ingest(run_id, sample_inputs(sample_data, n))
    client = BillingClient(ChatClient(config.endpoints[0], config.generation, None))
    return sim, config, store, client


def _ledger(db_path: Path) -> tuple[float, int, int]:
    db = sqlite3.connect(db_path)
    try:
        spent = db.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM responses").fetchone()[0]
        ok, distinct = db.execute(
            "SELECT COUNT(*), COUNT(DISTINCT sample_pk) FROM responses WHERE content IS NOT NULL"
        ).fetchone()
        return spent, ok, distinct
    finally:
        db.close()


HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


async def test_a_write_lock_held_past_the_busy_timeout_holds_results_until_it_is_released(tmp_path, sample_data, capfd):
    # The engine's busy timeout is cut to 1 s so the 4 s lock outlasts it (the same as a 12 s lock against the
    # default 10 s): every write in that window fails with "database is locked" and must be retried.
    db_path = tmp_path / "run.db"
    sim, config, store, client = await _setup(tmp_path, sample_data, db_path, 120, busy_timeout_s=1.0)
    run = Run(config, store, clients={"sim": client})
    holder = None
    try:
        await run.start()
        await _until(lambda: run.snapshot().done >= 10)
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLD_LOCK, str(db_path), "4", stdout=subprocess.PIPE
        )
        assert (await holder.stdout.readline()).strip() == b"locked"
        await _until(lambda: run._gate.blocked is not None, 10)
        peak = 0
        while run._gate.blocked is not None:
            snap = run.snapshot()
            peak = max(peak, snap.live.in_flight)
            assert snap.live.in_flight <= snap.live.concurrency_limit  # held results stay inside the in-flight bound
            await asyncio.sleep(0.05)
        await holder.wait()
        outcome = await asyncio.wait_for(run.wait(), 60)
    finally:
        if holder is not None and holder.returncode is None:
            holder.kill()
        await run.close()
        await store.close()
        await client.inner.aclose()
        await sim.close()
    assert outcome.state == "done"
    spent, ok, distinct = _ledger(db_path)
    assert (ok, distinct) == (120, 120)
    assert spent == pytest.approx(client.billed, abs=1e-12) and client.responses == 120
    messages = [e.message for e in run.events_since(0)]
    assert any("refuses writes" in m for m in messages) and any("writes again" in m for m in messages)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "never retrieved" not in err


class _Filler:
    """Files that fill a filesystem on demand, opened up front.

    Opening a file needs a directory entry; on a filesystem the engine may already have brought to its last
    pages, a late `open` can itself fail with ENOSPC before a byte is written, so both are opened before the
    run starts and only written when the test fills the disk."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / f"filler-{uuid.uuid4().hex}"
        # held open across fill() and release(), closed there
        self._main = open(self.path, "wb")  # noqa: SIM115
        self._tail = open(folder / "filler-tail", "wb")  # noqa: SIM115

    def fill(self) -> Path:
        """Write until the filesystem is full, then a last few bytes so not even a page is left; return the file."""
        for f, chunk in ((self._main, b"\0" * 65536), (self._tail, b"\0" * 512)):
            try:
                while True:
                    f.write(chunk)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
            finally:
                try:
                    f.close()
                except OSError:  # the buffered remainder cannot be flushed to a full disk: it is dropped
                    pass
        return self.path


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True)
    if rc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {rc.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


async def test_a_full_disk_pauses_the_run_says_what_to_free_and_loses_nothing_billed(
    tmp_path, sample_data, small_tmpfs, capfd
):
    db_path = small_tmpfs / "run.db"
    sim, config, store, client = await _setup(tmp_path, sample_data, db_path, 150)
    run = Run(config, store, clients={"sim": client})
    filler_files = _Filler(small_tmpfs)
    try:
        await run.start()
        await _until(lambda: run.snapshot().done >= 10)
        filler = filler_files.fill()
        await _until(lambda: run.state == "paused", 30)
        assert run.state_reason.startswith("disk full")
        # the requests in flight keep being answered and their results are held: wait until none is on the wire
        await _until(lambda: run.snapshot().live.in_flight == 0, 30)
        for p in small_tmpfs.glob("filler-*"):
            p.unlink()
        outcome = await asyncio.wait_for(run.wait(), 30)  # paused, and every held result stored
        assert outcome.state == "paused" and run.snapshot().live.in_flight == 0
        await run.resume()
        await asyncio.wait_for(run.wait_finished(), 60)
    finally:
        await run.close()
        await store.close()
        await client.inner.aclose()
        await sim.close()
    assert not filler.exists()
    spent, ok, distinct = _ledger(db_path)
    assert (ok, distinct) == (150, 150)
    assert spent == pytest.approx(client.billed, abs=1e-12) and client.responses == 150
    full = [e.message for e in run.events_since(0) if "is full" in e.message]
    assert full and "free space" in full[0] and str(db_path) in full[0]
    db = sqlite3.connect(db_path)
    assert any("is full" in r[0] for r in db.execute("SELECT message FROM events"))  # written once there was room
    assert os.path.exists(db_path)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "never retrieved" not in err
