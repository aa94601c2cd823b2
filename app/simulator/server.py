"""`SimulatorServer`: an OpenAI/OpenRouter-compatible chat server on loopback that replays reference ids.

    async with SimulatorServer(options, tokenizer_dir=...) as sim:
        sim.base_url            # http://127.0.0.1:<free port>/v1
        sim.counters["429"]     # requests answered with each fault kind ("ok" for plain answers)

POST /v1/chat/completions (non-streaming and SSE) and GET /v1/models (with pricing). Faults are drawn
per request from a seeded RNG, at most one per request; "keepalive" is drawn on its own.
Simulator extensions beyond OpenRouter's protocol: `metadata.sample_id` names the reference sample to answer
(`SAMPLE_FIELD`; eaglewatch sends it to its simulators only), so samples that share a prompt each get their
own; logprobs of reasoning tokens under `choices[0].logprobs.reasoning`; `"return_token_ids": true` adds vLLM-style
`token_ids` to the choice
(the full output ids; in a stream they come with the finish chunk); an `api_key` makes it answer 401 to
any other Bearer token. `options.prompt_cache` reports `cached_tokens` as a provider's prompt cache would
(`PromptCache`: the longest earlier request whose messages begin this one's); `record=True` keeps every chat
request as received (`received`: arrival time, the sample it named, the body bytes, the requests in flight).
`latency_by_sample=True`
draws each request's latency from its sample alone (`sample_latency_s`), not from the order requests arrive in,
so every client that sends the same samples is given the same work (benchmarks compute their oracle from it).

`options.personality` (app.simulator.personalities) makes it answer as another real server: vLLM, SGLang
or transformers serve field names, ids and prompt ids where that server puts them, its text steps, its
stream ending and its error bodies.
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import hashlib
import json
import math
import random
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from app.providers.pricing import ModelPricing, cost_of
from app.records import Usage
from app.simulator.capacity import CapacityGate, has_capacity, retry_after_headers
from app.simulator.options import FAULT_KINDS, KEEPALIVE, SimulatorOptions, canonical_faults, check_options
from app.simulator.personalities import OPENAI_CHAT_FIELDS, Personality, get_personality
from app.simulator.reference import ReferenceBook, messages_key
from app.simulator.render import OutputRenderer, RenderedOutput, text_pieces

PROVIDER = "eaglewatch-simulator"
DEFAULT_MODEL = "moonshotai/kimi-k2.5"
# OpenRouter list prices for Kimi K2.5 (USD per million tokens), used unless told otherwise
DEFAULT_PRICING = ModelPricing(prompt_per_m=0.60, completion_per_m=2.50, cached_prompt_per_m=0.15)
_Z95 = 1.6448536269514722
SAMPLE_FIELD = ("metadata", "sample_id")  # body["metadata"]["sample_id"]: the reference sample asked for
CACHE_ENTRIES = 2048  # rendered samples kept per cache
VLLM_FINGERPRINT = "vllm-0.32.0-simulated"  # vLLM's system_fingerprint: vllm-<version>-<hash>
# the keys vLLM 0.32 writes as null on a response, a choice and a message when it has nothing for them
# (vllm/entrypoints/openai/chat_completion/protocol.py ChatCompletionResponse, ...Choice, ChatMessage)
_VLLM_BODY_NULLS = (
    "service_tier",
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
)
_VLLM_CHOICE_NULLS = ("stop_reason", "token_ids", "routed_experts")
_VLLM_MESSAGE_NULLS = ("refusal", "annotations", "audio", "function_call")

_ERRORS = {
    400: ("invalid_request", "Bad request (simulated)"),
    401: ("authentication", "No auth credentials found (simulated)"),
    402: ("payment_required", "Insufficient credits (simulated). Add more using https://openrouter.ai/credits"),
    403: ("permission_denied", "Forbidden (simulated)"),
    429: ("rate_limit_exceeded", "Rate limit exceeded (simulated)"),
    500: ("server", "Internal Server Error (simulated)"),
    502: ("provider_unavailable", "Provider returned error (simulated)"),
    503: ("provider_overloaded", "No available provider (simulated)"),
}


def _json(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """A chat request as the simulator received it: when (unix time, on arrival), the sample it named, the body,
    and how many chat requests the server was handling on its arrival, itself included (refused ones too)."""

    at: float
    sample_id: str | None
    body: bytes
    in_flight: int = 0


class PromptCache:
    """A provider's prompt cache, by message list: each request's messages are remembered (the JSON text of each
    message as sent, chained through a hash) with its prompt tokens; a later request whose messages begin with an
    earlier request's, byte for byte, is served that many cached tokens. Bounded (oldest forgotten first)."""

    def __init__(self, entries: int = 65536) -> None:
        self._seen: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._entries = entries

    @staticmethod
    def _prefixes(messages: list) -> list[bytes]:
        h = hashlib.sha256()
        out = []
        for m in messages:
            h.update(_json(m))
            h.update(b"\x00")
            out.append(h.copy().digest())
        return out

    def serve(self, messages: list, prompt_tokens: int) -> int:
        """The cached prompt tokens for this request (then remember it)."""
        prefixes = self._prefixes(messages)
        cached = 0
        for key in reversed(prefixes):
            hit = self._seen.get(key)
            if hit is not None:
                cached = min(hit, prompt_tokens)
                break
        if prefixes:
            self._seen[prefixes[-1]] = prompt_tokens
            self._seen.move_to_end(prefixes[-1])
            while len(self._seen) > self._entries:
                self._seen.popitem(last=False)
        return cached


