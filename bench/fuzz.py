"""Hostile provider bodies against the real engine: does anything hang, stay leased, break, or store garbage as good?

    python bench/fuzz.py [--bodies 100000] [--seed 1] [--samples-per-round 2000] [--mutate 0.6] [--concurrency 64]

A seeded loopback server (aiohttp, in this process) answers every chat request with an OpenAI-compatible body built
from the sample data's reference answers (the sample tokenizer's text, tool calls, token ids where asked), and
mutates a share of them (`--mutate`): truncated JSON, wrong types, huge / negative / NaN / infinite numbers, lone
surrogates, invalid UTF-8, deep nesting, slow drips, extra choices, an early or missing `[DONE]`, no finish_reason,
`choices` 0 or empty, `delta` a list, `content` false, ids outside the vocabulary, error envelopes, HTTP errors.
The real engine (`Run`, the real Reconstructor over the sample tokenizer, a real SQLite file per round) runs each
round of `--samples-per-round` samples to its end; rounds alternate plain and streamed answers and OpenRouter and
vLLM shapes until `--bodies` bodies were served.

Reported (exit 1 when any is not 0):
- hangs: a round that does not end within its bound;
- samples left leased once the run ended;
- internal errors: error events, samples failed as `internal` / `reconstruct` / `unrecordable`, exceptions that
  reached the event loop's handler, tracebacks written to stderr;
- garbage stored as good: a sample stored done, with a clean finish (stop / tool_calls) and no suspect flag (what
  the default export takes) whose reasoning, content or tool calls differ from what the body said;
- ledger: a cost that is not finite or is negative, a ledger (SUM(responses.cost_usd)) that differs from what the
  engine charged, or an answer charged other than max(its usable reported cost, its tokens' list price).

The server knows what every body said: a sample's answer is the same on every attempt (a model replaying its
reference), so the stored text of a good sample must equal it exactly. `run_fuzz` is what the tests call with a few
thousand bodies (`tests/providers/test_fuzz.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import random
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "sample_data"
MODEL = "moonshotai/kimi-k2.5"
PRICES = {"prompt_per_m": 0.6, "completion_per_m": 2.5}
TIMEOUT_S = 4.0  # each attempt's deadline in the fuzz config
STALL_S = 1.5  # a streamed answer's longest silence

# mutation -> (where it applies: plain | stream | both, what it needs: None | "tools" | "ids", weight)
MUTATIONS: dict[str, tuple[str, str | None, float]] = {
    "extra_field": ("both", None, 1.0),  # an unknown field holding a 70-bit integer: harmless
    "deep_ok": ("both", None, 0.5),  # 200 levels of nesting in an unknown field: harmless
    "cost_negative": ("both", None, 1.0),
    "cost_nan": ("both", None, 1.0),
    "cost_inf": ("both", None, 1.0),
    "cost_absurd": ("both", None, 1.0),
    "cost_string": ("both", None, 0.5),
    "count_huge": ("both", None, 1.0),
    "count_negative": ("both", None, 1.0),
    "count_inf": ("both", None, 1.0),
    "count_nan": ("both", None, 0.5),
    "count_string": ("both", None, 0.5),
    "ids_negative": ("both", "ids", 1.0),
    "ids_uint32": ("both", "ids", 1.0),
    "ids_vocab": ("both", "ids", 1.0),
    "ids_bigint": ("both", "ids", 0.5),
    "ids_float": ("both", "ids", 0.5),
    "surrogate": ("both", None, 1.0),
    "invalid_utf8": ("both", None, 1.0),
    "deep": ("both", None, 1.0),
    "truncated_json": ("both", None, 1.0),
    "content_false": ("both", None, 1.0),
    "content_number": ("both", None, 0.5),
    "choices_zero": ("both", None, 1.0),
    "reasoning_list": ("both", None, 0.5),
    "finish_number": ("both", None, 0.5),
    "extra_choice": ("both", None, 1.0),
    "extra_choice_first": ("plain", None, 1.0),
    "index_one": ("both", None, 1.0),
    "no_finish": ("both", None, 1.0),
    "tool_index_inf": ("both", "tools", 1.0),
    "tool_args_number": ("both", "tools", 0.5),
    "tool_calls_object": ("both", "tools", 0.5),
    "choices_empty": ("both", None, 0.5),
    "message_list": ("plain", None, 0.5),
    "usage_list": ("both", None, 0.5),
    "error_envelope": ("both", None, 0.5),
    "not_json": ("plain", None, 0.5),
    "empty_body": ("plain", None, 0.3),
    "http_500": ("both", None, 0.5),
    "http_429": ("both", None, 0.5),
    "http_400": ("both", None, 0.1),
    "drip": ("both", None, 0.4),
    "delta_list": ("stream", None, 1.0),
    "early_done": ("stream", None, 1.0),
    "cut_stream": ("stream", None, 1.0),
    "error_chunk": ("stream", None, 0.5),
    "keepalive_crlf": ("stream", None, 0.5),  # SSE comments and CRLF line ends: harmless
}


@dataclass(frozen=True)
class Truth:
    """What the model answered for one sample (every attempt's body says this, mutated or not)."""

    reasoning: str | None
    content: str | None
    tool_calls: tuple[tuple[str, str, str], ...]  # (id, name, arguments)
    finish: str
    output_ids: tuple[int, ...]
    prompt_tokens: int


def load_truths() -> tuple[list[list[dict]], list[Truth]]:
    """The sample data's prompts and their reference answers as the API returns them."""
    from app.simulator.render import OutputRenderer
    from app.tokens import load_tokenizer

    tok = load_tokenizer(SAMPLE / "tokenizer")
    renderer = OutputRenderer(tok)
    prompts, truths = [], []
    for line in (SAMPLE / "reference.jsonl").read_text().splitlines():
        row = json.loads(line)
        out = renderer.render(tuple(row["output_ids"]))
        prompts.append(row["messages"])
        truths.append(
            Truth(
                out.reasoning,
                out.content,
                tuple((c.id, c.name, c.arguments) for c in out.tool_calls),
                out.finish_reason,
                out.output_ids,
                int(row.get("meta_info", {}).get("prompt_tokens", 40)),
            )
        )
    return prompts, truths


class Raw:
    """A JSON fragment written as is (a NaN, 1e999, 2,000 brackets), which no serialiser would write."""

    def __init__(self, text: str) -> None:
        self.text = text


def dump(value: Any) -> bytes:
    """JSON of `value` with `Raw` fragments in place; lone surrogates as `\\uXXXX` escapes; NaN/inf as literals."""
    raws: list[str] = []

    def mark(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mark(x) for x in v]
        return v

    text = json.dumps(mark(value), separators=(",", ":"))  # ensure_ascii: surrogates become escapes
    for i, raw in enumerate(raws):
        text = text.replace(f'"\\u0000raw{i}\\u0000"', raw)
    return text.encode()


INVALID_UTF8 = "\x00bad-utf8\x00"


def encode_body(value: Any) -> bytes:
    """`dump` with the invalid-UTF-8 marker turned into bytes no UTF-8 decoder accepts."""
    data = dump(value)
    return data.replace(b"\\u0000bad-utf8\\u0000", b"\xed\xa0\x80\xff")


@dataclass
class Served:
    """What the server did: bodies by mode and mutation."""

    bodies: int = 0
    streamed: int = 0
    by_mutation: Counter = field(default_factory=Counter)


class FuzzServer:
    """The loopback provider: `truths[k % n]` for the request of sample `k` (its prompt starts `fz-<k>|`), its body
    mutated with probability `mutate`, every choice drawn from `seed`, the sample and its attempt number."""

    def __init__(self, truths: list[Truth], seed: int, mutate: float) -> None:
        self.truths = truths
        self.seed = seed
        self.mutate = mutate
        self.served = Served()
        self.attempts: Counter = Counter()
        self._runner: Any = None
        self.base_url = ""

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"data": []})

    def _choose(self, rng: random.Random, stream: bool, ids: bool, tools: bool) -> str | None:
        if rng.random() >= self.mutate:
            return None
        names, weights = [], []
        for name, (mode, need, weight) in MUTATIONS.items():
            if mode != "both" and mode != ("stream" if stream else "plain"):
                continue
            if (need == "ids" and not ids) or (need == "tools" and not tools):
                continue
            names.append(name)
            weights.append(weight)
        return rng.choices(names, weights)[0]

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        req = orjson.loads(await request.read())
        last = req["messages"][-1]["content"]
        k = int(last[3 : last.index("|")])
        attempt = self.attempts[k]
        self.attempts[k] += 1
        rng = random.Random(f"{self.seed}:{k}:{attempt}")
        truth = self.truths[k % len(self.truths)]
        stream = bool(req.get("stream"))
        ids = bool(req.get("return_token_ids"))
        mutation = self._choose(rng, stream, ids, bool(truth.tool_calls))
        self.served.bodies += 1
        self.served.streamed += stream
        self.served.by_mutation[mutation or "clean"] += 1
        if mutation in ("http_500", "http_429", "http_400"):
            status = int(mutation[5:])
            headers = {"Retry-After": "0"} if status == 429 else {}
            return web.json_response(
                {"error": {"code": status, "message": f"fuzz {status}"}}, status=status, headers=headers
            )
        if stream:
            return await self._stream(request, rng, truth, k, ids, mutation)
        body = plain_body(rng, truth, k, ids, mutation)
        if mutation == "drip":
            return await self._drip(request, rng, [body], "application/json")
        return web.Response(body=body, content_type="application/json")

    async def _drip(self, request: Any, rng: random.Random, parts: list[bytes], content_type: str) -> Any:
        """Send `parts` (split further) with pauses; the whole takes 0.1-6 s, past the deadline sometimes."""
        from aiohttp import web

        data = b"".join(parts)
        pieces = max(2, min(len(data), rng.randint(2, 8)))
        step = math.ceil(len(data) / pieces)
        total = rng.uniform(0.1, 6.0)
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        try:
            for i in range(0, len(data), step):
                await response.write(data[i : i + step])
                await asyncio.sleep(total / pieces)
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client gave up (its deadline): that is the point
        return response

    async def _stream(
        self, request: Any, rng: random.Random, truth: Truth, k: int, ids: bool, mutation: str | None
    ) -> Any:
        from aiohttp import web

        events, cut = stream_events(rng, truth, k, ids, mutation)
        if mutation == "drip":
            return await self._drip(request, rng, events, "text/event-stream")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await response.write(b"".join(events))
            if cut:  # the connection ends mid-stream: no finish, no [DONE]
                request.transport.close()
                return response
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return response


