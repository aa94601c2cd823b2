"""Run configuration: one TOML file describes a run; validated on load. The one place defaults live.

`load_config(path)` returns a frozen `RunConfig` or raises `InputError` whose lines read
`demo.toml: endpoints[0].base_url: must start with http:// or https://` (file, key path, problem).
Relative paths in the file are resolved against the file's directory. Secrets are never read into the
config: an endpoint names the environment variable that holds its key (`api_key_env`).
"""

from __future__ import annotations

import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticUndefined

from app.errors import InputError

DATASET_FORMATS = ("openai-messages", "sharegpt", "specforge-conversations")
DatasetFormat = Literal["openai-messages", "sharegpt", "specforge-conversations", "auto"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# keys inside `extra` tables whose values are masked by RunConfig.redacted()
_SECRET_KEY = re.compile(r"(^|_)(api_?key|key|secret|password|token|authorization|auth)$", re.IGNORECASE)
# query parameters of a base_url that carry a credential (`?api-key=...`, `?access_token=...`, `?sig=...`)
_SECRET_PARAM = re.compile(
    r"(^|[-_.])(api[-_]?key|apikey|key|token|access[-_]?token|auth|authorization|secret|"
    r"password|passwd|pwd|sig|signature|credential|credentials|session)$",
    re.IGNORECASE,
)


def url_secret_problem(url: str) -> str | None:
    """Why `url` must not be stored or printed (credentials in it: `user:key@host`, or a query parameter whose name
    says it holds a key), in words that never include the secret; None when it carries none."""
    try:
        parts = urlsplit(url)
        userinfo = parts.username is not None or parts.password is not None
    except ValueError:
        return None  # not a URL at all: the URL check says so
    if userinfo or "@" in parts.netloc:
        return (
            "carries credentials before the host (user:key@host); remove them from the URL and put the key in "
            "an environment variable named by api_key_env"
        )
    names = sorted({name for name, _ in parse_qsl(parts.query, keep_blank_values=True) if _SECRET_PARAM.search(name)})
    if names:
        return (
            f"carries a credential in its query ({', '.join(repr(n) for n in names)}); remove it from the URL and "
            "put the key in an environment variable named by api_key_env (it is sent as a bearer token)"
        )
    return None


# a name becomes a file name, a log label, a Slurm job name and a line of a generated script: no control
# characters (newline, tab, escape, DEL, the Unicode line separators) and no path separators
_BAD_NAME_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029/\\]")


def name_problem(value: str) -> str | None:
    """Why `value` cannot be a run, dataset, endpoint or job name (control character, path separator), or None."""
    m = _BAD_NAME_CHARS.search(value)
    if m is None:
        return None
    ch = m.group(0)
    kind = "a path separator" if ch in "/\\" else "a control character"
    return f"{value!r} contains {kind} ({ch!r} at position {m.start()}); use letters, digits, '-', '_', '.' or spaces"


def check_name(value: str, what: str = "name") -> str:
    """Return `value` if it is usable as a name; InputError naming `what` (e.g. "--run") otherwise."""
    problem = name_problem(value)
    if problem is not None:
        raise InputError(f"{what}: {problem}")
    return value


def _valid_name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Name = Annotated[str, AfterValidator(_valid_name)]


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    """Resolve a relative path against the config file's directory (the `base_dir` validation context)."""
    value = value.expanduser()
    base = (info.context or {}).get("base_dir") if info.context else None
    if base is not None and not value.is_absolute():
        value = Path(base) / value
    return value


ConfigPath = Annotated[Path, AfterValidator(_resolve_path)]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


# keys renamed in a section: old name -> new name. The old name is still read (a config written before the
# rename, or a run's stored config), `config check` calls it deprecated, and both at once is an error.
RENAMED_KEYS: dict[str, dict[str, str]] = {
    "run": {"rebuild_workers": "reconstruct_workers"},  # old name kept (issue 30: one word per act)
}


def _renamed(section: str, data: Any) -> tuple[Any, tuple[str, ...]]:
    """`data` with the section's old key names moved to their new names, and the old names it used."""
    if not isinstance(data, dict):
        return data, ()
    used = tuple(old for old in RENAMED_KEYS[section] if old in data)
    if not used:
        return data, ()
    data = dict(data)
    for old in used:
        new = RENAMED_KEYS[section][old]
        if new in data:
            raise ValueError(
                f"{old} and {new} are both set; they are one setting ({old} is its old name): keep only {new}"
            )
        data[new] = data.pop(old)
    return data, used


