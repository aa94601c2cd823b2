"""The K2.5 prompt renderer: layout rules, errors, and the encoded ids against the real Kimi files."""

from __future__ import annotations

import pytest

from app.errors import InputError
from app.tokens import get_profile, load_tokenizer
from app.tokens.prompt import PROMPT_RENDERERS, render_conversation, render_prompt

GEN = "<|im_assistant|>assistant<|im_middle|><think>"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


AGENT = [
    {"role": "system", "content": "You are Kimi."},
    {"role": "user", "content": "Weather in Beijing?"},
    {
        "role": "assistant",
        "reasoning_content": "Call the tool.",
        "content": "",
        "tool_calls": [_call("functions.get_weather:0", "get_weather", '{"city": "Beijing"}')],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "name": "get_weather", "content": "Sunny, 25C"},
]

# tokenization.md §1.3: the verified output ids of this K2.5 thinking-mode response.
WORKED_TURN = {
    "role": "assistant",
    "reasoning_content": "Let me check the weather.",
    "content": "I'll look it up.",
    "tool_calls": [_call("functions.get_weather:0", "get_weather", '{"city": "Beijing"}')],
}
WORKED_IDS = [
    9413,
    1019,
    2598,
    276,
    10666,
    13,
    163607,
    65447,
    1799,
    483,
    979,
    13,
    163595,
    163597,
    41937,
    1150,
    21055,
    2800,
    25,
    15,
    163598,
    8264,
    37666,
    1289,
    414,
    4396,
    39556,
    16934,
    163599,
    163596,
    163586,
]

# Marker ids from ../shared/tokenizers/kimi-k2.5/README.md.
IM_END, IM_USER, IM_ASSISTANT, IM_SYSTEM, IM_MIDDLE = 163586, 163587, 163588, 163594, 163601
SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END = 163595, 163596, 163597, 163598, 163599
THINK, THINK_END = 163606, 163607


def test_the_generation_prompt_opens_the_think_block():
    prompt = render_prompt("kimi-k2.5", [{"role": "user", "content": "Hi"}])
    assert prompt == "<|im_user|>user<|im_middle|>Hi<|im_end|>" + GEN


def test_thinking_off_closes_the_think_block_in_the_prompt_and_in_every_assistant_turn():
    msgs = [{"role": "user", "content": "Hi"}, WORKED_TURN, {"role": "user", "content": "More"}]
    prompt = render_prompt("kimi-k2.5", msgs[2:], thinking=False)
    assert prompt.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    agent = render_prompt("kimi-k2.5", AGENT, thinking=False)
    assert "Call the tool." not in agent and "<think></think><|tool_calls_section_begin|>" in agent


def test_history_turns_up_to_the_last_plain_answer_get_an_empty_think_block():
    msgs = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "reasoning_content": "OLD", "content": "4"},
        {"role": "user", "content": "3+3?"},
    ]
    assert render_prompt("kimi-k2.5", msgs) == (
        "<|im_user|>user<|im_middle|>2+2?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>4<|im_end|>"
        "<|im_user|>user<|im_middle|>3+3?<|im_end|>" + GEN
    )
    kept = render_prompt("kimi-k2.5", msgs, preserve_thinking=True)
    assert "<think>OLD</think>4<|im_end|>" in kept


def test_tool_calling_turns_after_the_last_plain_answer_keep_their_reasoning_and_tool_results_are_system_turns():
    assert render_prompt("kimi-k2.5", AGENT) == (
        "<|im_system|>system<|im_middle|>You are Kimi.<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather in Beijing?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>Call the tool.</think>"
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Beijing"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\nSunny, 25C<|im_end|>" + GEN
    )


def test_a_nameless_tool_result_is_labelled_tool_and_text_parts_are_joined():
    msgs = [
        {
            "role": "tool",
            "tool_call_id": "functions.f:0",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        }
    ]
    assert render_prompt("kimi-k2.5", msgs, add_generation_prompt=False) == (
        "<|im_system|>tool<|im_middle|>## Return of functions.f:0\nab<|im_end|>"
    )


def test_dict_arguments_are_printed_like_tojson_and_missing_ids_count_calls_across_the_conversation():
    msgs = [
        {"role": "assistant", "content": None, "tool_calls": [_call("functions.a:0", "a", "{}")]},
        {"role": "tool", "tool_call_id": "functions.a:0", "content": "ok"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "b", "arguments": {"q": "北京", "n": 2}}}],
        },
    ]
    prompt = render_prompt("kimi-k2.5", msgs)
    assert (
        '<|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{"q": "北京", "n": 2}<|tool_call_end|>' in prompt
    )


def test_render_conversation_is_the_prompt_plus_the_output_layout():
    full = [*AGENT, {"role": "user", "content": "Thanks"}, WORKED_TURN]
    text = render_conversation("kimi-k2.5", full, [WEATHER_TOOL])
    prompt = render_prompt("kimi-k2.5", full[:-1], [WEATHER_TOOL])
    assert text == prompt + (
        "Let me check the weather.</think>I'll look it up.<|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
    )


