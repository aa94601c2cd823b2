"""Fixtures for the job tests: a run database, a control dir, and a spec over the fake extractor."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from app.jobs.spec import JobSpec, Resources
from app.jobs.store import JobStore

FAKE = Path(__file__).with_name("fake_extractor.py")


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    s = JobStore(tmp_path / "run.db")
    yield s
    s.close()


@pytest.fixture
def ctl(tmp_path: Path) -> Path:
    d = tmp_path / "ctl"
    d.mkdir()
    return d


def fake_spec(tmp_path: Path, ctl: Path, shards=(0, 1, 2, 3), *extra: str, **kw) -> JobSpec:
    """A JobSpec running the fake extractor once per shard."""
    return JobSpec(
        name=kw.pop("name", "fake"),
        argv=(sys.executable, str(FAKE), "--shard", "{shard}", "--out", "{out}", "--ctl", str(ctl), *extra),
        shards=tuple(shards),
        output_dir=tmp_path / "out",
        workdir=tmp_path,
        resources=kw.pop("resources", Resources(gpus=1)),
        **kw,
    )


def poll_until(executor, job_id: int, predicate, timeout: float = 30.0, **poll_kw):
    """Poll the executor until `predicate(status)` holds; fail the test after `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        status = executor.poll(job_id, **poll_kw)
        if predicate(status):
            return status
        if time.monotonic() > end:
            pytest.fail(
                f"timed out waiting; last status: {status.summary()} "
                f"{[(s.shard, s.state, s.error) for s in status.shards]}"
            )
        time.sleep(0.03)
