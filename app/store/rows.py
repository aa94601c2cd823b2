"""Row codecs of the run database: each record and its encode / decode pair, in one place.

- responses: `encode_response` (Completion -> the `INSERT_RESPONSE` parameters) and `decode_completion`
  (a `responses` row -> Completion), with `encode_logprobs` / `decode_logprobs` and the tool-call pair;
- reconstructions: `reconstruction_row` builds a `ReconstructionRow` record ONCE from a Reconstruction and
  its Verdict; `encode_reconstruction` turns it into the named parameters of `UPSERT_RECONSTRUCTION`, and
  `decode_reconstruction` reads a row back;
- the records the reads of `app.store.queries` return (RunRow, MismatchRow, MismatchPage, SampleDetail,
  EventRow, JobSummary, JobShardRow): frozen dataclasses, never tuples.

JSON goes through orjson both ways (the column formats are in `app.store.schema`). Stdlib + orjson only.

The encoders check what they write: an integer column within SQLite's 64-bit range (counts never negative), a
cost finite and never negative, text valid Unicode (a lone surrogate cannot be encoded as UTF-8), ids within
uint32, JSON that serialises. A value that is not is a `RowError` naming the column, raised before any
statement runs, so a caller can end the sample with that sentence instead of losing the transaction.
`clean_text` makes any message safe to store (lone surrogates become U+FFFD).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from app.records import Category, Completion, Reconstruction, TokenLogprob, ToolCall, Verdict
from app.store.ids import pack_ids, unpack_ids
from app.store.schema import N_DIFF_SQL
from app.store.store_records import ReconstructionLabels

NO_LABELS = ReconstructionLabels()  # a reconstruction's labels when the caller has none (one shared frozen value)


def dumps(value: Any) -> str:
    """JSON text of `value` (orjson: compact, UTF-8, enums as their values)."""
    return orjson.dumps(value).decode("utf-8")


class RowError(ValueError):
    """A value a row codec will not write: `column` names where, the message what is wrong with it."""

    def __init__(self, column: str, problem: str) -> None:
        super().__init__(f"{column} {problem}; it was not stored")
        self.column = column


INT64_MAX = 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` with any lone surrogate replaced by U+FFFD: what an error message or event may always store."""
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


def _text(value: str | None, column: str) -> str | None:
    """A text column's value, refused when it is not valid Unicode (a lone surrogate)."""
    if value is None or type(value) is str and value.isascii():
        return value
    if type(value) is not str:
        raise RowError(column, f"should be text, got {type(value).__name__}")
    if _SURROGATE.search(value):
        raise RowError(column, "holds a lone surrogate (not valid Unicode)")
    return value


def _count(value: int, column: str) -> int:
    if type(value) is not int or not 0 <= value <= INT64_MAX:
        raise RowError(column, f"is {value!r}, not a count SQLite can hold (0..{INT64_MAX})")
    return value


def _real(value: float | None, column: str, *, nullable: bool = False, negative: bool = False) -> float | None:
    if value is None and nullable:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise RowError(column, f"is {value!r}, not a number") from None
    if not math.isfinite(number) or (number < 0 and not negative):
        raise RowError(column, f"is {number!r}, not a finite{'' if negative else ' non-negative'} number")
    return number


def _ids(ids: Sequence[int] | None, column: str) -> bytes | None:
    try:
        return pack_ids(ids)
    except (ValueError, TypeError) as exc:
        raise RowError(column, f"cannot be packed as uint32 ids ({exc})") from None


def _json(value: Any, column: str) -> str:
    try:
        return dumps(value)
    except (TypeError, ValueError) as exc:  # orjson: a huge integer, a lone surrogate, too deep
        raise RowError(column, f"cannot be written as JSON ({exc})") from None


def loads(text: str | bytes | None, default: Any = None) -> Any:
    """The JSON value of a column, or `default` when it is NULL, empty or not JSON."""
    if not text:
        return default
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return default


