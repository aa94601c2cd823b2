"""Reconstructor: strategies, repairs, the edge cases of real responses, and what text cannot recover."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.records import Completion, TokenLogprob, ToolCall
from app.tokens import Reconstructor, get_profile, split_output
from tests.tokens.test_tokenizer import KIMI_WORKED, KIMI_WORKED_IDS

KIMI = get_profile("kimi-k2.5")


def _ref(tok, text):
    return tok.encode(text)


def _view(rec, ids):
    return split_output(ids, rec.profile, rec.tokenizer).to_completion()


def _check(rec, text):
    ids = rec.tokenizer.encode(text)
    out, verdict = rec.process(_view(rec, ids), ids)
    return out, verdict, ids


# --- strategies -------------------------------------------------------------------------------------


def test_canonical_reconstruction_of_a_tool_call_response_is_exact(sample_rec):
    out, verdict, ids = _check(sample_rec, KIMI_WORKED)
    assert verdict.category == "exact" and out.output_ids == tuple(ids)
    assert out.strategy == "canonical" and out.repair is None and out.roundtrip is True


@pytest.mark.kimi
def test_kimi_tool_call_response_reconstructs_exactly(kimi_rec):
    c = Completion(
        content="I'll look it up.",
        reasoning="Let me check the weather.",
        finish_reason="tool_calls",
        tool_calls=(ToolCall("functions.get_weather:0", "get_weather", '{"city": "Beijing"}', 0),),
    )
    out, verdict = kimi_rec.process(c, KIMI_WORKED_IDS)
    assert out.output_ids == tuple(KIMI_WORKED_IDS) and verdict.category == "exact"


def test_without_reference_the_verdict_is_unchecked_with_a_roundtrip(sample_rec):
    ids = sample_rec.tokenizer.encode(KIMI_WORKED)
    out, verdict = sample_rec.process(_view(sample_rec, ids), None)
    assert verdict.category == "unchecked" and out.roundtrip is True and "round-trip ok" in verdict.explanation
    assert out.output_ids == tuple(ids)


def test_server_ids_are_taken_as_given_and_the_end_token_appended(sample_rec):
    tok = sample_rec.tokenizer
    ids = tok.encode("r</think>an answer<|im_end|>")
    c = Completion(content="an answer", reasoning="r", finish_reason="stop", token_ids=tuple(ids[:-1]))
    out, verdict = sample_rec.process(c, ids)
    assert out.strategy == "server_ids" and out.output_ids == tuple(ids) and verdict.category == "exact"


def _split_token(tok, ids):
    """Replace the first multi-byte ordinary token by two tokens with the same bytes (non-canonical)."""
    for k, i in enumerate(ids):
        b = tok.token_bytes(i)
        if tok.is_special(i) or len(b) < 2:
            continue
        for cut in range(1, len(b)):
            left, right = tok.id_of_bytes(b[:cut]), tok.id_of_bytes(b[cut:])
            if left is not None and right is not None:
                return ids[:k] + [left, right] + ids[k + 1 :]
    raise AssertionError("no splittable token")


def _logprobs(tok, ids, with_bytes=True):
    return tuple(TokenLogprob(tok.decode([i]), tuple(tok.token_bytes(i)) if with_bytes else None, -0.1) for i in ids)


def test_logprobs_recover_a_non_canonical_split_exactly(sample_rec):
    tok = sample_rec.tokenizer
    reasoning_ids, content_ids = tok.encode("Let me think here."), tok.encode("The answer is forty two.")
    content_ids = _split_token(tok, content_ids)
    ref = reasoning_ids + [tok.special_id("</think>")] + content_ids + [tok.special_id("<|im_end|>")]
    c = replace(_view(sample_rec, ref), content_logprobs=_logprobs(tok, content_ids))
    out, verdict = sample_rec.process(c, ref)
    assert out.strategy == "logprobs" and verdict.category == "exact"
    # The same text reconstructed canonically is only bpe_equivalent.
    assert sample_rec.process(_view(sample_rec, ref), ref)[1].category == "bpe_equivalent"


def test_logprobs_for_content_only_reconstruct_reasoning_canonically(sample_rec):
    tok = sample_rec.tokenizer
    ref = tok.encode("Plan the steps.</think>Done well.<|im_end|>")
    content_ids = tok.encode("Done well.")
    c = replace(_view(sample_rec, ref), content_logprobs=_logprobs(tok, content_ids, with_bytes=False))
    out, verdict = sample_rec.process(c, ref)
    assert out.strategy == "logprobs" and verdict.category == "exact"


def test_logprobs_covering_the_tool_section_are_used_whole(sample_rec):
    tok = sample_rec.tokenizer
    ref = tok.encode(KIMI_WORKED)
    tail = ref[ref.index(tok.special_id("</think>")) + 1 : -1]
    c = replace(_view(sample_rec, ref), content_logprobs=_logprobs(tok, tail))
    out, verdict = sample_rec.process(c, ref)
    assert out.strategy == "logprobs" and out.output_ids == tuple(ref) and verdict.category == "exact"


def test_unknown_logprob_tokens_fall_back_to_canonical(sample_rec):
    ref = sample_rec.tokenizer.encode("r</think>ok<|im_end|>")
    c = replace(_view(sample_rec, ref), content_logprobs=(TokenLogprob("\x00never", None, -1.0),))
    out, verdict = sample_rec.process(c, ref)
    assert out.strategy == "canonical" and verdict.category == "exact"


# --- repairs: the inverse of each server-side step ----------------------------------------------------


def _repaired(rec, text, quirk):
    ids = rec.tokenizer.encode(text)
    c = quirk(_view(rec, ids))
    plain = rec.encode_fields(__import__("app.tokens", fromlist=["Fields"]).Fields.of(c))
    assert plain != ids, "the quirk must change the plain reconstruction"
    return rec.process(c, ids, assisted=True)


def test_without_assistance_the_reference_only_judges(sample_rec):
    ids = sample_rec.tokenizer.encode("Think first.\n</think>\n\nAnswer here.<|im_end|>")
    c = _view(sample_rec, ids)
    c = replace(c, reasoning=c.reasoning.strip(), content=c.content.strip())
    out, v = sample_rec.process(c, ids)
    assert (v.category, out.repair, out.roundtrip) == ("text_mismatch", None, False)
    out, v = sample_rec.process(c, ids, assisted=True)
    assert (v.category, out.repair) == ("exact", "strip_whitespace")


def test_repair_stripped_whitespace(sample_rec):
    out, v = _repaired(
        sample_rec,
        "Think first.\n</think>\n\nAnswer here.<|im_end|>",
        lambda c: replace(c, reasoning=c.reasoning.strip(), content=c.content.strip()),
    )
    assert (v.category, out.repair) == ("exact", "strip_whitespace")


def test_repair_spaces_around_added_tokens(sample_rec):
    out, v = _repaired(
        sample_rec,
        "ok</think>1 Hi.<|im_end|>",
        lambda c: replace(c, reasoning=c.reasoning + " ", content=" " + c.content),
    )
    assert (v.category, out.repair) == ("exact", "think_spaces")


def test_repair_deleted_no_content_placeholder(sample_rec):
    text = KIMI_WORKED.replace("I'll look it up.", "(no content)")
    out, v = _repaired(sample_rec, text, lambda c: replace(c, content=""))
    assert (v.category, out.repair) == ("exact", "no_content")


def test_repair_trimmed_tool_call_whitespace(sample_rec):
    text = KIMI_WORKED.replace('{"city": "Beijing"}', '\n{"city": "Beijing"}\n')
    out, v = _repaired(
        sample_rec,
        text,
        lambda c: replace(c, tool_calls=tuple(replace(t, arguments=t.arguments.strip()) for t in c.tool_calls)),
    )
    assert (v.category, out.repair) == ("exact", "tool_whitespace")


def test_repair_reserialised_json(sample_rec):
    text = KIMI_WORKED.replace('{"city": "Beijing"}', '{"city":"Beijing"}')
    out, v = _repaired(
        sample_rec,
        text,
        lambda c: replace(c, tool_calls=tuple(replace(t, arguments='{"city": "Beijing"}') for t in c.tool_calls)),
    )
    assert (v.category, out.repair) == ("exact", "json_reserialised")


def test_repair_reindexed_tool_ids(sample_rec):
    text = KIMI_WORKED.replace("get_weather:0", "get_weather:5")
    out, v = _repaired(
        sample_rec,
        text,
        lambda c: replace(c, tool_calls=tuple(replace(t, id="functions.get_weather:0") for t in c.tool_calls)),
    )
    assert (v.category, out.repair) == ("exact", "tool_ids_reindexed")


def test_repair_stripped_whitespace_at_every_edge(sample_rec):
    out, v = _repaired(
        sample_rec,
        "  Think first.\n\n</think>\n\nAnswer here.\n<|im_end|>",
        lambda c: replace(c, reasoning=c.reasoning.strip(), content=c.content.strip()),
    )
    assert (v.category, out.repair) == ("exact", "strip_whitespace")


def test_stripped_whitespace_is_not_restored_over_different_text(sample_rec):
    ids = sample_rec.tokenizer.encode("  Think first.</think>\nAnswer here.<|im_end|>")
    c = replace(_view(sample_rec, ids), reasoning="Think again.", content="Answer here.")
    out, v = sample_rec.process(c, ids)
    assert v.category == "text_mismatch" and out.roundtrip is False


def test_several_server_steps_at_once_are_inverted_together(sample_rec):
    text = KIMI_WORKED.replace("I'll look it up.", "(no content)").replace("get_weather:0", "get_weather:2")
    out, v = _repaired(
        sample_rec,
        text,
        lambda c: replace(
            c,
            reasoning=c.reasoning + " ",
            content="",
            tool_calls=tuple(replace(t, id="functions.get_weather:0") for t in c.tool_calls),
        ),
    )
    assert v.category == "exact"
    assert out.repair == "think_spaces+no_content+tool_ids_reindexed"


def test_a_repair_is_not_tried_when_the_plain_reconstruction_matches(sample_rec):
    out, v, _ = _check(sample_rec, "  spaced reasoning \n</think>\n content with edges \n<|im_end|>")
    assert v.category == "exact" and out.repair is None


# --- edge cases ---------------------------------------------------------------------------------------


def test_think_close_inside_content_with_no_reasoning_field(sample_rec):
    ids = sample_rec.tokenizer.encode("hidden reasoning</think>visible answer<|im_end|>")
    c = Completion(content="hidden reasoning</think>visible answer", reasoning=None, finish_reason="stop")
    out, v = sample_rec.process(c, ids)
    assert v.category == "exact" and out.repair is None


def test_no_reasoning_at_all_output_starts_with_think_close(sample_rec):
    out, v, _ = _check(sample_rec, "</think>Straight answer.<|im_end|>")
    assert v.category == "exact"


def test_no_reasoning_field_when_the_output_opened_with_think_close(sample_rec):
    ids = sample_rec.tokenizer.encode("</think>Straight answer.<|im_end|>")
    c = Completion(content="Straight answer.", reasoning=None, finish_reason="stop")
    assert sample_rec.process(c, ids)[1].category == "structure_mismatch"  # production: text cannot tell
    out, v = sample_rec.process(c, ids, assisted=True)
    assert (v.category, out.repair) == ("exact", "think_close")


def test_empty_content(sample_rec):
    out, v, _ = _check(sample_rec, "only reasoning</think><|im_end|>")
    assert v.category == "exact"


def test_tool_arguments_are_kept_byte_exact(sample_rec):
    text = KIMI_WORKED.replace('{"city": "Beijing"}', '{ "city" :"Beijing",\t"n":1.0e3 ,"x":"\\u00e9"}')
    out, v, _ = _check(sample_rec, text)
    assert v.category == "exact"


def test_several_tool_calls(sample_rec):
    call = '<|tool_call_begin|>functions.f:{i}<|tool_call_argument_begin|>{{"i": {i}}}<|tool_call_end|>'
    text = (
        "r</think><|tool_calls_section_begin|>"
        + "".join(call.format(i=i) for i in range(4))
        + "<|tool_calls_section_end|><|im_end|>"
    )
    out, v, ids = _check(sample_rec, text)
    assert v.category == "exact" and len(_view(sample_rec, ids).tool_calls) == 4


def test_truncated_response_has_no_end_token(sample_rec):
    out, v, _ = _check(sample_rec, "reasoning</think>an answer cut off mid")
    assert v.category == "truncated" and "no end-of-turn" in v.explanation


def test_truncated_right_after_think_close(sample_rec):
    ids = sample_rec.tokenizer.encode("reasoning done</think>")
    out, v = sample_rec.process(_view(sample_rec, ids), ids, assisted=True)  # text alone cannot tell
    assert v.category == "truncated" and out.repair == "think_close"


def test_content_ending_in_the_text_of_a_wrong_constant_is_never_stripped(sample_rec):
    # The 'chas' trap: 163533 decodes to 'chas'; stripping that text as if it were <|im_end|> corrupts data.
    out, v, ids = _check(sample_rec, "r</think>the word is chas<|im_end|>")
    assert v.category == "exact" and _view(sample_rec, ids).content.endswith("chas")


@pytest.mark.kimi
def test_kimi_chas_trap(kimi_rec, kimi_tok):
    ids = kimi_tok.encode("r</think>Les ") + [163533, 163586]
    view = _view(kimi_rec, ids)
    assert view.content.endswith("chas") and view.finish_reason == "stop"
    out, v = kimi_rec.process(view, ids)
    assert v.category in ("exact", "bpe_equivalent") and out.output_ids[-1] == 163586
    assert kimi_tok.decode(out.output_ids[:-1]).endswith("chas")


@pytest.mark.parametrize("text", ["北京的天气很好。", "rocket 🚀🙂 done", "mixed 世界 and 🎉!"])
def test_cjk_and_emoji(sample_rec, text):
    out, v, _ = _check(sample_rec, f"{text}</think>{text}<|im_end|>")
    assert v.category == "exact"


def test_partial_utf8_is_classified_not_guessed(sample_rec):
    tok = sample_rec.tokenizer
    emoji = tok.encode("🚀")
    raw = tok.token_bytes(emoji[0])
    lone = tok.id_of_bytes(raw[:1]) if len(raw) > 1 else tok.id_of_bytes("🚀".encode()[:1])
    ids = tok.encode("r</think>bad ") + [lone] + tok.encode(" byte<|im_end|>")
    out, v = sample_rec.process(_view(sample_rec, ids), ids)
    assert v.category == "text_mismatch" and "replacement_char" in out.notes


def test_marker_spelled_with_ordinary_tokens_is_classified(sample_rec):
    tok = sample_rec.tokenizer
    ids = tok.encode("r</think>see ") + tok.encode_ordinary("</think>") + tok.encode(" here<|im_end|>")
    out, v = sample_rec.process(_view(sample_rec, ids), ids)
    assert v.category == "structure_mismatch" and "marker_as_text" in out.notes


def test_reconstructor_refuses_a_tokenizer_without_the_profile_markers(sample_tok):
    from app.errors import InputError

    with pytest.raises(InputError, match="profile qwen3 needs"):
        Reconstructor(get_profile("qwen3"), sample_tok)


def test_reconstructor_is_thread_safe(sample_rec):
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"reason {i}</think>answer {i} 世界<|im_end|>" for i in range(40)]
    refs = [sample_rec.tokenizer.encode(t) for t in texts]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda r: sample_rec.process(_view(sample_rec, r), r), refs))
    assert [o.output_ids for o, _ in got] == [tuple(r) for r in refs]


# The four ways text can differ from its NFC form; a model may emit any of them token by token.
NFC_CASES = {
    "cjk_compatibility_ideograph": "\uf900 and \uf91d",  # NFC maps them to the unified ideographs
    "decomposed_accent": "cafe\u0301 and re\u0301sume\u0301",
    "non_canonical_mark_order": "a\u0307\u0323 q\u0301\u0327",  # NFC reorders the combining marks
    "hangul_conjoining_jamo": "\u1100\u1161\u11a8 \u1112\u1161\u11ab",  # NFC composes the syllables
}


@pytest.mark.parametrize("case", sorted(NFC_CASES))
def test_no_normaliser_false_alarm(nfc_qwen_tokenizer, case):
    tok = nfc_qwen_tokenizer
    text = NFC_CASES[case]
    assert tok.normalize(text) != text, "the case must be one the normaliser changes"
    rec = Reconstructor(get_profile("qwen3"), tok)
    # The model's ids: the raw text's bytes as BPE tokens (no normaliser runs inside a model).
    raw = [t for ch in text.encode() for t in [tok.id_of_bytes(bytes([ch]))]]
    ref = tok.encode("<think>\nr\n</think>\n\nsee ") + raw + tok.encode("<|im_end|>")
    out, v = rec.process(_view(rec, ref), ref)
    assert v.category in ("exact", "bpe_equivalent"), v.explanation
    assert tok.decode_bytes(out.output_ids) == tok.decode_bytes(ref)
    assert "normaliser" not in out.notes and "normaliser" in out.flags  # suspect without ground truth


def test_logprobs_for_reasoning_only(sample_rec):
    tok = sample_rec.tokenizer
    reasoning_ids = _split_token(tok, tok.encode("Consider the options carefully."))
    ref = reasoning_ids + tok.encode("</think>Pick two.<|im_end|>")
    c = replace(_view(sample_rec, ref), reasoning_logprobs=_logprobs(tok, reasoning_ids))
    out, verdict = sample_rec.process(c, ref)
    assert out.strategy == "logprobs" and verdict.category == "exact"


def _partial(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_logprob_tokens_written_as_escaped_bytes(sample_rec):
    tok = sample_rec.tokenizer
    content_ids = tok.encode("go 🦜 now")  # a rare emoji: split into tokens that are partial characters
    assert any(_partial(tok.token_bytes(i)) for i in content_ids)
    entries = []
    for i in content_ids:
        raw = tok.token_bytes(i)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)  # vLLM's spelling of a partial character
        entries.append(TokenLogprob(text, None, -0.5))
    ref = tok.encode("r</think>") + content_ids + tok.encode("<|im_end|>")
    c = replace(_view(sample_rec, ref), content_logprobs=tuple(entries))
    out, verdict = sample_rec.process(c, ref)
    assert out.strategy == "logprobs" and verdict.category == "exact"
