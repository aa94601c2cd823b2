"""split_output (ids -> provider fields) and render_output (fields -> output string) for every profile."""

from __future__ import annotations

import pytest

from app.records import ToolCall
from app.tokens import get_profile, pieces_text, render_output, split_output
from tests.tokens.test_tokenizer import KIMI_WORKED, KIMI_WORKED_IDS

CALLS = (
    ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}', 0),
    ToolCall("functions.lookup:1", "lookup", '{"q": "北京", "n": 2}', 1),
)


def _roundtrip(tok, profile, reasoning, content, calls, finish):
    text = pieces_text(render_output(profile, reasoning, content, calls, finish))
    ids = tok.encode(text)
    view = split_output(ids, profile, tok)
    assert (
        tok.encode(
            pieces_text(render_output(profile, view.reasoning, view.content, view.tool_calls, view.finish_reason))
        )
        == ids
    )
    return view


def test_kimi_split_of_a_tool_call_response(sample_tok):
    p = get_profile("kimi-k2.5")
    view = split_output(sample_tok.encode(KIMI_WORKED), p, sample_tok)
    assert view.reasoning == "Let me check the weather."
    assert view.content == "I'll look it up."
    assert view.tool_calls == (ToolCall("functions.get_weather:0", "get_weather", '{"city": "Beijing"}', 0),)
    assert view.finish_reason == "tool_calls"


@pytest.mark.kimi
def test_kimi_split_of_the_worked_example_ids(kimi_tok):
    view = split_output(KIMI_WORKED_IDS, get_profile("kimi-k2.5"), kimi_tok)
    assert (view.reasoning, view.content, view.finish_reason) == (
        "Let me check the weather.",
        "I'll look it up.",
        "tool_calls",
    )
    assert view.tool_calls[0].arguments == '{"city": "Beijing"}'


def test_kimi_truncated_inside_reasoning_is_all_reasoning(sample_tok):
    view = split_output(sample_tok.encode("still thinking about"), get_profile("kimi-k2.5"), sample_tok)
    assert (view.reasoning, view.content, view.finish_reason) == ("still thinking about", "", "length")


def test_kimi_without_think_close_and_with_end_is_all_content(sample_tok):
    view = split_output(sample_tok.encode("just an answer<|im_end|>"), get_profile("kimi-k2.5"), sample_tok)
    assert (view.reasoning, view.content, view.finish_reason) == (None, "just an answer", "stop")


def test_kimi_truncated_inside_tool_section_keeps_the_raw_text_as_content(sample_tok):
    text = 'r</think>c<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a"'
    view = split_output(sample_tok.encode(text), get_profile("kimi-k2.5"), sample_tok)
    assert view.content == text.split("</think>", 1)[1] and view.tool_calls == () and view.finish_reason == "length"


def test_end_token_is_removed_by_id_never_by_text(sample_tok):
    p = get_profile("kimi-k2.5")
    ids = sample_tok.encode("r</think>text ending in <|im_end|>") + sample_tok.encode_ordinary("<|im_end|>")
    view = split_output(ids, p, sample_tok)
    assert view.content.endswith("<|im_end|><|im_end|>") and view.finish_reason == "length"


def test_to_completion_carries_the_fields(sample_tok):
    view = split_output(sample_tok.encode(KIMI_WORKED), get_profile("kimi-k2.5"), sample_tok)
    c = view.to_completion(provider="sim")
    assert (c.reasoning, c.content, c.tool_calls, c.finish_reason, c.provider) == (
        view.reasoning,
        view.content,
        view.tool_calls,
        "tool_calls",
        "sim",
    )


@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3.1", "glm-4.5"])
@pytest.mark.parametrize("case", ["plain", "tools", "no_content_tools", "truncated", "no_reasoning"])
def test_other_families_split_and_render_are_inverse(family_tokenizers, name, case):
    tok, p = family_tokenizers[name], get_profile(name)
    args = {
        "plain": ("Okay, the user wants weather.", "It is sunny in Paris.", (), "stop"),
        "tools": ("I should call the tool.", "Checking.", CALLS, "tool_calls"),
        "no_content_tools": ("I should call the tool.", "", CALLS[:1], "tool_calls"),
        "truncated": ("Okay, the user wants", "", (), "length"),
        "no_reasoning": (None, "Direct answer.", (), "stop"),
    }[case]
    view = _roundtrip(tok, p, *args)
    assert view.reasoning == args[0] and view.content == args[1]
    assert [(c.name, c.arguments) for c in view.tool_calls] == [(c.name, c.arguments) for c in args[2]]
    assert view.finish_reason == args[3]


def test_qwen3_layout_has_the_template_whitespace(family_tokenizers):
    text = pieces_text(render_output(get_profile("qwen3"), "why", "answer", CALLS[:1], "tool_calls"))
    assert text == (
        '<think>\nwhy\n</think>\n\nanswer\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>'
    )


def test_glm_layout_writes_string_values_raw(family_tokenizers):
    call = ToolCall("x", "lookup", '{"q": "北京", "n": 2}', 0)
    text = pieces_text(render_output(get_profile("glm-4.5"), "r", "", (call,), "tool_calls"))
    assert text == (
        "\n<think>r</think>\n\n<tool_call>lookup\n<arg_key>q</arg_key>\n<arg_value>北京</arg_value>\n"
        "<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call><|observation|>"
    )
