"""The engine over real loopback HTTP (the simulator) and a real SQLite run store."""

from __future__ import annotations

import sqlite3

import pytest

from app.engine.run import Run
from tests.engine.conftest import make_config, open_ingested


def _db(config):
    return sqlite3.connect(config.run.database)


async def _run_to_end(config, sample_data, n, **kw):
    store, run_id = await open_ingested(config, sample_data, n)
    run = Run(config, store, **kw)
    try:
        await run.start()
        outcome = await run.wait()
        snap = run.snapshot()
    finally:
        await run.close()
        await store.close()
    return outcome, snap


@pytest.mark.parametrize("stream", [False, True])
async def test_every_sample_is_done_once(tmp_path, sample_data, stream):
    config = make_config(tmp_path, sample_data, stream=stream)
    outcome, snap = await _run_to_end(config, sample_data, 40)
    assert outcome.state == "done"
    assert (snap.done, snap.failed, snap.pending) == (40, 0, 0)
    db = _db(config)
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT sample_pk) FROM responses").fetchone() == (40, 40)
    assert db.execute("SELECT state FROM runs").fetchone()[0] == "done"
