"""The simulator's capacity: the pure model on a fake clock, then the real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from app.errors import InputError
from app.simulator import SimulatorOptions, SimulatorServer
from app.simulator.capacity import CapacityModel, check_capacity, has_capacity, parse_cap_changes
from tests.providers.support import user


def opts(**kw):
    return SimpleNamespace(**kw)


# ---- the pure model -----------------------------------------------------------------------------------


def test_a_concurrency_cap_refuses_one_more_and_admits_again_when_one_ends():
    model = CapacityModel(opts(concurrency_cap=3), retry_after_s=2.0)
    assert all(model.try_admit(0.0).admitted for _ in range(3))
    refused = model.try_admit(0.0)
    assert not refused.admitted and refused.reason == "concurrency" and refused.retry_after_s == 2.0
    model.finish()
    assert model.try_admit(0.1).admitted and model.peak == 3


def test_the_cap_changes_on_its_schedule():
    model = CapacityModel(opts(concurrency_cap=48, cap_changes=[(7.0, 16), (20.0, 0)]), start=100.0)
    assert model.cap_at(100.0) == 48 and model.cap_at(106.9) == 48
    assert model.cap_at(107.0) == 16 and model.cap_at(119.0) == 16
    assert model.cap_at(120.0) is None  # 0 lifts the cap
    for _ in range(20):
        model.try_admit(100.0)
    assert not model.try_admit(107.5).admitted  # 20 running over a cap of 16


def test_a_requests_per_min_quota_refuses_with_the_time_to_the_next_request():
    model = CapacityModel(opts(requests_per_min=600))  # 10/s, one second's burst of 10
    assert sum(model.try_admit(0.0).admitted for _ in range(15)) == 10
    refused = model.try_admit(0.0)
    assert refused.reason == "rpm" and 0 < refused.retry_after_s <= 0.1 + 1e-9
    assert model.try_admit(0.1 + 1e-6).admitted
    # sustained: 10 admitted per second
    admitted = sum(model.try_admit(1.0 + i / 100).admitted for i in range(1000))
    assert 95 <= admitted <= 112


def test_a_tokens_per_min_quota_counts_tokens():
    model = CapacityModel(opts(tokens_per_min=60_000))  # 1000 tokens/s
    assert model.try_admit(0.0, 900).admitted
    assert model.try_admit(0.0, 900).admitted  # goes into debt once
    refused = model.try_admit(0.0, 10)
    assert refused.reason == "tpm" and refused.retry_after_s > 0.7


def test_no_capacity_options_means_no_capacity_and_bad_ones_are_named():
    assert not has_capacity(SimulatorOptions())
    assert has_capacity(SimulatorOptions(batch_slots=4))
    with pytest.raises(InputError, match="cap_changes\\[1\\]"):
        check_capacity(opts(cap_changes=[(5.0, 10), (2.0, 4)]))
    with pytest.raises(InputError, match="concurrency_cap"):
        check_capacity(opts(concurrency_cap=-1))
    with pytest.raises(InputError, match="SECONDS:CAP"):
        parse_cap_changes("30-16")
    assert parse_cap_changes("30:16, 60:48") == [(30.0, 16), (60.0, 48)]


# ---- the real server --------------------------------------------------------------------------------


async def _post(http, sim, prompt="x"):
    return await http.post(sim.base_url + "/chat/completions", json={"model": "m", "messages": user(prompt)})


async def test_the_server_refuses_beyond_its_cap_with_retry_after(tok, reference):
    options = SimulatorOptions(concurrency_cap=4, latency_median_ms=300, latency_p95_ms=300)
    async with SimulatorServer(options, tokenizer=tok, reference=reference[0], retry_after_s=2.0) as sim:
        async with httpx.AsyncClient() as http:
            answers = await asyncio.gather(*(_post(http, sim) for _ in range(10)))
            later = await _post(http, sim)  # everything ended: admitted again
    refused = [a for a in answers if a.status_code == 429]
    assert sum(a.status_code == 200 for a in answers) == 4 and len(refused) == 6
    assert refused[0].headers["Retry-After"] == "2" and refused[0].headers["retry-after-ms"] == "2000"
    assert refused[0].json()["error"]["code"] == 429
    assert later.status_code == 200
    assert sim.counters["429_concurrency"] == 6 and sim.capacity.model.peak == 4


async def test_a_queueing_server_never_refuses_and_its_latency_grows_with_the_queue(tok, reference):
    options = SimulatorOptions(batch_slots=2, latency_median_ms=200, latency_p95_ms=200)
    async with SimulatorServer(options, tokenizer=tok, reference=reference[0]) as sim:
        async with httpx.AsyncClient() as http:

            async def timed():
                t0 = time.monotonic()
                r = await _post(http, sim)
                return r.status_code, time.monotonic() - t0

            results = await asyncio.gather(*(timed() for _ in range(6)))
    assert all(status == 200 for status, _ in results)
    waits = sorted(s for _, s in results)
    # the last pair waited for two rounds of slots (200 ms each) that the first did not: measured against the
    # first pair, not the clock's zero, as a loaded machine delays every request alike
    assert waits[-1] >= 0.55 and waits[-1] - waits[0] >= 0.3
    assert sim.capacity.queued == 0 and sim.capacity.model.active == 0


async def test_without_capacity_options_random_429s_are_as_before(tok, reference):
    options = SimulatorOptions(faults={"429": 0.3}, seed=11)
    async with SimulatorServer(options, tokenizer=tok, reference=reference[0], retry_after_s=0) as sim:
        assert sim.capacity is None
        async with httpx.AsyncClient() as http:
            statuses = [(await _post(http, sim)).status_code for _ in range(100)]
    assert sim.counters["429"] == statuses.count(429) and "429_concurrency" not in sim.counters


def test_simulate_command_takes_capacity_flags(tmp_path):
    # bad capacity flags are reported before anything binds
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "simulate", "--port", "0", "--cap-changes", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--cap-changes" in proc.stderr and "Traceback" not in proc.stderr


def test_config_capacity_fields_reach_the_server(tmp_path, tok, reference):
    from app.config import load_config

    sample = Path(__file__).resolve().parents[2] / "sample_data"
    demo = (
        (sample / "demo.toml")
        .read_text(encoding="utf-8")
        .replace("seed = 7 ", "seed = 7\nconcurrency_cap = 24\ncap_changes = [[30.0, 16]]\nbatch_slots = 8\n#")
    )
    # the copy lives elsewhere: every file the demo names, the conversations' per-turn reference included
    for name in ("tokenizer", "reference.jsonl", "prompts.openai.jsonl", "conversations.reference.jsonl"):
        demo = demo.replace(f'"{name}"', f'"{(sample / name).as_posix()}"', 1)
    path = tmp_path / "demo.toml"
    path.write_text(demo, encoding="utf-8")
    sim = load_config(path).endpoints[0].simulator
    assert (sim.concurrency_cap, sim.cap_changes, sim.batch_slots) == (24, [(30.0, 16)], 8)
    server = SimulatorServer(sim, tokenizer=tok, reference=reference[0])
    assert server.capacity is not None and server.capacity.model.cap_at(server.capacity.model.start) == 24
