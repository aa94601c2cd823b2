"""Server personalities: each answers as its real server does; Qwen3 tool calls; Kimi ids with whitespace."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest

from app.providers import ChatClient, RetryableError, SampleFatalError
from app.records import Completion
from app.simulator import SimulatorOptions, SimulatorServer
from app.tokens import Reconstructor, get_profile, parse_output
from app.tokens.prompt_check import check_prompt
from app.tokens.tokenizer import load_tokenizer
from tests.providers.support import Endpoint, Generation, user
from tests.realserver.tiny_qwen3 import WEATHER_TOOL, build_tokenizer

QWEN_OUTPUTS = {
    "weather": '<think>\nI should call the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Paris"}}\n</tool_call><|im_end|>',
    "two": '<think>\nTwo calls.\n</think>\n\nChecking both.\n<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Zürich"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}'
    "\n</tool_call><|im_end|>",
    "plain": "<think>\nThe user greets me.\n</think>\n\nHello! How can I help you today?<|im_end|>",
    "broken": "<think>\nOops.\n</think>\n\n<tool_call>\nnot json at all\n</tool_call><|im_end|>",
    "thinkless": "Ok, at once.<|im_end|>",  # no think block: vLLM's qwen3 parser returns it as reasoning
}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """(tokenizer, reference path, prompt -> output ids) for a tiny Qwen3-layout tokenizer."""
    root = tmp_path_factory.mktemp("qwen3")
    build_tokenizer(root / "tok")
    tok = load_tokenizer(root / "tok")
    ids = {}
    path = root / "reference.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for prompt, text in QWEN_OUTPUTS.items():
            ids[prompt] = tok.encode(text)
            handle.write(
                json.dumps(
                    {
                        "id": prompt,
                        "messages": user(prompt),
                        "output_ids": ids[prompt],
                        "meta_info": {"prompt_tokens": 30},
                    }
                )
                + "\n"
            )
    return tok, path, ids


def _sim(tok, path, personality="openrouter", profile="qwen3", **kw):
    return SimulatorServer(
        SimulatorOptions(personality=personality), tokenizer=tok, reference=path, profile=profile, **kw
    )


def _client(sim, stream=False, server=None):
    return ChatClient(
        Endpoint(server=server),
        Generation(stream=stream, temperature=None, max_tokens=256),
        None,
        base_url=sim.base_url,
    )


@pytest.mark.parametrize("personality", ["openrouter", "vllm", "sglang", "transformers-serve"])
@pytest.mark.parametrize("stream", [False, True])
async def test_qwen3_tool_calls_carry_the_real_function_name_and_reconstruct_exactly(qwen, personality, stream):
    from app.tokens.server_steps import prior_profile

    tok, path, ids = qwen
    # what the engine reconstructs with once it knows the server: its known text steps (vLLM keeps the template's
    # whitespace in the fields, as the real one does)
    profile = get_profile("qwen3")
    rec = Reconstructor(profile, tok, prior_profile(personality, stream, profile, "sim", simulated=True))
    async with _sim(tok, path, personality) as sim, _client(sim, stream) as client:
        for prompt in ("weather", "two"):
            completion = await client.complete(user(prompt), [WEATHER_TOOL], model="qwen3")
            names = [c.name for c in completion.tool_calls]
            assert names == (["get_weather"] if prompt == "weather" else ["get_weather", "get_time"])
            reconstruction, verdict = rec.process(completion, ids[prompt])
            right = tuple(reconstruction.output_ids) == tuple(ids[prompt])
            assert (verdict.category == "exact") == right, verdict  # the verdict is never wrong
            if personality != "transformers-serve":
                assert verdict.category in ("exact", "bpe_equivalent"), (personality, stream, prompt, verdict)
            else:
                # non-streaming: stripped regions and json.dumps ASCII escapes; streaming: the raw regions keep
                # the template whitespace and the qwen3 profile adds it again (docs/providers.md). With a
                # reference the repairs rescue some; whatever is left is called corrupt, never exact
                assert verdict.category in ("exact", "text_mismatch"), verdict


async def test_kimi_tool_id_with_surrounding_whitespace_names_the_tool_and_reconstructs(tok, tmp_path):
    text = (
        "Call.</think><|tool_calls_section_begin|><|tool_call_begin|> functions.f:7 <|tool_call_argument_begin|>"
        '{"a": 1}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    )
    ids = tok.encode(text)
    view = parse_output(tok.decode(ids[:-1]), get_profile("kimi-k2.5"), True)
    assert [(c.id, c.name) for c in view.tool_calls] == [(" functions.f:7 ", "f")]
    path = tmp_path / "reference.jsonl"
    path.write_text(json.dumps({"id": "ws", "messages": user("ws"), "output_ids": ids}) + "\n")
    rec = Reconstructor(get_profile("kimi-k2.5"), tok)
    for stream in (False, True):
        async with _sim(tok, path, profile="kimi-k2.5") as sim, _client(sim, stream) as client:
            completion = await client.complete(user("ws"), model="kimi")
        assert [(c.id, c.name) for c in completion.tool_calls] == [(" functions.f:7 ", "f")]
        reconstruction, verdict = rec.process(completion, ids)
        assert verdict.category == "exact", verdict
        assert tuple(reconstruction.output_ids) == tuple(ids)


async def _raw(sim, body):
    async with httpx.AsyncClient() as http:
        return await http.post(sim.base_url + "/chat/completions", json=dict({"model": "m"}, **body))


def _events(text: str) -> list:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


async def test_openrouter_answers_with_reasoning_details_provider_and_cost(qwen):
    tok, path, _ = qwen
    async with _sim(tok, path) as sim:
        body = (await _raw(sim, {"messages": user("plain")})).json()
        stream = (await _raw(sim, {"messages": user("plain"), "stream": True})).text
    message = body["choices"][0]["message"]
    assert message["reasoning"] and message["reasoning_details"][0]["text"] == message["reasoning"]
    assert body["provider"] and body["usage"]["cost"] > 0
    assert _events(stream)[-1] == "[DONE]"


async def test_vllm_personality_returns_token_ids_and_prompt_ids_where_vllm_does(qwen):
    tok, path, ids = qwen
    async with _sim(tok, path, "vllm") as sim:
        body = (
            await _raw(sim, {"messages": user("weather"), "tools": [WEATHER_TOOL], "return_token_ids": True})
        ).json()
        stream = (
            await _raw(
                sim, {"messages": user("weather"), "tools": [WEATHER_TOOL], "stream": True, "return_token_ids": True}
            )
        ).text
        async with _client(sim, server="vllm") as client:
            completion = await client.complete(user("weather"), [WEATHER_TOOL], model="m")
    choice = body["choices"][0]
    assert "reasoning" in choice["message"] and "reasoning_content" not in choice["message"]
    assert choice["token_ids"] == ids["weather"] and choice["finish_reason"] == "tool_calls"
    assert body["prompt_token_ids"] and "provider" not in body and "cost" not in body["usage"]
    chunks = [json.loads(e) for e in _events(stream) if e != "[DONE]"]
    assert chunks[0]["prompt_token_ids"] == body["prompt_token_ids"]
    deltas = [c["choices"][0]["token_ids"] for c in chunks if c["choices"] and "token_ids" in c["choices"][0]]
    assert len(deltas) > 2 and sum(deltas, []) == ids["weather"]  # per-chunk deltas that add up
    assert not any("prompt_token_ids" in c for c in chunks[1:])
    assert completion.token_ids == tuple(ids["weather"])
    assert completion.prompt_token_ids == tuple(body["prompt_token_ids"])


async def test_sglang_personality_gives_ids_only_without_streaming_and_refuses_them_streaming(qwen):
    tok, path, ids = qwen
    async with _sim(tok, path, "sglang") as sim:
        body = (
            await _raw(sim, {"messages": user("plain"), "return_token_ids": True, "return_prompt_token_ids": True})
        ).json()
        refused = await _raw(sim, {"messages": user("plain"), "stream": True, "return_prompt_token_ids": True})
        async with _client(sim, server="sglang") as client:
            plain = await client.complete(user("plain"), model="m")
        async with _client(sim, stream=True, server="sglang") as client:
            streamed = await client.complete(user("plain"), model="m")  # the client does not ask: no 400
        async with ChatClient(
            Endpoint(extra={"return_prompt_token_ids": True}), Generation(stream=True), None, base_url=sim.base_url
        ) as client:
            with pytest.raises(SampleFatalError, match="not supported with streaming"):
                await client.complete(user("plain"), model="m")
    choice = body["choices"][0]
    assert "reasoning_content" in choice["message"] and "reasoning" not in choice["message"]
    assert choice["token_ids"] == ids["plain"] and choice["prompt_token_ids"]
    assert refused.status_code == 400
    assert plain.token_ids == tuple(ids["plain"]) and plain.prompt_token_ids == tuple(choice["prompt_token_ids"])
    assert streamed.token_ids is None and streamed.reasoning == plain.reasoning


async def test_transformers_serve_personality_strips_plain_keeps_stream_raw_and_fails_like_it(qwen):
    tok, path, _ = qwen
    async with _sim(tok, path, "transformers-serve") as sim:
        plain = (await _raw(sim, {"messages": user("two"), "tools": [WEATHER_TOOL]})).json()
        stream = (await _raw(sim, {"messages": user("two"), "tools": [WEATHER_TOOL], "stream": True})).text
        unknown = await _raw(sim, {"messages": user("two"), "return_token_ids": True})
        broken = await _raw(sim, {"messages": user("broken")})
    message = plain["choices"][0]["message"]
    assert message["reasoning_content"] == "Two calls." and message["content"] == "Checking both."
    calls = message["tool_calls"]
    assert calls[0]["function"]["arguments"] == '{"city": "Z\\u00fcrich"}'  # json.dumps, ASCII escapes
    assert [c["id"] for c in calls] == [f"{plain['id']}_tool_call_0", f"{plain['id']}_tool_call_1"]
    chunks = [json.loads(e) for e in _events(stream)]
    # transformers 5.25: the usage in a last chunk of its own, after the finish chunk, and no [DONE]
    assert _events(stream)[-1] != "[DONE]" and chunks[-1]["usage"]["completion_tokens"] > 0
    assert chunks[-1]["choices"] == [] and chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c["choices"])
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert reasoning == "\nTwo calls.\n" and content.startswith("\n\nChecking both.")
    assert unknown.status_code == 422 and "return_token_ids" in unknown.text
    assert broken.status_code == 400


async def test_transformers_serve_stream_error_chunk_that_is_not_json_names_the_failure(qwen):
    tok, path, _ = qwen
    options = SimulatorOptions(personality="transformers-serve", faults={"stream_error": 1.0})
    async with SimulatorServer(options, tokenizer=tok, reference=path, profile="qwen3") as sim:
        async with _client(sim, stream=True) as client:
            with pytest.raises(RetryableError, match="out of memory") as caught:
                await client.complete(user("plain"), model="m")
    assert caught.value.error_class == "stream"


@pytest.mark.parametrize("personality", ["vllm", "sglang"])
async def test_prompt_check_agrees_with_the_right_template_and_finds_a_wrong_one(qwen, personality):
    tok, path, _ = qwen
    messages = [{"role": "system", "content": "Be brief."}] + user("weather")
    async with _sim(tok, path, personality) as sim, _client(sim, server=personality) as client:
        completion: Completion = await client.complete(messages, [WEATHER_TOOL], model="m")
    assert completion.prompt_token_ids
    right = check_prompt(tok, "qwen3", messages, [WEATHER_TOOL], completion.prompt_token_ids)
    assert right.status == "agree" and right.agrees
    # deliberately wrong: the template without the tools (a client that forgot to send them to its renderer)
    wrong = check_prompt(tok, "qwen3", messages, None, completion.prompt_token_ids)
    assert wrong.status == "differ" and wrong.first_diff is not None
    rendered = tok.encode("<|im_start|>system\nBe brief.<|im_end|>")
    assert wrong.first_diff == next(k for k, (a, b) in enumerate(zip(completion.prompt_token_ids, rendered)) if a != b)
    assert "position" in wrong.describe()
    thinking_off = check_prompt(tok, "qwen3", messages, [WEATHER_TOOL], completion.prompt_token_ids, thinking=False)
    assert thinking_off.status == "differ" and thinking_off.first_diff == len(completion.prompt_token_ids)


async def test_simulate_cli_answers_as_the_personality_it_is_given(sample_tokenizer_dir, reference):
    from tests.simulator.test_server import _start_cli

    proc, line = await _start_cli(
        "--tokenizer", str(sample_tokenizer_dir), "--reference", str(reference[0]), "--personality", "vllm"
    )
    try:
        assert "personality: vllm" in line
        base_url = line.split("listening on ")[1].split()[0]
        async with httpx.AsyncClient() as http:
            body = (
                await http.post(
                    base_url + "/chat/completions",
                    json={"model": "m", "messages": user("plain"), "return_token_ids": True},
                )
            ).json()
        assert "provider" not in body and body["choices"][0]["token_ids"]
    finally:
        proc.terminate()
        await proc.wait()


def test_an_unknown_personality_is_refused_with_the_choices():
    from app.errors import InputError
    from app.simulator.options import check_options

    with pytest.raises(InputError, match="transformers-serve"):
        check_options(SimulatorOptions(personality="tgi"))


@pytest.mark.parametrize("dropped", [False, True], ids=["complete", "tool_ids_dropped"])
async def test_streamed_ids_that_lost_a_tool_call_are_not_trusted(qwen, dropped):
    """vLLM #27482: a stream's tool-call chunks came without their token ids. Ids whose text lacks what the
    stream said are not ground truth: the answer is reconstructed from its text and flagged, never stored as server ids;
    complete ids are kept as they are."""
    tok, path, ids = qwen
    rec = Reconstructor(get_profile("qwen3"), tok)
    options = SimulatorOptions(personality="vllm", quirks=["tool_ids_dropped"] if dropped else [])
    sim = SimulatorServer(options, tokenizer=tok, reference=path, profile="qwen3")
    async with sim, _client(sim, stream=True, server="vllm") as client:
        completion = await client.complete(user("two"), [WEATHER_TOOL], model="qwen3")
        plain = await client.complete(user("plain"), model="qwen3")  # no tool call: nothing dropped
    assert [c.name for c in completion.tool_calls] == ["get_weather", "get_time"]
    assert (len(completion.token_ids) < len(ids["two"])) == dropped
    reconstruction, _ = rec.process(completion)
    assert rec.ids_carry_text(tuple(completion.token_ids), completion) == (not dropped)
    if dropped:
        assert reconstruction.ids_source == "text" and "server_ids_incomplete" in reconstruction.flags
        assert rec.truth_of(completion) is None  # nor ground truth for a probe or a twin
    else:
        assert reconstruction.ids_source == "server" and tuple(reconstruction.output_ids) == tuple(ids["two"])
    kept, _ = rec.process(plain)
    assert kept.ids_source == "server" and tuple(kept.output_ids) == tuple(ids["plain"])


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_vllms_logprobs_hold_every_token_and_its_known_steps_reconstruct_its_text(qwen, stream):
    """vLLM (as tests/realserver saw it): logprobs under `content` for every output token, tags included (a stream's
    reasoning and tool-call chunks too, and an empty delta per tag), an answer with no think block returned as
    reasoning, the template's whitespace kept. The logprobs give the true ids whole and in order; vLLM's known
    steps (the server table) reconstruct every answer's ids from its text alone."""
    from app.tokens.server_steps import prior_profile

    tok, path, ids = qwen
    profile = get_profile("qwen3")
    rec = Reconstructor(profile, tok, prior_profile("vllm", stream, profile, "sim", simulated=True))
    async with _sim(tok, path, "vllm") as sim, _client(sim, stream) as client:
        for prompt in ("plain", "weather", "two", "thinkless"):
            tools = [WEATHER_TOOL] if prompt in ("weather", "two") else None
            completion = await client.complete(
                user(prompt), tools, model="qwen3", extra={"logprobs": True, "top_logprobs": 0}
            )
            if prompt == "thinkless":
                assert completion.reasoning == "Ok, at once." and not completion.content
            assert rec.ground_truth(completion) == (tuple(ids[prompt]), "logprobs"), prompt
            text_only = replace(completion, content_logprobs=None, reasoning_logprobs=None)
            reconstruction, _ = rec.process(text_only)
            assert tuple(reconstruction.output_ids) == tuple(ids[prompt]), (prompt, reconstruction)
            assert not reconstruction.flags, (prompt, reconstruction.flags)
