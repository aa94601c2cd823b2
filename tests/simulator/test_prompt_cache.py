"""The simulator as a provider with a prompt cache and as a fixed workload: `cached_tokens` for a request whose
messages begin, byte for byte, with an earlier request's; and each sample's latency its own whatever the order
(`latency_by_sample`, the conversations benchmark's oracle)."""

from __future__ import annotations

import json
import statistics

import httpx
import pytest

from app.simulator import SimulatorOptions, SimulatorServer
from app.simulator.server import sample_latency_s

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


@pytest.fixture
def plain_reference(tmp_path, tok):
    """A reference whose samples report no cached tokens of their own."""
    path = tmp_path / "reference.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"s{k}",
                    "messages": [{"role": "user", "content": f"q{k}"}],
                    "output_ids": tok.encode(f"Thinking {k}.</think>Answer {k}.<|im_end|>"),
                    "meta_info": {"prompt_tokens": 100 + k},
                }
            )
            + "\n"
            for k in range(3)
        )
    )
    return path


async def _usage(http: httpx.AsyncClient, url: str, messages: list) -> dict:
    body = json.dumps({"model": "m", "messages": messages}, ensure_ascii=False, separators=(",", ":"))
    resp = await http.post(url + "/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 200
    return resp.json()["usage"]


async def test_a_later_turn_is_served_its_earlier_turns_prompt_from_the_cache(tok, plain_reference):
    turn1 = [SYSTEM, {"role": "user", "content": "What is a prompt cache?"}]
    turn2 = turn1 + [
        {"role": "assistant", "content": "A store of prompt prefixes."},
        {"role": "user", "content": "And when does it hit?"},
    ]
    edited = [dict(SYSTEM, content="You are a helpful assistant!")] + turn2[1:]  # one byte differs up front
    async with SimulatorServer(SimulatorOptions(prompt_cache=True), tokenizer=tok, reference=plain_reference) as sim:
        async with httpx.AsyncClient() as http:
            first = await _usage(http, sim.base_url, turn1)
            second = await _usage(http, sim.base_url, turn2)
            other = await _usage(http, sim.base_url, edited)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached == min(first["prompt_tokens"], second["prompt_tokens"]) > 0
    assert other["prompt_tokens_details"]["cached_tokens"] == 0  # no earlier request begins it


async def test_without_the_option_nothing_is_served_from_a_cache(tok, plain_reference):
    turn1 = [SYSTEM, {"role": "user", "content": "What is a prompt cache?"}]
    async with SimulatorServer(SimulatorOptions(), tokenizer=tok, reference=plain_reference) as sim:
        async with httpx.AsyncClient() as http:
            await _usage(http, sim.base_url, turn1)
            again = await _usage(http, sim.base_url, turn1 + [{"role": "user", "content": "More?"}])
    assert again["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_samples_latency_is_its_own_whatever_the_order_and_follows_the_median_and_p95():
    keys = [f"conv-{i}#{k}" for i in range(500) for k in (1, 2, 3, 4)]
    forward = [sample_latency_s(7, key, 300.0, 600.0) for key in keys]
    backward = [sample_latency_s(7, key, 300.0, 600.0) for key in reversed(keys)]
    assert forward == backward[::-1]
    assert sample_latency_s(8, keys[0], 300.0, 600.0) != forward[0]  # the seed changes the draw
    ordered = sorted(forward)
    assert abs(statistics.median(ordered) - 0.300) < 0.015
    assert abs(ordered[int(0.95 * len(ordered))] - 0.600) < 0.05
    assert sample_latency_s(7, keys[0], 0.0, 0.0) == 0.0
