"""Error texts name the real failure (a reset is a reset); prices follow the model name; ids are asked for."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from app.providers import ChatClient, RetryableError
from app.providers.exceptions import EndpointUnreachable
from app.providers.pricing import ModelPricing, PriceQuote, base_model, prices_at_start, resolve_pricing
from app.simulator import SimulatorOptions, SimulatorServer
from tests.providers.support import Endpoint, Generation, user


async def _start(handler) -> tuple[asyncio.AbstractServer, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _reset_after_reading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")  # the request head: the connection was made, then reset
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
    writer.transport.abort()


async def _reset_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    event = (
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"cost":0.0042}}\n\n'
    )
    writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_a_connection_reset_is_reported_as_a_reset_not_a_connect_timeout(transport):
    server, port = await _start(_reset_after_reading)
    async with server:
        async with ChatClient(
            Endpoint(), Generation(), None, base_url=f"http://127.0.0.1:{port}/v1", transport=transport
        ) as client:
            with pytest.raises(RetryableError) as caught:
                await client.complete(user("x"), model="m")
    text = str(caught.value)
    assert isinstance(caught.value, EndpointUnreachable) and caught.value.cause == "reset"
    assert "reset" in text or "closed the connection" in text, text
    assert "ConnectTimeout" not in text and "timed out" not in text


async def test_a_refused_connection_says_refused():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    async with ChatClient(Endpoint(), Generation(), None, base_url=f"http://127.0.0.1:{port}/v1") as client:
        with pytest.raises(RetryableError, match="refused") as caught:
            await client.complete(user("x"), model="m")
    assert "ConnectTimeout" not in str(caught.value)


async def test_a_stream_reset_after_a_costed_usage_chunk_keeps_the_cost():
    server, port = await _start(_reset_mid_stream)
    async with server:
        async with ChatClient(
            Endpoint(), Generation(stream=True), None, base_url=f"http://127.0.0.1:{port}/v1"
        ) as client:
            with pytest.raises(RetryableError) as caught:
                await client.complete(user("x"), model="m")
    assert caught.value.error_class == "stream"
    assert caught.value.cost_usd == pytest.approx(0.0042)
    assert "ConnectTimeout" not in str(caught.value)


def test_variants_resolve_to_their_base_price_unless_priced_themselves():
    base = ModelPricing(0.6, 2.5, 0.15)
    floor = ModelPricing(0.5, 2.0, 0.1)
    table = {"moonshotai/kimi-k2.5": base, "moonshotai/kimi-k2.5:floor": floor}
    assert resolve_pricing("moonshotai/kimi-k2.5:nitro", table) == (base, "moonshotai/kimi-k2.5")
    assert resolve_pricing("moonshotai/kimi-k2.5:free", table) == (base, "moonshotai/kimi-k2.5")
    assert resolve_pricing("moonshotai/kimi-k2.5:thinking", table) == (base, "moonshotai/kimi-k2.5")
    assert resolve_pricing("moonshotai/kimi-k2.5:floor", table) == (floor, "moonshotai/kimi-k2.5:floor")
    assert resolve_pricing("qwen/qwen3-8b:free", table) == (None, None)
    assert base_model("moonshotai/kimi-k2.5") == "moonshotai/kimi-k2.5"


async def test_prices_at_start_take_the_config_then_models_then_say_there_are_none(tok, reference):
    listed = ModelPricing(1.0, 4.0, 0.25)
    async with SimulatorServer(
        SimulatorOptions(), tokenizer=tok, reference=reference[0], model="vendor/m", pricing=listed
    ) as sim:
        async with ChatClient(Endpoint(name="sim"), Generation(), None, base_url=sim.base_url) as client:
            configured = await prices_at_start("vendor/m:nitro", {"vendor/m": ModelPricing(9, 9)}, {"sim": client})
            fetched = await prices_at_start("vendor/m:floor", {}, {"sim": client})
            missing = await prices_at_start("other/model", {}, {"sim": client})
    assert configured.source == "config" and configured.key == "vendor/m" and configured.pricing.prompt_per_m == 9
    assert fetched == PriceQuote("vendor/m:floor", listed, "models", "sim")
    assert "GET /models of sim" in fetched.describe()
    assert missing.source == "none" and missing.pricing is None and "no price" in missing.describe()


@pytest.mark.parametrize(
    ("server", "stream", "asked"),
    [
        ("vllm", False, {"return_token_ids": True}),
        ("vllm", True, {"return_token_ids": True}),
        ("sglang", False, {"return_token_ids": True, "return_prompt_token_ids": True}),
        ("sglang", True, {}),  # SGLang answers 400 to either with stream=true
        ("openrouter", False, {}),
        ("transformers-serve", True, {}),  # transformers serve answers 422 to unknown fields
        (None, False, {}),
    ],
)
def test_the_client_asks_each_server_for_ids_it_can_return(server, stream, asked):
    client = ChatClient(Endpoint(server=server), Generation(stream=stream), None, base_url="http://127.0.0.1:9/v1")
    body = client.build_request(user("x"), model="m")
    got = {k: v for k, v in body.items() if k.startswith("return_")}
    assert got == asked


def test_endpoint_extra_still_overrides_what_the_server_kind_asks():
    client = ChatClient(
        Endpoint(server="vllm", extra={"return_token_ids": False}), Generation(), None, base_url="http://127.0.0.1:9/v1"
    )
    assert client.build_request(user("x"), model="m")["return_token_ids"] is False


def _config(tmp_path, model: str, pricing: str = ""):
    from app.config import load_config

    (tmp_path / "p.jsonl").write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    path = tmp_path / "run.toml"
    path.write_text(f"""
[run]
name = "r"
database = "{tmp_path / "r.db"}"
[[data.datasets]]
path = "p.jsonl"
format = "openai-messages"
[model]
name = "{model}"
tokenizer = "{tmp_path}"
[[endpoints]]
base_url = "https://openrouter.ai/api/v1"
server = "openrouter"
{pricing}
""")
    return load_config(path)


def test_config_check_prints_the_variant_price_or_warns_there_is_none(tmp_path):
    from app.commands.config import price_lines

    priced = _config(
        tmp_path,
        "moonshotai/kimi-k2.5:floor",
        '[pricing."moonshotai/kimi-k2.5"]\nprompt_per_m = 0.6\ncompletion_per_m = 2.5',
    )
    [line] = price_lines(priced)
    assert (
        line.startswith("# prices: moonshotai/kimi-k2.5:floor: $0.6/M prompt")
        and '[pricing."moonshotai/kimi-k2.5"]' in line
    )
    [warning] = price_lines(_config(tmp_path, "vendor/unpriced:nitro"))
    assert warning.startswith("# warning: no [pricing.") and "GET /models" in warning
