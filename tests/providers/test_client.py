"""ChatClient against the real simulator over loopback HTTP: parsing, streaming, faults, ids, logprobs."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

from app.providers import ChatClient, RetryableError, RunStoppingError, SampleFatalError
from app.providers.exceptions import EndpointUnreachable
from app.providers.pricing import cost_of, pricing_from_models_entry
from app.simulator import SimulatorOptions, SimulatorServer
from tests.providers.support import OUTPUTS, Endpoint, Generation, user

KEY = "sk-or-v1-THIS-KEY-MUST-NEVER-LEAK-0123456789"


def sim_for(tok, reference, **kwargs) -> SimulatorServer:
    options = SimulatorOptions(
        faults=kwargs.pop("faults", {}), quirks=kwargs.pop("quirks", []), seed=kwargs.pop("seed", 0)
    )
    kwargs.setdefault("retry_after_s", 0)
    return SimulatorServer(options, tokenizer=tok, reference=reference[0], **kwargs)


def client_for(sim: SimulatorServer, *, key: str | None = KEY, timeout_s: float = 5.0, **gen) -> ChatClient:
    return ChatClient(Endpoint(timeout_s=timeout_s), Generation(**gen), key, base_url=sim.base_url)


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_content_usage_and_cost(tok, reference, stream):
    async with sim_for(tok, reference) as sim, client_for(sim, stream=stream) as client:
        completion = await client.complete(user("plain"), model="kimi")
    assert completion.reasoning == "Let me think.\nThe answer is simple."
    assert completion.content == "Hello! ünï 中文 here."
    assert completion.finish_reason == "stop" and not completion.truncated
    usage = completion.usage
    assert usage.prompt_tokens == 100 and usage.cached_tokens == 40
    assert usage.completion_tokens == len(reference[1]["plain"])
    assert usage.reasoning_tokens > 0
    expected = (60 * 0.60 + 40 * 0.15 + usage.completion_tokens * 2.50) / 1e6
    assert usage.cost_usd == pytest.approx(expected)
    assert completion.provider == "eaglewatch-simulator" and completion.model == "kimi"
    assert completion.generation_id.startswith("gen-sim-")
    assert (completion.ttft_s is not None) == stream
    assert completion.total_s > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_are_assembled_by_index_exactly(tok, reference, stream):
    async with sim_for(tok, reference) as sim, client_for(sim, stream=stream) as client:
        completion = await client.complete(user("tools"), model="kimi")
    assert completion.finish_reason == "tool_calls"
    assert [(c.index, c.id, c.name, c.arguments) for c in completion.tool_calls] == [
        (0, "functions.get_weather:0", "get_weather", '{"city": "Paris"}'),
        (1, "functions.get_time:1", "get_time", '{"tz": "Europe/Paris", "fmt": 24}'),
    ]
    assert completion.content == "Checking."


async def test_stream_skips_keepalive_comments(tok, reference):
    async with sim_for(tok, reference, faults={"keepalive": 1.0}) as sim, client_for(sim, stream=True) as client:
        completion = await client.complete(user("plain"), model="kimi")
        assert sim.counters["keepalive"] == 1
    assert completion.content == "Hello! ünï 中文 here."
    assert completion.usage.completion_tokens > 0  # taken from the final chunk with empty choices


async def test_plain_body_after_whitespace_keepalive(tok, reference):
    async with sim_for(tok, reference, faults={"keepalive": 1.0}) as sim, client_for(sim) as client:
        completion = await client.complete(user("plain"), model="kimi")
    assert completion.content == "Hello! ünï 中文 here."


@pytest.mark.parametrize("stream", [False, True])
async def test_empty_content_with_length_is_truncated(tok, reference, stream):
    async with sim_for(tok, reference) as sim, client_for(sim, stream=stream) as client:
        completion = await client.complete(user("length"), model="kimi")
    assert completion.truncated
    assert completion.content == "" and completion.finish_reason == "length"
    assert completion.reasoning == OUTPUTS["length"]


FAULTS = [
    ("429", RetryableError, "429"),
    ("500", RetryableError, "5xx"),
    ("502", RetryableError, "5xx"),
    ("503", RetryableError, "5xx"),
    ("402", RunStoppingError, "credits"),
    ("401", RunStoppingError, "auth"),
    ("403", RunStoppingError, "forbidden"),
    ("400", SampleFatalError, "400"),
    ("reset", EndpointUnreachable, "unreachable"),  # reset before any byte: the endpoint failed, not the sample
    ("stream_error", RetryableError, "stream"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("fault", "error_type", "error_class"), FAULTS)
async def test_fault_maps_to_error_class(tok, reference, stream, fault, error_type, error_class):
    async with sim_for(tok, reference, faults={fault: 1.0}) as sim, client_for(sim, stream=stream) as client:
        with pytest.raises(error_type) as info:
            await client.complete(user("plain"), model="kimi")
        assert sim.counters[fault] == 1
    assert info.value.error_class == error_class
    assert KEY not in str(info.value) and KEY not in repr(info.value)


@pytest.mark.parametrize(("stream", "error_class"), [(False, "malformed"), (True, "malformed")])
async def test_malformed_json_is_retryable_and_named(tok, reference, stream, error_class):
    async with sim_for(tok, reference, faults={"malformed": 1.0}) as sim, client_for(sim, stream=stream) as client:
        with pytest.raises(RetryableError) as info:
            await client.complete(user("plain"), model="kimi")
    assert info.value.error_class == error_class
    assert "malformed" in str(info.value)


@pytest.mark.parametrize(("stream", "error_class"), [(False, "malformed"), (True, "stream")])
async def test_truncated_response_is_retryable(tok, reference, stream, error_class):
    async with sim_for(tok, reference, faults={"truncate": 1.0}) as sim, client_for(sim, stream=stream) as client:
        with pytest.raises(RetryableError) as info:
            await client.complete(user("plain"), model="kimi")
    assert info.value.error_class == error_class


@pytest.mark.parametrize("stream", [False, True])
async def test_hang_past_the_client_timeout_is_a_timeout(tok, reference, stream):
    async with sim_for(tok, reference, faults={"hang": 1.0}, hang_s=30) as sim:
        async with client_for(sim, stream=stream, timeout_s=0.3) as client:
            with pytest.raises(RetryableError) as info:
                await client.complete(user("plain"), model="kimi")
    assert info.value.error_class == "timeout"


async def test_429_carries_retry_after_seconds(tok, reference):
    async with sim_for(tok, reference, faults={"429": 1.0}, retry_after_s=7) as sim, client_for(sim) as client:
        with pytest.raises(RetryableError) as info:
            await client.complete(user("plain"), model="kimi")
    assert info.value.retry_after_s == 7.0 and info.value.status == 429


async def test_429_carries_retry_after_http_date(tok, reference):
    async with sim_for(tok, reference, faults={"429": 1.0}, retry_after_s=30, retry_after_http_date=True) as sim:
        async with client_for(sim) as client:
            with pytest.raises(RetryableError) as info:
                await client.complete(user("plain"), model="kimi")
    # an HTTP date has 1 s resolution
    assert 28.0 <= info.value.retry_after_s <= 31.0


async def test_wrong_key_is_run_stopping_and_never_echoed(tok, reference):
    async with sim_for(tok, reference, api_key="the-right-key") as sim, client_for(sim) as client:
        with pytest.raises(RunStoppingError) as info:
            await client.complete(user("plain"), model="kimi")
    assert info.value.error_class == "auth" and info.value.exit_code == 3
    assert KEY not in str(info.value) and KEY not in repr(info.value)
    assert KEY not in repr(client)


async def test_right_key_is_sent_as_bearer(tok, reference):
    async with sim_for(tok, reference, api_key=KEY) as sim, client_for(sim) as client:
        completion = await client.complete(user("plain"), model="kimi")
    assert completion.content


async def test_network_error_text_has_no_key():
    client = ChatClient(Endpoint(timeout_s=1.0), Generation(), KEY, base_url="http://127.0.0.1:9/v1")
    async with client:
        with pytest.raises(RetryableError) as info:
            await client.complete(user("plain"), model="kimi")
    assert isinstance(info.value, EndpointUnreachable) and info.value.cause in ("refused", "connect_timeout")
    assert KEY not in str(info.value) and KEY not in repr(info.value)


@pytest.mark.parametrize("stream", [False, True])
async def test_logprobs_carry_bytes_that_reconstruction_the_text(tok, reference, stream):
    async with sim_for(tok, reference) as sim:
        async with client_for(sim, stream=stream, logprobs=True, top_logprobs=2) as client:
            completion = await client.complete(user("plain"), model="kimi")
    content_bytes = b"".join(bytes(lp.bytes) for lp in completion.content_logprobs)
    assert content_bytes.decode() == completion.content
    reasoning_bytes = b"".join(bytes(lp.bytes) for lp in completion.reasoning_logprobs)
    assert reasoning_bytes.decode() == completion.reasoning
    # 'ü' is split over two byte tokens: each token's text alone is U+FFFD, its bytes are exact
    partial = [lp for lp in completion.content_logprobs if lp.token == "\ufffd"]
    assert partial and all(len(lp.bytes) == 1 for lp in partial)
    assert all(lp.logprob <= 0 for lp in completion.content_logprobs)


async def test_no_logprobs_unless_asked(tok, reference):
    async with sim_for(tok, reference) as sim, client_for(sim) as client:
        completion = await client.complete(user("plain"), model="kimi")
    assert completion.content_logprobs is None and completion.token_ids is None


@pytest.mark.parametrize("stream", [False, True])
async def test_server_token_ids_pass_through(tok, reference, stream):
    async with sim_for(tok, reference) as sim, client_for(sim, stream=stream) as client:
        completion = await client.complete(user("tools"), model="kimi", extra={"return_token_ids": True})
    assert completion.token_ids == tuple(reference[1]["tools"])


async def test_models_pricing_matches_computed_cost(tok, reference):
    async with sim_for(tok, reference, report_cost=False) as sim, client_for(sim) as client:
        async with httpx.AsyncClient() as http:
            models = (await http.get(sim.base_url + "/models")).json()
        completion = await client.complete(user("plain"), model="kimi")
    pricing = pricing_from_models_entry(models["data"][0])
    assert pricing.prompt_per_m == pytest.approx(0.60)
    assert pricing.completion_per_m == pytest.approx(2.50)
    assert pricing.cached_prompt_per_m == pytest.approx(0.15)
    assert completion.usage.cost_usd is None  # not reported: computed from list prices instead
    usage = completion.usage
    assert cost_of(usage, pricing) == pytest.approx((60 * 0.60 + 40 * 0.15 + usage.completion_tokens * 2.5) / 1e6)


def test_request_body_merges_generation_and_extras(tok):
    endpoint = Endpoint(
        base_url="http://127.0.0.1:1/v1", extra={"reasoning": {"effort": "high"}, "provider": {"order": ["moonshotai"]}}
    )
    client = ChatClient(endpoint, Generation(stream=True, logprobs=True, top_logprobs=3), KEY)
    body = client.build_request(user("x"), [{"type": "function"}], model="m", extra={"seed": 1})
    assert body["model"] == "m" and body["tools"] == [{"type": "function"}]
    assert body["max_tokens"] == 256 and body["temperature"] == 0.6 and "top_p" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["logprobs"] is True and body["top_logprobs"] == 3
    assert body["reasoning"] == {"effort": "high"} and body["provider"] == {"order": ["moonshotai"]}
    assert body["seed"] == 1
    assert client.url == "http://127.0.0.1:1/v1/chat/completions"


def test_http_date_is_in_the_future_relative_to_now():
    from app.providers.parse import parse_retry_after

    now = time.time()
    date = email.utils.formatdate(now + 12, usegmt=True)
    assert 10.5 <= parse_retry_after({"retry-after": date}, now=now) <= 12.5


async def test_fetch_pricing_from_models(tok, reference):
    async with sim_for(tok, reference, model="moonshotai/kimi-k2.5") as sim, client_for(sim) as client:
        pricing = await client.fetch_pricing("moonshotai/kimi-k2.5")
        missing = await client.fetch_pricing("other/model")
    assert pricing.completion_per_m == pytest.approx(2.50) and missing is None


@pytest.mark.parametrize("stream", [False, True])
async def test_the_first_token_is_reported_once_as_it_arrives(tok, reference, stream):
    """The ETA counts a streamed sample's output from its first token: the client calls `on_first_token`
    once, when it arrives (here 1 s before the paced stream ends), and never for a plain answer."""
    options = SimulatorOptions(faults={}, quirks=[], seed=0, tokens_per_s=len(reference[1]["plain"]) / 1.0)
    calls: list[float] = []
    async with (
        SimulatorServer(options, tokenizer=tok, reference=reference[0], retry_after_s=0) as sim,
        client_for(sim, stream=stream) as client,
    ):
        started = time.perf_counter()
        completion = await client.complete(
            user("plain"), model="kimi", on_first_token=lambda: calls.append(time.perf_counter() - started)
        )
    if not stream:
        assert calls == []
        return
    assert len(calls) == 1
    assert calls[0] == pytest.approx(completion.ttft_s, abs=0.05)
    assert completion.total_s - calls[0] > 0.5
