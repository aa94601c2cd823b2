"""Each server-side quirk changes the API text exactly as the tokenization reference (section 7) says."""

from __future__ import annotations

import pytest

from app.providers import ChatClient
from app.simulator import QUIRKS, SimulatorOptions, SimulatorServer
from tests.providers.support import Endpoint, Generation, user


async def ask(tok, reference, prompt, quirks=(), stream=False, messages=None):
    options = SimulatorOptions(quirks=list(quirks))
    async with SimulatorServer(options, tokenizer=tok, reference=reference[0]) as sim:
        async with ChatClient(Endpoint(), Generation(stream=stream), None, base_url=sim.base_url) as client:
            return await client.complete(messages or user(prompt), model="kimi")


@pytest.mark.parametrize("stream", [False, True])
async def test_strip_whitespace(tok, reference, stream):
    plain = await ask(tok, reference, "ws", stream=stream)
    assert (plain.reasoning, plain.content) == ("\nThinking hard.\n", "\n\nAnswer.\n")
    quirked = await ask(tok, reference, "ws", ["strip_whitespace"], stream=stream)
    assert (quirked.reasoning, quirked.content) == ("Thinking hard.", "Answer.")


@pytest.mark.parametrize("stream", [False, True])
async def test_think_spaces_around_added_tokens(tok, reference, stream):
    plain = await ask(tok, reference, "spaces", stream=stream)
    assert (plain.reasoning, plain.content) == ("ok", "1")
    quirked = await ask(tok, reference, "spaces", ["think_spaces"], stream=stream)
    assert (quirked.reasoning, quirked.content) == ("ok ", " 1")


async def test_no_content_placeholder_deleted(tok, reference):
    plain = await ask(tok, reference, "nocontent")
    assert plain.content == "(no content)"
    quirked = await ask(tok, reference, "nocontent", ["no_content"])
    assert quirked.content == ""  # null on the wire
    assert quirked.raw["choices"][0]["message"]["content"] is None
    assert [c.name for c in quirked.tool_calls] == ["f"]


async def test_tool_whitespace_trimmed(tok, reference):
    plain = await ask(tok, reference, "toolws")
    assert (plain.tool_calls[0].id, plain.tool_calls[0].arguments) == (" functions.f:0 ", ' {"a": 1} \n')
    quirked = await ask(tok, reference, "toolws", ["tool_whitespace"])
    assert (quirked.tool_calls[0].id, quirked.tool_calls[0].arguments) == ("functions.f:0", '{"a": 1}')


@pytest.mark.parametrize("stream", [False, True])
async def test_arguments_reserialised(tok, reference, stream):
    plain = await ask(tok, reference, "json", stream=stream)
    assert plain.tool_calls[0].arguments == '{"a":1,  "b":"\\u00e9"}'
    quirked = await ask(tok, reference, "json", ["json_reserialised"], stream=stream)
    assert quirked.tool_calls[0].arguments == '{"a": 1, "b": "é"}'


async def test_tool_ids_reindexed_from_history(tok, reference):
    plain = await ask(tok, reference, "json")
    assert plain.tool_calls[0].id == "functions.f:7"
    quirked = await ask(tok, reference, "json", ["tool_ids_reindexed"])
    assert quirked.tool_calls[0].id == "functions.f:0"
    history = user("earlier") + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "functions.f:1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "functions.f:0", "content": "ok"},
    ]
    later = await ask(tok, reference, "", ["tool_ids_reindexed"], messages=history)
    assert all(c.id.endswith(f":{2 + i}") for i, c in enumerate(later.tool_calls))


@pytest.mark.parametrize("stream", [False, True])
async def test_replacement_char_for_partial_utf8(tok, reference, stream):
    plain = await ask(tok, reference, "utf8", stream=stream)
    assert plain.content == "über"
    quirked = await ask(tok, reference, "utf8", ["replacement_char"], stream=stream)
    assert quirked.content == "\ufffd\ufffdber"  # 'ü' is two byte tokens, each decoded alone


@pytest.mark.parametrize("prompt", ["plain", "tools", "ws", "spaces", "nocontent", "toolws", "json", "utf8", "length"])
async def test_stream_and_plain_answers_agree_under_all_quirks(tok, reference, prompt):
    a = await ask(tok, reference, prompt, QUIRKS, stream=False)
    b = await ask(tok, reference, prompt, QUIRKS, stream=True)
    assert (a.reasoning, a.content, a.tool_calls, a.finish_reason) == (
        b.reasoning,
        b.content,
        b.tool_calls,
        b.finish_reason,
    )
