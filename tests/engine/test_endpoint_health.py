"""A dead endpoint pauses the run, it does not burn the samples: connection failures are the endpoint's, an endpoint
is marked down after a run of them, requests go to the others, a probe brings it back, and the headless run says
why it stopped and exits non-zero. The endpoint's record itself is tested on its own first."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.health.endpoint_health import ENDPOINTS_DOWN, PROBE_CAP_S, PROBE_FIRST_S, EndpointHealth, HealthBook
from app.engine.run import Run
from app.simulator.options import SimulatorOptions
from app.simulator.server import SimulatorServer
from tests.engine.conftest import make_config, open_ingested, until


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------ the record


def test_an_endpoint_goes_down_after_the_set_number_of_failures_in_a_row_and_an_answer_resets_the_count():
    h = EndpointHealth("e", down_after=3)
    assert not h.failed("refused", 0.0) and not h.failed("refused", 0.0)
    assert not h.answered()  # up already: nothing to announce
    assert h.failures == 0
    assert [h.failed("refused", 1.0) for _ in range(3)] == [False, False, True]
    assert h.down and h.probe_at == 1.0 + PROBE_FIRST_S and h.last_error == "refused"
    assert not h.failed("refused", 2.0)  # already down: said once
    assert h.answered() and not h.down and h.failures == 0


def test_a_down_endpoints_probes_back_off_to_the_cap():
    h = EndpointHealth("e", down_after=1)
    h.failed("dns", 0.0)
    waits = []
    for t in range(10):
        h.probe_failed("dns", float(t))
        waits.append(h.probe_at - t)
    assert waits[0] == 2 * PROBE_FIRST_S and waits == sorted(waits) and waits[-1] == PROBE_CAP_S


def test_the_book_says_when_every_endpoint_is_down_and_names_them():
    book = HealthBook.of(["a", "b"], down_after=1)
    book.items[0].failed("connection refused", 0.0)
    assert not book.all_down and not book.up(0) and book.up(1)
    book.items[1].failed("host not found", 0.0)
    assert book.all_down and book.describe_down() == "a: connection refused; b: host not found"


# ------------------------------------------------------------------------------------ in the engine


def _down_config(tmp_path, sample_data, base_url: str, **kw):
    return make_config(
        tmp_path,
        sample_data,
        endpoints=[{"name": "local", "base_url": base_url, "timeout_s": 5.0}],
        limits={"concurrency_initial": 4, "concurrency_max": 4, **kw},
    )


def _states(db: Path) -> dict:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("base_url", "why"),
    [
        (None, "refused"),  # a local server that is not running
        ("http://api.eaglewatch-test.invalid/v1", "could not be resolved"),  # no network / no such host
    ],
)
async def test_an_endpoint_that_is_not_there_pauses_the_run_with_every_sample_pending(
    tmp_path, sample_data, base_url, why
):
    config = _down_config(tmp_path, sample_data, base_url or f"http://127.0.0.1:{free_port()}/v1")
    store, _ = await open_ingested(config, sample_data, 12)
    run = Run(config, store)
    try:
        await run.start()
        outcome = await asyncio.wait_for(run.wait(), 60)
        assert outcome.state == "paused" and outcome.reason.startswith(ENDPOINTS_DOWN) and why in outcome.reason
        assert _states(config.run.database) == {"pending": 12}
        assert run.snapshot().failed == 0
    finally:
        await run.close()
        await store.close()
    conn = sqlite3.connect(config.run.database)
    assert conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 0  # no attempt was used up
    assert conn.execute("SELECT MAX(tries) FROM samples").fetchone()[0] == 0
    events = [m for (m,) in conn.execute("SELECT message FROM events WHERE kind = 'endpoint'")]
    assert any("endpoint local is down" in m and why in m for m in events)
    assert any(m.startswith(ENDPOINTS_DOWN) and "resumes by itself" in m for m in events)


async def test_requests_go_to_the_other_endpoint_while_one_is_down(tmp_path, sample_data):
    async with SimulatorServer(
        SimulatorOptions(seed=3), tokenizer_dir=sample_data / "tokenizer", reference=sample_data / "reference.jsonl"
    ) as sim:
        config = make_config(
            tmp_path,
            sample_data,
            endpoints=[
                {"name": "dead", "base_url": f"http://127.0.0.1:{free_port()}/v1", "timeout_s": 5.0},
                {"name": "live", "base_url": sim.base_url, "timeout_s": 5.0},
            ],
            limits={"concurrency_initial": 8, "concurrency_max": 8},
        )
        store, _ = await open_ingested(config, sample_data, 40)
        run = Run(config, store)
        try:
            await run.start()
            outcome = await asyncio.wait_for(run.wait(), 60)
        finally:
            await run.close()
            await store.close()
    assert outcome.state == "done"
    assert _states(config.run.database) == {"done": 40}
    conn = sqlite3.connect(config.run.database)
    assert conn.execute("SELECT COUNT(*) FROM responses WHERE endpoint = 'dead'").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM events WHERE message LIKE 'endpoint dead is down%'").fetchone()[0] == 1


async def test_a_down_endpoint_that_comes_back_is_probed_up_and_the_paused_run_resumes_by_itself(tmp_path, sample_data):
    port = free_port()
    config = _down_config(tmp_path, sample_data, f"http://127.0.0.1:{port}/v1")
    store, _ = await open_ingested(config, sample_data, 10)
    run = Run(config, store)
    sim = SimulatorServer(
        SimulatorOptions(seed=3),
        tokenizer_dir=sample_data / "tokenizer",
        reference=sample_data / "reference.jsonl",
        port=port,
    )
    try:
        await run.start()
        await until(lambda: run.state == "paused", 30)
        await sim.start()  # the server is back on the same port
        await asyncio.wait_for(run.wait_finished(), 60)
    finally:
        await run.close()
        await store.close()
        await sim.close()
    assert _states(config.run.database) == {"done": 10}
    conn = sqlite3.connect(config.run.database)
    events = [m for (m,) in conn.execute("SELECT message FROM events ORDER BY id")]
    assert any(m.startswith("endpoint local is back") for m in events) and "run resumed" in events


def test_a_headless_run_against_a_closed_port_exits_non_zero_and_says_why(tmp_path, sample_data):
    db = tmp_path / "h.db"
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"""
[run]
name = "h"
database = "{db}"

[[data.datasets]]
path = "{sample_data / "prompts.openai.jsonl"}"
limit = 20

[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{sample_data / "tokenizer"}"

[[endpoints]]
name = "local-vllm"
base_url = "http://127.0.0.1:{free_port()}/v1"

[pricing."moonshotai/kimi-k2.5"]
prompt_per_m = 0.6
completion_per_m = 2.5
""")
    p = subprocess.run(
        [sys.executable, "-m", "app.cli", "run", "--headless", str(cfg)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 1, p.stderr
    assert "run paused: every endpoint is down (local-vllm" in p.stderr and "refused" in p.stderr
    assert "20 samples pending" in p.stderr and "Traceback" not in p.stderr
    assert _states(db) == {"pending": 20}
