"""Engine test parts: a real run config over the sample data, a real SQLite store, the real simulator."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from app.config import parse_config
from app.store.run_store import RunStore
from app.store.store_records import SampleInput


def make_config(tmp_path: Path, sample_data: Path, **kw):
    """A RunConfig on the sample data whose endpoint is the built-in simulator (no latency by default)."""
    return parse_config(config_data(tmp_path, sample_data, **kw), base_dir=tmp_path)


def config_data(
    tmp_path: Path,
    sample_data: Path,
    *,
    faults: dict | None = None,
    stream: bool = False,
    limits: dict | None = None,
    generation: dict | None = None,
    endpoints: list | None = None,
    pricing: dict | None = None,
    simulator: dict | None = None,
) -> dict:
    """The raw config dict behind `make_config` (JSON-serialisable, for a subprocess)."""
    sim = {
        "latency_median_ms": 0.0,
        "latency_p95_ms": 0.0,
        "tokens_per_s": 0.0,
        "seed": 3,
        "logprobs": False,
        "faults": faults or {},
    }
    sim.update(simulator or {})
    data = {
        "run": {"name": "t", "database": str(tmp_path / "run.db"), "output_dir": str(tmp_path / "out")},
        "data": {
            "datasets": [{"path": str(sample_data / "prompts.openai.jsonl")}],
            "reference": str(sample_data / "reference.jsonl"),
        },
        "model": {"name": "moonshotai/kimi-k2.5", "tokenizer": str(sample_data / "tokenizer")},
        "endpoints": endpoints or [{"name": "sim", "simulator": sim, "timeout_s": 5.0, "max_concurrency": 64}],
        "generation": {"max_tokens": 4096, "stream": stream, "attempts": 4, **(generation or {})},
        "limits": {"concurrency_initial": 8, "concurrency_min": 1, "concurrency_max": 32, **(limits or {})},
        "pricing": pricing
        if pricing is not None
        else {"moonshotai/kimi-k2.5": {"prompt_per_m": 0.6, "completion_per_m": 2.5}},
    }
    return data


def sample_inputs(sample_data: Path, n: int | None = None, references: bool = True) -> list[SampleInput]:
    """The first n sample prompts with their reference ids (none with references=False, as in production)."""
    refs = {}
    for line in (sample_data / "reference.jsonl").read_text().splitlines():
        obj = json.loads(line)
        refs[obj["id"]] = tuple(obj["output_ids"])
    out = []
    for line in (sample_data / "prompts.openai.jsonl").read_text().splitlines():
        obj = json.loads(line)
        out.append(
            SampleInput(
                obj["id"], "prompts", obj["messages"], obj.get("tools"), refs.get(obj["id"]) if references else None
            )
        )
        if n is not None and len(out) >= n:
            break
    return out


async def open_ingested(
    config, sample_data: Path, n: int | None = None, references: bool = True
) -> tuple[RunStore, int]:
    store = await RunStore.open(config.run.database)
    run_id = await store.ensure_run(config.run.name, config.redacted())
    await store.ingest(run_id, sample_inputs(sample_data, n, references))
    return store, run_id


@pytest.fixture
def sample_data(sample_data_dir: Path) -> Path:
    return sample_data_dir


async def until(pred, timeout: float = 20.0) -> None:
    """Poll `pred()` every 20 ms until it is true; fail the test after `timeout` seconds."""
    import asyncio

    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.02)


async def run_to_end(config, sample_data: Path, n: int, *, references: bool = True, **kw):
    """Ingest n samples (with their reference ids unless references=False), run them with a fresh
    Run(config, store, **kw) until it is idle; return (run, outcome)."""
    import asyncio

    from app.engine.run import Run

    store, _ = await open_ingested(config, sample_data, n, references)
    run = Run(config, store, **kw)
    try:
        await run.start()
        outcome = await asyncio.wait_for(run.wait(), 30)
    finally:
        await run.close()
        await store.close()
    return run, outcome


def last_beat(db: Path) -> float | None:
    """The time of the latest engine heartbeat the database holds (one row per run, rewritten each beat), or None."""
    if not Path(db).exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT MAX(beat_at) FROM engine_heartbeats").fetchone()[0]
    except sqlite3.OperationalError:  # the engine is still creating the schema
        return None
    finally:
        conn.close()


def wait_for_beats(db: Path, since: float, beats: int = 2, timeout: float = 30.0, *, check=None) -> None:
    """Wait until the engine has beaten `beats` times after unix time `since`: the positive witness that its
    event loop has gone on for about `beats - 1` seconds since then (it beats once a second), so its scheduler
    (which looks at the run's state at least every half second) has had its turns to do what it should not.
    `check()` runs on every poll (e.g. to assert that the engine's process is still there)."""
    seen: set[float] = set()
    end = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        beat = last_beat(db)
        if beat is not None and beat > since:
            seen.add(beat)
        if len(seen) >= beats:
            return
        assert time.monotonic() < end, f"the engine beat {len(seen)} time(s) in {timeout:g} s after {since}"
        time.sleep(0.05)


async def beats_after(db: Path, since: float, beats: int = 2, timeout: float = 30.0) -> None:
    """`wait_for_beats` for a test on the engine's own event loop (it keeps running while this waits)."""
    import asyncio

    seen: set[float] = set()
    end = time.monotonic() + timeout
    while True:
        beat = last_beat(db)
        if beat is not None and beat > since:
            seen.add(beat)
        if len(seen) >= beats:
            return
        assert time.monotonic() < end, f"the engine beat {len(seen)} time(s) in {timeout:g} s after {since}"
        await asyncio.sleep(0.05)