class RunSection(_Section):
    """[run]: what the run is called and where it writes."""

    _old_names: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _accept_old_names(cls, data: Any, handler: Any) -> RunSection:
        data, used = _renamed("run", data)
        section = handler(data)
        section._old_names = used
        return section

    def deprecated_notes(self) -> list[str]:
        """A sentence per old key name this section was written with (still accepted, deprecated)."""
        return [
            f"[run] {old} is deprecated: it is the old name of {RENAMED_KEYS['run'][old]} (still accepted; rename it)"
            for old in self._old_names
        ]

    name: Name = Field(
        min_length=1,
        description="Run name; a database can hold several runs (select one with --run). "
        "No control characters or path separators.",
    )
    database: ConfigPath = Field(Path("eaglewatch.db"), description="SQLite run store (created if missing).")
    output_dir: ConfigPath = Field(Path("out"), description="Where exports and job outputs go.")
    keep_raw: bool = Field(
        False, description="Store each response's raw body (streamed: every chunk) in responses.raw."
    )
    keep_raw_max_bytes: int = Field(
        1_000_000, gt=0, description="A raw body larger than this is stored as a note of its size."
    )
    reconstruct_workers: Literal["auto"] | Annotated[int, Field(ge=0)] = Field(
        "auto",
        description="Where token ids are reconstructed: 0 = threads in the engine's process; N = N worker processes "
        "(off the event loop's core and GIL); auto = processes (one per spare core, at most 4) when the machine has "
        "2 or more cores, else threads. A worker that dies falls back to threads for the rest of the run. "
        "Its old name rebuild_workers is still accepted (deprecated).",  # old name kept
    )


class Dataset(_Section):
    """[[data.datasets]]: one prompt file."""

    path: ConfigPath = Field(
        description="Prompt file, streamed, never loaded whole: JSON lines (`.jsonl`, `.jsonl.gz`, "
        "`.jsonl.zst`), a JSON array (`.json`), Parquet (`.parquet`), Arrow (`.arrow`) or a "
        "`datasets` save_to_disk folder; the container is told by the name."
    )
    format: DatasetFormat = Field(
        "openai-messages",
        description='Row format; "auto" tells each row\'s from its '
        "columns (messages; conversations from/value or role/content; prompt/response; "
        'instruction/input/output). With "auto" or none set, `config check`, `ingest` and `run` say the container '
        "and the formats they read the file as.",
    )
    id_field: str = Field("id", min_length=1, description="Field holding the sample id (a content hash when absent).")
    limit: int | None = Field(
        None, gt=0, description="Ingest at most this many samples from the file (after `sample_fraction`)."
    )
    sample_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Ingest this share of the rows, chosen by a seeded hash of each row's position "
        "(the same rows on every ingest, so resuming and re-ingesting keep the choice).",
    )
    sample_seed: int = Field(0, description="Seed of `sample_fraction`'s choice.")
    weight: float | None = Field(
        None,
        gt=0,
        description="This dataset's share of `data.total` (weights need not sum to 1): it gets "
        "round(total * weight / sum of weights) rows, its first rows (of those `sample_fraction` keeps); with "
        "weights the mix is declared, e.g. 0.4 code, 0.3 chat, 0.3 tool use. Not with `limit`.",
    )
    columns: dict[Literal["messages", "conversations", "id", "category", "tools"], str] = Field(
        default_factory=dict,
        description='Columns under other names, e.g. {messages = "chat", category = '
        "\"topic\"}: `category` names the column each sample's category is read from (default: the dataset's name); "
        "`id` overrides `id_field`.",
    )
    name: Name = Field(
        "",
        description="Dataset name recorded with each sample (default: the file's stem); "
        "no control characters or path separators.",
    )
    regenerate: Literal["last", "all"] = Field(
        "last",
        description='"last": one sample per line, the conversation without its trailing assistant turn; '
        '"all": every assistant turn regenerated in order, each request carrying the model\'s own earlier answers '
        "(sample ids `<id>#<turn>`).",
    )
    on_tool_divergence: Literal["stop", "replay"] = Field(
        "stop",
        description='With regenerate = "all": when the model\'s tool calls differ from the recorded ones, '
        'end the conversation there ("stop") or go on with the recorded results, the later turns marked '
        'off-policy ("replay").',
    )

    _share: int | None = PrivateAttr(None)

    @property
    def row_limit(self) -> int | None:
        """The rows to ingest at most: `limit`, or this dataset's weighted share of data.total."""
        return self._share if self._share is not None else self.limit

    @model_validator(mode="after")
    def _default_name(self) -> Dataset:
        if not self.name:
            problem = name_problem(self.path.stem)
            if problem is not None:
                raise ValueError(f"the file name stem {problem}; set `name` for this dataset")
            object.__setattr__(self, "name", self.path.stem)
        return self


class DataSection(_Section):
    """[data]: prompt datasets and the optional ground-truth reference."""

    datasets: list[Dataset] = Field(min_length=1, description="Prompt files, ingested in order.")
    total: int | None = Field(
        None,
        gt=0,
        description="Rows ingested in all, shared among the datasets by their `weight` (every dataset then needs one).",
    )
    reference: ConfigPath | None = Field(
        None, description="SGLang-style JSONL with `output_ids` per sample id: the ground truth to validate against."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> DataSection:
        seen: set[str] = set()
        for ds in self.datasets:
            if ds.name in seen:
                raise ValueError(f"two datasets are named {ds.name!r}; give each a distinct `name`")
            seen.add(ds.name)
        return self

    @model_validator(mode="after")
    def _weighted_limits(self) -> DataSection:
        weighted = [ds for ds in self.datasets if ds.weight is not None]
        if not weighted and self.total is None:
            return self
        if self.total is None:
            raise ValueError("datasets have a `weight` but data.total is not set; set the rows to share among them")
        if len(weighted) != len(self.datasets):
            missing = ", ".join(repr(ds.name) for ds in self.datasets if ds.weight is None)
            raise ValueError(
                f"data.total shares rows by weight, but dataset(s) {missing} have none; give each a weight"
            )
        both = [ds.name for ds in weighted if ds.limit is not None]
        if both:
            raise ValueError(f"dataset {both[0]!r} has both `limit` and `weight`; the weight sets its limit, keep one")
        for ds, n in zip(
            self.datasets, weighted_shares(self.total, [ds.weight or 0.0 for ds in self.datasets]), strict=True
        ):
            ds._share = max(n, 1)
        return self


def weighted_shares(total: int, weights: list[float]) -> list[int]:
    """`total` split in proportion to `weights`, rounded so the parts sum to `total` (largest remainders)."""
    exact = [total * w / sum(weights) for w in weights]
    parts = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: exact[i] - parts[i], reverse=True)[: total - sum(parts)]:
        parts[i] += 1
    return parts


