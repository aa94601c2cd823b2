"""Helpers shared by the provider and simulator tests: a reference file written from texts, endpoint objects."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# prompt -> the model output (as Kimi K2.5 text with markers) the simulator replays for it
OUTPUTS = {
    "plain": "Let me think.\nThe answer is simple.</think>Hello! ünï 中文 here.<|im_end|>",
    "tools": "I should call two tools.</think>Checking.<|tool_calls_section_begin|>"
    '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
    '<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"tz": "Europe/Paris", "fmt": 24}'
    "<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
    "length": "I keep thinking and thinking about this and never stop",
    "ws": "\nThinking hard.\n</think>\n\nAnswer.\n<|im_end|>",
    "spaces": "ok</think>1<|im_end|>",
    "nocontent": "Need a tool.</think>(no content)<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
    "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
    "toolws": "Call.</think><|tool_calls_section_begin|><|tool_call_begin|> functions.f:0 "
    '<|tool_call_argument_begin|> {"a": 1} \n<|tool_call_end|><|tool_calls_section_end|><|im_end|>',
    "json": "Call.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:7"
    '<|tool_call_argument_begin|>{"a":1,  "b":"\\u00e9"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>',
    "utf8": "Umlaut.</think>über<|im_end|>",
}


def user(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def write_reference(path: Path, tokenizer: Any, outputs: dict[str, str] = OUTPUTS) -> dict[str, list[int]]:
    """Write an SGLang-style reference.jsonl, one sample per prompt; returns prompt -> output ids."""
    ids = {}
    with open(path, "w", encoding="utf-8") as handle:
        for prompt, text in outputs.items():
            ids[prompt] = tokenizer.encode(text)
            row = {
                "id": prompt,
                "messages": user(prompt),
                "output_ids": ids[prompt],
                "meta_info": {"prompt_tokens": 100, "cached_tokens": 40},
            }
            handle.write(json.dumps(row) + "\n")
    return ids


@dataclass
class Endpoint:
    name: str = "sim"
    base_url: str | None = None
    timeout_s: float = 5.0
    max_concurrency: int = 16
    extra: dict = field(default_factory=dict)
    server: str | None = None  # app.providers.servers kind: which ids to ask for
    allow_prompt_transforms: bool = False


@dataclass
class Generation:
    max_tokens: int | None = 256
    temperature: float | None = 0.6
    top_p: float | None = None
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    attempts: int = 3


BODIES = Path(__file__).parent / "bodies"


class BodyServer:
    """A real loopback HTTP server answering every chat request with saved bytes (`tests/providers/bodies`), as
    one write or in `pieces` separated by `pause_s` (a slow drip); GET /models answers 200 (a probe's answer).
    `then`: the bytes every request after the first gets (a fault that clears on the retry)."""

    def __init__(
        self, body: bytes, *, stream: bool, pieces: int = 1, pause_s: float = 0.0, then: bytes | None = None
    ) -> None:
        self.body, self.stream, self.pieces, self.pause_s = body, stream, pieces, pause_s
        self.then = then
        self.last_body: dict = {}  # the latest request's JSON body and headers
        self.last_headers: dict = {}
        self.requests = 0
        self._runner: Any = None
        self.base_url = ""

    async def __aenter__(self) -> BodyServer:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"data": []})

    async def _chat(self, request: Any) -> Any:
        import asyncio

        from aiohttp import web

        self.requests += 1
        self.last_body = json.loads(await request.read())
        self.last_headers = dict(request.headers)
        kind = "text/event-stream" if self.stream else "application/json"
        response = web.StreamResponse(headers={"Content-Type": kind})
        await response.prepare(request)
        body = self.then if self.then is not None and self.requests > 1 else self.body
        step = -(-len(body) // self.pieces)
        try:
            for i in range(0, len(body), step):
                if i and self.pause_s:
                    await asyncio.sleep(self.pause_s)
                await response.write(body[i : i + step])
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client gave up on a drip: what the test is about
        return response


def saved_body(name: str) -> bytes:
    """The bytes of a saved hostile body."""
    return (BODIES / name).read_bytes()
