"""The profile renderer gets the run's thinking options, so a run that turned thinking off exports prompts
that end the way the server rendered them (`<think></think>`), not with an open `<think>`."""

from __future__ import annotations

from app.export import PromptRenderer
from app.tokens import get_profile, load_tokenizer

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def _renderer(sample_tokenizer_dir, kwargs):
    return PromptRenderer(load_tokenizer(sample_tokenizer_dir), get_profile("kimi-k2.5"), None, kwargs)


def test_profile_prompt_ends_with_open_think_by_default(sample_tokenizer_dir):
    text = _renderer(sample_tokenizer_dir, {}).prompt_text(MESSAGES, None)
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think>")


def test_profile_prompt_honours_thinking_off(sample_tokenizer_dir):
    text = _renderer(sample_tokenizer_dir, {"thinking": False}).prompt_text(MESSAGES, None)
    assert text.endswith("<|im_middle|><think></think>")


def test_qwen_style_enable_thinking_maps_to_thinking(sample_tokenizer_dir):
    renderer = _renderer(sample_tokenizer_dir, {"enable_thinking": False})
    assert renderer.profile_kwargs == {"thinking": False}
    assert renderer.prompt_text(MESSAGES, None).endswith("<think></think>")