# ------------------------------------------------------------------------------------------------ bodies


def _usage(truth: Truth, with_cost: bool) -> dict:
    usage = {
        "prompt_tokens": truth.prompt_tokens,
        "completion_tokens": len(truth.output_ids),
        "total_tokens": truth.prompt_tokens + len(truth.output_ids),
    }
    if with_cost:
        usage["cost"] = round(
            (truth.prompt_tokens * PRICES["prompt_per_m"] + len(truth.output_ids) * PRICES["completion_per_m"]) / 1e6, 9
        )
    return usage


def _mutate_usage(rng: random.Random, usage: dict, mutation: str) -> dict:
    key = rng.choice(["prompt_tokens", "completion_tokens"])
    values = {
        "cost_negative": ("cost", -rng.choice([1.0, 0.001])),
        "cost_nan": ("cost", float("nan")),
        "cost_inf": ("cost", rng.choice([float("inf"), float("-inf")])),
        "cost_absurd": ("cost", 9.2e18),
        "cost_string": ("cost", "0.01"),
        "count_huge": (key, 2**64),
        "count_negative": (key, -1),
        "count_inf": (key, Raw("1e999")),
        "count_nan": (key, float("nan")),
        "count_string": (key, "12"),
    }
    name, value = values[mutation]
    return dict(usage, **{name: value})