# ================================================================================================ responses

RESPONSE_COLUMNS = (
    "run_id",
    "sample_pk",
    "attempt",
    "endpoint",
    "provider",
    "model",
    "generation_id",
    "finish_reason",
    "reasoning",
    "content",
    "tool_calls",
    "logprobs",
    "token_ids",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
    "cost_usd",
    "latency_ms",
    "ttft_ms",
    "raw",
    "created_at",
    "prompt_ids",
)
INSERT_RESPONSE = (
    f"INSERT INTO responses ({', '.join(RESPONSE_COLUMNS)}) VALUES ({', '.join('?' * len(RESPONSE_COLUMNS))})"
)


def encode_tool_calls(calls: Sequence[ToolCall]) -> str | None:
    """The `responses.tool_calls` JSON list ({id, name, arguments, index, type}), NULL when there are none."""
    return _json([asdict(t) for t in calls], "responses.tool_calls") if calls else None


def decode_tool_calls(text: str | None) -> tuple[ToolCall, ...]:
    """The ToolCalls of a `responses.tool_calls` value (arguments byte-exact)."""
    return tuple(
        ToolCall(
            id=c.get("id", ""),
            name=c.get("name", ""),
            arguments=c.get("arguments", ""),
            index=c.get("index", i),
            type=c.get("type", "function"),
        )
        for i, c in enumerate(loads(text, []))
    )


def encode_logprobs(completion: Completion) -> str | None:
    """`{"content": [[token, bytes|null, logprob], ...], "reasoning": ...}`, NULL when the completion has none."""
    if completion.content_logprobs is None and completion.reasoning_logprobs is None:
        return None

    def enc(seq: tuple[TokenLogprob, ...] | None) -> Any:
        if seq is None:
            return None
        for t in seq:
            if not math.isfinite(t.logprob):  # orjson would write NaN as null, which reads back as no number
                raise RowError("responses.logprobs", f"holds logprob {t.logprob!r} for token {t.token!r}")
        return [[t.token, list(t.bytes) if t.bytes is not None else None, t.logprob] for t in seq]

    return _json(
        {"content": enc(completion.content_logprobs), "reasoning": enc(completion.reasoning_logprobs)},
        "responses.logprobs",
    )


def decode_logprobs(
    text: str | None,
) -> tuple[tuple[TokenLogprob, ...] | None, tuple[TokenLogprob, ...] | None]:
    """(content logprobs, reasoning logprobs) of a `responses.logprobs` value; None where absent."""
    value = loads(text, {})

    def dec(key: str) -> tuple[TokenLogprob, ...] | None:
        seq = value.get(key)
        if seq is None:
            return None
        return tuple(TokenLogprob(t[0], tuple(t[1]) if t[1] is not None else None, float(t[2])) for t in seq)

    return dec("content"), dec("reasoning")


def encode_raw(raw: Any, max_bytes: int | None = None) -> str | None:
    """The provider's parsed body (or chunk list) as JSON for `responses.raw`; None when absent, not JSON-able,
    or longer than `max_bytes` (a cap keeps one huge stream from bloating the database)."""
    if raw is None:
        return None
    try:
        text = dumps(raw)
    except TypeError:
        return None
    if max_bytes is not None and len(text.encode("utf-8")) > max_bytes:
        return None
    return text


