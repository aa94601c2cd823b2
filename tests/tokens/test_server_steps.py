"""Every server-side text step of the reference (section 7), applied to the sample reference set, is
inverted by the reference-assisted search (the upper bound; app.tokens.fidelity_profile learns them for production):
the verdict stays benign and the repair is named. Steps are written here from the reference."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from app.datasets import iter_references
from app.records import Completion
from app.tokens import Fields, split_output


def _strip(c: Completion) -> Completion:  # older SGLang: .strip() on reasoning and content
    return replace(c, reasoning=c.reasoning.strip() if c.reasoning is not None else None, content=c.content.strip())


def _spaces(c: Completion) -> Completion:  # vLLM slow detokenizer: ' ' around added tokens
    reasoning = c.reasoning + " " if c.reasoning is not None else None
    content = (" " + c.content if c.reasoning is not None else c.content) + (" " if c.tool_calls else "")
    return replace(c, reasoning=reasoning, content=content)


def _no_content(c: Completion) -> Completion:  # vLLM KimiK2ReasoningParser
    return replace(c, content=c.content.replace("(no content)", ""))


def _tool_ws(c: Completion) -> Completion:  # kimi_k2 tool parser regex \s*
    return replace(
        c, tool_calls=tuple(replace(t, id=t.id.strip(), arguments=t.arguments.strip()) for t in c.tool_calls)
    )


def _json(c: Completion) -> Completion:  # hermes / glm parsers re-serialise arguments
    def redump(a: str) -> str:
        try:
            return json.dumps(json.loads(a), ensure_ascii=False)
        except ValueError:
            return a

    return replace(c, tool_calls=tuple(replace(t, arguments=redump(t.arguments)) for t in c.tool_calls))


def _reindex(c: Completion) -> Completion:  # SGLang / newer vLLM synthesise functions.NAME:{history + i}
    return replace(
        c, tool_calls=tuple(replace(t, id=f"functions.{t.name}:{3 + i}") for i, t in enumerate(c.tool_calls))
    )


STEPS = {
    "strip_whitespace": _strip,
    "think_spaces": _spaces,
    "no_content": _no_content,
    "tool_whitespace": _tool_ws,
    "json_reserialised": _json,
    "tool_ids_reindexed": _reindex,
}


@pytest.fixture(scope="module")
def references(sample_reference):
    return [(r.sample_id, list(r.output_ids)) for r in iter_references(sample_reference)][::5]


@pytest.mark.parametrize("step", sorted(STEPS))
def test_each_server_step_is_inverted(sample_rec, references, step):
    affected = 0
    for sid, ids in references:
        c = split_output(ids, sample_rec.profile, sample_rec.tokenizer).to_completion()
        quirked = STEPS[step](c)
        out, verdict = sample_rec.process(quirked, ids, assisted=True)
        assert verdict.category in ("exact", "bpe_equivalent", "truncated"), (sid, verdict.explanation)
        if sample_rec.encode_fields(Fields.of(quirked)) != sample_rec.encode_fields(Fields.of(c)):
            affected += 1
            assert out.repair and step in out.repair.split("+"), (sid, out.repair)
    if step != "tool_whitespace":  # the sample set has no whitespace around arguments (see test_reconstruct)
        assert affected > 0, f"the sample set never exercised {step}"


def test_several_steps_at_once(sample_rec, references):
    for sid, ids in references:
        c = split_output(ids, sample_rec.profile, sample_rec.tokenizer).to_completion()
        quirked = _reindex(_no_content(_spaces(c)))
        out, verdict = sample_rec.process(quirked, ids, assisted=True)
        assert verdict.category in ("exact", "bpe_equivalent", "truncated"), (sid, verdict.explanation)
