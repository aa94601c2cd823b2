"""The simulator's server interventions on demand: OpenRouter's `openrouter_metadata` (only when asked for, a
compression only where transforms are allowed, a fallback), vLLM's thinking budget forcing the think-close."""

from __future__ import annotations

import json

import httpx
import pytest

from app.simulator import SimulatorOptions, SimulatorServer
from app.tokens import get_profile
from app.tokens.tokenizer import load_tokenizer
from tests.providers.support import user
from tests.realserver.tiny_qwen3 import build_tokenizer

ANSWER = "<think>\nThe user greets me and I think about it at some length.\n</think>\n\nHello there!<|im_end|>"
METADATA = {"X-OpenRouter-Metadata": "enabled"}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3")
    build_tokenizer(root / "tok")
    tok = load_tokenizer(root / "tok")
    ids = tok.encode(ANSWER)
    path = root / "reference.jsonl"
    record = {"id": "hi", "messages": user("hi"), "output_ids": ids, "meta_info": {"prompt_tokens": 9}}
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return tok, path, ids


def _sim(qwen, personality: str, **interventions: float) -> SimulatorServer:
    tok, path, _ = qwen
    options = SimulatorOptions(personality=personality, interventions=interventions)
    return SimulatorServer(options, tokenizer=tok, reference=path, profile="qwen3")


async def _post(sim, body: dict, headers: dict | None = None) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.post(
            sim.base_url + "/chat/completions", json=dict({"model": "m"}, **body), headers=headers or {}
        )


def _final_chunk(text: str) -> dict:
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ") and line != "data: [DONE]"]
    return json.loads(events[-1])


async def test_openrouter_reports_only_when_asked_and_compresses_only_where_transforms_are_allowed(qwen) -> None:
    async with _sim(qwen, "openrouter", context_compression=1.0, provider_fallback=1.0) as sim:
        unasked = (await _post(sim, {"messages": user("hi")})).json()
        allowed = (await _post(sim, {"messages": user("hi")}, METADATA)).json()
        off = (await _post(sim, {"messages": user("hi"), "transforms": []}, METADATA)).json()
        streamed = (await _post(sim, {"messages": user("hi"), "stream": True}, METADATA)).text
    assert "openrouter_metadata" not in unasked
    meta = allowed["openrouter_metadata"]
    assert meta["attempt"] == 2 and [a["status"] for a in meta["attempts"]] == [503, 200]
    assert meta["pipeline"] == [{"stage": "context_compression"}]
    assert off["openrouter_metadata"]["pipeline"] == [] and off["openrouter_metadata"]["attempt"] == 2
    assert _final_chunk(streamed)["openrouter_metadata"] == meta  # on the final chunk


async def test_openrouter_reports_a_clean_first_attempt_when_nothing_happened(qwen) -> None:
    async with _sim(qwen, "openrouter") as sim:
        body = (await _post(sim, {"messages": user("hi")}, METADATA)).json()
    assert body["openrouter_metadata"]["attempt"] == 1 and body["openrouter_metadata"]["pipeline"] == []


@pytest.mark.parametrize("stream", [False, True])
async def test_vllm_thinking_budget_forces_the_think_close_at_the_budget(qwen, stream) -> None:
    tok, _, ids = qwen
    profile = get_profile("qwen3")
    think_open, think_close = tok.special_id(profile.think_open), tok.special_id(profile.think_close)
    close = ids.index(think_close)
    budget = 3
    assert close - 1 > budget  # the answer thinks longer than the budget
    body = {"messages": user("hi"), "return_token_ids": True, "thinking_token_budget": budget, "stream": stream}
    async with _sim(qwen, "vllm") as sim:
        response = await _post(sim, body)
        roomy = (await _post(sim, dict(body, thinking_token_budget=1000, stream=False))).json()
    if stream:
        chunks = [
            json.loads(line[6:])
            for line in response.text.split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
        got = sum((c["choices"][0].get("token_ids") or [] for c in chunks if c.get("choices")), [])
        finish = next(
            c["choices"][0]["finish_reason"]
            for c in chunks
            if c.get("choices") and c["choices"][0].get("finish_reason")
        )
    else:
        choice = response.json()["choices"][0]
        got, finish = choice["token_ids"], choice["finish_reason"]
    assert got[0] == think_open and got[: 1 + budget] == ids[: 1 + budget]
    assert got[1 + budget] == think_close and got[2 + budget :] == ids[close + 1 :]  # the answer goes on
    assert finish == "stop"  # nothing in the response says the server closed the reasoning
    assert roomy["choices"][0]["token_ids"] == ids  # a budget the reasoning fits changes nothing
