"""Crash safety: SIGKILL the engine process at random moments, resume, and account for every sample."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.conftest import config_data, make_config, open_ingested

WORKER = Path(__file__).with_name("engine_process.py")


def _start(cfg_path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(WORKER), str(cfg_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started", proc.stderr.read()
    return proc


async def test_sigkill_at_random_moments_loses_nothing_committed_and_duplicates_nothing(tmp_path, sample_data):
    n = 300
    data = config_data(tmp_path, sample_data, stream=True,
                       simulator={"latency_median_ms": 250.0, "latency_p95_ms": 400.0, "faults": {"500": 0.05}},
                       limits={"concurrency_initial": 16, "concurrency_max": 16})
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(data))
    store, _ = await open_ingested(make_config(tmp_path, sample_data, **{}), sample_data, n)
    await store.close()
    db_path = data["run"]["database"]
    rng = random.Random(1234)
    done_before = 0
    for _ in range(3):
        proc = _start(cfg_path)
        time.sleep(rng.uniform(0.3, 1.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        db = sqlite3.connect(db_path)
        done_now = db.execute("SELECT COUNT(*) FROM samples WHERE state = 'done'").fetchone()[0]
        db.close()
        assert done_now >= done_before  # nothing committed is ever lost
        done_before = done_now
    assert done_before < n, "the kills came too late to test anything"
    proc = _start(cfg_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    engine_spent = float(out.split("spent=")[1])

    db = sqlite3.connect(db_path)
    assert db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall() == [("done", n)]
    ok = "content IS NOT NULL AND error_class IS NULL"
    # every sample exactly once
    assert db.execute(f"SELECT COUNT(*), COUNT(DISTINCT sample_pk) FROM responses WHERE {ok}").fetchone() == (n, n)
    # the ledger: the run's total is the sum over stored responses, each priced from its own usage
    ledger = db.execute("SELECT SUM(cost_usd) FROM responses").fetchone()[0]
    priced = db.execute(
        "SELECT SUM(prompt_tokens * 0.6 + completion_tokens * 2.5) / 1e6 FROM responses WHERE " + ok
    ).fetchone()[0]
    assert ledger == pytest.approx(priced, rel=1e-9)
    assert engine_spent == pytest.approx(ledger, rel=1e-9)