def encode_response(
    run_id: int,
    sample_pk: int,
    attempt: int,
    endpoint: str,
    completion: Completion,
    cost_usd: float,
    *,
    keep_raw: bool = False,
    raw_max_bytes: int | None = None,
) -> tuple[Any, ...]:
    """The `INSERT_RESPONSE` parameters (RESPONSE_COLUMNS order) of one successful attempt; a value the table
    cannot hold is a RowError naming its column (see the module doc)."""
    u = completion.usage
    counts = [
        _count(getattr(u, name), f"responses.{name}")  # before the usage JSON, which holds them too
        for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens")
    ]
    return (
        run_id,
        sample_pk,
        attempt,
        _text(endpoint, "responses.endpoint"),
        _text(completion.provider, "responses.provider"),
        _text(completion.model, "responses.model"),
        _text(completion.generation_id, "responses.generation_id"),
        _text(completion.finish_reason, "responses.finish_reason"),
        _text(completion.reasoning, "responses.reasoning"),
        _text(completion.content, "responses.content"),
        encode_tool_calls(completion.tool_calls),
        encode_logprobs(completion),
        _ids(completion.token_ids, "responses.token_ids"),
        _json(asdict(u), "responses.usage"),
        *counts,
        _real(cost_usd, "responses.cost_usd"),
        _real(completion.total_s * 1000.0, "responses.latency_ms"),
        _real(completion.ttft_s * 1000.0, "responses.ttft_ms") if completion.ttft_s is not None else None,
        encode_raw(completion.raw, raw_max_bytes) if keep_raw else None,
        time.time(),
        _ids(completion.prompt_token_ids, "responses.prompt_ids"),
    )


def decode_completion(row: Mapping[str, Any]) -> Completion:
    """The Completion a `responses` row holds (text, tool calls, logprobs, server ids; usage and timings too
    when the row carries those columns). The inverse of `encode_response` for what reconstruction reads."""
    content_lp, reasoning_lp = decode_logprobs(row.get("logprobs"))
    return Completion(
        content=row.get("content") or "",
        reasoning=row.get("reasoning"),
        tool_calls=decode_tool_calls(row.get("tool_calls")),
        finish_reason=row.get("finish_reason"),
        content_logprobs=content_lp,
        reasoning_logprobs=reasoning_lp,
        token_ids=unpack_ids(row.get("token_ids")),
        ttft_s=row["ttft_ms"] / 1000.0 if row.get("ttft_ms") is not None else None,
        total_s=(row.get("latency_ms") or 0.0) / 1000.0,
        provider=row.get("provider"),
        model=row.get("model"),
        generation_id=row.get("generation_id"),
        prompt_token_ids=unpack_ids(row.get("prompt_ids")),
    )


@dataclass(frozen=True, slots=True)
class StoredCompletion:
    """A sample's latest successful attempt read back for reconstruction (`queries.latest_completions`)."""

    sample_pk: int
    sample_id: str
    response_id: int
    reference_ids: tuple[int, ...] | None
    completion: Completion


# ================================================================================================ reconstructions


@dataclass(frozen=True, slots=True)
class ReconstructionRow:
    """One `reconstructions` row as a record (ids unpacked, JSON decoded); the store writes and reads these.

    `ids_source` (where the output ids came from) and `flags` (suspect-sample flags) are the schema v5
    columns; None until the fidelity / export work fills them.
    """

    run_id: int
    sample_pk: int
    strategy: str
    output_ids: tuple[int, ...]
    category: str
    response_id: int | None = None
    profile: str = ""
    tokenizer: str = ""
    repair: str | None = None
    roundtrip: bool | None = None
    notes: tuple[str, ...] = ()
    reference_ids: tuple[int, ...] | None = None
    first_diff: int | None = None
    ref_len: int | None = None
    explanation: str | None = None
    spans: tuple[tuple[int, int, int, int], ...] = ()
    created_at: float = 0.0
    ids_source: str | None = None
    flags: tuple[str, ...] | None = None
    prompt_check: str | None = None  # agree | differ | no_server_ids (app.tokens.prompt_check); None: not checked
    prompt_first_diff: int | None = None

    @property
    def n_tokens(self) -> int:
        """len(output_ids): the `n_tokens` column."""
        return len(self.output_ids)


