"""Simulator behaviour outside the text: sample lookup, fault counters, latency model, options, CLI."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys

import httpx
import pytest

from app.errors import InputError
from app.providers import ChatClient
from app.simulator import SimulatorOptions, SimulatorServer
from app.simulator.options import check_options, parse_faults
from app.simulator.reference import ReferenceBook
from tests.providers.support import OUTPUTS, Endpoint, Generation, user


async def test_known_prompt_gets_its_sample_and_unknown_prompts_are_deterministic(tok, reference):
    async with SimulatorServer(SimulatorOptions(), tokenizer=tok, reference=reference[0]) as sim:
        async with ChatClient(Endpoint(), Generation(), None, base_url=sim.base_url) as client:
            known = await client.complete(user("spaces"), model="m", extra={"return_token_ids": True})
            first = await client.complete(user("never seen"), model="m", extra={"return_token_ids": True})
            again = await client.complete(user("never seen"), model="m", extra={"return_token_ids": True})
    assert known.token_ids == tuple(reference[1]["spaces"])
    assert first.token_ids == again.token_ids
    assert first.token_ids in {tuple(v) for v in reference[1].values()}


async def test_samples_that_share_a_prompt_each_replay_their_own_reference(tok, tmp_path):
    # four samples of one prompt: by prompt alone all would get the first one's answer; the sample id a request
    # names (metadata.sample_id, which eaglewatch sends to its simulators) picks its own
    import json

    texts = [f"Answer {k}.</think>Reply number {k}.<|im_end|>" for k in range(4)]
    path = tmp_path / "reference.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"s{k}", "messages": user("same prompt"), "output_ids": tok.encode(t)}) + "\n"
            for k, t in enumerate(texts)
        )
    )
    async with SimulatorServer(SimulatorOptions(), tokenizer=tok, reference=path) as sim:
        async with ChatClient(Endpoint(), Generation(), None, base_url=sim.base_url) as client:
            by_id = [
                await client.complete(
                    user("same prompt"), model="m", extra={"return_token_ids": True, "metadata": {"sample_id": f"s{k}"}}
                )
                for k in (2, 0, 3, 1)
            ]
            by_prompt = await client.complete(user("same prompt"), model="m", extra={"return_token_ids": True})
            unknown = await client.complete(
                user("same prompt"), model="m", extra={"return_token_ids": True, "metadata": {"sample_id": "nope"}}
            )
    assert [c.token_ids for c in by_id] == [tuple(tok.encode(texts[k])) for k in (2, 0, 3, 1)]
    assert by_prompt.token_ids == unknown.token_ids == tuple(tok.encode(texts[0]))  # the prompt's first sample


async def test_counters_follow_seeded_fault_rates(tok, reference):
    options = SimulatorOptions(faults={"429": 0.3, "502": 0.2, "keepalive": 0.5}, seed=11)
    async with SimulatorServer(options, tokenizer=tok, reference=reference[0], retry_after_s=0) as sim:
        async with httpx.AsyncClient() as http:
            statuses = [
                (
                    await http.post(sim.base_url + "/chat/completions", json={"model": "m", "messages": user("x")})
                ).status_code
                for _ in range(200)
            ]
        counters = dict(sim.counters)
    assert counters["429"] == statuses.count(429) and counters["502"] == statuses.count(502)
    assert counters["ok"] == statuses.count(200)
    assert counters["429"] + counters["502"] + counters["ok"] == 200
    assert 30 <= counters["429"] <= 90 and 15 <= counters["502"] <= 65 and 60 <= counters["keepalive"] <= 140


def test_latency_is_lognormal_with_the_configured_median_and_p95(tok, reference):
    server = SimulatorServer(
        SimulatorOptions(latency_median_ms=200, latency_p95_ms=800, seed=5), tokenizer=tok, reference=reference[0]
    )
    draws = sorted(server._latency_s() for _ in range(20000))
    assert statistics.median(draws) == pytest.approx(0.200, rel=0.05)
    assert draws[int(0.95 * len(draws))] == pytest.approx(0.800, rel=0.08)


def test_zero_latency_draws_nothing(tok, reference):
    server = SimulatorServer(SimulatorOptions(), tokenizer=tok, reference=reference[0])
    assert server._latency_s() == 0.0


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (SimulatorOptions(faults={"418x": 0.1}), "unknown fault kind '418x'"),
        (SimulatorOptions(faults={"429": 1.5}), "between 0 and 1"),
        (SimulatorOptions(faults={"429": 0.6, "500": 0.6}), "add up"),
        (SimulatorOptions(quirks=["lowercase"]), "unknown quirk 'lowercase'"),
        (SimulatorOptions(latency_median_ms=100, latency_p95_ms=50), "p95"),
    ],
)
def test_bad_options_are_named(options, needle):
    with pytest.raises(InputError, match=needle):
        check_options(options)


def test_fault_spec_parsing():
    assert parse_faults("429=0.05, 500=0.02,keepalive=1") == {"429": 0.05, "500": 0.02, "keepalive": 1.0}
    with pytest.raises(InputError, match="KIND=RATE"):
        parse_faults("429")


def test_bad_reference_line_is_named(tmp_path):
    path = tmp_path / "ref.jsonl"
    path.write_text('{"messages": [], "output_ids": [1, 2]}\n{"messages": []}\n')
    with pytest.raises(InputError, match=r"ref.jsonl:2"):
        ReferenceBook.load(path)


async def test_synthetic_samples_when_no_reference(tok):
    async with SimulatorServer(SimulatorOptions(), tokenizer=tok) as sim:
        async with ChatClient(Endpoint(), Generation(), None, base_url=sim.base_url) as client:
            completion = await client.complete(user("anything"), model="m")
    assert completion.content and completion.finish_reason in ("stop", "tool_calls")


async def test_paced_stream_still_assembles(tok, reference):
    options = SimulatorOptions(tokens_per_s=2000)
    async with SimulatorServer(options, tokenizer=tok, reference=reference[0], stream_chunk_tokens=1) as sim:
        async with ChatClient(Endpoint(), Generation(stream=True), None, base_url=sim.base_url) as client:
            completion = await client.complete(user("plain"), model="m")
    assert completion.content == "Hello! ünï 中文 here."
    assert len(completion.raw) > 10  # one chunk per token


async def _start_cli(*argv: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.cli",
        "simulate",
        "--port",
        "0",
        *argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    return proc, line


async def test_cli_starts_and_serves_models(sample_tokenizer_dir, reference):
    proc, line = await _start_cli(
        "--tokenizer",
        str(sample_tokenizer_dir),
        "--reference",
        str(reference[0]),
        "--faults",
        "429=0.1",
        "--quirks",
        "strip_whitespace",
    )
    try:
        assert "listening on http://127.0.0.1:" in line and f"{len(OUTPUTS)} samples" in line
        assert "faults: 429=0.1" in line and "quirks: strip_whitespace" in line
        base_url = line.split("listening on ")[1].split()[0]
        async with httpx.AsyncClient() as http:
            models = (await http.get(base_url + "/models")).json()
        assert models["data"][0]["pricing"]["prompt"]
    finally:
        proc.terminate()
        await proc.wait()


async def test_cli_serves_a_configs_simulator_endpoint(repo_root):
    proc, line = await _start_cli(str(repo_root / "sample_data" / "demo.toml"), "--latency-median-ms", "0")
    try:
        assert "listening on http://127.0.0.1:" in line and "faults: 429=0.02,500=0.01,hang=0.005" in line
        assert re.search(r"\(\d+ samples", line)
    finally:
        proc.terminate()
        await proc.wait()


async def test_fault_aliases_count_under_their_status(tok, reference):
    options = SimulatorOptions(faults={"rate_limit": 1.0})
    async with SimulatorServer(options, tokenizer=tok, reference=reference[0], retry_after_s=0) as sim:
        async with httpx.AsyncClient() as http:
            response = await http.post(sim.base_url + "/chat/completions", json={"model": "m", "messages": user("x")})
        assert response.status_code == 429 and sim.counters["429"] == 1


async def test_accepts_the_config_simulator_options(tok, reference):
    from app.config import SimulatorOptions as ConfigSimulatorOptions

    options = ConfigSimulatorOptions(
        latency_median_ms=0, latency_p95_ms=0, faults={"500": 1.0}, quirks=["strip_whitespace"], seed=2
    )
    async with SimulatorServer(options, tokenizer=tok, reference=reference[0]) as sim:
        async with httpx.AsyncClient() as http:
            response = await http.post(sim.base_url + "/chat/completions", json={"model": "m", "messages": user("x")})
        assert response.status_code == 500 and sim.counters["500"] == 1
