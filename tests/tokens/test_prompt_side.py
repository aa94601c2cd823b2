"""The prompt side and the output side of a row are encoded apart: the prompt as the server encodes it (the
tokenizer's normaliser applied, as transformers' apply_chat_template does), the output as the bytes the model
generated (the normaliser bypassed). U+F981 (a CJK compatibility ideograph) is NFC-normalised to U+5973."""

from __future__ import annotations

import pytest

from app.tokens import get_profile
from app.tokens.prompt_check import rendered_prompt_ids
from app.tokens.render_export import ChatTemplate, PromptRenderer

COMPAT = "\uf981"  # NFC -> U+5973
TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _transformers_ids(tok_dir, messages) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    hf.chat_template = TEMPLATE
    out = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(out["input_ids"])


@pytest.mark.parametrize(
    "text", [f"Translate {COMPAT} please.", "Translate this please."], ids=["normaliser-changing", "plain"]
)
def test_prompt_ids_equal_apply_chat_template_and_output_ids_keep_the_models_bytes(nfc_qwen_tokenizer, text):
    tok = nfc_qwen_tokenizer
    messages = [{"role": "user", "content": text}]
    renderer = PromptRenderer(tok, get_profile("qwen3"), ChatTemplate("test", TEMPLATE))
    prompt = renderer.prompt_ids(messages, None)
    # the prompt side: what the server (transformers' apply_chat_template) feeds the model
    assert prompt == _transformers_ids(tok.path, messages)
    # the output side: a model that generated U+F981 generated its bytes; they are kept
    output = tok.encode(text)
    assert tok.decode(output) == text
    if COMPAT in text:
        assert tok.decode(prompt).count("\u5973") == 1 and COMPAT not in tok.decode(prompt)
        assert tok.encode_prompt(text) != output
    else:
        assert tok.encode_prompt(text) == output


def test_the_prompt_check_renders_what_the_server_encodes(nfc_qwen_tokenizer):
    tok, profile = nfc_qwen_tokenizer, get_profile("qwen3")
    ids = rendered_prompt_ids(tok, profile, [{"role": "user", "content": f"a {COMPAT} b"}])
    assert "\u5973" in tok.decode(ids) and COMPAT not in tok.decode(ids)


def test_a_tokenizer_without_a_normaliser_encodes_both_sides_alike(sample_tok):
    text = f"<|im_end|>{COMPAT} e\u0301"
    assert sample_tok.encode_prompt(text) == sample_tok.encode(text)
