"""The export's chat-template renderer (`ChatTemplate.render`: transformers' compiled template called directly)
gives byte for byte what transformers' own `apply_chat_template` gives, over every prompt of the sample data, for
each profile's template: the K2.5-style template of the sample tokenizer (the real Kimi K2.5 files ship no
template: K2.5 renders in remote code) and the Qwen3 template of tests/realserver/tiny_qwen3.py, with the
thinking switches each honours. The prompt ids the export writes equal apply_chat_template's tokenisation."""

from __future__ import annotations

import json

import pytest

from app.export import PromptRenderer, load_chat_template
from app.tokens import get_profile, load_tokenizer, render_export

# history shapes the sample prompts lack: the older reasoning names transformers aliases, empty and None fields
EXTRA = [
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning": "r1"},
        {"role": "user", "content": "c"},
    ],
    [
        {"role": "user", "content": "a"},
        {
            "role": "assistant",
            "content": "",
            "thinking": "r2",
            "tool_calls": [
                {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
            ],
        },
        {"role": "tool", "tool_call_id": "functions.f:0", "content": "42"},
    ],
    [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "parts"}]}],
]


def _conversations(sample_reference):
    rows = [json.loads(line) for line in sample_reference.read_text(encoding="utf-8").splitlines()]
    return [(r["messages"], r.get("tools")) for r in rows] + [(m, None) for m in EXTRA]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    from tests.realserver.tiny_qwen3 import build_tokenizer

    directory = tmp_path_factory.mktemp("qwen3-tok")
    build_tokenizer(directory)
    return directory


def _check(tokenizer_dir, profile, kwargs_list, conversations):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ours = load_tokenizer(tokenizer_dir)
    assert render_export._fast_renderer() is not None  # the fast path is what is checked here
    compared = 0
    for kwargs in kwargs_list:
        template = load_chat_template(tokenizer_dir, kwargs=kwargs)
        assert template is not None
        renderer = PromptRenderer(ours, get_profile(profile), template, kwargs)
        for messages, tools in conversations:
            want = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs)
            assert renderer.prompt_text(messages, tools) == want, (kwargs, messages)
            assert renderer.prompt_ids(messages, tools) == hf(want, add_special_tokens=False)["input_ids"]
            # the final assistant turn rendered too (what a conversation export's consumer re-renders)
            full = [*messages, {"role": "assistant", "content": "done", "reasoning_content": "why"}]
            want = hf.apply_chat_template(full, tools=tools, add_generation_prompt=False, tokenize=False, **kwargs)
            assert template.render(full, tools, add_generation_prompt=False) == want
            compared += 1
    return compared


def test_kimi_template_renders_as_apply_chat_template(sample_tokenizer_dir, sample_reference):
    conversations = _conversations(sample_reference)
    assert _check(
        sample_tokenizer_dir, "kimi-k2.5", [{}, {"thinking": False}, {"preserve_thinking": True}], conversations
    ) == 3 * len(conversations)


def test_qwen3_template_renders_as_apply_chat_template(qwen3_dir, sample_reference):
    conversations = [
        (m, t) for m, t in _conversations(sample_reference) if all(isinstance(x.get("content"), str) for x in m)
    ]  # that template concatenates strings
    assert len(conversations) > 300
    assert _check(qwen3_dir, "qwen3", [{}, {"enable_thinking": False}], conversations) == 2 * len(conversations)


def test_a_template_error_names_the_sample(sample_tokenizer_dir, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ raise_exception('no system turns here') }}", encoding="utf-8")
    renderer = PromptRenderer(
        load_tokenizer(sample_tokenizer_dir),
        get_profile("kimi-k2.5"),
        load_chat_template(sample_tokenizer_dir, bad),
        {},
    )
    from app.errors import InputError

    with pytest.raises(InputError, match=r"sample 's1'.*bad\.jinja.*TemplateError: no system turns here"):
        renderer.prompt_ids([{"role": "user", "content": "x"}], None, "s1")


def test_plain_data_takes_the_fast_path_and_the_rest_transformers_own(sample_tokenizer_dir, monkeypatch):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(sample_tokenizer_dir))
    template = load_chat_template(sample_tokenizer_dir)
    messages = [{"role": "user", "content": "weather?"}]

    def get_weather(city: str) -> str:
        """Weather of a city.

        Args:
            city: the city
        """
        return city

    want = hf.apply_chat_template(
        messages, tools=[get_weather], add_generation_prompt=True, tokenize=False, extra_list=[1, 2]
    )
    assert '"name":"get_weather"' in want
    # a tool given as a function and a non-scalar kwarg: transformers converts them, so its own entry point renders
    assert template.render(messages, [get_weather], add_generation_prompt=True, extra_list=[1, 2]) == want

    def refuse(*args, **kwargs):
        raise AssertionError("plain JSON data should not need transformers' wrapper")

    monkeypatch.setattr(render_export, "_jinja_renderer", lambda: refuse)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert template.render(messages, tools, add_generation_prompt=True) == hf.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )


@pytest.mark.kimi
def test_kimi_files_special_tokens_render_as_transformers_renders(
    kimi_tokenizer_dir, sample_tokenizer_dir, sample_reference, tmp_path
):
    """With the real Kimi K2.5 files (no template of their own: the K2.5-style one given as --chat-template), the
    fast path equals transformers' `render_jinja_template` given the same special tokens: what
    apply_chat_template calls, which cannot be built here (the Kimi tokenizer class is remote code)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    override = tmp_path / "k25.jinja"
    override.write_text(load_chat_template(sample_tokenizer_dir).text, encoding="utf-8")
    template = load_chat_template(kimi_tokenizer_dir, override)
    assert template.special_tokens["eos_token"] == "[EOS]"
    for messages, tools in _conversations(sample_reference):
        [want], _ = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=template.text,
            add_generation_prompt=True,
            **template.special_tokens,
        )
        assert template.render(messages, tools, add_generation_prompt=True) == want
