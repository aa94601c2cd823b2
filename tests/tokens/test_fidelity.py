"""Fidelity profiles: learned from probes with true ids, applied without a reference, flagging what text
cannot carry. The quirks come from the simulator's renderer (the one implementation of each server step);
the reference set is the committed 300-sample one, probes are every 4th sample, and every sample is judged
against its true ids."""

from __future__ import annotations

from collections import Counter

import pytest

from app.datasets import iter_references
from app.records import Completion, ToolCall
from app.simulator.render import OutputRenderer
from app.tokens import Reconstructor, get_profile
from app.tokens.fidelity_profile import FidelityProfile, learn, merge
from app.tokens.flags import TEXT_PATH, is_suspect, text_path_of

KIMI = get_profile("kimi-k2.5")
BENIGN = ("exact", "bpe_equivalent", "truncated")
# per-provider quirk mixes (what each kind of server was shown to do; reference section 7)
MIXES = {
    "ideal": (),
    "sglang-old": ("strip_whitespace",),
    "vllm-kimi": ("think_spaces", "no_content", "tool_whitespace"),
    "hermes-json": ("json_reserialised",),
    "reindexing": ("tool_ids_reindexed",),
    "byte-fragments": ("replacement_char",),
}


@pytest.fixture(scope="module")
def refs(sample_reference):
    return [(r.sample_id, tuple(r.output_ids)) for r in iter_references(sample_reference)]


@pytest.fixture(scope="module")
def renderer(sample_tok):
    return OutputRenderer(sample_tok, KIMI)


def _served(renderer, ids, quirks) -> Completion:
    o = renderer.render(ids, frozenset(quirks), 0)
    calls = tuple(ToolCall(c.id, c.name, c.arguments, i) for i, c in enumerate(o.tool_calls))
    return Completion(content=o.content or "", reasoning=o.reasoning, tool_calls=calls, finish_reason=o.finish_reason)


def _profile(renderer, refs, quirks, tok) -> FidelityProfile:
    return learn([(_served(renderer, ids, quirks), ids) for _, ids in refs[::4]], KIMI, tok, endpoint="sim")


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_a_calibrated_reconstruction_without_reference_exports_no_wrong_ids(sample_tok, renderer, refs, mix):
    fp = _profile(renderer, refs, MIXES[mix], sample_tok)
    rec = Reconstructor(KIMI, sample_tok, fp)
    tally = Counter()
    for sid, ids in refs:
        out, verdict = rec.process(_served(renderer, ids, MIXES[mix]), ids)  # the reference only judges
        suspect = is_suspect(out.flags)
        tally["suspect" if suspect else "kept"] += 1
        if not suspect:
            assert verdict.category in BENIGN, (mix, sid, out.repair, verdict.explanation)
    assert tally["kept"] > 0


def test_constant_steps_are_learned_as_invertible(sample_tok, renderer, refs):
    fp = _profile(renderer, refs, MIXES["vllm-kimi"], sample_tok)
    steps = {(s.name, s.where): s for s in fp.steps()}
    assert steps[("think_spaces", "reasoning.trail")].invertible
    assert steps[("think_spaces", "content.lead")].inverse == "remove ' '"
    fp = _profile(renderer, refs, MIXES["hermes-json"], sample_tok)
    (step,) = fp.steps()
    assert (step.name, step.invertible) == ("json_reserialised", True) and "compact" in step.inverse


def test_learned_inverses_are_used_and_named(sample_tok, renderer, refs):
    fp = _profile(renderer, refs, MIXES["vllm-kimi"], sample_tok)
    rec = Reconstructor(KIMI, sample_tok, fp)
    plain = Reconstructor(KIMI, sample_tok)
    _, ids = next((s, i) for s, i in refs if _served(renderer, i, ()).reasoning)
    served = _served(renderer, ids, MIXES["vllm-kimi"])
    assert plain.process(served, ids)[1].category == "text_mismatch"
    out, verdict = rec.process(served, ids)
    assert verdict.category in BENIGN and "think_spaces" in (out.repair or "") and out.ids_source == "text"