def test_a_final_turn_in_the_suffix_renders_the_same_through_the_template_path():
    full = [*AGENT, WORKED_TURN]
    assert render_conversation("kimi-k2.5", full) == render_prompt("kimi-k2.5", full, add_generation_prompt=False)
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "reasoning_content": "r", "content": "Hello"}]
    assert render_conversation("kimi-k2.5", plain) == render_prompt(
        "kimi-k2.5", plain, add_generation_prompt=False, preserve_thinking=True
    )


def test_empty_reasoning_gives_a_bare_think_close_and_missing_reasoning_none():
    user = {"role": "user", "content": "Hi"}
    empty = render_conversation("kimi-k2.5", [user, {"role": "assistant", "reasoning_content": "", "content": "Yo"}])
    missing = render_conversation("kimi-k2.5", [user, {"role": "assistant", "content": "Yo"}])
    assert empty.endswith(GEN + "</think>Yo<|im_end|>")
    assert missing.endswith(GEN + "Yo<|im_end|>")


def test_render_prompt_accepts_a_profile_object():
    msgs = [{"role": "user", "content": "Hi"}]
    assert render_prompt(get_profile("kimi-k2.5"), msgs) == render_prompt("kimi-k2.5", msgs)


def test_profiles_without_a_renderer_and_unknown_profiles_raise_input_errors():
    assert set(PROMPT_RENDERERS) == {"kimi-k2.5", "qwen3"}
    with pytest.raises(InputError, match="deepseek-v3.1.*no built-in prompt renderer.*--chat-template"):
        render_prompt("deepseek-v3.1", [{"role": "user", "content": "Hi"}])
    with pytest.raises(InputError, match="unknown profile 'nope'"):
        render_prompt("nope", [{"role": "user", "content": "Hi"}])


def test_malformed_messages_raise_input_errors_naming_the_message():
    with pytest.raises(InputError, match=r"messages\[1\]: expected an object with a string 'role'"):
        render_prompt("kimi-k2.5", [{"role": "user", "content": "Hi"}, {"content": "x"}])
    with pytest.raises(InputError, match=r"messages\[0\].content\[1\]: only text parts.*'image_url'"):
        render_prompt(
            "kimi-k2.5",
            [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {}}]}],
        )
    with pytest.raises(InputError, match="last message must be the assistant turn"):
        render_conversation("kimi-k2.5", [{"role": "user", "content": "Hi"}])


@pytest.fixture(scope="module")
def kimi(kimi_tokenizer_dir):
    return load_tokenizer(kimi_tokenizer_dir)


def _markers(ids):
    return [i for i in ids if i >= 163584]


@pytest.mark.kimi
def test_real_kimi_ids_of_the_markers_in_an_agent_prompt(kimi):
    ids = kimi.encode(render_prompt("kimi-k2.5", AGENT, [WEATHER_TOOL]))
    assert _markers(ids) == [
        IM_SYSTEM,
        IM_MIDDLE,
        IM_END,  # tool_declare
        IM_SYSTEM,
        IM_MIDDLE,
        IM_END,  # system
        IM_USER,
        IM_MIDDLE,
        IM_END,
        IM_ASSISTANT,
        IM_MIDDLE,
        THINK,
        THINK_END,
        SECTION_BEGIN,
        CALL_BEGIN,
        ARG_BEGIN,
        CALL_END,
        SECTION_END,
        IM_END,
        IM_SYSTEM,
        IM_MIDDLE,
        IM_END,  # tool result
        IM_ASSISTANT,
        IM_MIDDLE,
        THINK,  # generation prompt
    ]
    assert kimi.decode(ids[1 : ids.index(IM_MIDDLE)]) == "tool_declare"
    assert kimi.decode(ids).startswith(
        "<|im_system|>tool_declare<|im_middle|># Tools\n\n## functions\nnamespace functions {\n"
    )
    last_turn = len(ids) - 1 - ids[::-1].index(IM_ASSISTANT)
    assert ids[last_turn:] == [IM_ASSISTANT, *kimi.encode("assistant"), IM_MIDDLE, THINK]


@pytest.mark.kimi
def test_real_kimi_prompt_ids_plus_the_worked_example_output_ids_are_the_conversation_ids(kimi):
    prompt = [{"role": "system", "content": "You are Kimi."}, {"role": "user", "content": "Weather in Beijing?"}]
    prompt_ids = kimi.encode(render_prompt("kimi-k2.5", prompt, [WEATHER_TOOL]))
    full_ids = kimi.encode(render_conversation("kimi-k2.5", [*prompt, WORKED_TURN], [WEATHER_TOOL]))
    assert prompt_ids[-1] == THINK
    assert full_ids == prompt_ids + WORKED_IDS


@pytest.mark.kimi
def test_real_kimi_multi_turn_agent_conversation_splits_at_the_prompt_boundary(kimi):
    full = [*AGENT, {"role": "assistant", "reasoning_content": "It is sunny.", "content": "Sunny, 25°C in 北京."}]
    prompt_ids = kimi.encode(render_prompt("kimi-k2.5", full[:-1], [WEATHER_TOOL]))
    output_ids = kimi.encode("It is sunny.</think>Sunny, 25°C in 北京.<|im_end|>")
    assert kimi.encode(render_conversation("kimi-k2.5", full, [WEATHER_TOOL])) == prompt_ids + output_ids
    assert output_ids[-1] == IM_END and THINK_END in output_ids