def reconstruction_row(
    run_id: int,
    sample_pk: int,
    reconstruction: Reconstruction,
    verdict: Verdict | None,
    reference_ids: Sequence[int] | None,
    labels: ReconstructionLabels = NO_LABELS,
    *,
    response_id: int | None = None,
    created_at: float | None = None,
) -> ReconstructionRow:
    """The row of one reconstructed sample (no verdict: unchecked), labelled by `labels` (its tokenizer is the
    tokenizer's fingerprint)."""
    v = verdict or Verdict(category=Category.UNCHECKED, rec_len=len(reconstruction.output_ids))
    ref = tuple(reference_ids) if reference_ids is not None else None
    return ReconstructionRow(
        run_id=run_id,
        sample_pk=sample_pk,
        response_id=response_id,
        profile=labels.profile,
        tokenizer=labels.tokenizer,
        strategy=reconstruction.strategy,
        repair=reconstruction.repair,
        roundtrip=reconstruction.roundtrip,
        notes=tuple(reconstruction.notes),
        output_ids=tuple(reconstruction.output_ids),
        reference_ids=ref,
        category=str(v.category),
        first_diff=v.first_diff,
        ref_len=v.ref_len if v.ref_len is not None else (len(ref) if ref is not None else None),
        explanation=v.explanation,
        spans=tuple((s.ref_start, s.ref_end, s.rec_start, s.rec_end) for s in v.spans),
        created_at=time.time() if created_at is None else created_at,
        ids_source=labels.ids_source,
        flags=tuple(labels.flags) if labels.flags is not None else None,
        prompt_check=labels.prompt_check,
        prompt_first_diff=labels.prompt_first_diff,
    )


# n_diff (schema v4) is not a parameter: the upsert computes it from `detail` with N_DIFF_SQL.
RECONSTRUCTION_COLUMNS = (
    "run_id",
    "sample_pk",
    "response_id",
    "profile",
    "tokenizer",
    "strategy",
    "repair",
    "roundtrip",
    "notes",
    "output_ids",
    "reference_ids",
    "category",
    "first_diff",
    "n_tokens",
    "ref_len",
    "explanation",
    "detail",
    "created_at",
    "ids_source",
    "flags",
    "prompt_check",
    "prompt_first_diff",
)
UPSERT_RECONSTRUCTION = (
    f"INSERT INTO reconstructions ({', '.join(RECONSTRUCTION_COLUMNS)}, n_diff) "
    f"VALUES ({', '.join(':' + c for c in RECONSTRUCTION_COLUMNS)}, {N_DIFF_SQL.format(detail=':detail')}) "
    "ON CONFLICT (run_id, sample_pk) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in (*RECONSTRUCTION_COLUMNS[2:], "n_diff"))
)


def encode_reconstruction(row: ReconstructionRow, **override: Any) -> dict[str, Any]:
    """The named parameters of `UPSERT_RECONSTRUCTION` for `row`; `override` sets columns by name (e.g. the
    response_id known only inside the writing transaction)."""
    params = {
        "run_id": row.run_id,
        "sample_pk": row.sample_pk,
        "response_id": row.response_id,
        "profile": row.profile,
        "tokenizer": row.tokenizer,
        "strategy": row.strategy,
        "repair": row.repair,
        "roundtrip": None if row.roundtrip is None else int(row.roundtrip),
        "notes": _json(list(row.notes), "reconstructions.notes"),
        "output_ids": _ids(row.output_ids, "reconstructions.output_ids"),
        "reference_ids": _ids(row.reference_ids, "reconstructions.reference_ids"),
        "category": str(row.category),
        "first_diff": row.first_diff,
        "n_tokens": row.n_tokens,
        "ref_len": row.ref_len,
        "explanation": _text(row.explanation, "reconstructions.explanation"),
        "detail": _json({"spans": [list(s) for s in row.spans]}, "reconstructions.detail"),
        "created_at": row.created_at,
        "ids_source": row.ids_source,
        "flags": _json(list(row.flags), "reconstructions.flags") if row.flags is not None else None,
        "prompt_check": row.prompt_check,
        "prompt_first_diff": row.prompt_first_diff,
    }
    unknown = set(override) - params.keys()
    if unknown:
        raise KeyError(f"not reconstruction columns: {sorted(unknown)}")
    params.update(override)
    return params