def test_a_step_the_probes_saw_vary_is_flagged_not_guessed(sample_tok, renderer, refs):
    fp = _profile(renderer, refs, MIXES["sglang-old"], sample_tok)
    assert "strip_whitespace" in fp.uninvertible()
    out, _ = Reconstructor(KIMI, sample_tok, fp).process(_served(renderer, refs[1][1], MIXES["sglang-old"]))
    assert "uninvertible:strip_whitespace" in out.flags and out.repair is None
    assert (
        "suspect: uninvertible:strip_whitespace"
        in Reconstructor(KIMI, sample_tok, fp)
        .process(_served(renderer, refs[1][1], MIXES["sglang-old"]))[1]
        .explanation
    )


def test_empty_thinking_dropped_is_learned(sample_tok):
    ids = sample_tok.encode("</think>Straight answer.<|im_end|>")
    served = Completion(content="Straight answer.", reasoning=None, finish_reason="stop")
    fp = learn([(served, ids)] * 3, KIMI, sample_tok, endpoint="e")
    out, verdict = Reconstructor(KIMI, sample_tok, fp).process(served, ids)
    assert verdict.category == "exact" and out.repair == "empty_reasoning_dropped"
    answer = sample_tok.encode("Straight answer.<|im_end|>")  # the same text with no think part at all
    both = merge(fp, learn([(served, answer)], KIMI, sample_tok, endpoint="e"))
    out, _ = Reconstructor(KIMI, sample_tok, both).process(served)
    assert "uninvertible:empty_reasoning_dropped" in out.flags


def test_profile_round_trips_through_json(sample_tok, renderer, refs):
    fp = _profile(renderer, refs, MIXES["vllm-kimi"], sample_tok)
    assert FidelityProfile.from_json(fp.to_json()) == fp
    with pytest.raises(ValueError, match="not a stored fidelity profile"):
        FidelityProfile.from_json('{"endpoint": 1}')


def test_a_sample_with_true_ids_gets_its_text_path_measured(sample_tok, renderer, refs):
    _, ids = refs[3]
    served = _served(renderer, ids, MIXES["vllm-kimi"])
    with_ids = Completion(
        **{**{f: getattr(served, f) for f in ("content", "reasoning", "tool_calls", "finish_reason")}, "token_ids": ids}
    )
    out, verdict = Reconstructor(KIMI, sample_tok).process(with_ids)
    assert out.ids_source == "server" and text_path_of(out.flags) == "text_mismatch"
    assert not is_suspect(out.flags) and any(f.startswith(TEXT_PATH) for f in out.flags)
    fp = _profile(renderer, refs, MIXES["vllm-kimi"], sample_tok)
    out, _ = Reconstructor(KIMI, sample_tok, fp).process(with_ids)
    assert text_path_of(out.flags) in BENIGN
    out, _ = Reconstructor(KIMI, sample_tok, fp, measure=False).process(with_ids)
    assert text_path_of(out.flags) is None and out.ids_source == "server"


def test_suspect_flags_without_ground_truth(sample_rec):
    cases = {
        "replacement_char": Completion(content="caf\ufffd", finish_reason="stop"),
        "marker_as_text": Completion(content="see <|im_end|> here", reasoning="r", finish_reason="stop"),
    }
    for flag, c in cases.items():
        out, verdict = sample_rec.process(c)
        assert flag in out.flags and "suspect: " + flag in verdict.explanation
        assert "not verified" in verdict.explanation
    out, _ = sample_rec.process(Completion(content="plain answer", reasoning="r", finish_reason="stop"))
    assert out.flags == ()


def test_missing_template_whitespace_is_flagged(family_tokenizers):
    rec = Reconstructor(get_profile("qwen3"), family_tokenizers["qwen3"])
    raw = Completion(content="<think>\nr\n</think>\n\nanswer", reasoning=None, finish_reason="stop")
    assert rec.process(raw)[0].flags == ()
    squashed = Completion(content="<think>r</think>answer", reasoning=None, finish_reason="stop")
    assert "template_whitespace_missing" in rec.process(squashed)[0].flags