class ModelSection(_Section):
    """[model]: the model as the provider knows it, and how to reconstruct its token ids."""

    name: str = Field(min_length=1, description="Model name sent in requests (e.g. moonshotai/kimi-k2.5).")
    tokenizer: ConfigPath = Field(description="Tokenizer directory (tokenizer.json or tiktoken.model + config).")
    profile: str = Field("kimi-k2.5", min_length=1, description="Chat-template profile used for reconstruction.")


class SimulatorOptions(_Section):
    """[endpoints.simulator]: the built-in provider simulator instead of a real base_url."""

    reference: ConfigPath | None = Field(None, description="Reference JSONL to replay (default: data.reference).")
    extra_references: list[ConfigPath] = Field(
        default_factory=list,
        description="More reference JSONL files replayed too (e.g. the per-turn references "
        '`<conversation id>#<turn>` of a regenerate = "all" dataset).',
    )
    prompt_cache: bool = Field(
        False,
        description="Report as `cached_tokens` the prompt tokens of the longest "
        "earlier request whose messages begin this one's, byte for byte (a provider's prompt "
        "cache: a conversation's later turns hit it).",
    )
    latency_median_ms: float = Field(300.0, ge=0, description="Median time to the first byte.")
    latency_p95_ms: float = Field(1200.0, ge=0, description="95th percentile time to the first byte.")
    tokens_per_s: float = Field(0.0, ge=0, description="Streaming pace per request; 0 = unpaced.")
    faults: dict[str, float] = Field(
        default_factory=dict,
        description="Fault kind -> rate in 0..1 (e.g. rate_limit = 0.02); an unknown kind is "
        "refused at load, naming the kinds the simulator knows.",
    )
    interventions: dict[str, float] = Field(
        default_factory=dict,
        description="OpenRouter personality: per-sample rate of each intervention its metadata reports "
        "(context_compression — only where the request allows prompt transforms —, provider_fallback, "
        "response_healing).",
    )
    quirks: list[str] = Field(default_factory=list, description="Server-side text steps to imitate.")
    logprobs: bool = Field(True, description="Return per-token logprobs when asked.")
    seed: int = Field(0, description="Random seed: the same seed gives the same faults and latencies.")
    personality: Literal["openrouter", "sglang", "vllm", "transformers-serve"] = Field(
        "openrouter", description="Which real server to answer as (field names, ids, text steps, errors)."
    )
    # load-dependent capacity (app/simulator/capacity.py); 0 / empty = none
    concurrency_cap: int = Field(0, ge=0, description="Most requests at once; more get 429 + Retry-After (0 = no cap).")
    cap_changes: list[tuple[float, int]] = Field(
        default_factory=list,
        description="[[seconds, cap], ...]: the cap from that time after start (e.g. [[30.0, 16]]).",
    )
    requests_per_min: float = Field(0.0, ge=0, description="Requests/min quota; 429 when exceeded (0 = none).")
    tokens_per_min: float = Field(
        0.0, ge=0, description="Tokens/min quota (prompt + output); 429 when exceeded (0 = none)."
    )
    batch_slots: int = Field(
        0, ge=0, description="Queueing server: requests run at once, the rest wait (never 429; 0 = off)."
    )
    spec_acceptance: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=list,
        description="Speculative decoding (vllm personality): the chance draft position k is accepted given k-1 "
        "were; one entry per draft token. Each answer then carries `metrics.speculative_decoding` (empty: none).",
    )
    spec_acceptance_by_category: dict[str, list[Annotated[float, Field(ge=0, le=1)]]] = Field(
        default_factory=dict,
        description="Per-position acceptance by prompt category (the reference row's `category`); a category not "
        "named here uses spec_acceptance.",
    )
    spec_dead: bool = Field(
        False,
        description="A dead drafter: every draft is rejected (acceptance length exactly 1.0), as a broken deployment.",
    )
    spec_loop_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of samples whose output is caught in a repeated 4-token cycle to the output's length, every "
        "draft of them accepted (what a repetition loop does to acceptance).",
    )
    spec_per_request: bool = Field(
        True,
        description="Answers carry per-request figures (vLLM metrics.speculative_decoding, SGLang meta_info); off: "
        "only /metrics counts (vLLM without --per-request-spec-decode-metrics).",
    )

    @field_validator("faults")
    @classmethod
    def _rates(cls, value: dict[str, float]) -> dict[str, float]:
        for kind, rate in value.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"rate of fault {kind!r} must be between 0 and 1, got {rate}")
        return value

    @model_validator(mode="after")
    def _simulator_check(self) -> SimulatorOptions:
        # the simulator's own check (fault kinds, rates, their sum, quirks), run at load so `config check` and
        # `run` refuse an unknown kind before anything starts
        from app.simulator.options import check_options

        try:
            check_options(self)
        except InputError as exc:
            raise ValueError(
                str(exc).replace("simulator faults: ", "faults: ").replace("simulator quirks: ", "quirks: ")
            ) from None
        return self

    @model_validator(mode="after")
    def _p95(self) -> SimulatorOptions:
        if self.latency_p95_ms < self.latency_median_ms:
            raise ValueError(
                f"latency_p95_ms ({self.latency_p95_ms}) must be at least latency_median_ms ({self.latency_median_ms})"
            )
        return self


