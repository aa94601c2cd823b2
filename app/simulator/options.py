"""What the simulator can be told: fault rates, server-side text quirks, latency and pacing.

`SimulatorOptions` has the same field names as the config's `SimulatorOptions` (docs/contracts.md), so
the simulator accepts either; it reads them with getattr and never imports app.config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from app.errors import InputError

# request-level faults; each request draws at most one (in this order of the cumulative rates)
FAULT_KINDS = (
    "429",  # rate limited, with Retry-After
    "500",
    "502",
    "503",
    "402",  # out of credits (run-stopping)
    "401",
    "403",
    "400",
    "hang",  # no answer until the client gives up (past its timeout)
    "reset",  # connection reset before any response
    "malformed",  # 200 with a body (or a stream chunk) that is not JSON
    "truncate",  # stream (or body) that ends early, without finish_reason or [DONE]
    "done_early",  # a proxy's cut: half the stream's chunks, then `[DONE]` with no finish_reason (or a body without)
    "stream_error",  # OpenRouter mid-stream error chunk under HTTP 200 (finish_reason "error")
)
# readable names accepted for the status faults
FAULT_ALIASES = {
    "rate_limit": "429",
    "server_error": "500",
    "bad_gateway": "502",
    "overloaded": "503",
    "credits": "402",
    "auth": "401",
    "forbidden": "403",
    "bad_request": "400",
}
# what an OpenRouter personality reports doing to a request in `openrouter_metadata` (asked for with the
# X-OpenRouter-Metadata header), drawn per sample at these rates: the prompt's middle compressed (only where the
# request did not send `transforms: []`, as OpenRouter), a fallback to another provider, the answer's JSON healed
INTERVENTION_KINDS = ("context_compression", "provider_fallback", "response_healing")

# not a failure: OpenRouter keep-alive comments (stream) / leading whitespace (non-streaming body)
KEEPALIVE = "keepalive"

QUIRKS = (
    "strip_whitespace",  # older SGLang: reasoning.strip(), content.strip()
    "think_spaces",  # vLLM slow-tokenizer detokenizer: ' ' around added tokens
    "no_content",  # vLLM KimiK2ReasoningParser deletes "(no content)"; blank content -> null
    "tool_whitespace",  # kimi_k2 tool parser regex \s*: whitespace around ids and arguments lost
    "json_reserialised",  # arguments -> json.dumps(json.loads(args), ensure_ascii=False)
    "tool_ids_reindexed",  # ids re-made as functions.{name}:{history + i}
    "replacement_char",  # incremental detokenizer: partial UTF-8 bytes of a token -> U+FFFD
    "json_dumps",  # arguments -> json.dumps(json.loads(args)) with ASCII escapes (transformers serve)
    "empty_reasoning_none",  # empty reasoning -> no reasoning field (transformers serve, non-streaming)
    "raw_regions",  # the template's whitespace around reasoning/content kept in the fields (transformers serve stream)
    "tool_ids_dropped",  # vLLM #27482: a stream's tool-call chunks (and what follows) carry no token_ids
    "reasoning_first",  # vLLM's qwen3 parser: an output with no think-close tag is all reasoning
    "blank_content_dropped",  # transformers serve streaming: no whitespace-only content before a tool call
    "tool_separator_kept",  # vLLM's hermes parser: content keeps the template's "\n" before the first tool call
)


@dataclass(frozen=True, slots=True)
class SimulatorOptions:
    """Simulator behaviour (mirror of the config's SimulatorOptions).

    latency: lognormal with this median and p95 (ms; 0 = no added latency); tokens_per_s paces
    generation (0 = unpaced, for benchmarks); faults: rate per kind in FAULT_KINDS plus "keepalive";
    interventions: rate per sample of each INTERVENTION_KINDS (OpenRouter personality; app.simulator.server
    `intervened`); quirks: names from QUIRKS; logprobs: whether logprobs are returned when asked; concurrency_cap,
    cap_changes, requests_per_min, tokens_per_min, batch_slots: capacity (app/simulator/capacity.py);
    extra_references: more reference files replayed beside `reference`; prompt_cache: cached_tokens reported for
    the longest earlier request whose messages begin this one's (app/simulator/server.py, `PromptCache`).
    """

    reference: Path | None = None
    extra_references: list[Path] = field(default_factory=list)  # replayed too (per-turn conversation references)
    prompt_cache: bool = False  # report cached_tokens for the prefix earlier requests share with this one
    latency_median_ms: float = 0.0
    latency_p95_ms: float = 0.0
    tokens_per_s: float = 0.0
    faults: dict[str, float] = field(default_factory=dict)
    interventions: dict[str, float] = field(default_factory=dict)  # kind of INTERVENTION_KINDS -> rate per sample
    quirks: list[str] = field(default_factory=list)
    logprobs: bool = True
    seed: int = 0
    personality: str = "openrouter"  # app.simulator.personalities: which real server to behave like
    # load-dependent capacity (app/simulator/capacity.py); all 0/empty = faults only, as before
    concurrency_cap: int = 0
    cap_changes: list[tuple[float, int]] = field(default_factory=list)
    requests_per_min: float = 0.0
    tokens_per_min: float = 0.0
    batch_slots: int = 0
    # speculative decoding (vllm/sglang personalities; app.simulator.server `SimulatorServer._spec_fields`)
    spec_acceptance: list[float] = field(default_factory=list)
    spec_acceptance_by_category: dict[str, list[float]] = field(default_factory=dict)
    spec_dead: bool = False
    spec_loop_rate: float = 0.0
    spec_per_request: bool = True


def canonical_faults(faults: dict[str, float] | None) -> dict[str, float]:
    """Fault rates keyed by canonical kind (aliases such as "rate_limit" -> "429"; rates of one kind add)."""
    out: dict[str, float] = {}
    for kind, rate in (faults or {}).items():
        kind = FAULT_ALIASES.get(kind, kind)
        out[kind] = out.get(kind, 0.0) + float(rate)
    return out


def check_options(options: object) -> None:
    """Raise InputError naming the bad fault kind, rate, quirk or capacity option."""
    from app.simulator.capacity import check_capacity

    check_capacity(options)
    faults = canonical_faults(getattr(options, "faults", None))
    for kind, rate in faults.items():
        if kind not in FAULT_KINDS and kind != KEEPALIVE and not (kind.isdigit() and len(kind) == 3):
            raise InputError(
                f"simulator faults: unknown fault kind {kind!r}; use one of {', '.join(FAULT_KINDS + (KEEPALIVE,))} "
                f"(or {', '.join(FAULT_ALIASES)})"
            )
        if not 0.0 <= float(rate) <= 1.0:
            raise InputError(f"simulator faults: rate for {kind!r} is {rate}; it must be between 0 and 1")
    total = sum(float(r) for k, r in faults.items() if k != KEEPALIVE)
    if total > 1.0 + 1e-9:
        raise InputError(f"simulator faults: the failure rates add up to {total:.3f}; they must add up to at most 1")
    for kind, rate in (getattr(options, "interventions", None) or {}).items():
        if kind not in INTERVENTION_KINDS:
            raise InputError(
                f"simulator interventions: unknown kind {kind!r}; use any of {', '.join(INTERVENTION_KINDS)}"
            )
        if not 0.0 <= float(rate) <= 1.0:
            raise InputError(f"simulator interventions: rate for {kind!r} is {rate}; it must be between 0 and 1")
    for quirk in getattr(options, "quirks", None) or []:
        if quirk not in QUIRKS:
            raise InputError(f"simulator quirks: unknown quirk {quirk!r}; use any of {', '.join(QUIRKS)}")
    from app.simulator.personalities import PERSONALITIES

    personality = getattr(options, "personality", None) or "openrouter"
    if personality not in PERSONALITIES:
        raise InputError(f"simulator personality: unknown {personality!r}; use one of {', '.join(PERSONALITIES)}")
    median = float(getattr(options, "latency_median_ms", 0) or 0)
    p95 = float(getattr(options, "latency_p95_ms", 0) or 0)
    if median < 0 or p95 < 0 or (median > 0 and p95 and p95 < median):
        raise InputError(f"simulator latency: median {median} ms and p95 {p95} ms; both must be >= 0 and p95 >= median")


def parse_faults(text: str) -> dict[str, float]:
    """'429=0.05,500=0.02' -> {'429': 0.05, '500': 0.02} (InputError naming the bad item)."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, sep, rate = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[kind.strip()] = float(rate)
        except ValueError:
            raise InputError(f"--faults: {item!r} should look like KIND=RATE, e.g. 429=0.05") from None
    return out


def parse_quirks(text: str) -> list[str]:
    """'strip_whitespace,think_spaces' -> the list, names checked later by check_options."""
    return [q.strip() for q in text.split(",") if q.strip()]