RECONSTRUCTION_SELECT = ", ".join(c for c in RECONSTRUCTION_COLUMNS if c != "n_tokens")


def decode_reconstruction(row: Mapping[str, Any]) -> ReconstructionRow:
    """A `reconstructions` row (selected with RECONSTRUCTION_SELECT, as a mapping) back as its record."""
    flags = loads(row.get("flags"))
    return ReconstructionRow(
        run_id=row["run_id"],
        sample_pk=row["sample_pk"],
        response_id=row.get("response_id"),
        profile=row.get("profile") or "",
        tokenizer=row.get("tokenizer") or "",
        strategy=row["strategy"],
        repair=row.get("repair"),
        roundtrip=None if row.get("roundtrip") is None else bool(row["roundtrip"]),
        notes=tuple(loads(row.get("notes"), [])),
        output_ids=unpack_ids(row["output_ids"]) or (),
        reference_ids=unpack_ids(row.get("reference_ids")),
        category=row["category"],
        first_diff=row.get("first_diff"),
        ref_len=row.get("ref_len"),
        explanation=row.get("explanation"),
        spans=tuple(tuple(s) for s in loads(row.get("detail"), {}).get("spans", ())),
        created_at=row.get("created_at") or 0.0,
        ids_source=row.get("ids_source"),
        flags=tuple(flags) if flags is not None else None,
        prompt_check=row.get("prompt_check"),
        prompt_first_diff=row.get("prompt_first_diff"),
    )


# ================================================================================================ read records


@dataclass(frozen=True, slots=True)
class RunRow:
    """One row of `runs` (config decoded)."""

    id: int
    name: str
    state: str
    reason: str | None
    created_at: float
    updated_at: float
    config: dict[str, Any]


RUN_SELECT = "id, name, state, reason, created_at, updated_at, config"


def decode_run(r: Sequence[Any]) -> RunRow:
    """A RunRow from a row selected with RUN_SELECT."""
    return RunRow(r[0], r[1], r[2], r[3], r[4], r[5], loads(r[6], {}))


@dataclass(frozen=True, slots=True)
class MismatchRow:
    """One reconstruction in the mismatch list (its ids are not read: see `queries.sample_ids`)."""

    sample_id: str
    dataset: str
    category: str
    first_diff: int | None
    ref_len: int | None
    rec_len: int  # n_tokens
    n_diff: int  # tokens differing (NULL, from a row written outside the store, reads as 0)
    pk: int = 0  # the sample's row key: pages turn by it (keyset paging)


@dataclass(frozen=True, slots=True)
class MismatchPage:
    """A window of the mismatch list: `rows` start at `offset` of `total` matching rows."""

    rows: tuple[MismatchRow, ...]
    total: int
    offset: int