class Endpoint(_Section):
    """[[endpoints]]: an OpenAI-compatible API (base_url) or the built-in simulator; requests are spread by weight."""

    name: Name = Field(
        "",
        description="Label in logs and the TUI (default: the URL's host, or 'simulator'); "
        "no control characters or path separators.",
    )
    base_url: str | None = Field(None, description="OpenAI-compatible base URL, e.g. https://openrouter.ai/api/v1.")
    simulator: SimulatorOptions | None = Field(
        None, description="Use the built-in simulator (set instead of base_url)."
    )
    api_key_env: str | None = Field(
        None, description="Name of the environment variable holding the API key (never the key)."
    )
    server: Literal["openrouter", "sglang", "vllm", "transformers-serve", "openai"] | None = Field(
        None, description="The server behind base_url: vllm/sglang are asked for output and prompt token ids."
    )
    weight: float = Field(1.0, gt=0, description="Share of requests relative to the other endpoints.")
    max_concurrency: int = Field(64, gt=0, description="Most requests in flight to this endpoint.")
    timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Deadline of one whole attempt: connecting, waiting for the "
        "answer and reading every byte of it (a long answer needs max_tokens over the slowest "
        "tokens/s you accept).",
    )
    stall_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Longest silence between two reads of a streamed answer "
        "(at most timeout_s); a stream that stalls longer is retried.",
    )
    max_response_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="Largest response body read; a longer one is a malformed response (retried).",
    )
    probe_fraction: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Share of requests that ask for true ids (logprobs on OpenRouter) once the "
        "endpoint (and each upstream provider behind it) has limits.min_verified_samples verified samples; before "
        "that every request does. Default 1 where every answer carries ids (vllm/sglang), 0.05 where logprobs must be "
        "asked (openrouter/openai, the simulator), 0 for a server with no ground truth or an unknown one; 0 turns "
        "probes off.",
    )
    trusted: bool = Field(
        False,
        description="A server you run that returns ids (vllm/sglang) for the same model: probes to the other "
        "endpoints are sent greedily (temperature 0) and also to this one, whose ids teach and measure their text "
        "steps (a trusted twin).",
    )
    allow_prompt_transforms: bool = Field(
        False,
        description="OpenRouter only: let OpenRouter transform the prompt (its context compression drops the "
        "middle of a long prompt, on by default for models with 8k context or less). Off sends `transforms: []`, so "
        "the model sees the prompt eaglewatch rendered.",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Merged into every request body (reasoning options, provider routing)."
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        # before anything else, so no message (nor a derived endpoint name) ever holds the secret
        problem = url_secret_problem(value)
        if problem is not None:
            raise ValueError(problem)
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value.startswith(("sk-", "Bearer ")) or not _ENV_NAME.match(value):
            raise ValueError(
                "must be the NAME of an environment variable (e.g. OPENROUTER_API_KEY), never the key itself"
            )
        return value

    @model_validator(mode="after")
    def _one_target(self) -> Endpoint:
        if (self.base_url is None) == (self.simulator is None):
            raise ValueError("set exactly one of base_url or simulator")
        if not self.name:
            name = "simulator" if self.simulator is not None else re.sub(r"^https?://", "", self.base_url or "")
            object.__setattr__(self, "name", name.split("/")[0])
        return self


class Generation(_Section):
    """[generation]: sampling parameters sent with every request."""

    max_tokens: int = Field(8192, gt=0, description="Completion token cap per request.")
    temperature: float = Field(1.0, ge=0, le=2, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    stream: bool = Field(True, description="Stream responses (server-sent events).")
    attempts: int = Field(4, ge=1, description="Tries per sample before it is marked failed.")
    logprobs: bool = Field(False, description="Ask for per-token logprobs (enables exact id reconstruction).")
    top_logprobs: int = Field(0, ge=0, le=20, description="Alternatives per token when logprobs is on.")


class Limits(_Section):
    """[limits]: concurrency (adaptive between min and max), rate limits and the budget."""

    concurrency_initial: int | None = Field(
        None,
        gt=0,
        description="Requests in flight at start (default: concurrency_max, what a fixed-concurrency client sends).",
    )
    concurrency_min: int = Field(1, gt=0, description="Floor of the adaptive concurrency.")
    concurrency_max: int = Field(64, gt=0, description="Ceiling of the adaptive concurrency.")
    requests_per_min: float | None = Field(None, gt=0, description="Request rate cap across endpoints.")
    tokens_per_min: int | None = Field(None, gt=0, description="Token rate cap (prompt + completion).")
    budget_usd: float | None = Field(None, ge=0, description="Stop leasing new samples once this much is spent.")
    max_response_cost_usd: float = Field(
        20.0,
        gt=0,
        description="A cost reported for one response above this (or negative, NaN, infinite) is not "
        "believed: an event says so and the response is charged at the list price ([pricing]).",
    )
    endpoint_down_after: int = Field(
        5,
        ge=1,
        description="Consecutive connection failures (DNS, refused, TLS, reset before any byte) with no "
        "answer in between that mark an endpoint down: requests go to the other endpoints, or the run pauses when "
        "all are down; a down endpoint is probed with backoff and comes back on its first answer.",
    )
    lease_s: float = Field(
        600.0, gt=0, description="A leased sample returns to pending after this long (crash safety)."
    )
    max_corrupt_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Pause (or route around) an endpoint/provider whose measured corrupt rate exceeds this.",
    )
    min_verified_samples: int = Field(
        20,
        gt=0,
        description="Verified samples needed before max_corrupt_rate is "
        "judged; until an endpoint (and each upstream provider behind it) has this many, "
        "every request to it is a probe.",
    )
    on_corrupt: Literal["pause", "route_around"] = Field(
        "pause", description="What crossing max_corrupt_rate does: pause the run, or ignore that upstream provider."
    )

    @model_validator(mode="after")
    def _ordered(self) -> Limits:
        initial = self.concurrency_max if self.concurrency_initial is None else self.concurrency_initial
        if not self.concurrency_min <= initial <= self.concurrency_max:
            raise ValueError(
                "concurrency_min <= concurrency_initial <= concurrency_max must hold, got "
                f"{self.concurrency_min}, {initial}, {self.concurrency_max}"
            )
        return self


class Pricing(_Section):
    """[pricing."<model>"]: dollars per million tokens, used when the API reports no cost."""

    prompt_per_m: float = Field(ge=0, description="$ per 1M prompt tokens.")
    completion_per_m: float = Field(ge=0, description="$ per 1M completion tokens (reasoning included).")
    cached_prompt_per_m: float | None = Field(
        None, ge=0, description="$ per 1M cached prompt tokens (default: prompt_per_m)."
    )

    @model_validator(mode="after")
    def _cached_default(self) -> Pricing:
        if self.cached_prompt_per_m is None:
            object.__setattr__(self, "cached_prompt_per_m", self.prompt_per_m)
        return self


class Extraction(_Section):
    """[extraction]: hidden-state extraction jobs after generation."""

    executor: Literal["local", "slurm"] = Field("local", description="Where shards run.")
    extractor: Literal["builtin", "command"] = Field(
        "builtin", description="The built-in extractor or your own command."
    )
    command: list[str] | None = Field(None, description='Command template run per shard when extractor = "command".')
    model_path: ConfigPath | None = Field(
        None, description="Target model weights directory for the built-in extractor."
    )
    aux_layers: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="Aux layer ids (default: the model's EAGLE-3 choice)."
    )
    layer_convention: Literal["output", "input"] = Field(
        "output", description="Whether a layer id means that layer's output or input."
    )
    layout: Literal["packed", "specforge", "speculators", "modelopt"] = Field(
        "packed",
        description="Built-in extractor's files: packed, or as SpecForge / speculators (last state pre-norm) / "
        "Model-Optimizer load them.",
    )
    backend: Literal["builtin", "vllm"] = Field(
        "builtin",
        description="Built-in extractor's engine: transformers (builtin) or vLLM's hidden-states connector (vllm, "
        "run by vLLM's Python).",
    )
    python: str | None = Field(
        None, description='Python of the vLLM venv for backend = "vllm" (default: $EAGLEWATCH_VLLM_PYTHON).'
    )
    shard_size: int = Field(1000, gt=0, description="Samples per shard.")
    output_dir: ConfigPath = Field(Path("extract"), description="Where shards, hidden states and logs go.")
    gpus: int = Field(1, ge=0, description="GPUs per shard (local: devices used in parallel).")
    slurm: dict[str, Any] = Field(default_factory=dict, description="partition, time, mem and extra sbatch args.")

    @model_validator(mode="after")
    def _command(self) -> Extraction:
        if self.extractor == "command" and not self.command:
            raise ValueError('extractor = "command" needs a non-empty command list')
        if self.extractor == "builtin" and self.command:
            raise ValueError('command is set but extractor is "builtin"; set extractor = "command" to use it')
        return self


