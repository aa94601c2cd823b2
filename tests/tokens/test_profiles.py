"""Template profiles are data: each loads, knows its markers, and refuses a tokenizer that lacks them."""

from __future__ import annotations

import pytest

from app.errors import InputError
from app.tokens import PROFILES, get_profile


def test_the_four_profiles_are_there():
    assert set(PROFILES) == {"kimi-k2.5", "qwen3", "deepseek-v3.1", "glm-4.5"}


def test_kimi_profile_facts():
    p = get_profile("kimi-k2.5")
    assert p.end_of_turn == "<|im_end|>" and p.think_close == "</think>"
    assert not p.output_opens_with_think and p.tool_id_in_stream
    assert p.audit_tokens["<|im_end|>"] == 163586
    assert p.pretokenizer_pattern and "\\p{Han}" in p.pretokenizer_pattern


def test_glm_ends_tool_calls_with_observation():
    p = get_profile("glm-4.5")
    assert p.end_token(True) == "<|observation|>" and p.end_token(False) == "<|user|>"


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(InputError, match="known profiles: .*kimi-k2.5"):
        get_profile("llama")


def test_tokenizer_lacking_a_profile_marker_is_a_sentence(sample_tok):
    with pytest.raises(InputError, match=r"has no special token '<tool_call>', which profile qwen3 needs"):
        get_profile("qwen3").marker_ids(sample_tok)


def test_sample_tokenizer_has_every_kimi_marker(sample_tok):
    ids = get_profile("kimi-k2.5").marker_ids(sample_tok)
    assert ids["<|im_end|>"] == sample_tok.special_id("<|im_end|>")
