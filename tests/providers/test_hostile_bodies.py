"""Every class of hostile body, replayed from a saved file by a real loopback server through the real client.

A body that breaks the boundary is a MalformedResponse naming the field (retryable); text that is not valid
Unicode is replaced and flagged, never passed on; a cost that cannot be believed is kept out of the usage with
the reason; an answer without a finish_reason is truncated; the deadline and the stall timeout bound a drip.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from app.providers import ChatClient
from app.providers.exceptions import MalformedResponse, RetryableError
from app.providers.retry import RetryPolicy, with_retries
from app.providers.wire import FINISH_MISSING, TEXT_REPLACED, WireLimits
from app.store.rows import encode_response
from tests.providers.support import BodyServer, Endpoint, Generation, saved_body, user

REFUSED = [
    ("count_past_64_bits.json", "usage.prompt_tokens"),
    ("count_1e999.json", "usage.completion_tokens"),
    ("count_nan.json", "usage.prompt_tokens"),
    ("count_negative.json", "usage.prompt_tokens"),
    ("token_ids_negative.json", "choices[0].token_ids"),
    ("token_ids_past_uint32.json", "choices[0].token_ids"),
    ("token_ids_1e20.json", "choices[0].token_ids"),
    ("token_ids_outside_vocab.json", "choices[0].token_ids"),
    ("prompt_token_ids_negative.json", "body.prompt_token_ids"),
    ("tool_call_index_1e999.json", "choices[0].message.tool_calls[0].index"),
    ("nested_2000_deep.json", "body"),
    ("second_choice_listed_first.json", "choices"),
    ("choice_index_1.json", "choices[0].index"),
    ("content_false.json", "choices[0].message.content"),
    ("choices_zero.json", "choices"),
    ("stream_second_choice.sse", "stream chunk 2.choices"),
    ("stream_choices_zero.sse", "stream chunk 1.choices"),
    ("stream_delta_list.sse", "stream chunk 1.choices[0].delta"),
    ("stream_content_false.sse", "stream chunk 1.choices[0].delta.content"),
    ("stream_count_past_64_bits.sse", "stream chunk 2.usage.prompt_tokens"),
    ("stream_tool_call_index_1e999.sse", "stream chunk 0.choices[0].delta.tool_calls[0].index"),
]


async def _complete(name: str, *, limits: WireLimits = WireLimits(vocab_size=6160)):
    """The saved body `name` served by a loopback server, through the client (streamed for .sse)."""
    stream = name.endswith(".sse")
    async with BodyServer(saved_body(name), stream=stream) as srv:
        async with ChatClient(
            Endpoint(), Generation(stream=stream), None, base_url=srv.base_url, limits=limits
        ) as client:
            return await client.complete(user("x"), model="m")


@pytest.mark.parametrize(("name", "field"), REFUSED)
async def test_a_body_that_breaks_the_boundary_is_a_retryable_malformed_response_naming_the_field(name, field):
    with pytest.raises(MalformedResponse) as caught:
        await _complete(name)
    assert isinstance(caught.value, RetryableError) and caught.value.error_class == "malformed"
    assert caught.value.field == field, str(caught.value)
    assert field in str(caught.value)


@pytest.mark.parametrize(
    "name",
    [
        "lone_surrogate_escape.json",
        "lone_surrogate_raw_bytes.json",
        "invalid_utf8.json",
        "stream_lone_surrogate_escape.sse",
        "stream_invalid_utf8.sse",
    ],
)
async def test_text_that_is_not_unicode_is_replaced_and_flagged_and_the_store_can_encode_it(name):
    completion = await _complete(name)
    assert "\ufffd" in completion.content and TEXT_REPLACED in completion.wire_flags
    completion.content.encode("utf-8")  # no lone surrogate survives
    encode_response(1, 1, 1, "e", completion, 0.0)  # the row codec takes it


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("cost_nan.json", "NaN"),
        ("cost_infinity.json", "+inf"),
        ("cost_negative.json", "negative"),
        ("cost_9e18.json", "past the cap"),
        ("stream_cost_nan.sse", "NaN"),
    ],
)
async def test_a_cost_that_cannot_be_believed_is_left_out_with_the_reason_and_the_answer_kept(name, why):
    completion = await _complete(name)
    assert completion.usage.cost_usd is None and why in completion.usage.cost_problem
    assert completion.content and completion.finish_reason == "stop"


@pytest.mark.parametrize("name", ["no_finish_reason.json", "stream_done_without_finish.sse"])
async def test_an_answer_without_a_finish_reason_is_a_retryable_fault_never_a_truncation(name):
    with pytest.raises(RetryableError) as caught:
        await _complete(name)
    assert caught.value.error_class == "stream" and "finish_reason" in str(caught.value)


async def test_a_stream_cut_before_its_finish_reason_is_asked_again_and_the_second_answer_kept():
    cut, clean = saved_body("stream_done_without_finish.sse"), saved_body("stream_clean.sse")
    async with (
        BodyServer(cut, stream=True, then=clean) as srv,
        ChatClient(Endpoint(), Generation(stream=True), None, base_url=srv.base_url) as client,
    ):
        completion = await with_retries(
            lambda: client.complete(user("x"), model="m"),
            RetryPolicy(attempts=3, base_s=0.0),
            sleep=lambda _s: asyncio.sleep(0),
        )
    assert srv.requests == 2
    assert completion.finish_reason == "stop" and completion.content == "Hello, world"
    assert FINISH_MISSING not in completion.wire_flags


async def test_a_dripped_body_is_cut_at_the_attempts_deadline():
    body = saved_body("no_finish_reason.json")
    async with BodyServer(body, stream=False, pieces=10, pause_s=0.5) as srv:  # 4.5 s of drip
        async with ChatClient(Endpoint(timeout_s=1.0), Generation(), None, base_url=srv.base_url) as client:
            started = time.monotonic()
            with pytest.raises(RetryableError) as caught:
                await client.complete(user("x"), model="m")
            elapsed = time.monotonic() - started
    assert caught.value.error_class == "timeout" and "deadline" in str(caught.value)
    assert elapsed < 2.5


async def test_a_stalled_stream_is_cut_at_the_stall_timeout_long_before_the_deadline():
    body = saved_body("stream_done_without_finish.sse")

    class Stalling(Endpoint):
        stall_timeout_s = 0.4

    async with BodyServer(body, stream=True, pieces=3, pause_s=3.0) as srv:
        async with ChatClient(Stalling(timeout_s=30.0), Generation(stream=True), None, base_url=srv.base_url) as client:
            started = time.monotonic()
            with pytest.raises(RetryableError) as caught:
                await client.complete(user("x"), model="m")
            elapsed = time.monotonic() - started
    assert caught.value.error_class == "timeout" and "stall_timeout_s" in str(caught.value)
    assert elapsed < 2.5


@pytest.mark.parametrize("stream", [False, True])
async def test_a_body_past_max_response_bytes_is_refused(stream):
    name = "stream_done_without_finish.sse" if stream else "no_finish_reason.json"

    class Capped(Endpoint):
        max_response_bytes = 100

    async with BodyServer(saved_body(name), stream=stream) as srv:
        async with ChatClient(Capped(), Generation(stream=stream), None, base_url=srv.base_url) as client:
            with pytest.raises(MalformedResponse, match="max_response_bytes") as caught:
                await client.complete(user("x"), model="m")
    assert caught.value.field == "body"


@pytest.mark.parametrize(("allow", "sent"), [(False, []), (True, None)])
async def test_openrouter_is_asked_for_its_routing_metadata_and_not_to_compress_the_prompt(allow, sent):
    async with (
        BodyServer(saved_body("stream_clean.sse"), stream=True) as srv,
        ChatClient(
            Endpoint(server="openrouter", allow_prompt_transforms=allow),
            Generation(stream=True),
            None,
            base_url=srv.base_url,
        ) as client,
    ):
        await client.complete(user("x"), model="m")
    assert srv.last_headers.get("X-OpenRouter-Metadata") == "enabled"
    assert srv.last_body.get("transforms") == sent


async def test_a_server_that_is_not_openrouter_gets_neither_the_metadata_header_nor_transforms():
    async with (
        BodyServer(saved_body("stream_clean.sse"), stream=True) as srv,
        ChatClient(Endpoint(server="vllm"), Generation(stream=True), None, base_url=srv.base_url) as client,
    ):
        await client.complete(user("x"), model="m")
    assert "X-OpenRouter-Metadata" not in srv.last_headers and "transforms" not in srv.last_body
