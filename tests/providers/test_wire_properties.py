"""The body boundary as a property: whatever value lands in whatever field, parsing ends in a ProviderError or in a
Completion the store can encode, with every count, id and cost in range, and nothing but provider errors raised."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.providers.exceptions import ProviderError
from app.providers.parse import StreamAssembler, parse_body
from app.providers.wire import MAX_COUNT, WireLimits
from app.store.rows import encode_response

LIMITS = WireLimits(vocab_size=1000, max_cost_usd=5.0)

# JSON values a hostile server can send: the odd numbers and text included
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e999, -1e999, 9.2e18, -1.0, 0.5]),
    st.text(max_size=20),
    st.sampled_from(["\ud83d", "a\udc00b", "\ufffd", ""]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def _plain() -> dict:
    return {
        "id": "g",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "token_ids": [1, 2, 3],
                "message": {
                    "role": "assistant",
                    "content": "hi",
                    "reasoning": "r",
                    "tool_calls": [
                        {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                "logprobs": {"content": [{"token": "hi", "bytes": [104, 105], "logprob": -0.1}]},
            }
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "cost": 0.001,
            "completion_tokens_details": {"reasoning_tokens": 1},
            "prompt_tokens_details": {"cached_tokens": 1},
        },
    }


PATHS = [
    ("choices",),
    ("choices", 0),
    ("choices", 0, "index"),
    ("choices", 0, "finish_reason"),
    ("choices", 0, "token_ids"),
    ("choices", 0, "message"),
    ("choices", 0, "message", "content"),
    ("choices", 0, "message", "reasoning"),
    ("choices", 0, "message", "tool_calls"),
    ("choices", 0, "message", "tool_calls", 0, "index"),
    ("choices", 0, "message", "tool_calls", 0, "function"),
    ("choices", 0, "message", "tool_calls", 0, "function", "arguments"),
    ("choices", 0, "logprobs"),
    ("choices", 0, "logprobs", "content", 0, "logprob"),
    ("choices", 0, "logprobs", "content", 0, "bytes"),
    ("usage",),
    ("usage", "prompt_tokens"),
    ("usage", "completion_tokens"),
    ("usage", "cost"),
    ("usage", "completion_tokens_details"),
    ("usage", "prompt_tokens_details", "cached_tokens"),
    ("id",),
    ("model",),
]


def _set(body: dict, path: tuple, value) -> dict:
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


def _check(completion) -> None:
    u = completion.usage
    for n in (u.prompt_tokens, u.completion_tokens, u.reasoning_tokens, u.cached_tokens):
        assert type(n) is int and 0 <= n <= MAX_COUNT
    assert u.cost_usd is None or (math.isfinite(u.cost_usd) and 0 <= u.cost_usd <= LIMITS.max_cost_usd)
    for ids in (completion.token_ids or (), completion.prompt_token_ids or ()):
        assert all(type(i) is int and 0 <= i < LIMITS.vocab_size for i in ids)
    for text in (completion.content, completion.reasoning or "", *(c.arguments for c in completion.tool_calls)):
        text.encode("utf-8")
    encode_response(1, 1, 1, "e", completion, 0.0, keep_raw=True)


@settings(max_examples=400, deadline=None)
@given(path=st.sampled_from(PATHS), value=values)
def test_any_value_in_any_field_of_a_body_is_refused_as_a_provider_error_or_stored_safely(path, value):
    data = json.dumps(_set(_plain(), path, value))  # NaN, Infinity and lone surrogates written as JSON allows them
    try:
        completion = parse_body(data.encode(), total_s=0.1, limits=LIMITS)
    except ProviderError:
        return
    _check(completion)


STREAM_PATHS = [
    (0, "choices"),
    (0, "choices", 0, "delta"),
    (0, "choices", 0, "delta", "content"),
    (0, "choices", 0, "index"),
    (0, "choices", 0, "token_ids"),
    (1, "choices", 0, "delta", "tool_calls"),
    (1, "choices", 0, "delta", "tool_calls", 0, "index"),
    (2, "choices", 0, "finish_reason"),
    (3, "usage"),
    (3, "usage", "prompt_tokens"),
    (3, "usage", "cost"),
]


def _chunks() -> list[dict]:
    return [
        {"id": "g", "choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": [1]}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "cost": 0.001}},
    ]


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(STREAM_PATHS), value=values, done=st.booleans())
def test_any_value_in_any_field_of_a_stream_is_refused_as_a_provider_error_or_stored_safely(path, value, done):
    chunks = _chunks()
    _set(chunks[path[0]], path[1:], value)
    assembler = StreamAssembler(0.0, limits=LIMITS)
    try:
        for chunk in chunks:
            assembler.feed(json.dumps(chunk).encode())
        if done:
            assembler.feed(b"[DONE]")
        completion = assembler.finish_completion(0.1)
    except ProviderError:
        return
    _check(completion)
