"""Each endpoint's server is identified at start: from the config, the simulator's personality, the host, or what a
real server on loopback answers to GET /models (its own words: vLLM's and SGLang's `owned_by`)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from app.config import Endpoint, SimulatorOptions
from app.engine.fidelity.identify import identify


@dataclass
class _Live:
    config: Endpoint
    owned: bool = True


async def _serve(body: dict, status: int = 200) -> web.AppRunner:
    async def models(_request: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner


def _url(runner: web.AppRunner) -> str:
    port = runner.addresses[0][1]
    return f"http://127.0.0.1:{port}/v1"


async def test_servers_say_what_they_are_or_stay_unknown() -> None:
    vllm = await _serve(
        {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}]}
    )
    quiet = await _serve({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "me"}]})
    broken = await _serve({"error": "no"}, status=500)
    try:
        found = await identify(
            [
                _Live(Endpoint(name="a", base_url=_url(vllm))),
                _Live(Endpoint(name="b", base_url=_url(quiet))),
                _Live(Endpoint(name="c", base_url=_url(broken))),
                _Live(Endpoint(name="d", base_url=_url(quiet), server="sglang")),
                _Live(Endpoint(name="e", simulator=SimulatorOptions(personality="transformers-serve"))),
                _Live(Endpoint(name="f", base_url="https://openrouter.ai/api/v1")),
                _Live(Endpoint(name="g", base_url=_url(vllm)), owned=False),
            ]
        )
    finally:
        for runner in (vllm, quiet, broken):
            await runner.cleanup()
    assert [(i.kind, i.how) for i in found] == [
        ("vllm", "GET /models"),
        (None, "GET /models did not say"),
        (None, "GET /models answered 500"),
        ("sglang", "config"),
        ("transformers-serve", "personality"),
        ("openrouter", "host"),
        (None, "not asked (no base_url of its own)"),
    ]
