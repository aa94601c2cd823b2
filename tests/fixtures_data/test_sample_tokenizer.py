"""The sample tokenizer: reproducible from its script, loadable offline, Kimi-style special tokens."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

KIMI_MARKERS = [
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
]
NOT_SPECIAL = {
    "<think>",
    "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
}


@pytest.fixture(scope="module")
def hf_tokenizer(sample_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(sample_tokenizer_dir))


FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module")
def two_builds(repo_root, tmp_path_factory):
    outs = []
    for name in ("a", "b"):
        out = tmp_path_factory.mktemp(f"tok-{name}")
        subprocess.run(
            [sys.executable, str(repo_root / "scripts" / "build_sample_tokenizer.py"), "--out", str(out)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        outs.append(out)
    return outs


def test_script_is_byte_deterministic(two_builds):
    a, b = two_builds
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_script_reproduces_the_committed_files(two_builds, sample_tokenizer_dir):
    # Compared as JSON content, so a tokenizers release that reorders keys does not break CI; a change in
    # vocabulary, merges, added tokens or template does.
    for name in FILES:
        fresh = json.loads((two_builds[0] / name).read_text(encoding="utf-8"))
        committed = json.loads((sample_tokenizer_dir / name).read_text(encoding="utf-8"))
        assert fresh == committed, (
            f"{name} differs from a fresh build: rerun scripts/build_sample_tokenizer.py and "
            "scripts/build_sample_reference.py and commit the results"
        )


def test_vocabulary_is_a_few_thousand_tokens(hf_tokenizer):
    assert 4000 <= len(hf_tokenizer) <= 8200


@pytest.mark.parametrize("marker", KIMI_MARKERS)
def test_each_marker_encodes_to_one_id_and_back(hf_tokenizer, marker):
    ids = hf_tokenizer.encode(marker, add_special_tokens=False)
    assert len(ids) == 1
    assert hf_tokenizer.decode(ids) == marker


def test_marker_special_flags_mirror_kimi(sample_tokenizer_dir):
    config = json.loads((sample_tokenizer_dir / "tokenizer_config.json").read_text())
    flags = {entry["content"]: entry["special"] for entry in config["added_tokens_decoder"].values()}
    for marker in KIMI_MARKERS:
        assert flags[marker] is (marker not in NOT_SPECIAL), marker


def test_encode_adds_no_bos_or_eos(hf_tokenizer):
    ids = hf_tokenizer.encode("hello world")
    assert hf_tokenizer.convert_tokens_to_ids("[BOS]") not in ids
    assert hf_tokenizer.convert_tokens_to_ids("[EOS]") not in ids


@pytest.mark.parametrize(
    "text",
    [
        "The draft model accepts 3 tokens.",
        "def f(x):\n    return x * 2\n",
        '{"city":"北京"}',
        "天气很好 😀🎉",
        "  \n\n x",
    ],
)
def test_text_round_trips_byte_exact(hf_tokenizer, text):
    assert hf_tokenizer.decode(hf_tokenizer.encode(text, add_special_tokens=False)) == text


def test_markers_inside_text_are_recognised(hf_tokenizer):
    ids = hf_tokenizer.encode("ok</think>hi<|im_end|>", add_special_tokens=False)
    assert hf_tokenizer.convert_tokens_to_ids("</think>") in ids
    assert ids[-1] == hf_tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_generation_prompt_forces_think_open(hf_tokenizer):
    text = hf_tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == (
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>Hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )


def test_thinking_off_closes_think_in_the_prompt(hf_tokenizer):
    text = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False, thinking=False
    )
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")


def test_tools_are_declared_and_tool_turns_render_kimi_style(hf_tokenizer):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Check it.",
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "name": "get_weather", "content": "5C"},
    ]
    text = hf_tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text == (
        '<|im_system|>tool_declare<|im_middle|>[{"type":"function","function":{"name":"get_weather",'
        '"parameters":{"type":"object"}}}]<|im_end|>'
        "<|im_user|>user<|im_middle|>Weather?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>Check it.</think>"
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city":"Oslo"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n5C<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )


def test_history_answers_drop_reasoning_unless_preserved(hf_tokenizer):
    messages = [
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": "B", "reasoning_content": "why"},
        {"role": "user", "content": "C"},
    ]
    plain = hf_tokenizer.apply_chat_template(messages, tokenize=False)
    kept = hf_tokenizer.apply_chat_template(messages, tokenize=False, preserve_thinking=True)
    assert "<think></think>B" in plain
    assert "<think>why</think>B" in kept
