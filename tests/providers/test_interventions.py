"""What a server says it did, read at the body boundary (OpenRouter's `openrouter_metadata`), and what the engine
measures against what it sent (app.engine.interventions): tolerant of odd shapes, never failing a sound answer,
and never silent about a report it could not read."""

from __future__ import annotations

import json
import time

import pytest

from app.engine import interventions as measured
from app.providers.parse import StreamAssembler, parse_body
from app.records import Completion, Usage
from app.tokens.prompt_check import compare_prompt_ids


def _body(**top) -> str:
    body = {"choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}], **top}
    return json.dumps(body)


def _kinds(completion: Completion) -> list[str]:
    return [i.kind for i in completion.interventions]


def test_a_clean_report_records_nothing() -> None:
    meta = {"requested": "m", "strategy": "price", "attempt": 1, "attempts": [{"provider": "A", "status": 200}]}
    assert parse_body(_body(openrouter_metadata=meta), total_s=0).interventions == ()
    assert parse_body(_body(), total_s=0).interventions == ()


def test_a_fallback_and_pipeline_stages_are_each_recorded_with_what_was_tried() -> None:
    meta = {
        "requested": "qwen/qwen3-8b",
        "attempt": 2,
        "attempts": [{"provider": "A", "status": 503}, {"provider": "B", "status": 200}],
        "pipeline": ["context_compression", {"stage": "response-healing"}, {"name": "guardrail"}],
    }
    got = parse_body(_body(openrouter_metadata=meta), total_s=0)
    assert _kinds(got) == ["provider_fallback", "context_compression", "response_healing", "pipeline_stage"]
    assert "tried A (503), B (200)" in got.interventions[0].detail
    assert "guardrail" in got.interventions[3].detail


@pytest.mark.parametrize(
    "meta, field",
    [
        ("enabled", "openrouter_metadata should be an object"),
        ({"attempt": "2"}, "openrouter_metadata.attempt"),
        ({"attempt": 0}, "openrouter_metadata.attempt"),
        ({"pipeline": "context_compression"}, "openrouter_metadata.pipeline should be a list"),
        ({"pipeline": [{"when": 3}]}, "openrouter_metadata.pipeline[0] names no stage"),
    ],
)
def test_a_report_that_cannot_be_read_is_recorded_not_raised(meta, field) -> None:
    got = parse_body(_body(openrouter_metadata=meta), total_s=0)
    assert got.content == "hi" and _kinds(got) == ["metadata_unreadable"]
    assert field in got.interventions[0].detail


def test_a_huge_report_is_read_within_its_bounds() -> None:
    meta = {"attempt": 3, "attempts": [{"provider": "P" * 500, "status": 500}] * 10_000, "pipeline": ["x"] * 10_000}
    got = parse_body(_body(openrouter_metadata=meta), total_s=0)
    assert len(got.interventions) == 1 + 32
    assert len(got.interventions[0].detail) < 32 * 100


def test_a_stream_reads_the_report_on_its_final_chunk() -> None:
    s = StreamAssembler(time.perf_counter())
    s.feed(json.dumps({"id": "g", "choices": [{"index": 0, "delta": {"content": "hi"}}]}))
    s.feed(json.dumps({"id": "g", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    meta = {"attempt": 1, "pipeline": [{"stage": "context_compression"}]}
    s.feed(json.dumps({"id": "g", "choices": [], "usage": {"prompt_tokens": 3}, "openrouter_metadata": meta}))
    s.feed("[DONE]")
    assert _kinds(s.finish_completion(0.1)) == ["context_compression"]


THINK_OPEN, THINK_CLOSE = 1, 2


def _answer(ids_reasoning: int, *, prompt_tokens: int = 10, finish: str = "stop", raw=None) -> tuple:
    completion = Completion(
        content="x", finish_reason=finish, usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=5), raw=raw
    )
    return completion, (THINK_OPEN, *([7] * ids_reasoning), THINK_CLOSE, 8, 9)


def _measured(completion, ids, fields, check=None) -> list[str]:
    found = measured.measured(
        completion, fields, output_ids=ids, think_open=THINK_OPEN, think_close=THINK_CLOSE, prompt_check=check
    )
    return [i.kind for i in found]


def test_reasoning_at_the_thinking_budget_is_a_forced_close_and_under_it_is_not() -> None:
    assert _measured(*_answer(60), {"thinking_token_budget": 60}) == ["thinking_budget"]
    assert _measured(*_answer(59), {"thinking_token_budget": 60}) == []
    assert _measured(*_answer(60), None) == []  # no budget sent: the model closed its own think block


def test_an_answer_without_a_think_close_was_not_stopped_by_the_budget() -> None:
    # real vLLM 0.32: an answer with no think block is all `reasoning` (its qwen3 parser) and counted in
    # usage.reasoning_tokens, though nothing was forced: the ids, which would hold the forced close, decide
    completion = Completion(content="", finish_reason="stop", usage=Usage(prompt_tokens=9, reasoning_tokens=7))
    assert _measured(completion, (5, 6, 7, 8, 9, 10, 11), {"thinking_token_budget": 4}) == []
    assert _measured(completion, None, {"thinking_token_budget": 4}) == ["thinking_budget"]  # no ids: the count


RENDERED = list(range(100, 140))  # 40 rendered prompt ids


def test_server_prompt_ids_cut_from_the_rendered_prompt_are_a_truncation() -> None:
    tail = compare_prompt_ids(RENDERED[-32:], RENDERED)  # vLLM's truncate_prompt_tokens keeps the tail
    head = compare_prompt_ids(RENDERED[:32], RENDERED)
    assert tail.cut and head.cut
    sent = {"truncate_prompt_tokens": 32}
    assert _measured(*_answer(3, prompt_tokens=32), sent, tail) == ["prompt_truncated"]
    assert _measured(*_answer(3, prompt_tokens=32), None, head) == ["prompt_truncated"]


def test_a_prompt_count_that_disagrees_with_the_servers_prompt_ids_is_recorded() -> None:
    agree = compare_prompt_ids(RENDERED, RENDERED)
    assert _measured(*_answer(3, prompt_tokens=40), None, agree) == []
    assert _measured(*_answer(3, prompt_tokens=41), None, agree) == ["prompt_tokens_differ"]


def test_another_template_is_the_prompt_checks_finding_not_an_intervention() -> None:
    other = compare_prompt_ids([7, *RENDERED[1:], 8], RENDERED)  # differs inside, longer: not a cut
    assert other.status == "differ" and not other.cut
    assert _measured(*_answer(3, prompt_tokens=41), None, other) == []


def test_without_server_prompt_ids_a_count_of_exactly_the_truncation_is_flagged() -> None:
    # a count of exactly the truncation cannot be told from a prompt that long: flagged, never kept silently
    assert _measured(*_answer(3, prompt_tokens=32), {"truncate_prompt_tokens": 32}) == ["prompt_truncated"]
    assert _measured(*_answer(3, prompt_tokens=20), {"truncate_prompt_tokens": 32}) == []


def test_a_repetition_stop_the_server_names_is_recorded() -> None:
    raw = {"choices": [{"index": 0, "stop_reason": "repetition_detected", "finish_reason": "stop"}]}
    assert _measured(*_answer(3, raw=raw), None) == ["repetition_stop"]
    assert _measured(*_answer(3, raw={"choices": [{"stop_reason": None}]}), None) == []
