"""The Qwen3 renderer: the official Qwen3 ChatML template's layout (tokenization.md §2), written out by hand."""

from __future__ import annotations

from app.tokens.prompt import render_conversation, render_prompt

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def _call(name, arguments):
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_system_and_user_then_the_generation_prompt_without_think():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_prompt("qwen3", msgs) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_thinking_off_appends_an_empty_think_block():
    assert render_prompt("qwen3", [{"role": "user", "content": "Hi"}], thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_tools_are_json_lines_in_the_system_turn():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_prompt("qwen3", msgs, [TOOL]).startswith(
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
        "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
        'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_reasoning_is_kept_only_after_the_last_user_query_and_tool_results_group_into_one_user_turn():
    msgs = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "reasoning_content": "old", "content": "A1"},
        {"role": "user", "content": "Q2"},
        {
            "role": "assistant",
            "reasoning_content": "plan",
            "content": "Checking.",
            "tool_calls": [_call("get_weather", '{"city": "Paris"}'), _call("get_time", {"tz": "CET"})],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "12:00"},
    ]
    assert render_prompt("qwen3", msgs) == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nplan\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_render_conversation_appends_the_output_layout_and_agrees_with_the_template_path():
    full = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "reasoning_content": "Use the tool.",
            "content": "",
            "tool_calls": [_call("get_weather", '{"city": "Paris"}')],
        },
    ]
    text = render_conversation("qwen3", full)
    assert text == (
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\nUse the tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    assert text + "\n" == render_prompt("qwen3", full, add_generation_prompt=False)