@dataclass(frozen=True, slots=True)
class SampleDetail:
    """One sample and its latest attempt, as stored (JSON decoded; the raw body re-indented)."""

    sample_id: str
    dataset: str
    state: str
    prompt: Sequence[dict[str, Any]] = ()
    reasoning: str | None = None
    content: str | None = None
    tool_calls: Sequence[dict[str, Any]] = ()
    usage: dict[str, Any] = field(default_factory=dict)
    cost_usd: float = 0.0
    latency_ms: float | None = None
    ttft_ms: float | None = None
    endpoint: str | None = None
    finish_reason: str | None = None
    category: str | None = None
    strategy: str | None = None
    error: str | None = None
    reference_ids: tuple[int, ...] | None = None
    raw: str | None = None  # responses.raw, when the run keeps raw bodies
    keep_raw: bool = False  # the run's config asks for raw bodies ([run] keep_raw)
    # what servers did to the sample's stored answers that the model did not: (kind, detail), app.engine.interventions
    interventions: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class EventRow:
    """One row of `events`."""

    id: int
    ts: float
    level: str
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One extraction job with its shard progress, as the faces list it."""

    job_id: int
    name: str
    state: str
    executor: str
    n_shards: int
    shards_done: int
    tokens: int
    updated_at: float | None
    log_path: str | None


@dataclass(frozen=True, slots=True)
class JobShardRow:
    """One row of `job_shards`."""

    job_id: int
    shard: int
    state: str
    pid: int | None
    external_id: str | None
    done: int
    total: int
    tokens: int
    exit_code: int | None
    log_path: str | None
    output_path: str | None
    error: str | None
    started_at: float | None
    ended_at: float | None


@dataclass(frozen=True, slots=True)
class ConversationCounts:
    """A run's whole conversations (schema v8) at a glance: each counted once by how it stands.

    total = done + diverged + failed + truncated + ended_skipped + open. A conversation ends done (every turn
    done), diverged (the model's tool calls differed, policy stop), failed (a turn failed for good), truncated (an
    answer cut at max_tokens before its last turn) or ended_skipped (a turn skipped, e.g. its prompt too long).
    Of the open ones: not_started (turn 1 pending), in_flight (a turn leased: on the wire or about to be), of which
    waiting_on_parent have later turns that wait for it; the rest are ready (a later turn pending).
    `turns` counts turn rows by state (pending, waiting, leased, done, failed, skipped); off_policy_turns the
    turns with replayed recorded tool results after a divergent call in their history."""

    total: int = 0
    done: int = 0
    diverged: int = 0
    failed: int = 0
    truncated: int = 0
    ended_skipped: int = 0
    open: int = 0
    not_started: int = 0
    in_flight: int = 0
    waiting_on_parent: int = 0
    turns: dict[str, int] = field(default_factory=dict)
    off_policy_turns: int = 0

    @property
    def in_progress(self) -> int:
        """Open conversations with a turn done or in flight."""
        return self.open - self.not_started


@dataclass(frozen=True, slots=True)
class TurnRow:
    """One turn of a conversation as the conversation view lists it (its verdict when it has a reconstruction)."""

    pk: int
    sample_id: str
    turn: int
    turns: int
    state: str
    error_class: str | None
    last_error: str | None
    off_policy: bool
    category: str | None
    n_tokens: int | None
    first_diff: int | None


# How a conversation stands (ConversationRow.status), with `at_turn` the turn it refers to.
CONVERSATION_STATUSES = ("not_started", "ready", "running", "done", "diverged", "failed", "truncated", "skipped")


@dataclass(frozen=True, slots=True)
class ConversationRow:
    """One conversation in the conversations list: `status` (CONVERSATION_STATUSES) at turn `at_turn` of
    `turns`, its turns done, whether any turn is off-policy."""

    conversation_id: str
    dataset: str
    turns: int
    done_turns: int
    status: str
    at_turn: int
    off_policy: bool
    pk: int  # turn 1's row key: pages turn by it


def conversation_status(states: Sequence[tuple[int, str, str | None]]) -> tuple[str, int]:
    """(status, turn) of a conversation from its turns' (turn, state, error_class), in turn order."""
    from app.conversation import DIVERGED, ENDED_CLASSES, PARENT_TRUNCATED

    for turn, state, error_class in states:
        if state == "failed":
            return "failed", turn
        if state == "skipped":
            if error_class == DIVERGED:
                return "diverged", turn
            if error_class == PARENT_TRUNCATED:
                return "truncated", turn - 1
            if error_class in ENDED_CLASSES:
                continue
            return "skipped", turn
        if state == "leased":
            return "running", turn
        if state == "pending":
            return ("not_started" if turn == 1 else "ready"), turn
    last = states[-1][0] if states else 0
    return "done", last


# ============================================================================================== eval requests


