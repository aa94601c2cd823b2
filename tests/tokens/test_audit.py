"""audit_tokenizer: profile markers encode to one id and decode back; constants are checked by decoding."""

from __future__ import annotations

import pytest

from app.tokens import get_profile
from app.tokens.audit import audit_tokenizer


def test_sample_tokenizer_passes_the_kimi_audit(sample_tok):
    findings = audit_tokenizer(sample_tok, get_profile("kimi-k2.5"))
    assert findings and all(f.level == "ok" for f in findings)


def test_a_constant_that_is_an_ordinary_token_is_an_error(sample_tok):
    ordinary = sample_tok.encode("chas")[0]
    f = audit_tokenizer(sample_tok, get_profile("kimi-k2.5"), {"<|im_end|>": ordinary})[-1]
    assert f.level == "error" and "ordinary text token" in f.message
    assert f"the right id is {sample_tok.special_id('<|im_end|>')}" in f.message


def test_a_profile_marker_missing_from_the_tokenizer_is_an_error(sample_tok):
    findings = audit_tokenizer(sample_tok, get_profile("qwen3"))
    assert any(f.level == "error" and f.token == "<tool_call>" for f in findings)


@pytest.mark.kimi
def test_kimi_audit_rejects_163533_as_im_end(kimi_tok):
    findings = audit_tokenizer(kimi_tok, get_profile("kimi-k2.5"), {"<|im_end|>": 163533, "</think>": 163607})
    bad = [f for f in findings if f.level == "error"]
    assert len(bad) == 1 and bad[0].token_id == 163533 and "'chas'" in bad[0].message and "163586" in bad[0].message


@pytest.mark.kimi
def test_kimi_audit_checks_the_reference_table(kimi_tok):
    findings = audit_tokenizer(kimi_tok, get_profile("kimi-k2.5"))
    assert all(f.level == "ok" for f in findings)
    assert {f.token: f.token_id for f in findings}["<|im_end|>"] == 163586
