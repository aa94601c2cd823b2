"""Body, SSE and error parsing on hand-written payloads (the shapes the simulator does not produce)."""

from __future__ import annotations

import json

import pytest

from app.providers.exceptions import RetryableError, RunStoppingError, SampleFatalError
from app.providers.parse import (
    StreamAssembler,
    classify_status,
    iter_sse_events,
    parse_body,
    parse_retry_after,
    parse_usage,
)
from app.providers.pricing import ModelPricing, cost_of
from app.records import Usage


def body(**message):
    return json.dumps({"id": "gen-1", "choices": [{"finish_reason": "stop", "message": message}]})


def test_malformed_field_is_named():
    with pytest.raises(RetryableError) as info:
        parse_body(
            json.dumps({"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "12"}}), total_s=0.1
        )
    assert info.value.error_class == "malformed"
    assert "usage.prompt_tokens" in str(info.value)


def test_missing_choices_is_malformed():
    with pytest.raises(RetryableError, match="choices"):
        parse_body(b'{"id": "gen-1"}', total_s=0.1)


def test_reasoning_content_alias_and_details():
    assert parse_body(body(content="a", reasoning_content="r"), total_s=0).reasoning == "r"
    details = [{"type": "reasoning.text", "text": "t1"}, {"type": "reasoning.text", "text": "t2"}]
    assert parse_body(body(content="a", reasoning_details=details), total_s=0).reasoning == "t1t2"


def test_choice_error_under_200_is_retryable():
    raw = {
        "choices": [
            {
                "finish_reason": "error",
                "message": {"content": "part"},
                "error": {"code": 502, "message": "upstream died"},
            }
        ]
    }
    with pytest.raises(RetryableError, match="upstream died") as info:
        parse_body(json.dumps(raw), total_s=0)
    assert info.value.error_class == "stream"


def test_content_filter_is_fatal_for_the_sample():
    raw = {"choices": [{"finish_reason": "content_filter", "message": {"content": ""}}]}
    with pytest.raises(SampleFatalError):
        parse_body(json.dumps(raw), total_s=0)


def test_sglang_chat_ids_and_prompt_ids_live_on_the_choice():
    # protocol.py ChatCompletionResponseChoice: token_ids / prompt_token_ids / meta_info on the choice
    raw = {
        "choices": [
            {
                "finish_reason": "stop",
                "message": {"content": "x", "reasoning_content": "r"},
                "token_ids": [1, 2],
                "prompt_token_ids": [7, 8, 9],
                "meta_info": {"id": "a"},
            }
        ]
    }
    completion = parse_body(json.dumps(raw), total_s=0)
    assert (completion.token_ids, completion.prompt_token_ids, completion.reasoning) == ((1, 2), (7, 8, 9), "r")


def test_native_generate_output_ids_are_not_read_from_a_chat_body():
    # `output_ids` + `meta_info` is SGLang's native /generate shape; its chat API has no such field
    raw = {
        "choices": [{"finish_reason": "stop", "message": {"content": "x"}, "output_ids": [1]}],
        "meta_info": {"output_ids": [1, 2]},
    }
    assert parse_body(json.dumps(raw), total_s=0).token_ids is None


def test_vllm_prompt_token_ids_on_the_body_and_the_first_chunk():
    raw = {
        "prompt_token_ids": [3, 4],
        "choices": [{"finish_reason": "stop", "message": {"content": "x"}, "token_ids": [5]}],
    }
    assert parse_body(json.dumps(raw), total_s=0).prompt_token_ids == (3, 4)
    asm = StreamAssembler(0.0)
    asm.feed(json.dumps({"prompt_token_ids": [3, 4], "choices": [{"delta": {"role": "assistant", "content": ""}}]}))
    asm.feed(json.dumps({"choices": [{"delta": {"content": "x"}, "token_ids": [5], "finish_reason": "stop"}]}))
    done = asm.finish_completion(0.1)
    assert (done.prompt_token_ids, done.token_ids) == ((3, 4), (5,))


def test_byok_upstream_cost_is_counted_beside_the_fee():
    usage = parse_usage(
        {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "cost": 0.0001,
            "is_byok": True,
            "cost_details": {"upstream_inference_cost": 0.0042},
        }
    )
    assert usage.cost_usd == pytest.approx(0.0043)
    plain = parse_usage({"cost": 0.0001, "cost_details": {"upstream_inference_cost": None}})
    assert plain.cost_usd == pytest.approx(0.0001)


def test_a_stream_with_a_costed_usage_chunk_but_no_finish_records_the_cost():
    asm = StreamAssembler(0.0)
    asm.feed(json.dumps({"choices": [{"delta": {"content": "partial"}}]}))
    asm.feed(json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "cost": 0.0123}}))
    with pytest.raises(RetryableError) as caught:
        asm.finish_completion(0.2)
    assert caught.value.error_class == "stream" and caught.value.cost_usd == pytest.approx(0.0123)