def test_learned_template_whitespace_that_is_absent_is_flagged(family_tokenizers):
    tok = family_tokenizers["qwen3"]
    qwen = get_profile("qwen3")
    ids = tok.encode("<think>\nthe plan\n</think>\n\nthe answer<|im_end|>")
    kept = Completion(content="\n\nthe answer", reasoning="\nthe plan\n", finish_reason="stop")  # raw regions
    fp = learn([(kept, ids)] * 2, qwen, tok, endpoint="tserve")
    assert {s.name for s in fp.steps()} == {"template_whitespace_kept"}
    rec = Reconstructor(qwen, tok, fp)
    out, verdict = rec.process(kept, ids)
    assert verdict.category == "exact" and out.repair == "template_whitespace_kept"
    out, _ = rec.process(Completion(content="\n\nthe answer", reasoning="the plan\n", finish_reason="stop"))
    assert "template_whitespace_missing" in out.flags


def test_transformers_serve_non_streaming_steps_are_learned(family_tokenizers):
    # transformers serve, non-streaming, Qwen3: empty thinking becomes no reasoning field and tool arguments
    # are re-serialised with json.dumps; the model here always writes compact JSON.
    tok = family_tokenizers["qwen3"]
    qwen = get_profile("qwen3")

    def sample(word):
        ids = tok.encode(
            "<think>\n\n</think>\n\n" + word + '\n<tool_call>\n{"name": "f", "arguments": {"a":1}}\n'
            "</tool_call><|im_end|>"
        )
        served = Completion(
            content=word, reasoning=None, finish_reason="tool_calls", tool_calls=(ToolCall("call_0", "f", '{"a": 1}'),)
        )
        return served, ids

    probes = [sample(w) for w in ("Ok.", "Sure.", "Fine.")]
    fp = learn(probes, qwen, tok, endpoint="tserve")
    assert {(s.name, s.invertible) for s in fp.steps()} == {
        ("empty_reasoning_dropped", True),
        ("json_reserialised", True),
    }
    served, ids = sample("Right.")
    out, verdict = Reconstructor(qwen, tok, fp).process(served, ids)
    assert verdict.category == "exact", verdict.explanation
    assert out.repair == "empty_reasoning_dropped+json_reserialised" and not is_suspect(out.flags)


def test_vllms_thinkless_answers_and_re_dumped_arguments_are_learned(family_tokenizers):
    # vLLM 0.32 (seen in tests/realserver): its qwen3 parser returns an answer with no think block as reasoning;
    # its hermes parser re-dumps non-streamed arguments with ensure_ascii=False, which changes only arguments with
    # an escape: arguments every style writes alike ({"city": "Paris"}) say nothing either way
    tok = family_tokenizers["qwen3"]
    qwen = get_profile("qwen3")
    thinkless = tok.encode("Ok, at once.<|im_end|>")
    served_thinkless = Completion(content="", reasoning="Ok, at once.", finish_reason="stop")

    def call(city: str, raw: str) -> tuple[Completion, list[int]]:
        ids = tok.encode(
            '<think>\nCall it.\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"city": "'
            + raw
            + '"}}\n</tool_call><|im_end|>'
        )
        return Completion(
            content="",
            reasoning="\nCall it.\n",
            finish_reason="tool_calls",
            tool_calls=(ToolCall("chatcmpl-tool-1", "f", '{"city": "' + city + '"}'),),
        ), ids

    probes = [(served_thinkless, thinkless), call("Paris", "Paris"), call("Zürich", "Z\\u00fcrich")]
    fp = learn(probes, qwen, tok, endpoint="vllm")
    steps = {s.name: s.invertible for s in fp.steps()}
    assert steps["reasoning_holds_answer"] and steps["json_reserialised"], fp.steps()
    rec = Reconstructor(qwen, tok, fp)
    for served, ids in probes + [call("Oslo", "Oslo")]:
        out, verdict = rec.process(served, ids)
        assert verdict.category == "exact", (served, verdict.explanation)
        assert not is_suspect(out.flags), out.flags
    # a think block's reasoning opens with the template's newline: it stays reasoning
    kept = tok.encode("<think>\nHmm.\n</think>\n\n<|im_end|>")
    out, verdict = rec.process(Completion(content="\n\n", reasoning="\nHmm.\n", finish_reason="stop"), kept)
    assert "reasoning_holds_answer" not in (out.repair or ""), out