class ExportSection(_Section):
    """[export]: what `eaglewatch export` keeps out of the training data."""

    eval_prompts: list[ConfigPath] = Field(
        default_factory=list,
        description="Eval prompt files (JSONL, any dataset format): training rows whose "
        "prompt equals one after whitespace normalisation are left out and counted; near-duplicates (word 8-gram "
        "containment >= 0.5) are reported. `export --eval-prompts` overrides it.",
    )
    keep_eval_overlap: bool = Field(False, description="Keep (but still count) training rows equal to an eval prompt.")


class EvalSection(_Section):
    """[eval]: what only `eaglewatch eval` needs (the prompts are the run's [data] datasets)."""

    drafter: str = Field(
        "", description="The drafter's identity (checkpoint name or path) recorded with the run; required for eval."
    )
    endpoints: list[Name] = Field(
        default_factory=list,
        description="Endpoints serving the target with the drafter (default: every endpoint but `baseline`).",
    )
    baseline: Name | None = Field(
        None, description="An endpoint serving the target without a drafter, for speedup (optional; not averaged)."
    )
    num_draft_tokens: int = Field(
        3, gt=0, description="Draft tokens per step the server was started with (per-position figures use it)."
    )
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature of the eval requests.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass of the eval requests.")
    top_k: int | None = Field(None, gt=0, description="Top-k of the eval requests (None: the server's default).")
    max_tokens: int = Field(256, gt=0, description="Completion token cap per eval request.")
    thinking: bool | None = Field(
        None, description="chat_template_kwargs.enable_thinking sent with each request (None: not sent)."
    )
    dead_below: float = Field(
        1.1, gt=1, description="Mean acceptance length at or below which the drafter is called dead."
    )
    dead_after: int = Field(20, gt=0, description="Requests with acceptance figures before `dead drafter` is said.")
    loop_min_repeat: int = Field(
        8, ge=2, description="Fewest tokens repeating a cycle (period <= 64) before an output counts as a loop."
    )
    loop_share: float = Field(
        0.5, gt=0, le=1, description="Share of an output that the repeated cycle must cover to make it a loop."
    )
    bootstrap: int = Field(1000, ge=100, description="Bootstrap resamples of the 95 % confidence intervals.")
    seed: int = Field(0, description="Seed of the bootstrap.")
    training: ConfigPath | None = Field(
        None,
        description="The drafter's training export folder (`eaglewatch export --out OUT`): its eval split "
        "(OUT/eval/prompts.jsonl, from --eval-fraction) is the prompts when [data] names no datasets; its sampling "
        "and prompt hashes are compared with the eval's (`sampling differs`, `eval/training overlap`).",
    )
    d2t: ConfigPath | None = Field(
        None,
        description="The drafter's d2t (a .npy, .safetensors or .pt file, or its checkpoint folder): the share of "
        "eval output tokens inside its draft vocabulary is reported (`draft vocabulary coverage`).",
    )
    min_vocab_coverage: float = Field(
        0.9, ge=0, le=1, description="Share of eval output tokens in the draft vocabulary below which it is said."
    )
    min_acceptance: dict[str, float] = Field(
        default_factory=dict,
        description='Gates per category on the mean acceptance length, e.g. {code = 2.0}; "*" gates the whole run '
        "(added to `--min-acceptance`; a failed gate exits 4).",
    )
    raw_completion_endpoints: list[Name] = Field(
        default_factory=list,
        description="Endpoints sent the prompt's text without the chat template, to /v1/completions (how a raw "
        "prompt inflates acceptance; the template guard then reports a `template mismatch`).",
    )
    counter_window_requests: int = Field(
        50,
        gt=0,
        description="Answers per endpoint between two scrapes of its Prometheus spec-decode counters (/metrics); "
        "each window's deltas are stored and reported apart from the per-request figures.",
    )