@dataclass(frozen=True, slots=True)
class EvalRequestRow:
    """One answered eval request (`eval_requests`, schema v11 (eval)). `spec_source` None: the server reported no
    acceptance (the figures are None, never zero). `per_position[k]`: steps whose draft position k was accepted."""

    run_id: int
    sample_pk: int
    endpoint: str
    drafter: str | None = None
    category: str | None = None
    error: str | None = None
    output_ids: tuple[int, ...] = ()
    completion_tokens: int = 0
    ttft_ms: float | None = None
    itl_ms: float | None = None
    latency_ms: float | None = None
    tokens_per_s: float | None = None
    spec_source: str | None = None
    spec: dict[str, Any] | None = None
    accepted: int | None = None
    drafted: int | None = None
    steps: int | None = None
    per_position: tuple[int, ...] | None = None
    loop: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    # schema v12: the server's prompt ids, and the template guard's finding when they differ from the run's own
    # rendering (app.eval.template `template_finding`)
    prompt_ids: tuple[int, ...] | None = None
    template: dict[str, Any] | None = None


EVAL_REQUEST_COLUMNS = (
    "run_id, sample_pk, endpoint, drafter, category, error, output_ids, completion_tokens, ttft_ms, itl_ms, "
    "latency_ms, tokens_per_s, spec_source, spec, accepted, drafted, steps, per_position, loop, sampling, created_at, "
    "prompt_ids, template"
)


def encode_eval_request(row: EvalRequestRow) -> tuple[Any, ...]:
    """The parameters of an `eval_requests` insert, in EVAL_REQUEST_COLUMNS order (RowError on a bad value)."""

    def count(value: int | None, column: str) -> int | None:
        return None if value is None else _count(value, column)

    return (
        row.run_id,
        row.sample_pk,
        _text(row.endpoint, "endpoint"),
        _text(row.drafter, "drafter"),
        _text(row.category, "category"),
        _text(clean_text(row.error) if row.error is not None else None, "error"),
        _ids(row.output_ids, "output_ids"),
        _count(row.completion_tokens, "completion_tokens"),
        _real(row.ttft_ms, "ttft_ms", nullable=True),
        _real(row.itl_ms, "itl_ms", nullable=True),
        _real(row.latency_ms, "latency_ms", nullable=True),
        _real(row.tokens_per_s, "tokens_per_s", nullable=True),
        row.spec_source,
        _json(row.spec, "spec") if row.spec is not None else None,
        count(row.accepted, "accepted"),
        count(row.drafted, "drafted"),
        count(row.steps, "steps"),
        _json(list(row.per_position), "per_position") if row.per_position is not None else None,
        int(row.loop),
        _json(row.sampling, "sampling"),
        row.created_at or time.time(),
        _ids(row.prompt_ids, "prompt_ids") if row.prompt_ids is not None else None,
        _json(row.template, "template") if row.template is not None else None,
    )


def decode_eval_request(r: Sequence[Any]) -> EvalRequestRow:
    """An EvalRequestRow from a row selected with EVAL_REQUEST_COLUMNS."""
    per_position = loads(r[17])
    return EvalRequestRow(
        run_id=r[0],
        sample_pk=r[1],
        endpoint=r[2],
        drafter=r[3],
        category=r[4],
        error=r[5],
        output_ids=unpack_ids(r[6]) or (),
        completion_tokens=r[7],
        ttft_ms=r[8],
        itl_ms=r[9],
        latency_ms=r[10],
        tokens_per_s=r[11],
        spec_source=r[12],
        spec=loads(r[13]),
        accepted=r[14],
        drafted=r[15],
        steps=r[16],
        per_position=tuple(per_position) if per_position is not None else None,
        loop=bool(r[18]),
        sampling=loads(r[19], {}),
        created_at=r[20],
        prompt_ids=unpack_ids(r[21]) if r[21] is not None else None,
        template=loads(r[22]),
    )