def _insert(text: str | None, rng: random.Random, piece: str) -> str:
    text = text or ""
    at = rng.randint(0, len(text))
    return text[:at] + piece + text[at:]


def plain_body(rng: random.Random, truth: Truth, k: int, ids: bool, mutation: str | None) -> bytes:
    """One non-streamed body saying `truth`, mutated by `mutation`."""
    message: dict[str, Any] = {"role": "assistant", "content": truth.content, "reasoning": truth.reasoning}
    if truth.tool_calls:
        message["tool_calls"] = [
            {"index": i, "id": cid, "type": "function", "function": {"name": n, "arguments": a}}
            for i, (cid, n, a) in enumerate(truth.tool_calls)
        ]
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": truth.finish}
    if ids:
        choice["token_ids"] = list(truth.output_ids)
    body: dict[str, Any] = {
        "id": f"gen-{k}",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [choice],
        "usage": _usage(truth, with_cost=not ids),
    }
    m = mutation
    if m is None:
        return orjson.dumps(body)
    if m == "extra_field":
        body["x_fuzz"] = {"n": Raw(str(2**70)), "nested": [1, {"a": None}]}
    elif m == "deep_ok":
        body["x_deep"] = Raw("[" * 200 + "]" * 200)
    elif m == "deep":
        body["x_deep"] = Raw("[" * 2000 + "]" * 2000)
    elif m.startswith(("cost_", "count_")):
        if m.startswith("cost_") and "cost" not in body["usage"]:
            body["usage"]["cost"] = 0.0
        body["usage"] = _mutate_usage(rng, body["usage"], m)
    elif m.startswith("ids_"):
        bad = {
            "ids_negative": -1,
            "ids_uint32": 4294967297,
            "ids_vocab": 70000,
            "ids_bigint": Raw(str(10**20)),
            "ids_float": 1.5,
        }[m]
        choice["token_ids"] = [bad, *truth.output_ids]
    elif m == "surrogate":
        message["content"] = _insert(truth.content, rng, "\ud83d")
    elif m == "invalid_utf8":
        message["content"] = _insert(truth.content, rng, INVALID_UTF8)
    elif m == "truncated_json":
        data = orjson.dumps(body)
        return data[: rng.randint(1, len(data) - 1)]
    elif m == "content_false":
        message["content"] = False
    elif m == "content_number":
        message["content"] = 123
    elif m == "choices_zero":
        body["choices"] = 0
    elif m == "choices_empty":
        body["choices"] = []
    elif m == "reasoning_list":
        message["reasoning"] = ["thinking"]
    elif m == "finish_number":
        choice["finish_reason"] = 5
    elif m == "extra_choice":
        body["choices"].append(
            {"index": 1, "message": {"role": "assistant", "content": "another answer"}, "finish_reason": "stop"}
        )
    elif m == "extra_choice_first":
        body["choices"].insert(
            0, {"index": 1, "message": {"role": "assistant", "content": "another answer"}, "finish_reason": "stop"}
        )
    elif m == "index_one":
        choice["index"] = 1
    elif m == "no_finish":
        choice["finish_reason"] = None
    elif m == "tool_index_inf":
        message["tool_calls"][0]["index"] = Raw("1e999")
    elif m == "tool_args_number":
        message["tool_calls"][0]["function"]["arguments"] = 5
    elif m == "tool_calls_object":
        message["tool_calls"] = {"0": message["tool_calls"][0]}
    elif m == "message_list":
        choice["message"] = []
    elif m == "usage_list":
        body["usage"] = []
    elif m == "error_envelope":
        return orjson.dumps({"error": {"code": 502, "message": "upstream failed (fuzz)"}})
    elif m == "not_json":
        return b"<html><body>502 Bad Gateway</body></html>"
    elif m == "empty_body":
        return b""
    return encode_body(body)


