"""The K2.5 renderer against the sample tokenizer's Jinja template (rendered by transformers) and reference data.

The sample template declares tools as compact JSON while real K2.5 (and this renderer) uses the TypeScript
`tools_ts_str`, and it prints dict arguments with compact separators where K2.5's `tojson` uses ", "/": ".
Those two differences are intentional, so the template comparison covers conversations without a tool
declaration and with string arguments (tool calls and tool results included).
"""

from __future__ import annotations

import json

import pytest

from app.tokens import get_profile, load_tokenizer, split_output
from app.tokens.prompt import render_conversation, render_prompt


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello"}],
    "system_user": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there 🙂"}],
    "multi_turn": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "reasoning_content": "add", "content": "4"},
        {"role": "user", "content": [{"type": "text", "text": "and "}, {"type": "text", "text": "3+3?"}]},
    ],
    "agent_loop": [
        {"role": "system", "content": "You are Kimi."},
        {"role": "user", "content": "Price of tea and the sum?"},
        {
            "role": "assistant",
            "reasoning_content": "Two tools.",
            "content": "",
            "tool_calls": [
                _call("functions.lookup_price:0", "lookup_price", '{"product":"tea"}'),
                _call("functions.run_python:1", "run_python", '{"code":"print(1+1)"}'),
            ],
        },
        {"role": "tool", "tool_call_id": "functions.lookup_price:0", "name": "lookup_price", "content": "3 EUR"},
        {"role": "tool", "tool_call_id": "functions.run_python:1", "content": "2"},
        {"role": "assistant", "reasoning_content": "Done.", "content": "Tea costs 3 EUR; 1+1 is 2."},
        {"role": "user", "content": "Now in USD?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning": "convert",
            "tool_calls": [_call("functions.lookup_price:2", "lookup_price", '{"product":"tea","currency":"USD"}')],
        },
        {"role": "tool", "tool_call_id": "functions.lookup_price:2", "name": "lookup_price", "content": "3.3 USD"},
    ],
}
OPTIONS = {
    "default": {},
    "thinking_off": {"thinking": False},
    "preserve": {"preserve_thinking": True},
    "preserve_thinking_off": {"thinking": False, "preserve_thinking": True},
}


@pytest.fixture(scope="module")
def hf_sample(sample_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(sample_tokenizer_dir))


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("name", CONVERSATIONS)
def test_every_prefix_renders_as_the_sample_jinja_template_does(hf_sample, name, option):
    messages, kwargs = CONVERSATIONS[name], OPTIONS[option]
    for end in range(1, len(messages) + 1):
        for generation in (True, False):
            expected = hf_sample.apply_chat_template(
                messages[:end], tokenize=False, add_generation_prompt=generation, **kwargs
            )
            assert render_prompt("kimi-k2.5", messages[:end], add_generation_prompt=generation, **kwargs) == expected


def _references(path, cases_path):
    cases = json.loads(cases_path.read_text())["samples"]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows, cases


def test_sample_references_prompt_ids_plus_output_ids_are_the_conversation_ids(sample_reference, sample_data_dir):
    tok, profile = load_tokenizer(sample_data_dir / "tokenizer"), get_profile("kimi-k2.5")
    rows, cases = _references(sample_reference, sample_data_dir / "reference_cases.json")
    checked = 0
    for row in rows:
        kinds = cases[row["id"]]["kinds"]
        if "non_canonical" in kinds or row["meta_info"]["finish_reason"]["type"] != "stop":
            continue  # a non-canonical split or a cut-off response is not what encoding text gives back
        view = split_output(row["output_ids"], profile, tok)
        turn = {
            "role": "assistant",
            "reasoning_content": view.reasoning,
            "content": view.content,
            "tool_calls": [_call(c.id, c.name, c.arguments) for c in view.tool_calls],
        }
        prompt_ids = tok.encode(render_prompt("kimi-k2.5", row["messages"], row.get("tools")))
        full_ids = tok.encode(render_conversation("kimi-k2.5", [*row["messages"], turn], row.get("tools")))
        assert full_ids == prompt_ids + row["output_ids"], row["id"]
        if not row.get("tools"):  # the sample builder declared tools as JSON, so only tool-free counts agree
            assert len(prompt_ids) == row["meta_info"]["prompt_tokens"], row["id"]
        checked += 1
    assert checked > 250