def test_transformers_serve_error_chunks_json_or_not_name_the_failure():
    asm = StreamAssembler(0.0)
    with pytest.raises(RetryableError, match="out of memory") as caught:
        asm.feed('{"error": "generation failed: said "out of memory""}')  # its f-string, not JSON
    assert caught.value.error_class == "stream"
    with pytest.raises(RetryableError, match="boom"):
        StreamAssembler(0.0).feed(json.dumps({"error": "boom"}))


def test_sse_comments_multiline_data_and_crlf():
    buffer = bytearray()
    events = iter_sse_events(buffer, b': OPENROUTER PROCESSING\n\ndata: {"a":\r\ndata: 1}\r\n\r\ndata: [DO')
    assert events == [b'{"a":\n1}']
    assert iter_sse_events(buffer, b"NE]\n\n") == [b"[DONE]"]


def test_stream_tool_call_arguments_concatenate_exactly_by_index():
    asm = StreamAssembler(0.0)

    def first(index, call_id, name, args):
        return {"index": index, "id": call_id, "function": {"name": name, "arguments": args}}

    chunks = [
        {"choices": [{"delta": {"tool_calls": [first(1, "b", "g", "")]}}]},
        {"choices": [{"delta": {"tool_calls": [first(0, "a", "f", "{ ")]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": "[1, "}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": " 2]"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "cost": 0.5}},
    ]
    for chunk in chunks:
        asm.feed(json.dumps(chunk))
    asm.feed("[DONE]")
    completion = asm.finish_completion(1.0)
    assert [(c.index, c.id, c.name, c.arguments) for c in completion.tool_calls] == [
        (0, "a", "f", "{ }"),
        (1, "b", "g", "[1,  2]"),
    ]
    assert completion.usage.cost_usd == 0.5 and completion.usage.completion_tokens == 4


def test_stream_error_chunk_is_retryable():
    asm = StreamAssembler(0.0)
    asm.feed(json.dumps({"choices": [{"delta": {"content": "hal"}}]}))
    with pytest.raises(RetryableError, match="overloaded") as info:
        asm.feed(
            json.dumps(
                {
                    "error": {"code": 502, "message": "overloaded"},
                    "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
                }
            )
        )
    assert info.value.error_class == "stream"


def test_stream_vllm_token_ids_per_delta():
    asm = StreamAssembler(0.0)
    asm.feed(json.dumps({"choices": [{"delta": {"content": "a"}, "token_ids": [5, 6]}]}))
    asm.feed(json.dumps({"choices": [{"delta": {"content": "b"}, "token_ids": [7], "finish_reason": "stop"}]}))
    assert asm.finish_completion(0.1).token_ids == (5, 6, 7)


def test_retry_after_sources():
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "garbage"}) is None
    availability = {"error": {"availability": {"retryable": True, "retry_after": 9}}}
    assert parse_retry_after({}, availability) == 9.0


@pytest.mark.parametrize(
    ("status", "kind", "error_class"),
    [
        (408, RetryableError, "408"),
        (429, RetryableError, "429"),
        (500, RetryableError, "5xx"),
        (524, RetryableError, "5xx"),
        (529, RetryableError, "5xx"),
        (400, SampleFatalError, "400"),
        (413, SampleFatalError, "413"),
        (422, SampleFatalError, "422"),
        (401, RunStoppingError, "auth"),
        (402, RunStoppingError, "credits"),
        (403, RunStoppingError, "forbidden"),
        (404, RunStoppingError, "not_found"),
    ],
)
def test_status_classification(status, kind, error_class):
    error = classify_status(status, {}, {"error": {"code": status, "message": "m"}})
    assert type(error) is kind and error.error_class == error_class and error.status == status


def test_moderation_403_is_fatal_for_the_sample_only():
    body = {"error": {"code": 403, "message": "flagged", "metadata": {"reasons": ["x"], "flagged_input": "..."}}}
    error = classify_status(403, {}, body)
    assert isinstance(error, SampleFatalError) and error.error_class == "filtered"


def test_retryable_availability_overrides_status():
    body = {"error": {"message": "busy", "availability": {"code": "temporarily_unavailable", "retryable": True}}}
    assert isinstance(classify_status(404, {}, body), RetryableError)


def test_cost_prefers_reported_then_list_prices():
    pricing = ModelPricing(prompt_per_m=1.0, completion_per_m=2.0, cached_prompt_per_m=0.25)
    assert cost_of(Usage(100, 10, cost_usd=0.123), pricing) == 0.123
    assert cost_of(Usage(1_000_000, 1_000_000, cached_tokens=400_000), pricing) == pytest.approx(0.6 + 0.1 + 2.0)
    assert cost_of(Usage(1_000_000, 0), ModelPricing(1.0, 2.0, None)) == pytest.approx(1.0)
    assert cost_of(Usage(5, 5), None) == 0.0


def test_error_envelope_under_200_is_judged_by_its_code():
    with pytest.raises(RunStoppingError) as info:
        parse_body(json.dumps({"error": {"code": 402, "message": "no credits"}}), total_s=0)
    assert info.value.error_class == "credits"
    with pytest.raises(RetryableError):
        parse_body(json.dumps({"error": {"message": "odd"}}), total_s=0)
