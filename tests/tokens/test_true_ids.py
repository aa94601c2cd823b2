"""A response with true ids is reconstructed as those ids, whatever the server did to its text: the
changed text is named in the notes, the round-trip is left unjudged (None), the text path is measured apart."""

from __future__ import annotations

from dataclasses import replace

from app.records import TokenLogprob
from app.tokens import Reconstructor, split_output
from tests.tokens.test_tokenizer import KIMI_WORKED


def _view(rec, ids):
    return split_output(ids, rec.profile, rec.tokenizer).to_completion()


def _logprobs(tok, ids):
    return tuple(TokenLogprob(tok.decode([i]), tuple(tok.token_bytes(i)), -0.1) for i in ids)


def _spaced(c):
    """vLLM's slow detokenizer: ' ' around the think-close tag (the text step `think_spaces`)."""
    return replace(c, reasoning=c.reasoning + " ", content=" " + c.content)


def test_server_ids_with_changed_text_are_kept_and_the_change_named(sample_rec):
    tok = sample_rec.tokenizer
    ids = tok.encode(KIMI_WORKED)
    c = replace(_spaced(_view(sample_rec, ids)), token_ids=tuple(ids))
    out, verdict = sample_rec.process(c)
    assert out.output_ids == tuple(ids) and (out.strategy, out.ids_source) == ("server_ids", "server")
    assert out.roundtrip is None and out.notes == ("reasoning_text_differs", "content_text_differs")
    assert verdict.category == "unchecked" and "not a round-trip failure" in verdict.explanation
    assert "ids from server (ground truth)" in verdict.explanation
    # the text path is what is measured: the spaced text reconstructs to other ids
    measured = [f for f in out.flags if f.startswith("text_path:")]
    assert measured and measured[0] != "text_path:exact"
    # a reference judges the true ids, not the text
    out, verdict = sample_rec.process(c, ids)
    assert verdict.category == "exact" and out.roundtrip is True and out.output_ids == tuple(ids)


def test_server_ids_whose_text_is_intact_round_trip(sample_rec):
    ids = sample_rec.tokenizer.encode(KIMI_WORKED)
    out, verdict = sample_rec.process(replace(_view(sample_rec, ids), token_ids=tuple(ids)))
    assert out.roundtrip is True and out.notes == () and "round-trip ok" in verdict.explanation
    assert out.flags == ("text_path:exact",)


def test_logprob_ids_are_kept_where_the_server_changed_the_text(sample_rec):
    tok = sample_rec.tokenizer
    reasoning, content = tok.encode("Think it through."), tok.encode("The answer.")
    ids = reasoning + [tok.special_id("</think>")] + content + [tok.special_id("<|im_end|>")]
    c = replace(
        _spaced(_view(sample_rec, ids)),
        reasoning_logprobs=_logprobs(tok, reasoning),
        content_logprobs=_logprobs(tok, content),
    )
    out, _ = sample_rec.process(c)
    assert out.output_ids == tuple(ids) and (out.strategy, out.ids_source) == ("logprobs", "logprobs")
    assert out.roundtrip is None and "content_text_differs" in out.notes


def test_content_logprobs_holding_the_whole_output_are_the_whole_output(sample_rec):
    # vLLM's non-streaming logprobs.content covers every output token, reasoning and the think-close tag too
    tok = sample_rec.tokenizer
    ids = tok.encode(KIMI_WORKED)
    c = replace(_view(sample_rec, ids), content_logprobs=_logprobs(tok, ids[:-1]))
    out, _ = sample_rec.process(c)
    assert out.output_ids == tuple(ids) and out.ids_source == "logprobs" and out.roundtrip is True


def test_the_engine_measures_probes_only(sample_rec):
    # measure=False (the engine's EndpointReconstructor measures probes itself): the true ids are kept, nothing measured
    tok = sample_rec.tokenizer
    ids = tok.encode(KIMI_WORKED)
    quiet = Reconstructor(sample_rec.profile, tok, measure=False)
    out, _ = quiet.process(replace(_spaced(_view(sample_rec, ids)), token_ids=tuple(ids)))
    assert out.output_ids == tuple(ids) and out.flags == () and out.roundtrip is None
