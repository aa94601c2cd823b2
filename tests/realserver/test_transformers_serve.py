"""eaglewatch against a real `transformers serve` (tiny Qwen3-layout model), checked against model.generate.

What the real server was shown to do (transformers 5.x; docs/providers.md holds the table):
- non-streaming: content and reasoning stripped of leading/trailing whitespace, empty thinking -> no
  reasoning field, tool arguments re-serialised with json.dumps (ASCII escapes), ids `{id}_tool_call_{i}`;
- streaming: the raw regions (reasoning "\\n...\\n", content "\\n\\n..."), a tool call in one delta, usage on
  the finish chunk, no [DONE];
- 422 to request fields outside its schema; 500 to a tool-call region that is not JSON.
"""

from __future__ import annotations

import json

import pytest

from app.providers import ChatClient, ProviderError, RetryableError, SampleFatalError
from app.simulator import SimulatorOptions, SimulatorServer
from app.tokens import Reconstructor, get_profile
from app.tokens.tokenizer import load_tokenizer
from tests.providers.support import Endpoint, Generation
from tests.realserver.tiny_qwen3 import CASES

MAX_TOKENS = 96
CUT = 12  # max_tokens for the truncation cases: generation stops while thinking
GOOD = [case for case in CASES if "not json" not in case[2]]
BROKEN = [case for case in CASES if "not json" in case[2]]


def _client(base_url: str, stream: bool, max_tokens: int = MAX_TOKENS, **endpoint) -> ChatClient:
    return ChatClient(Endpoint(name="serve", timeout_s=120, server="transformers-serve", **endpoint),
                      Generation(stream=stream, temperature=0.0, max_tokens=max_tokens), None, base_url=base_url)


@pytest.fixture(scope="module")
def rec(tiny_model_dir):
    return Reconstructor(get_profile("qwen3"), load_tokenizer(tiny_model_dir))


async def _run_cases(base_url, model, stream, truth, cases, max_tokens):
    out = []
    async with _client(base_url, stream, max_tokens) as client:
        for messages, tools, _ in cases:
            completion = await client.complete(messages, tools, model=model)
            out.append((messages, tools, completion, truth(messages, tools, max_tokens)))
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_every_verdict_agrees_with_generate_truth(real_server, truth, rec, stream):
    base_url, model = real_server
    results = await _run_cases(base_url, model, stream, truth, GOOD, MAX_TOKENS)
    results += await _run_cases(base_url, model, stream, truth, GOOD[:2], CUT)
    report = []
    for messages, tools, completion, ids in results:
        reconstruction, verdict = rec.process(completion, ids)
        right = tuple(reconstruction.output_ids) == tuple(ids)
        # never a wrong verdict: exact (truncated: exact without an end of turn) exactly when the rebuilt ids
        # are generate()'s ids; bpe_equivalent only for other ids of the same text
        assert (verdict.category in ("exact", "truncated")) == right, (messages, verdict)
        production, _ = rec.process(completion, None)  # no reference: what a real run rebuilds
        report.append((messages[-1]["content"], completion.finish_reason, verdict.category, reconstruction.repair,
                       tuple(production.output_ids) == tuple(ids)))
        if ids[-1:] != [rec.tokenizer.special_id("<|im_end|>")]:
            assert completion.finish_reason == "length"
    print("\n".join(map(str, report)))
    assert any(r[1] == "tool_calls" for r in report) and any(r[1] == "length" for r in report)


def _shape(completion) -> dict:
    """What the mirror must reproduce: texts, calls (name, arguments, id pattern), finish, completion tokens."""
    return {
        "content": completion.content,
        "reasoning": completion.reasoning,
        "calls": [(c.name, c.arguments, c.id.replace(completion.generation_id or "", "{id}"), c.index)
                  for c in completion.tool_calls],
        "finish": completion.finish_reason,
        "completion_tokens": completion.usage.completion_tokens,
    }


def _raw_shape(completion) -> dict:
    """The wire: which fields the message (or the stream's chunks) carried, and how the stream ended."""
    if isinstance(completion.raw, list):
        keys = sorted({k for chunk in completion.raw for choice in chunk.get("choices") or []
                       for k in (choice.get("delta") or {})})
        return {"delta_keys": keys, "usage_on_finish": any(c.get("usage") and c.get("choices")
                                                           for c in completion.raw)}
    message = completion.raw["choices"][0]["message"]
    return {"message_keys": sorted(k for k, v in message.items() if v is not None)}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_the_simulator_personality_mirrors_the_real_server(real_server, truth, tiny_model_dir, tmp_path,
                                                                  stream):
    base_url, model = real_server
    cases = [(m, t, MAX_TOKENS) for m, t, _ in GOOD] + [(m, t, CUT) for m, t, _ in GOOD[:2]]
    tok = load_tokenizer(tiny_model_dir)
    real = []
    for messages, tools, max_tokens in cases:
        async with _client(base_url, stream, max_tokens) as client:
            real.append(await client.complete(messages, tools, model=model))
    # one simulator per budget: it replays generate()'s ids for each prompt
    mirrored = []
    for max_tokens in (MAX_TOKENS, CUT):
        path = tmp_path / f"reference-{max_tokens}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            for messages, tools, budget in cases:
                if budget == max_tokens:
                    handle.write(json.dumps({"messages": messages, "output_ids": truth(messages, tools, budget)})
                                 + "\n")
        options = SimulatorOptions(personality="transformers-serve")
        async with SimulatorServer(options, tokenizer=tok, reference=path, profile="qwen3", model=model) as sim:
            async with _client(sim.base_url, stream, max_tokens) as client:
                for messages, tools, budget in cases:
                    if budget == max_tokens:
                        mirrored.append((messages, await client.complete(messages, tools, model=model)))
    order = {repr(m) + str(b): i for i, (m, _, b) in enumerate(cases)}
    mirrored_in_order = [None] * len(cases)
    for k, (messages, completion) in enumerate(mirrored):
        budget = MAX_TOKENS if k < len(GOOD) else CUT
        mirrored_in_order[order[repr(messages) + str(budget)]] = completion
    for (messages, _, budget), got, want in zip(cases, mirrored_in_order, real):
        assert _shape(got) == _shape(want), (messages[-1]["content"], budget)
        assert _raw_shape(got) == _raw_shape(want), (messages[-1]["content"], budget)


async def test_real_server_and_mirror_fail_alike(real_server, truth, tiny_model_dir, tmp_path):
    base_url, model = real_server
    messages, tools, _ = BROKEN[0]
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"messages": messages, "output_ids": truth(messages, tools, MAX_TOKENS)}) + "\n")
    sim = SimulatorServer(SimulatorOptions(personality="transformers-serve"), tokenizer=load_tokenizer(tiny_model_dir),
                          reference=path, profile="qwen3", model=model)
    async with sim:
        for url in (base_url, sim.base_url):
            # a tool-call region that is not JSON: HTTP 500 (retryable), non-streaming
            async with _client(url, False) as client:
                with pytest.raises(RetryableError) as caught:
                    await client.complete(messages, tools, model=model)
            assert caught.value.status == 500, url
            # a field outside its schema: 422 naming the field (sample-fatal)
            async with _client(url, False, extra={"return_token_ids": True}) as client:
                with pytest.raises(SampleFatalError, match="return_token_ids") as refused:
                    await client.complete(GOOD[0][0], model=model)
            assert refused.value.status == 422, url