class RunConfig(_Section):
    """A whole run, as one TOML file describes it."""

    run: RunSection = Field(description="[run] section.")
    data: DataSection = Field(description="[data] section.")
    model: ModelSection = Field(description="[model] section.")
    endpoints: list[Endpoint] = Field(min_length=1, description="[[endpoints]] tables.")
    # the nested sections default to {} on purpose: validate_default validates it into the section with the
    # loader's context (relative paths resolve against the config's folder), which Model() would not
    generation: Generation = Field(default_factory=dict, description="[generation] section.")  # type: ignore[assignment]
    limits: Limits = Field(default_factory=dict, description="[limits] section.")  # type: ignore[assignment]
    pricing: dict[str, Pricing] = Field(default_factory=dict, description='[pricing."<model>"] tables.')
    extraction: Extraction = Field(default_factory=dict, description="[extraction] section.")  # type: ignore[assignment]
    export: ExportSection = Field(default_factory=dict, description="[export] section.")  # type: ignore[assignment]
    eval: EvalSection | None = Field(None, description="[eval] section (only `eaglewatch eval` reads it).")

    _source: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        names: set[str] = set()
        for i, ep in enumerate(self.endpoints):
            if ep.name in names:
                raise ValueError(f"endpoints[{i}].name: {ep.name!r} is used twice; give each endpoint a distinct name")
            names.add(ep.name)
            if ep.simulator is not None and ep.simulator.reference is None:
                if self.data.reference is None:
                    raise ValueError(
                        f"endpoints[{i}].simulator.reference: the simulator replays reference ids; "
                        "set it or data.reference"
                    )
                sim = ep.simulator.model_copy(update={"reference": self.data.reference})
                object.__setattr__(ep, "simulator", sim)
        return self

    @model_validator(mode="before")
    @classmethod
    def _eval_split_prompts(cls, values: Any) -> Any:
        """With `[eval] training = OUT` and no datasets, the prompts are the export's eval split."""
        if not isinstance(values, dict):
            return values
        ev, data = values.get("eval"), values.get("data")
        if not isinstance(ev, dict) or not ev.get("training") or (isinstance(data, dict) and data.get("datasets")):
            return values
        if data is not None and not isinstance(data, dict):
            return values
        split = {
            "path": str(Path(str(ev["training"])) / "eval" / "prompts.jsonl"),  # app.eval.training.eval_split_prompts
            "format": "openai-messages",
            "name": "eval-split",
            "columns": {"category": "category"},
        }
        return {**values, "data": {**(data or {}), "datasets": [split]}}

    @model_validator(mode="after")
    def _eval_endpoints(self) -> RunConfig:
        if self.eval is None:
            return self
        if not self.eval.drafter.strip():
            raise ValueError("eval.drafter: name the drafter (its checkpoint name or path) so runs can be compared")
        names = [ep.name for ep in self.endpoints]
        for i, name in enumerate(self.eval.endpoints):
            if name not in names:
                raise ValueError(f"eval.endpoints[{i}]: no endpoint is called {name!r}; the endpoints are {names}")
        if self.eval.baseline is not None:
            if self.eval.baseline not in names:
                raise ValueError(
                    f"eval.baseline: no endpoint is called {self.eval.baseline!r}; the endpoints are {names}"
                )
            if self.eval.baseline in self.eval.endpoints:
                raise ValueError(
                    f"eval.baseline: {self.eval.baseline!r} is also in eval.endpoints; a baseline has no drafter"
                )
        if not self.eval_endpoints():
            raise ValueError("eval: no endpoint serves a drafter; add an endpoint besides the baseline")
        for i, name in enumerate(self.eval.raw_completion_endpoints):
            if name not in names:
                raise ValueError(
                    f"eval.raw_completion_endpoints[{i}]: no endpoint is called {name!r}; the endpoints are {names}"
                )
        return self

    def eval_endpoints(self) -> list[str]:
        """The endpoints an eval measures the drafter on ([eval].endpoints, else all but the baseline)."""
        if self.eval is None:
            return []
        return list(self.eval.endpoints) or [ep.name for ep in self.endpoints if ep.name != self.eval.baseline]

    @property
    def source(self) -> Path | None:
        """The file this config was loaded from (None when built in code)."""
        return self._source

    def endpoint(self, name: str) -> Endpoint:
        """The endpoint called `name`; KeyError if none."""
        for ep in self.endpoints:
            if ep.name == name:
                return ep
        raise KeyError(name)

    def redacted(self) -> dict[str, Any]:
        """The effective configuration as JSON-ready data, secret-looking `extra` values masked."""
        data = self.model_dump(mode="json")
        for ep in data["endpoints"]:
            ep["extra"] = _mask_secrets(ep["extra"])
        return data