def _pieces(rng: random.Random, text: str | None) -> list[str]:
    text = text or ""
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 24)
        out.append(text[i : i + n])
        i += n
    return out


def stream_events(
    rng: random.Random, truth: Truth, k: int, ids: bool, mutation: str | None
) -> tuple[list[bytes], bool]:
    """The SSE events of one streamed answer saying `truth`, mutated; and whether the connection is cut after them."""
    head = {"id": f"gen-{k}", "object": "chat.completion.chunk", "model": MODEL}
    chunks: list[dict] = [dict(head, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])]
    for piece in _pieces(rng, truth.reasoning):
        chunks.append(dict(head, choices=[{"index": 0, "delta": {"reasoning": piece}}]))
    for piece in _pieces(rng, truth.content):
        chunks.append(dict(head, choices=[{"index": 0, "delta": {"content": piece}}]))
    for i, (cid, name, args) in enumerate(truth.tool_calls):
        chunks.append(
            dict(
                head,
                choices=[
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
                            ]
                        },
                    }
                ],
            )
        )
        for piece in _pieces(rng, args):
            chunks.append(
                dict(
                    head,
                    choices=[{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}}],
                )
            )
    if ids:  # vLLM streams each chunk's ids; spread them over the body chunks, the rest on the finish chunk
        left = list(truth.output_ids)
        for c in chunks[1:]:
            n = rng.randint(0, 3)
            c["choices"][0]["token_ids"], left = left[:n], left[n:]
    finish = {"index": 0, "delta": {}, "finish_reason": truth.finish}
    if ids:
        finish["token_ids"] = left
    chunks.append(dict(head, choices=[finish]))
    chunks.append(dict(head, choices=[], usage=_usage(truth, with_cost=not ids)))
    body_range = (1, len(chunks) - 2)  # the chunks between the role chunk and the finish chunk
    m, cut, done_at = mutation, False, len(chunks)
    target = chunks[rng.randint(*body_range)] if body_range[1] >= body_range[0] else chunks[0]
    first = target["choices"][0]
    if m == "extra_field":
        target["x_fuzz"] = {"n": Raw(str(2**70))}
    elif m == "deep_ok":
        target["x_deep"] = Raw("[" * 200 + "]" * 200)
    elif m == "deep":
        target["x_deep"] = Raw("[" * 2000 + "]" * 2000)
    elif m is not None and m.startswith(("cost_", "count_")):
        usage = chunks[-1]["usage"]
        if m.startswith("cost_") and "cost" not in usage:
            usage["cost"] = 0.0
        chunks[-1]["usage"] = _mutate_usage(rng, usage, m)
    elif m is not None and m.startswith("ids_"):
        bad = {
            "ids_negative": -1,
            "ids_uint32": 4294967297,
            "ids_vocab": 70000,
            "ids_bigint": Raw(str(10**20)),
            "ids_float": 1.5,
        }[m]
        first["token_ids"] = [bad, *first.get("token_ids", [])]
    elif m == "surrogate":
        first["delta"]["content"] = _insert(first["delta"].get("content"), rng, "\ud83d")
    elif m == "invalid_utf8":
        first["delta"]["content"] = _insert(first["delta"].get("content"), rng, INVALID_UTF8)
    elif m == "content_false":
        first["delta"]["content"] = False
    elif m == "content_number":
        first["delta"]["content"] = 123
    elif m == "choices_zero":
        target["choices"] = 0
    elif m == "choices_empty":
        for c in chunks[:-1]:
            c["choices"] = []
    elif m == "reasoning_list":
        first["delta"]["reasoning"] = ["x"]
    elif m == "finish_number":
        chunks[-2]["choices"][0]["finish_reason"] = 5
    elif m == "extra_choice":
        target["choices"] = [first, {"index": 1, "delta": {"content": "another answer"}}]
    elif m == "index_one":
        first["index"] = 1
    elif m == "no_finish":
        chunks[-2]["choices"][0]["finish_reason"] = None
    elif m == "delta_list":
        first["delta"] = []
    elif m in ("tool_index_inf", "tool_args_number", "tool_calls_object"):
        calls = [c for c in chunks if c["choices"] and "tool_calls" in c["choices"][0].get("delta", {})]
        call_chunk = rng.choice(calls)["choices"][0]["delta"]
        if m == "tool_index_inf":
            call_chunk["tool_calls"][0]["index"] = Raw("1e999")
        elif m == "tool_args_number":
            call_chunk["tool_calls"][0].setdefault("function", {})["arguments"] = 5
        else:
            call_chunk["tool_calls"] = {"0": call_chunk["tool_calls"][0]}
    elif m == "usage_list":
        chunks[-1]["usage"] = []
    elif m == "early_done":
        done_at = rng.randint(1, len(chunks))  # at len(chunks) - 1 or later it comes after the finish chunk
    elif m == "cut_stream":
        chunks = chunks[: rng.randint(1, len(chunks) - 2)]
        done_at, cut = len(chunks), True
    elif m == "error_chunk":
        at = rng.randint(*body_range) if body_range[1] >= body_range[0] else 1
        chunks.insert(
            at,
            dict(
                head,
                error={"code": 502, "message": "upstream failed mid-stream (fuzz)"},
                choices=[{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
            ),
        )
        done_at = len(chunks)
    elif m == "error_envelope":
        chunks = [{"error": {"code": 503, "message": "overloaded (fuzz)"}}]
        done_at = 1
    events = [b"data: " + (encode_body(c) if m else orjson.dumps(c)) + b"\n\n" for c in chunks]
    if m == "truncated_json":
        at = rng.randint(1, len(events) - 1)
        events[at] = events[at][: max(7, len(events[at]) // 2)] + b"\n\n"
    if not cut:
        events.insert(min(done_at, len(events)), b"data: [DONE]\n\n")
    if m == "keepalive_crlf":
        events = [e.replace(b"\n", b"\r\n") for e in events]
        events.insert(rng.randint(0, len(events)), b": OPENROUTER PROCESSING\r\n\r\n")
    return events, cut


# ------------------------------------------------------------------------------------------------ one round


@dataclass
class Report:
    """What the rounds found; `violations` is the sum that must be 0."""

    bodies: int = 0
    streamed: int = 0
    samples: int = 0
    rounds: int = 0
    done_good: int = 0
    done_other: int = 0
    failed: int = 0
    hangs: int = 0
    leased: int = 0
    internal_errors: int = 0
    tracebacks: int = 0
    garbage_as_good: int = 0
    ledger_problems: int = 0
    ledger_usd: float = 0.0
    charged_usd: float = 0.0
    seconds: float = 0.0
    by_mutation: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return (
            self.hangs
            + self.leased
            + self.internal_errors
            + self.tracebacks
            + self.garbage_as_good
            + self.ledger_problems
        )

    def note(self, text: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(text)


def _fuzz_config(db: Path, base_url: str, *, stream: bool, vllm: bool, concurrency: int) -> Any:
    from app.config import parse_config

    return parse_config(
        {
            "run": {"name": "fuzz", "database": str(db), "reconstruct_workers": 0},
            "data": {"datasets": [{"path": str(SAMPLE / "prompts.openai.jsonl")}]},
            "model": {"name": MODEL, "tokenizer": str(SAMPLE / "tokenizer")},
            "endpoints": [
                {
                    "name": "fuzz",
                    "base_url": base_url,
                    "timeout_s": TIMEOUT_S,
                    "stall_timeout_s": STALL_S,
                    "max_concurrency": concurrency,
                    **({"server": "vllm"} if vllm else {}),
                }
            ],
            "generation": {"max_tokens": 4096, "stream": stream, "attempts": 4},
            "limits": {"concurrency_max": concurrency},
            "pricing": {MODEL: PRICES},
        }
    )


async def fuzz_round(
    server: FuzzServer,
    prompts: list[list[dict]],
    first: int,
    n: int,
    *,
    stream: bool,
    vllm: bool,
    concurrency: int,
    folder: Path,
    report: Report,
    reconstructor: Any,
) -> None:
    """One Run of samples first..first+n-1 over a fresh database; add what it found to `report`."""
    from app.engine.run import Run
    from app.providers.retry import RetryPolicy
    from app.store.run_store import RunStore
    from app.store.store_records import SampleInput

    db = folder / f"round-{report.rounds}.db"
    config = _fuzz_config(db, server.base_url, stream=stream, vllm=vllm, concurrency=concurrency)
    store = await RunStore.open(db)
    loop = asyncio.get_running_loop()
    loop_errors: list[str] = []
    previous = loop.get_exception_handler()

    def on_loop_error(_loop: Any, ctx: dict) -> None:
        exc = ctx.get("exception")
        if exc is not None and __import__("os").environ.get("FUZZ_DEBUG"):
            import traceback

            traceback.print_exception(exc, file=sys.__stderr__)
            print(ctx, file=sys.__stderr__)
        loop_errors.append(str(exc or ctx.get("message")))

    loop.set_exception_handler(on_loop_error)
    run = None
    try:
        run_id = await store.ensure_run("fuzz", config.redacted())
        samples = []
        for k in range(first, first + n):
            messages = [dict(m) for m in prompts[k % len(prompts)]]
            messages[-1] = dict(messages[-1], content=f"fz-{k}|" + str(messages[-1]["content"]))
            samples.append(SampleInput(f"s{k}", "fuzz", messages, None))
        await store.ingest(run_id, samples)
        run = Run(
            config,
            store,
            reconstructor=reconstructor,
            db_path=db,
            retry_policy=RetryPolicy(attempts=4, base_s=0.005, cap_s=0.02),
        )
        await run.start()
        bound = 60.0 + n * 0.05
        try:
            outcome = await asyncio.wait_for(run.wait(), bound)
        except TimeoutError:
            report.hangs += 1
            report.note(f"round {report.rounds}: the run did not end within {bound:.0f} s")
            outcome = None
        if outcome is not None and outcome.state != "done":
            report.hangs += 1
            report.note(f"round {report.rounds}: the run ended {outcome.state} ({outcome.reason})")
        report.charged_usd += run.budget.spent_usd
        _check_round(db, run.budget.spent_usd, server, report)
    finally:
        if run is not None:
            await run.close()
        await store.close()
        loop.set_exception_handler(previous)
    report.internal_errors += len(loop_errors)
    for text in loop_errors[:3]:
        report.note(f"round {report.rounds}: the event loop's handler saw {text[:200]}")
    report.rounds += 1
    report.samples += n


def _check_round(db: Path, charged: float, server: FuzzServer, report: Report) -> None:
    from app.engine.money.budget import charge
    from app.providers.pricing import ModelPricing
    from app.records import Usage
    from app.tokens.flags import is_suspect

    conn = sqlite3.connect(db)
    try:
        states = dict(conn.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())
        report.leased += states.get("leased", 0)
        if states.get("leased"):
            report.note(f"round {report.rounds}: {states['leased']} samples left leased")
        report.failed += states.get("failed", 0)
        for cls, count in conn.execute(
            "SELECT error_class, COUNT(*) FROM samples WHERE state = 'failed' AND "
            "error_class IN ('internal', 'reconstruct', 'unrecordable') GROUP BY 1"
        ):
            report.internal_errors += count
            msg = conn.execute("SELECT last_error FROM samples WHERE error_class = ? LIMIT 1", (cls,)).fetchone()[0]
            report.note(f"round {report.rounds}: {count} samples failed as {cls}: {msg[:200]}")
        for kind, message in conn.execute("SELECT kind, message FROM events WHERE level = 'error'"):
            report.internal_errors += 1
            report.note(f"round {report.rounds}: error event ({kind}): {message[:200]}")
        rows = conn.execute(
            "SELECT s.sample_id, r.reasoning, r.content, r.tool_calls, r.finish_reason, rc.flags, r.usage, r.cost_usd "
            "FROM samples s JOIN responses r ON r.sample_pk = s.pk AND r.error_class IS NULL "
            "LEFT JOIN reconstructions rc ON rc.sample_pk = s.pk WHERE s.state = 'done'"
        ).fetchall()
        pricing = ModelPricing(PRICES["prompt_per_m"], PRICES["completion_per_m"], PRICES["prompt_per_m"])
        for sid, reasoning, content, calls, finish, flags, usage, cost in rows:
            truth = server.truths[int(sid[1:]) % len(server.truths)]
            u = Usage(**json.loads(usage))
            expected = charge(u, pricing).usd
            if not math.isclose(cost, expected, rel_tol=1e-9, abs_tol=1e-12):
                report.ledger_problems += 1
                report.note(
                    f"round {report.rounds}: {sid} was charged {cost!r}, not max(reported, priced) = {expected!r}"
                )
            good = finish in ("stop", "tool_calls") and not is_suspect(json.loads(flags) if flags else [])
            if not good:
                report.done_other += 1
                continue
            report.done_good += 1
            stored_calls = tuple((c["id"], c["name"], c["arguments"]) for c in json.loads(calls)) if calls else ()
            if (
                (reasoning or "") != (truth.reasoning or "")
                or (content or "") != (truth.content or "")
                or stored_calls != truth.tool_calls
                or finish != truth.finish
            ):
                report.garbage_as_good += 1
                report.note(
                    f"round {report.rounds}: {sid} stored as good differs from what the body said: "
                    f"content {content!r:.80} vs {truth.content!r:.80}"
                )
        ledger, bad_rows = conn.execute(
            "SELECT SUM(cost_usd), SUM(cost_usd IS NULL OR cost_usd < 0 OR cost_usd > 1e300) FROM responses"
        ).fetchone()
        ledger = ledger or 0.0
        if bad_rows:
            report.ledger_problems += bad_rows
            report.note(f"round {report.rounds}: {bad_rows} ledger rows hold a cost that is not finite and >= 0")
        if not math.isfinite(ledger) or ledger < 0 or not math.isclose(ledger, charged, rel_tol=1e-9, abs_tol=1e-9):
            report.ledger_problems += 1
            report.note(f"round {report.rounds}: the ledger {ledger!r} is not what the engine charged ({charged!r})")
        report.ledger_usd += ledger
    finally:
        conn.close()


class _Tee(io.TextIOBase):
    """stderr, kept: tracebacks written there are counted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.text = io.StringIO()

    def write(self, s: str) -> int:
        self.text.write(s)
        return self.inner.write(s)

    def flush(self) -> None:
        self.inner.flush()


async def run_fuzz(
    bodies: int,
    seed: int,
    *,
    samples_per_round: int = 2000,
    mutate: float = 0.6,
    concurrency: int = 64,
    folder: Path | None = None,
    progress: bool = False,
) -> Report:
    """Serve at least `bodies` bodies, at least half of them streamed, over rounds (plain and streamed, OpenRouter and
    vLLM shapes in turn); the Report."""
    from app.engine.fidelity.pool import build_reconstructor

    prompts, truths = load_truths()
    server = FuzzServer(truths, seed, mutate)
    await server.start()
    report = Report()
    tee = _Tee(sys.stderr)
    started = time.monotonic()
    cfg = _fuzz_config(Path("/nonexistent/fuzz.db"), server.base_url, stream=False, vllm=False, concurrency=concurrency)
    reconstructor = build_reconstructor(cfg)
    own = folder is None
    work = Path(tempfile.mkdtemp(prefix="eaglewatch-fuzz-")) if own else folder
    try:
        with contextlib.redirect_stderr(tee):
            first = 0
            served = server.served
            # until `bodies` were served, at least half of them streamed: each round takes the mode that is behind
            while served.bodies < bodies or 2 * served.streamed < bodies:
                stream = 2 * served.streamed < served.bodies or (served.bodies >= bodies)
                left = max(bodies - served.bodies, bodies // 2 - served.streamed, 1)
                n = max(1, min(samples_per_round, math.ceil(left / 1.6)))
                await fuzz_round(
                    server,
                    prompts,
                    first,
                    n,
                    stream=stream,
                    vllm=report.rounds % 4 >= 2,
                    concurrency=concurrency,
                    folder=work,
                    report=report,
                    reconstructor=reconstructor,
                )
                first += n
                if progress:
                    print(
                        f"round {report.rounds}: {server.served.bodies} bodies, {report.violations} violations, "
                        f"{time.monotonic() - started:.0f} s",
                        file=sys.__stderr__,
                    )
    finally:
        await server.close()
        if own:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    report.tracebacks = tee.text.getvalue().count("Traceback (most recent call last)")
    report.bodies, report.streamed = server.served.bodies, server.served.streamed
    report.by_mutation = server.served.by_mutation
    report.seconds = time.monotonic() - started
    return report


def render(report: Report) -> str:
    """The markdown table of a report."""
    lines = [
        f"| fuzz: {report.bodies:,} bodies ({report.streamed:,} streamed), {report.samples:,} samples, "
        f"{report.rounds} rounds, {report.seconds:.0f} s | |",
        "|---|---|",
        f"| samples stored good (clean finish, not suspect) | {report.done_good:,} |",
        f"| samples stored otherwise (truncated, flagged) | {report.done_other:,} |",
        f"| samples failed (attempts used up by refused bodies) | {report.failed:,} |",
        f"| **hangs** | {report.hangs} |",
        f"| **samples left leased** | {report.leased} |",
        f"| **internal errors** | {report.internal_errors} |",
        f"| **tracebacks on stderr** | {report.tracebacks} |",
        f"| **garbage stored as good** | {report.garbage_as_good} |",
        f"| **ledger problems** | {report.ledger_problems} |",
        f"| ledger / charged | ${report.ledger_usd:.6f} / ${report.charged_usd:.6f} |",
        "",
        "bodies by mutation: " + ", ".join(f"{k} {v}" for k, v in sorted(report.by_mutation.items())),
    ]
    if report.examples:
        lines += ["", "first findings:"] + [f"- {e}" for e in report.examples]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bodies", type=int, default=100_000, help="bodies to serve in all (half of them streamed)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--samples-per-round", type=int, default=2000)
    ap.add_argument("--mutate", type=float, default=0.6, help="share of bodies mutated")
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    report = asyncio.run(
        run_fuzz(
            args.bodies,
            args.seed,
            samples_per_round=args.samples_per_round,
            mutate=args.mutate,
            concurrency=args.concurrency,
            progress=True,
        )
    )
    print(render(report))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "fuzz.json").write_text(
        json.dumps(
            {k: v for k, v in report.__dict__.items() if k != "by_mutation"}
            | {"by_mutation": dict(report.by_mutation), "violations": report.violations},
            indent=2,
        )
    )
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