def _tool_ids_dropped(parts: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
    """vLLM #27482: the tool parser swallows the chunks of a streamed tool call, and their token ids with them."""
    out = []
    for choices, tokens in parts:
        items = json.loads(choices)
        if items[0].get("delta", {}).get("tool_calls") and "token_ids" in items[0]:
            del items[0]["token_ids"]
            choices = _json(items)
        out.append((choices, tokens))
    return out


def sample_latency_s(seed: int, key: str, median_ms: float, p95_ms: float) -> float:
    """The latency (seconds) of sample `key` under `latency_by_sample`: a lognormal draw with this median and p95
    (ms; 0 median = none) from an RNG seeded by (`seed`, `key`) alone, the same in any order and any process."""
    if median_ms <= 0:
        return 0.0
    p95_ms = max(p95_ms, median_ms)
    sigma = (math.log(p95_ms) - math.log(median_ms)) / _Z95
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big")).lognormvariate(math.log(median_ms / 1000.0), sigma)


def intervened(seed: int, kind: str, key: str, rate: float) -> bool:
    """Whether the sample `key` (its requested id, else its messages' key) draws intervention `kind` at `rate`: a
    draw from (`seed`, `kind`, `key`) alone, the same on every attempt, in any order and any process (a test
    names the samples it expects flagged with it)."""
    if rate <= 0:
        return False
    digest = hashlib.sha256(f"{seed}\x00{kind}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def budget_cut(output_ids: tuple[int, ...], think_open: int | None, think_close: int | None, budget: int):
    """`output_ids` as a server with a thinking budget of `budget` tokens produces them: reasoning longer than the
    budget is cut there and the think-close token forced in, the answer after the model's own close kept (the
    model goes on answering); unchanged where the reasoning fits or is never closed."""
    if think_close is None or think_close not in output_ids:
        return output_ids
    close = output_ids.index(think_close)
    start = 1 if output_ids and output_ids[0] == think_open else 0
    if close - start <= budget:
        return output_ids
    return output_ids[: start + budget] + output_ids[close:]


def looped(output_ids: tuple[int, ...], period: int = 4) -> tuple[int, ...]:
    """A target caught in a repetition loop: the output's first quarter, then one `period`-token cycle of it repeated
    to the output's length (no end of turn: a loop runs to max_tokens)."""
    head = max(1, len(output_ids) // 4)
    cycle = output_ids[head : head + period] or output_ids[:period]
    body = list(output_ids[:head])
    while len(body) < max(len(output_ids), head + 4 * period):
        body.extend(cycle)
    return tuple(body[: max(len(output_ids), head + 4 * period)])


def requested_sample(body: dict) -> str | None:
    """The reference sample id a request names (`metadata.sample_id`), or None."""
    meta = body.get(SAMPLE_FIELD[0])
    value = meta.get(SAMPLE_FIELD[1]) if isinstance(meta, dict) else None
    return value if isinstance(value, str) and value else None


class SimulatorServer:
    """The simulator on `host:port` (port 0 picks a free port); start with `async with` or `start()`."""

    def __init__(
        self,
        options: Any = None,
        *,
        tokenizer: Any = None,
        tokenizer_dir: str | Path | None = None,
        reference: str | Path | None = None,
        model: str = DEFAULT_MODEL,
        pricing: Any = DEFAULT_PRICING,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        hang_s: float = 3600.0,
        retry_after_s: float = 1.0,
        retry_after_http_date: bool = False,
        stream_chunk_tokens: int = 4,
        report_cost: bool = True,
        profile: Any = None,
        record: bool = False,
        latency_by_sample: bool = False,
    ) -> None:
        self.options = options if options is not None else SimulatorOptions()
        check_options(self.options)
        if tokenizer is None:
            if tokenizer_dir is None:
                raise ValueError("SimulatorServer needs tokenizer= or tokenizer_dir=")
            from app.tokens.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer_dir)
        self.tokenizer = tokenizer
        self.renderer = OutputRenderer(tokenizer, profile)
        ref = reference if reference is not None else getattr(self.options, "reference", None)
        paths = ([Path(ref)] if ref else []) + [Path(p) for p in getattr(self.options, "extra_references", None) or ()]
        self.book = ReferenceBook.load_all(paths) if paths else ReferenceBook.synthetic(tokenizer)
        self.prompt_cache = PromptCache() if getattr(self.options, "prompt_cache", False) else None
        # every chat request as received, when `record` (tests read what a client really sent)
        self.received: list[ReceivedRequest] | None = [] if record else None
        self.in_flight = 0  # chat requests being handled now (answered, refused or still waiting)
        self.latency_by_sample = latency_by_sample  # latency from the sample alone (`sample_latency_s`)
        self.model = model
        self.pricing = pricing
        self.host = host
        self.port = port
        self.api_key = api_key
        self.hang_s = hang_s
        self.retry_after_s = retry_after_s
        self.retry_after_http_date = retry_after_http_date
        self.stream_chunk_tokens = max(1, stream_chunk_tokens)
        self.report_cost = report_cost
        self.counters: collections.Counter[str] = collections.Counter()
        self.quirks = frozenset(getattr(self.options, "quirks", None) or ())
        self.personality: Personality = get_personality(getattr(self.options, "personality", None))
        self.profile = self.renderer.profile
        self._rng = random.Random(int(getattr(self.options, "seed", 0) or 0))
        faults = canonical_faults(getattr(self.options, "faults", None))
        self._keepalive_rate = float(faults.pop(KEEPALIVE, 0.0))
        order = [k for k in FAULT_KINDS if k in faults] + sorted(k for k in faults if k not in FAULT_KINDS)
        self._faults = [(k, float(faults[k])) for k in order if float(faults[k]) > 0]
        median = float(getattr(self.options, "latency_median_ms", 0) or 0)
        p95 = float(getattr(self.options, "latency_p95_ms", 0) or 0) or median
        self._mu = math.log(median / 1000.0) if median > 0 else None
        self._sigma = (math.log(p95) - math.log(median)) / _Z95 if median > 0 else 0.0
        self.tokens_per_s = float(getattr(self.options, "tokens_per_s", 0) or 0)
        self.logprobs_enabled = bool(getattr(self.options, "logprobs", True)) and self.personality.logprobs
        self.report_cost = self.report_cost and self.personality.cost
        self.spec_acceptance = tuple(float(x) for x in (getattr(self.options, "spec_acceptance", None) or ()))
        self.spec_by_category = {
            str(c): tuple(float(x) for x in rates)
            for c, rates in (getattr(self.options, "spec_acceptance_by_category", None) or {}).items()
        }
        self.spec_dead = bool(getattr(self.options, "spec_dead", False))
        self.spec_loop_rate = float(getattr(self.options, "spec_loop_rate", 0.0) or 0.0)
        self.spec_per_request = bool(getattr(self.options, "spec_per_request", True))
        self.spec_totals: collections.Counter[str] = collections.Counter()  # what /metrics counts
        self._cache: dict[tuple[int, int, bool, int], RenderedOutput] = {}
        self._interventions = {
            k: float(r) for k, r in (getattr(self.options, "interventions", None) or {}).items() if float(r) > 0
        }
        self._stream_cache: dict[tuple[int, int, bool, int], tuple[list[tuple[bytes, int]], int]] = {}
        self._runner: web.AppRunner | None = None
        self._served = 0
        # load-dependent capacity (app/simulator/capacity.py); None keeps the faults-only behaviour
        self.capacity = CapacityGate(self.options, retry_after_s=retry_after_s) if has_capacity(self.options) else None

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, `http://host:port/v1`."""
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        """Bind and serve; after this `port` and `base_url` are real."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat_gated)
        app.router.add_post("/api/v1/chat/completions", self._chat_gated)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/api/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._raw_completion)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock, backlog=1024)
        await site.start()

    async def close(self) -> None:
        """Stop serving (hanging requests are cancelled)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> SimulatorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- helpers --------------------------------------------------------------------------------

    def _draw_fault(self) -> str | None:
        if not self._faults:
            return None
        u = self._rng.random()
        total = 0.0
        for kind, rate in self._faults:
            total += rate
            if u < total:
                return kind
        return None

    def _router_metadata(self, request: web.Request, body: dict, key: str) -> dict | None:
        """OpenRouter's `openrouter_metadata` for this request when asked for (X-OpenRouter-Metadata: enabled), with
        the interventions this sample draws (`intervened`); None otherwise."""
        if not self.personality.router_metadata or request.headers.get("X-OpenRouter-Metadata") != "enabled":
            return None
        seed = int(getattr(self.options, "seed", 0) or 0)
        hit = {k for k, rate in self._interventions.items() if intervened(seed, k, key, rate)}
        if body.get("transforms") == []:  # OpenRouter compresses only where transforms are not turned off
            hit.discard("context_compression")
        meta: dict[str, Any] = {"requested": body.get("model") or self.model, "strategy": "price", "attempt": 1}
        meta["attempts"] = [{"provider": PROVIDER, "status": 200}]
        if "provider_fallback" in hit:
            meta["attempt"] = 2
            meta["attempts"] = [{"provider": "SimFirst", "status": 503}, {"provider": PROVIDER, "status": 200}]
        meta["pipeline"] = [{"stage": k} for k in ("context_compression", "response_healing") if k in hit]
        return meta

    def _latency_s(self) -> float:
        if self._mu is None:
            return 0.0
        return self._rng.lognormvariate(self._mu, self._sigma)

    def _rendered(self, index: int, history_calls: int, stream: bool = False, budget: int = 0) -> RenderedOutput:
        key = (index, history_calls, stream, budget)
        out = self._cache.get(key)
        if out is None:
            p = self.personality
            quirks = self.quirks | (p.stream_quirks if stream else p.plain_quirks)
            if self.profile.tool_format in p.json_formats and not stream:  # streamed arguments: the model's text
                quirks |= {"json_reserialised"}
            ids = self.book.samples[index].output_ids
            if self._loops(index):
                ids = looped(ids)
            if budget:
                tok = self.tokenizer
                ids = budget_cut(
                    ids, tok.special_id(self.profile.think_open), tok.special_id(self.profile.think_close), budget
                )
            out = self.renderer.render(ids, quirks, history_calls)
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = out
        return out

    @property
    def speculative(self) -> bool:
        """Whether this simulator serves as a speculative-decoding server (acceptance options given)."""
        return bool(self.spec_acceptance or self.spec_by_category) and self.personality.name in ("vllm", "sglang")

    def _loops(self, index: int) -> bool:
        """Whether sample `index` is one whose output the target repeats in a cycle (`spec_loop_rate`)."""
        if not self.spec_loop_rate or not self.speculative:
            return False
        seed = int(getattr(self.options, "seed", 0) or 0)
        return intervened(seed, "spec_loop", self.book.samples[index].sample_id, self.spec_loop_rate)

    def _acceptance(self, index: int) -> tuple[float, ...]:
        """The per-position acceptance that sample `index` draws from: its category's, else the default; a dead
        drafter's is zero at every position, a looping output's one (a loop accepts every draft)."""
        rates = self.spec_by_category.get(self.book.samples[index].category or "", self.spec_acceptance)
        rates = rates or next(iter(self.spec_by_category.values()))
        if self.spec_dead:
            return (0.0,) * len(rates)
        if self._loops(index):
            return (1.0,) * len(rates)
        return rates

    def _spec_fields(self, index: int, out: RenderedOutput) -> dict:
        """The answer's speculative-decoding fields: vLLM's `metrics.speculative_decoding`
        (--per-request-spec-decode-metrics detailed) or SGLang's `meta_info.spec_*` (return_meta_info), drawn per
        sample from its acceptance (position k accepted with its chance given k-1 were; the same sample always
        draws the same steps). Every answer counts in `spec_totals` (what /metrics reports, like vLLM's
        Prometheus counters); with `spec_per_request` off the answer carries nothing (a counter-only server)."""
        if not self.speculative:
            return {}
        rates = self._acceptance(index)
        k = len(rates)
        rng = random.Random(hash((int(getattr(self.options, "seed", 0) or 0), index)) & 0xFFFFFFFF)
        left = len(out.output_ids)
        accepted_steps: list[int] = []
        while left > 0:
            n = 0
            while n < k and rng.random() < rates[n]:
                n += 1
            n = min(n, left - 1)  # each step emits its accepted drafts plus one token of the target's own
            accepted_steps.append(n)
            left -= n + 1
        steps = len(accepted_steps)
        accepted = sum(accepted_steps)
        histogram = [0] * (k + 1)
        for n in accepted_steps:
            histogram[n] += 1
        per_pos = [sum(1 for n in accepted_steps if n > j) for j in range(k)]
        self.spec_totals.update(drafts=steps, draft_tokens=steps * k, accepted=accepted)
        for j, c in enumerate(per_pos):
            self.spec_totals[f"pos{j}"] += c
        if not self.spec_per_request:
            return {}
        if self.personality.name == "sglang":
            return {
                "meta_info": {
                    "spec_accept_length": (1 + accepted / steps) if steps else 0.0,
                    "spec_accept_rate": accepted / (steps * k) if steps else 0.0,
                    "spec_verify_ct": steps,
                    "spec_accept_histogram": histogram,
                    "spec_accept_token_num": accepted,
                    "spec_draft_token_num": steps * k,
                }
            }
        return {
            "metrics": {
                "speculative_decoding": {
                    "mean_acceptance_length": (1 + accepted / steps) if steps else 0.0,
                    "draft_acceptance_rate": accepted / (steps * k) if steps else 0.0,
                    "acceptance_histogram": histogram,
                    "num_spec_steps": steps,
                    "num_accepted_draft_tokens": accepted,
                    "num_draft_tokens": steps * k,
                    "num_spec_tokens": k,
                    "per_step_accepted": accepted_steps,
                    "per_step_drafted": [k] * steps,
                }
            }
        }

    def prometheus(self) -> str:
        """vLLM's speculative-decoding counters as /metrics serves them (Prometheus text format)."""
        t = self.spec_totals
        name = "vllm:spec_decode_num"
        lines = []
        for metric, key in (("drafts", "drafts"), ("draft_tokens", "draft_tokens"), ("accepted_tokens", "accepted")):
            lines += [f"# TYPE {name}_{metric}_total counter", f'{name}_{metric}_total{{model_name="{self.model}"}} '
                      f"{float(t[key])}"]  # fmt: skip
        lines.append(f"# TYPE {name}_accepted_tokens_per_pos_total counter")
        k = len(self.spec_acceptance or next(iter(self.spec_by_category.values()), ()))
        for j in range(k):
            labels = f'model_name="{self.model}",position="{j}"'
            lines.append(f"{name}_accepted_tokens_per_pos_total{{{labels}}} {float(t[f'pos{j}'])}")
        return "\n".join(lines) + "\n"

    async def _raw_completion(self, request: web.Request) -> web.Response:
        """vLLM's `/v1/completions` with a text `prompt` (non-streaming): the prompt is encoded as it is, with no chat
        template (its `prompt_token_ids` show it); the answer replays the reference sample the prompt's hash picks."""
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            self.counters["401"] += 1
            return self._error(401)
        try:
            body = json.loads(await request.read())
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            self.counters["400"] += 1
            return self._error(400)
        self._served += 1
        self.counters["ok"] += 1
        index, _ = self.book.pick([{"role": "user", "content": prompt}])
        out = self._rendered(index, 0)
        prompt_ids = self.tokenizer.encode_prompt(prompt)
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.tokenizer.decode(list(out.output_ids)),
            "logprobs": None,
            "finish_reason": self._finish(out),
        }
        if body.get("return_token_ids"):  # vLLM's CompletionResponseChoice: both on the choice
            choice["token_ids"] = list(out.output_ids)
            choice["prompt_token_ids"] = prompt_ids
        answer: dict[str, Any] = {
            "id": f"cmpl-sim-{self._served}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [choice],
            "usage": self._usage(index, out, 0, prompt_ids),
        }
        answer.update(self._spec_fields(index, out))
        return web.Response(body=_json(answer), content_type="application/json")

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.speculative:
            return web.Response(text="# no speculative decoding\n", content_type="text/plain")
        return web.Response(text=self.prometheus(), content_type="text/plain")

    def _usage(self, index: int, out: RenderedOutput, cached: int = 0, prompt_ids: list | None = None) -> dict:
        """The answer's usage; a server that returns the prompt ids counts those (as vLLM and SGLang do), else the
        reference's prompt count."""
        sample = self.book.samples[index]
        completion = len(out.output_ids)
        cached = max(cached, sample.cached_tokens)
        prompt_tokens = len(prompt_ids) if prompt_ids is not None else sample.prompt_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": len(out.reasoning_ids)},
        }
        if self.report_cost:
            usage["cost"] = round(
                cost_of(Usage(prompt_tokens, completion, len(out.reasoning_ids), cached), self.pricing), 10
            )
        return usage

    def _error(self, status: int) -> web.Response:
        error_type, message = _ERRORS.get(
            status, ("server" if status >= 500 else "invalid_request", f"Simulated HTTP {status}")
        )
        headers = {}
        if status in (429, 503):
            if self.retry_after_http_date:
                headers["Retry-After"] = email.utils.formatdate(time.time() + self.retry_after_s, usegmt=True)
            else:
                headers["Retry-After"] = f"{self.retry_after_s:g}"
        body = {"error": {"code": status, "message": message, "metadata": {"error_type": error_type}}}
        return web.Response(status=status, body=_json(body), content_type="application/json", headers=headers)

    @staticmethod
    def _reset(request: web.Request) -> web.Response:
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        return web.Response(status=500)

    # -- personalities ----------------------------------------------------------------------------

    def _personality_refusal(self, body: dict) -> web.Response | None:
        """The error a strict server answers to this body (422 unknown fields, 400 stream-only limits)."""
        p = self.personality
        if p.openai_fields_only:
            unexpected = sorted(set(body) - OPENAI_CHAT_FIELDS)
            if unexpected:
                self.counters["422"] += 1
                return web.Response(
                    status=422,
                    body=_json({"detail": f"Unexpected fields in the request: {set(unexpected)}"}),
                    content_type="application/json",
                )
        if body.get("stream"):
            asked = sorted(k for k in p.stream_rejects if body.get(k))
            if asked:
                self.counters["400"] += 1
                message = (
                    f"{asked[0]} is not supported with streaming. Please set stream=false when using {asked[0]}=true."
                )
                return web.Response(
                    status=400,
                    body=_json(
                        {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
                    ),
                    content_type="application/json",
                )
        return None

    def _wants_ids(self, body: dict) -> bool:
        p = self.personality
        if p.ids == "sglang":
            return bool(body.get("return_token_ids")) and not body.get("stream")
        if p.ids == "vllm" or p.name == "openrouter":  # openrouter: the simulator's own extension
            return bool(body.get("return_token_ids"))
        return False

    def _prompt_ids_for(self, body: dict, messages: list) -> list[int] | None:
        """The prompt ids this server returns for the request (rendered with the profile's template), or None."""
        p = self.personality
        wanted = (p.ids == "vllm" and body.get("return_token_ids")) or (
            p.ids == "sglang" and body.get("return_prompt_token_ids") and not body.get("stream")
        )
        if not wanted:
            return None
        from app.errors import InputError
        from app.tokens.prompt import render_prompt

        try:
            text = render_prompt(self.profile, messages, body.get("tools"))
        except InputError:
            return None
        return self.tokenizer.encode_prompt(text)  # as a server encodes a prompt: its normaliser applied

    @staticmethod
    def _with_delta_ids(parts: list[tuple[bytes, int]], output_ids: tuple[int, ...]):
        """`parts` with `token_ids` on each content chunk, handed out in order by the ids each chunk carries,
        and the ids left for the finish chunk: the deltas concatenate to `output_ids` exactly."""
        out, at = [], 0
        for choices, tokens in parts:
            if tokens:
                items = json.loads(choices)
                items[0]["token_ids"] = list(output_ids[at : at + tokens])
                at += tokens
                choices = _json(items)
            out.append((choices, tokens))
        return out, list(output_ids[at:])

    def _finish(self, out: RenderedOutput) -> str:
        if self.personality.finish_tool_calls and out.tool_calls and out.finish_reason == "stop":
            return "tool_calls"
        return out.finish_reason

    def _with_tool_ids(self, out: RenderedOutput, gen_id: str) -> RenderedOutput:
        from dataclasses import replace

        template = self.personality.tool_id or ""
        calls = tuple(replace(c, id=template.format(gen=gen_id, index=i)) for i, c in enumerate(out.tool_calls))
        return replace(out, tool_calls=calls)

    def _tool_region_not_json(self, out: RenderedOutput) -> bool:
        """A Hermes tool-call region whose body is not JSON (the parser found a marker but no call)."""
        markers = self.profile.tool_markers or {}
        begin = markers.get("call_begin")
        if not begin or self.profile.tool_format != "hermes" or out.tool_calls:
            return False
        return begin in (out.content or "")

    # -- handlers -------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        p = self.pricing
        cached = p.cached_prompt_per_m if p.cached_prompt_per_m is not None else p.prompt_per_m
        entry = {
            "id": self.model,
            "name": f"{self.model} (simulated)",
            "context_length": 262144,
            "pricing": {
                "prompt": format(p.prompt_per_m / 1e6, ".12g"),
                "completion": format(p.completion_per_m / 1e6, ".12g"),
                "input_cache_read": format(cached / 1e6, ".12g"),
                "request": "0",
            },
            "supported_parameters": [
                "max_tokens",
                "temperature",
                "top_p",
                "tools",
                "reasoning",
                "logprobs",
                "top_logprobs",
                "stream",
            ],
        }
        return web.Response(body=_json({"data": [entry]}), content_type="application/json")

    async def _chat_gated(self, request: web.Request) -> web.StreamResponse:
        """`_chat` behind the capacity model: refused with 429 + Retry-After, or queued for a slot."""
        self.in_flight += 1
        try:
            if self.received is not None:
                await self._record(request)
            return await self._admitted(request)
        finally:
            self.in_flight -= 1

    async def _admitted(self, request: web.Request) -> web.StreamResponse:
        if self.capacity is None:
            return await self._chat(request)
        tokens = 0
        if self.capacity.model.charges_tokens:  # charge the sample's prompt + output tokens
            try:
                body = json.loads(await request.read())
                sample = self.book.samples[self.book.pick(body["messages"], requested_sample(body))[0]]
                tokens = sample.prompt_tokens + len(sample.output_ids)
            except (ValueError, KeyError, TypeError):
                tokens = 0  # _chat answers 400
        admission = await self.capacity.admit(tokens)
        if not admission.admitted:
            self.counters[f"429_{admission.reason}"] += 1
            response = self._error(429)
            response.headers.update(retry_after_headers(admission.retry_after_s))
            return response
        try:
            return await self._chat(request)
        finally:
            self.capacity.release()

    async def _record(self, request: web.Request) -> None:
        raw = await request.read()  # (aiohttp keeps the body: the handler reads it again)
        try:
            named = requested_sample(json.loads(raw))
        except (ValueError, AttributeError):
            named = None
        assert self.received is not None  # called only when recording
        self.received.append(ReceivedRequest(time.time(), named, raw, self.in_flight))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            self.counters["401"] += 1
            return self._error(401)
        try:
            body = json.loads(raw)
            messages = body["messages"]
            if not isinstance(messages, list):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            self.counters["400"] += 1
            return self._error(400)
        self._served += 1
        fault = self._draw_fault()
        keepalive = self._keepalive_rate > 0 and self._rng.random() < self._keepalive_rate
        if self.latency_by_sample:
            latency = sample_latency_s(
                int(getattr(self.options, "seed", 0) or 0),
                requested_sample(body) or messages_key(messages),
                float(getattr(self.options, "latency_median_ms", 0) or 0),
                float(getattr(self.options, "latency_p95_ms", 0) or 0),
            )
        else:
            latency = self._latency_s()
        if keepalive:
            self.counters[KEEPALIVE] += 1
        if fault is not None and fault.isdigit():
            self.counters[fault] += 1
            await asyncio.sleep(min(latency, 0.05))
            return self._error(int(fault))
        if fault == "hang":
            self.counters["hang"] += 1
            await asyncio.sleep(self.hang_s)
            return self._error(504)
        if fault == "reset":
            self.counters["reset"] += 1
            return self._reset(request)

        refused = self._personality_refusal(body)
        if refused is not None:
            return refused
        history = sum(len(m.get("tool_calls") or []) for m in messages if isinstance(m, dict))
        index, _ = self.book.pick(messages, requested_sample(body))
        cached = (
            self.prompt_cache.serve(messages, self.book.samples[index].prompt_tokens)
            if self.prompt_cache is not None
            else 0
        )
        budget = body.get("thinking_token_budget") if self.personality.thinking_budget else None
        budget = budget if type(budget) is int and budget > 0 else 0
        out = self._rendered(index, history, bool(body.get("stream")), budget)
        metadata = self._router_metadata(request, body, requested_sample(body) or messages_key(messages))
        status = self.personality.non_json_tool_region
        if status is not None and self._tool_region_not_json(out):
            self.counters[str(status)] += 1
            return self._error(status)
        self.counters[fault or "ok"] += 1
        gen_id = f"gen-sim-{self._served}"
        model = body.get("model") or self.model
        want_lp = bool(body.get("logprobs")) and self.logprobs_enabled
        top = int(body.get("top_logprobs") or 0)
        ids_field = "token_ids" if self._wants_ids(body) else None
        prompt_ids = self._prompt_ids_for(body, messages)
        if self.personality.tool_id is not None and out.tool_calls:
            out = self._with_tool_ids(out, gen_id)
        if body.get("stream"):
            return await self._stream(
                request,
                index,
                history,
                out,
                gen_id,
                model,
                want_lp,
                top,
                ids_field,
                fault,
                keepalive,
                latency,
                prompt_ids,
                cached,
                metadata,
            )
        if latency:
            await asyncio.sleep(latency)
        if self.tokens_per_s > 0:
            await asyncio.sleep(len(out.output_ids) / self.tokens_per_s)
        return self._plain(
            index, out, gen_id, model, want_lp, top, ids_field, fault, keepalive, prompt_ids, cached, metadata
        )

    def _plain(
        self,
        index,
        out: RenderedOutput,
        gen_id,
        model,
        want_lp,
        top,
        ids_field,
        fault,
        keepalive,
        prompt_ids=None,
        cached: int = 0,
        metadata: dict | None = None,
    ):
        p = self.personality
        content = out.content if out.content is not None or p.null_content else ""
        if p.vllm_wire and content is not None and (not content or (out.tool_calls and content.isspace())):
            content = None  # vLLM: no content (or only whitespace before a tool call) is null
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if p.vllm_wire:
            message.update(dict.fromkeys(_VLLM_MESSAGE_NULLS))
        if out.reasoning is not None or p.name == "openrouter" or p.vllm_wire:
            message[p.reasoning_field] = out.reasoning
        if out.reasoning is not None and p.reasoning_details:
            message["reasoning_details"] = [
                {"type": "reasoning.text", "text": out.reasoning, "format": "unknown", "index": 0}
            ]
        if out.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "index": i, "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in enumerate(out.tool_calls)
            ]
            if p.vllm_wire:  # vLLM's message tool calls carry no index
                for call in message["tool_calls"]:
                    del call["index"]
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": self._finish(out),
            "logprobs": None,
            "message": message,
        }
        if p.provider_field:
            choice["native_finish_reason"] = out.finish_reason
        if p.vllm_wire:
            choice.update(dict.fromkeys(_VLLM_CHOICE_NULLS))
        if want_lp and p.vllm_wire:  # every output token's, tags included, under content
            choice["logprobs"] = {"content": self.renderer.logprob_entries(out.output_ids, top)}
        elif want_lp:
            choice["logprobs"] = {
                "content": self.renderer.logprob_entries(out.content_ids, top),
                "reasoning": self.renderer.logprob_entries(out.reasoning_ids, top),
                "refusal": None,
            }
        if ids_field:
            choice[ids_field] = list(out.output_ids)
        if prompt_ids is not None and p.ids == "sglang":
            choice["prompt_token_ids"] = prompt_ids
        if fault == "stream_error":
            choice["finish_reason"] = "error"
            choice["error"] = {
                "code": 502,
                "message": "Upstream provider failed mid-generation (simulated)",
                "metadata": {"error_type": "provider_unavailable"},
            }
        body = {
            "id": gen_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "provider": PROVIDER,
            "choices": [choice],
            "usage": self._usage(index, out, cached, prompt_ids),
        }
        if not p.provider_field:
            del body["provider"]
        if p.vllm_wire:
            body["system_fingerprint"] = VLLM_FINGERPRINT
            body.update(dict.fromkeys(_VLLM_BODY_NULLS))
            if not cached:  # vLLM reports prompt_tokens_details only with --enable-prompt-tokens-details
                body["usage"]["prompt_tokens_details"] = None
        if prompt_ids is not None and p.ids == "vllm":
            body["prompt_token_ids"] = prompt_ids
        if metadata is not None:
            body["openrouter_metadata"] = metadata
        body.update(self._spec_fields(index, out))
        if fault == "done_early":  # a whole body that simply lacks a finish_reason
            choice["finish_reason"] = None
        data = _json(body)
        if fault in ("malformed", "truncate"):
            data = data[: max(1, len(data) // 2)]
        if keepalive:
            data = b"\n\n   \n" + data
        return web.Response(body=data, content_type="application/json", headers={"X-Generation-Id": gen_id})

    def _stream_parts(self, index: int, history: int, out: RenderedOutput, want_lp: bool, top: int):
        """The `choices` JSON of every content-bearing chunk (cached per sample), and where reasoning ends."""
        key = (index, history, want_lp, top)
        cached = self._stream_cache.get(key)
        if cached is not None:
            return cached

        def choices(delta: dict, logprobs: dict | None = None) -> bytes:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None, "native_finish_reason": None}
            if logprobs is not None:
                choice["logprobs"] = logprobs
            return _json([choice])

        p = self.personality
        lean = p.lean_deltas
        parts: list[tuple[bytes, int]] = [
            (choices({"role": "assistant"} if lean else {"role": "assistant", "content": ""}), 0)
        ]
        n = self.stream_chunk_tokens
        if out.reasoning:
            for piece, group in text_pieces(out.reasoning, out.reasoning_ids, self.tokenizer, n):
                delta: dict[str, object] = (
                    {p.reasoning_field: piece}
                    if lean
                    else {"role": "assistant", "content": "", p.reasoning_field: piece}
                )
                if p.reasoning_details:
                    delta["reasoning_details"] = [
                        {"type": "reasoning.text", "text": piece, "format": "unknown", "index": 0}
                    ]
                lp = {"reasoning": self.renderer.logprob_entries(group, top), "content": None} if want_lp else None
                parts.append((choices(delta, lp), len(group)))
        reasoning_end = len(parts)
        if out.content:
            for piece, group in text_pieces(out.content, out.content_ids, self.tokenizer, n):
                lp = {"content": self.renderer.logprob_entries(group, top)} if want_lp else None
                delta = {"content": piece} if lean else {"role": "assistant", "content": piece}
                parts.append((choices(delta, lp), len(group)))
        for i, call in enumerate(out.tool_calls):
            if p.tool_args_at_once:  # transformers serve: one delta per call, on region close
                whole = {
                    "index": i,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                parts.append((choices({"tool_calls": [whole]}), 1))
                continue
            first = {"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            parts.append((choices({"role": "assistant", "content": None, "tool_calls": [first]}), 1))
            args = call.arguments
            step = 16
            for k in range(0, len(args), step):
                delta = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"index": i, "function": {"arguments": args[k : k + step]}}],
                }
                parts.append((choices(delta), 1))
        if len(self._stream_cache) >= CACHE_ENTRIES:
            self._stream_cache.clear()  # bounded memory for big references; refilling is cheap
        self._stream_cache[key] = (parts, reasoning_end)
        return parts, reasoning_end

    async def _stream(
        self,
        request,
        index,
        history,
        out: RenderedOutput,
        gen_id,
        model,
        want_lp,
        top,
        ids_field,
        fault,
        keepalive,
        latency,
        prompt_ids=None,
        cached: int = 0,
        metadata: dict | None = None,
    ) -> web.StreamResponse:
        if latency:
            await asyncio.sleep(latency)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Generation-Id": gen_id}
        )
        await response.prepare(request)
        created = int(time.time())
        p = self.personality
        head = {"id": gen_id, "object": "chat.completion.chunk", "created": created, "model": model}
        if p.provider_field:
            head["provider"] = PROVIDER

        prefix = b"data: " + _json(head)[:-1] + b',"choices":'

        def chunk(delta: dict, finish: str | None = None, extra: dict | None = None) -> bytes:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "finish_reason": finish,
                "native_finish_reason": finish,
            }
            if extra:
                choice.update(extra)
            return prefix + _json([choice]) + b"}\n\n"

        if p.vllm_wire:
            return await self._vllm_stream(
                response, head, out, want_lp, top, ids_field, fault, prompt_ids, index, cached
            )
        parts, reasoning_end = self._stream_parts(index, history, out, want_lp, top)
        # (event bytes, number of tokens it carries: for pacing)
        delta_ids = ids_field is not None and p.ids == "vllm"
        if delta_ids:  # vLLM streams each chunk's own token ids; whatever is left rides on the finish chunk
            parts, left = self._with_delta_ids(parts, out.output_ids)
            if "tool_ids_dropped" in self.quirks and out.tool_calls:
                parts, left = _tool_ids_dropped(parts), []
        events: list[tuple[bytes, int]] = [(prefix + choices + b"}\n\n", tokens) for choices, tokens in parts]
        if keepalive:
            events.insert(reasoning_end, (b": OPENROUTER PROCESSING\n\n", 0))
            events.insert(0, (b": OPENROUTER PROCESSING\n\n", 0))
        if prompt_ids is not None and p.ids == "vllm":  # vLLM: prompt_token_ids on the first chunk only
            first = dict(
                head, prompt_token_ids=prompt_ids, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]
            )
            events[0] = (b"data: " + _json(first) + b"\n\n", 0)
        extra = {ids_field: list(left if delta_ids else out.output_ids)} if ids_field else None
        body_events = len(events)
        if p.usage_on_finish_chunk:
            finish = dict(
                head,
                choices=[{"index": 0, "delta": {}, "finish_reason": self._finish(out)}],
                usage=self._usage(index, out, cached, prompt_ids),
                **self._spec_fields(index, out),
            )
            events.append((b"data: " + _json(finish) + b"\n\n", 0))
        else:
            events.append((chunk({}, finish=self._finish(out), extra=extra), 0))
            usage = dict(head, choices=[], usage=self._usage(index, out, cached, prompt_ids))
            if metadata is not None:  # OpenRouter: on the final chunk
                usage["openrouter_metadata"] = metadata
            usage.update(self._spec_fields(index, out))
            events.append((b"data: " + _json(usage) + b"\n\n", 0))
        if p.done_marker:
            events.append((b"data: [DONE]\n\n", 0))

        if fault in ("truncate", "stream_error", "malformed", "done_early"):
            cut = max(1, body_events // 2)
            events = events[:cut]
            if fault == "done_early":
                events.append((b"data: [DONE]\n\n", 0))
            if fault == "stream_error" and p.error_chunk == "text":
                # transformers serve: f'data: {{"error": "{msg}"}}' - not JSON when the message holds a quote
                events.append(
                    (b'data: {"error": "generation failed: \'CUDA\' said "out of memory" (simulated)"}\n\n', 0)
                )
            elif fault == "stream_error":
                error = dict(
                    head,
                    error={
                        "code": 502,
                        "message": "Upstream provider failed mid-stream (simulated)",
                        "metadata": {"error_type": "provider_unavailable"},
                    },
                    choices=[{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
                )
                events.append((b"data: " + _json(error) + b"\n\n", 0))
            elif fault == "malformed":
                events.append((b'data: {"id": "' + gen_id.encode() + b'", "choices": [{"delta": \n\n', 0))
                events.append((b"data: [DONE]\n\n", 0))

        return await self._send(response, events)

    async def _send(self, response: web.StreamResponse, events: list[tuple[bytes, int]]) -> web.StreamResponse:
        """Write the events (paced by the tokens each carries when tokens_per_s is set) and end the stream."""
        if self.tokens_per_s > 0:
            for data, tokens in events:
                if tokens:
                    await asyncio.sleep(tokens / self.tokens_per_s)
                await response.write(data)
        else:
            await response.write(b"".join(data for data, _ in events))
        await response.write_eof()
        return response

    def _vllm_regions(self, out: RenderedOutput) -> list[tuple[str, tuple[int, ...]]]:
        """vLLM streams a chunk per token group, in output order: (kind, ids) runs of the output, kind one of
        "tag" (a tag vLLM prints as nothing: an empty delta), "reasoning", "content", "tools", "end"."""
        ids = list(out.output_ids)
        end = [ids.pop()] if ids and ids[-1] in self.renderer.profile_stops else []
        runs: list[tuple[str, tuple[int, ...]]] = []
        think, close = self.renderer.ids.get("think"), self.renderer.ids.get("think_end")
        if ids and ids[0] == think:
            runs.append(("tag", (ids.pop(0),)))
        if close in ids:
            k = ids.index(close)
            runs += [("reasoning", tuple(ids[:k])), ("tag", (close,))]
            ids = ids[k + 1 :]
        call = self.tokenizer.special_id(self.profile.tool_markers.get("call_begin", "")) if out.tool_calls else None
        k = ids.index(call) if call is not None and call in ids else len(ids)
        body, tools = tuple(ids[:k]), tuple(ids[k:])
        if out.reasoning and not any(kind == "reasoning" for kind, _ in runs):
            runs.append(("reasoning", body))  # an answer with no think block, returned as reasoning
        else:
            runs.append(("content", body))
        runs.append(("tools", tools))
        runs.append(("end", tuple(end)))
        return runs

    async def _vllm_stream(
        self,
        response: web.StreamResponse,
        head: dict,
        out: RenderedOutput,
        want_lp: bool,
        top: int,
        ids_field: str | None,
        fault: str | None,
        prompt_ids: list[int] | None,
        index: int,
        cached: int,
    ) -> web.StreamResponse:
        """A stream as vLLM 0.32 writes it (seen in tests/realserver): a first chunk with the role (and the prompt
        ids), then a chunk per token group with its own `token_ids` and `logprobs.content`, lean deltas; a token
        it prints as nothing (a think tag, the tool-call markup around a call's name and arguments) is a chunk
        with an empty delta, sent only when ids or logprobs were asked; a tool call is a name chunk then argument
        chunks; the end token on a finish chunk of its own (an answer cut by max_tokens ends on the chunk of its
        last token); a usage chunk with `choices: []`; `[DONE]`."""
        n = self.stream_chunk_tokens
        dropped = "tool_ids_dropped" in self.quirks  # vLLM #27482: the tool parser's chunks lose their ids
        quiet = bool(ids_field) or want_lp  # whether a token that prints nothing still gets its chunk
        steps: list[tuple[dict, tuple[int, ...]]] = []  # (delta, its ids) in order

        def silent(ids: tuple[int, ...]) -> None:  # tokens it prints as nothing
            if quiet and ids:
                steps.extend(({}, ids[k : k + n]) for k in range(0, len(ids), n))

        texts = {"reasoning": out.reasoning or "", "content": out.content or ""}
        end: tuple[int, ...] = ()
        for kind, ids in self._vllm_regions(out):
            if kind == "tag":
                silent(ids)
            elif kind in texts:
                steps.extend(
                    ({kind: piece}, group) for piece, group in text_pieces(texts[kind], ids, self.tokenizer, n)
                )
            elif kind == "tools":
                steps.extend(self._vllm_tool_steps(out, ids, quiet and not dropped, dropped))
            else:
                end = ids
        if end or not steps:  # the end token on a finish chunk of its own
            steps.append(({}, () if dropped and out.tool_calls else end))

        def event(delta: dict, ids: tuple[int, ...], finish: str | None = None) -> tuple[bytes, int]:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": {"content": self.renderer.logprob_entries(ids, top)} if want_lp and ids else None,
                "finish_reason": finish,
            }
            if finish is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = list(ids) if ids_field else None
            return b"data: " + _json(dict(head, choices=[choice])) + b"\n\n", len(ids)

        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        events = [
            (b"data: " + _json(dict(head, choices=[first], prompt_token_ids=prompt_ids, prompt_text=None)) + b"\n\n", 0)
        ]
        events += [event(delta, ids) for delta, ids in steps[:-1]]
        events.append(event(*steps[-1], finish=self._finish(out)))
        usage = self._usage(index, out, cached, prompt_ids)
        if not cached:
            usage.pop("prompt_tokens_details", None)
        tail = dict(head, choices=[], system_fingerprint=VLLM_FINGERPRINT, usage=usage)
        tail.update(self._spec_fields(index, out))
        events.append((b"data: " + _json(tail) + b"\n\n", 0))
        events.append((b"data: [DONE]\n\n", 0))
        if fault in ("truncate", "stream_error", "malformed"):
            events = events[: max(1, (len(events) - 2) // 2)]
            if fault == "malformed":
                events.append((b'data: {"id": "' + head["id"].encode() + b'", "choices": [{"delta": \n\n', 0))
        return await self._send(response, events)

    @staticmethod
    def _vllm_tool_steps(
        out: RenderedOutput, ids: tuple[int, ...], quiet: bool, dropped: bool
    ) -> list[tuple[dict, tuple[int, ...]]]:
        """The deltas of a streamed tool section, each with its share of the section's ids: per call, the markup
        before its name, the name, the markup before its arguments, the arguments in slices; then the markup after
        the last call. Markup prints nothing: an empty delta, sent only when `quiet` (ids or logprobs asked and
        kept). `dropped` (vLLM #27482): the tool parser's chunks lose their ids."""
        steps: list[tuple[dict, tuple[int, ...]]] = []
        rest = list(ids)

        def take(k: int | None = 1) -> tuple[int, ...]:
            got = tuple(rest[:k] if k is not None else rest)
            del rest[: len(got)]
            return got

        def markup(k: int | None = 1) -> None:
            got = take(k)
            if quiet and got:
                steps.append(({}, got))

        for i, call in enumerate(out.tool_calls):
            markup()
            got = take()
            steps.append(
                (
                    {
                        "content": None,
                        "tool_calls": [
                            {"id": call.id, "type": "function", "index": i, "function": {"name": call.name}}
                        ],
                    },
                    () if dropped else got,
                )
            )
            markup()
            for k in range(0, max(len(call.arguments), 1), 16):
                got = take()
                steps.append(
                    (
                        {
                            "content": None,
                            "tool_calls": [{"index": i, "function": {"arguments": call.arguments[k : k + 16]}}],
                        },
                        () if dropped else got,
                    )
                )
        markup(None)
        return steps