def _mask_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ("***" if _SECRET_KEY.search(str(k)) and v not in (None, "") else _mask_secrets(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_mask_secrets(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- loading


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a run config TOML file; raise InputError naming file, key path and problem."""
    path = Path(path)
    label = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(
            f"{label}: no such file; pass the path of a run config TOML (see sample_data/demo.toml)"
        ) from None
    except IsADirectoryError:
        raise InputError(f"{label}: is a directory; pass the path of a run config TOML file") from None
    except OSError as exc:
        raise InputError(f"{label}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{label}: is not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{label}: {_toml_error(str(exc))}") from None
    return parse_config(data, base_dir=path.resolve().parent, label=label, source=path.resolve())


def parse_config(
    data: dict[str, Any], *, base_dir: Path | None = None, label: str = "config", source: Path | None = None
) -> RunConfig:
    """Validate parsed TOML data; relative paths resolve against base_dir. Raises InputError with `label:` lines."""
    try:
        config = RunConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise InputError(format_validation_error(exc, label)) from None
    config._source = source
    return config


def apply_overrides(config: RunConfig, overrides: dict[str, Any], *, base_dir: Path | None = None) -> RunConfig:
    """Return a new RunConfig with dotted keys replaced (`{"run.database": path, "endpoints[0].weight": 2}`).

    None values are skipped (an unset CLI flag). Relative paths in the new values resolve against base_dir
    (default: the current directory, since flags are typed there). Raises InputError on a bad key or value.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not overrides:
        return config
    data = config.model_dump(mode="python")
    for key, value in overrides.items():
        _set_key(data, key, value)
    label = "command-line override"
    new = parse_config(data, base_dir=base_dir or Path.cwd(), label=label, source=config.source)
    # a dataset's `format` left to its default stays "not set" (the dump above set every field): ingest and run say
    # what they read such a file as (app.datasets.reading_words)
    for old, fresh in zip(config.data.datasets, new.data.datasets):
        if "format" not in old.model_fields_set and fresh.format == old.format:
            fresh.model_fields_set.discard("format")
    return new


def _set_key(data: dict[str, Any], key: str, value: Any) -> None:
    parts = _split_key(key)
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            where = _format_loc(tuple(parts[: i + 1]))
            raise InputError(f"command-line override: {key}: there is no {where} in the configuration") from None
    last = parts[-1]
    if isinstance(node, dict) and isinstance(last, str):
        node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value
    else:
        raise InputError(f"command-line override: {key}: there is no such key in the configuration")


def _split_key(key: str) -> list[str | int]:
    parts: list[str | int] = []
    for token in re.finditer(r"([^.\[\]]+)|\[(\d+)\]", key):
        parts.append(int(token.group(2)) if token.group(2) is not None else token.group(1))
    if not parts:
        raise InputError(f"command-line override: {key!r} is not a key path like run.database")
    return parts


def _toml_error(message: str) -> str:
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)\s*$", message)
    if m:
        return f"line {m.group(1)}, column {m.group(2)}: invalid TOML: {message[: m.start()]}"
    m = re.search(r"\s*\(at end of document\)\s*$", message)
    if m:
        return f"at the end of the file: invalid TOML: {message[: m.start()]}"
    return f"invalid TOML: {message}"


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{str(part)!r}]".replace("'", '"')
    return out or "(top level)"


def format_validation_error(exc: ValidationError, label: str) -> str:
    """One `label: key.path[i]: problem` line per pydantic error."""
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        kind = err["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            msg = "unknown key" + (f" (allowed here: {', '.join(allowed)})" if allowed else "")
        elif kind == "missing":
            msg = "required key is missing"
        elif kind == "value_error":
            msg = str(err.get("ctx", {}).get("error", err["msg"]))
            # a model-level check may name its own key path: "endpoints[1].name: ..."
            m = re.match(r"^([A-Za-z_][\w.\[\]-]*): (.*)$", msg)
            if m and not loc:
                lines.append(f"{label}: {m.group(1)}: {m.group(2)}")
                continue
        else:
            msg = err["msg"]
            msg = msg[0].lower() + msg[1:]
            if "input" in err and not isinstance(err["input"], dict | list):
                msg += f" (got {err['input']!r})"
        lines.append(f"{label}: {_format_loc(loc)}: {msg}")
    return "\n".join(lines)


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys a table at `loc` may hold (for the 'unknown key' message)."""
    annotation: Any = RunConfig
    for part in loc:
        annotation = _strip_optional(annotation)
        origin = typing.get_origin(annotation)
        if origin is list and isinstance(part, int):
            annotation = typing.get_args(annotation)[0]
        elif origin is dict:
            annotation = typing.get_args(annotation)[1]  # `part` is the table's own key, e.g. a model name
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return []
            annotation = field.annotation
        else:
            return []
    annotation = _strip_optional(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _strip_optional(args[0])
    return annotation


def _inner_model(annotation: Any) -> Any:
    """The model class nested in an annotation (Endpoint in list[Endpoint], SimulatorOptions | None), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, dict, typing.Union, types.UnionType, Annotated):
        for arg in typing.get_args(annotation):
            found = _inner_model(arg)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------------------------------------- reference

REFERENCE_START = "<!-- config-reference:start -->"
REFERENCE_END = "<!-- config-reference:end -->"


def config_reference_markdown() -> str:
    """The configuration reference (every key, type, default, description) as Markdown tables."""
    out = [
        "Every key of a run config TOML file. Paths are relative to the config file. "
        "Generated from `app/config.py` by `python -m app.config`; a test keeps it in step.",
        "",
    ]
    sections: list[tuple[str, type[BaseModel]]] = [
        ("[run]", RunSection),
        ("[[data.datasets]]", Dataset),
        ("[data]", DataSection),
        ("[model]", ModelSection),
        ("[[endpoints]]", Endpoint),
        ("[endpoints.simulator]", SimulatorOptions),
        ("[generation]", Generation),
        ("[limits]", Limits),
        ('[pricing."<model>"]', Pricing),
        ("[extraction]", Extraction),
        ("[export]", ExportSection),
        ("[eval]", EvalSection),
    ]
    for title, model in sections:
        out.append(f"#### `{title}`")
        out.append("")
        doc = (model.__doc__ or "").split(":", 1)[-1].strip()
        out.append(doc[:1].upper() + doc[1:])
        out.append("")
        out.append("| key | type | default | description |")
        out.append("|---|---|---|---|")
        for name, field in model.model_fields.items():
            if isinstance(_inner_model(field.annotation), type) and name != "simulator":
                continue  # a nested section has its own table
            kind = _type_name(field.annotation) + _bounds(field.metadata)
            if field.is_required():
                default = "required"
            elif field.default_factory is not None:
                default = f"`{_toml_value(field.get_default(call_default_factory=True, validated_data={}))}`"
            elif field.default is None or field.default is PydanticUndefined:
                default = "unset"
            elif field.default == "":
                default = "derived"
            else:
                default = f"`{_toml_value(field.default)}`"
            cells = [f"`{name}`", kind, default, field.description or ""]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _bounds(metadata: list[Any]) -> str:
    """Range constraints of a field as text (", > 0", ", 0..1")."""
    low = high = None
    for m in metadata:
        for attr, sym in (("gt", ">"), ("ge", ">=")):
            if getattr(m, attr, None) is not None:
                low = (sym, getattr(m, attr))
        for attr, sym in (("lt", "<"), ("le", "<=")):
            if getattr(m, attr, None) is not None:
                high = (sym, getattr(m, attr))
    if low and high and low[0] == ">=" and high[0] == "<=":
        return f", {low[1]}..{high[1]}"
    parts = [f"{b[0]} {b[1]}" for b in (low, high) if b is not None]
    return (", " + " and ".join(parts)) if parts else ""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        return f'"{value.as_posix()}"'
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    if isinstance(value, list):
        return "[]" if not value else str(value)
    return str(value)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(f'"{a}"' for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " | ".join(names)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"table of {_type_name(args[1])}" if args and args[1] is not Any else "table"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}.get(
        annotation, str(annotation)
    )


if __name__ == "__main__":
    print(config_reference_markdown(), end="")
