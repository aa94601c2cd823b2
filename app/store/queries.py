"""Read-only queries for the faces (TUI, attach mode, `status`): plain sqlite3, safe from a thread.

Open the connection with `connect_readonly(path)`; WAL lets these run while a writer commits. Every
function takes the connection first and returns frozen records or plain dicts; none writes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.errors import InputError
from app.records import VERDICTS
from app.store import tallies
from app.store.db import connect_readonly
from app.store.ids import unpack_ids
from app.store.schema import SAMPLE_STATES

__all__ = [
    "connect_readonly",
    "RunRow",
    "MismatchRow",
    "ResponseRow",
    "ReconstructionRow",
    "SampleDetail",
    "EventRow",
    "JobRow",
    "JobShardRow",
    "MISMATCH_ORDERS",
    "list_runs",
    "run_by_name",
    "resolve_run",
    "state_counts",
    "verdict_counts",
    "strategy_counts",
    "cost_total",
    "mismatch_page",
    "mismatch_count",
    "sample_detail",
    "reconstruction_ids",
    "events_tail",
    "jobs",
    "job_shards",
]


@dataclass(frozen=True, slots=True)
class RunRow:
    id: int
    name: str
    state: str
    reason: str | None
    created_at: float
    updated_at: float
    config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class MismatchRow:
    """One reconstruction in a verdict list (ids not included: fetch them with reconstruction_ids)."""

    sample_pk: int
    sample_id: str
    dataset: str
    category: str
    first_diff: int | None
    n_tokens: int
    ref_len: int | None
    strategy: str
    repair: str | None
    explanation: str | None


@dataclass(frozen=True, slots=True)
class ResponseRow:
    id: int
    attempt: int
    endpoint: str
    provider: str | None
    model: str | None
    finish_reason: str | None
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cost_usd: float
    latency_ms: float | None
    ttft_ms: float | None
    error_class: str | None
    error: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class ReconstructionRow:
    response_id: int | None
    profile: str
    tokenizer: str
    strategy: str
    repair: str | None
    roundtrip: bool | None
    notes: tuple[str, ...]
    output_ids: tuple[int, ...]
    reference_ids: tuple[int, ...] | None
    category: str
    first_diff: int | None
    n_tokens: int
    ref_len: int | None
    explanation: str | None
    spans: tuple[tuple[int, int, int, int], ...]


@dataclass(frozen=True, slots=True)
class SampleDetail:
    """Everything the detail screen shows for one sample."""

    pk: int
    sample_id: str
    dataset: str
    state: str
    attempts: int
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    reference_ids: tuple[int, ...] | None
    reference_finish: str | None
    error_class: str | None
    last_error: str | None
    response: ResponseRow | None
    reconstruction: ReconstructionRow | None
    attempts_log: tuple[ResponseRow, ...]


@dataclass(frozen=True, slots=True)
class EventRow:
    id: int
    ts: float
    level: str
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class JobRow:
    id: int
    run_id: int | None
    name: str
    executor: str
    state: str
    n_shards: int
    output_dir: str | None
    external_id: str | None
    error: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    spec: dict[str, Any]


@dataclass(frozen=True, slots=True)
class JobShardRow:
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


# ---------------------------------------------------------------------------------------------- runs


def _run(r: sqlite3.Row | tuple[Any, ...]) -> RunRow:
    return RunRow(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6] or "{}"))


_RUN_COLS = "id, name, state, reason, created_at, updated_at, config"


def list_runs(conn: sqlite3.Connection) -> list[RunRow]:
    """Every run in the database, oldest first."""
    return [_run(r) for r in conn.execute(f"SELECT {_RUN_COLS} FROM runs ORDER BY id")]


def run_by_name(conn: sqlite3.Connection, name: str) -> RunRow | None:
    """The run called `name`, or None."""
    r = conn.execute(f"SELECT {_RUN_COLS} FROM runs WHERE name = ?", (name,)).fetchone()
    return _run(r) if r else None


def resolve_run(conn: sqlite3.Connection, name: str | None, *, db_label: str = "the database") -> RunRow:
    """The run named `name`, or the only run when `name` is None; InputError naming the choices otherwise."""
    runs = list_runs(conn)
    if name is not None:
        for run in runs:
            if run.name == name:
                return run
        names = ", ".join(r.name for r in runs) or "none"
        raise InputError(f"{db_label}: has no run named {name!r} (runs: {names}); pass one of them with --run")
    if not runs:
        raise InputError(f"{db_label}: holds no runs yet; run `eaglewatch ingest CONFIG` first")
    if len(runs) > 1:
        names = ", ".join(r.name for r in runs)
        raise InputError(f"{db_label}: holds several runs ({names}); choose one with --run NAME")
    return runs[0]


# ---------------------------------------------------------------------------------------------- counts


def state_counts(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Samples per state; every state present (0 when none). Reads the maintained tally."""
    out = dict.fromkeys(SAMPLE_STATES, 0)
    out.update(tallies.sample_counts(conn, run_id))
    return out


def verdict_counts(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Reconstructions per verdict category; every category of VERDICTS present. Reads the maintained tally."""
    out = dict.fromkeys(VERDICTS, 0)
    out.update(tallies.verdict_counts(conn, run_id))
    return out


def strategy_counts(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Reconstructions per strategy (server_ids, logprobs, canonical, none), most used first."""
    counts = tallies.strategy_counts(conn, run_id)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def cost_total(conn: sqlite3.Connection, run_id: int) -> float:
    """Dollars spent by the run so far (the sum over every stored attempt). Reads the maintained tally."""
    return float(sum(t.cost_usd for t in tallies.response_tallies(conn, run_id)))


# ---------------------------------------------------------------------------------------------- mismatches

# order name -> ORDER BY clause; every one ends in a unique key so pages are stable
MISMATCH_ORDERS: dict[str, str] = {
    "sample": "r.sample_pk",
    "first_diff": "r.first_diff IS NULL, r.first_diff, r.sample_pk",
    "longest": "r.n_tokens DESC, r.sample_pk",
    "recent": "r.sample_pk DESC",  # samples are leased in pk order, so the newest results come first
}


def _mismatch_where(run_id: int, verdicts: Iterable[str] | None, text: str | None) -> tuple[str, list[Any]]:
    where = ["r.run_id = ?"]
    args: list[Any] = [run_id]
    if verdicts is not None:
        cats = list(verdicts)
        unknown = [c for c in cats if c not in VERDICTS]
        if unknown:
            raise ValueError(f"unknown verdicts {unknown}; expected some of {', '.join(VERDICTS)}")
        if not cats:
            where.append("0")
        else:
            where.append(f"r.category IN ({','.join('?' * len(cats))})")
            args += cats
    if text:
        where.append("(s.sample_id LIKE ? ESCAPE '\\' OR r.explanation LIKE ? ESCAPE '\\')")
        pat = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        args += [pat, pat]
    return " AND ".join(where), args


def mismatch_page(
    conn: sqlite3.Connection,
    run_id: int,
    verdicts: Iterable[str] | None = ("text_mismatch", "structure_mismatch"),
    text: str | None = None,
    order: str = "sample",
    offset: int = 0,
    limit: int = 100,
) -> list[MismatchRow]:
    """One page of reconstructions with the given verdicts (None: all), filtered by `text` in id or explanation.

    Pages come from an index walk (no full scan); `first_diff` walks the (run, first_diff) index, so its
    first pages are as cheap as `sample`'s; `longest` sorts the filtered rows, which is cheap for mismatch
    verdicts (a few percent of a run) and a full sort only for verdicts=None.
    """
    if order not in MISMATCH_ORDERS:
        raise ValueError(f"unknown order {order!r}; expected one of {', '.join(MISMATCH_ORDERS)}")
    where, args = _mismatch_where(run_id, verdicts, text)
    if order == "first_diff":
        return _mismatch_page_by_first_diff(conn, where, args, max(0, offset), max(0, limit))
    # With a verdict filter, walk the (run, category, sample) index: it holds only the wanted rows, and for
    # one verdict it is already in sample order. Without one, the (run, sample) index is in page order.
    index = "reconstructions_by_run_category" if verdicts is not None else "sqlite_autoindex_reconstructions_1"
    sql = (
        "SELECT r.sample_pk, s.sample_id, s.dataset, r.category, r.first_diff, r.n_tokens, r.ref_len, r.strategy, "
        f"r.repair, r.explanation FROM reconstructions r INDEXED BY {index} JOIN samples s ON s.pk = r.sample_pk "
        f"WHERE {where} ORDER BY {MISMATCH_ORDERS[order]} LIMIT ? OFFSET ?"
    )
    return [MismatchRow(*r) for r in conn.execute(sql, (*args, max(0, limit), max(0, offset)))]


_MISMATCH_COLS = (
    "r.sample_pk, s.sample_id, s.dataset, r.category, r.first_diff, r.n_tokens, r.ref_len, r.strategy, r.repair, "
    "r.explanation"
)


def _mismatch_page_by_first_diff(
    conn: sqlite3.Connection, where: str, args: list[Any], offset: int, limit: int
) -> list[MismatchRow]:
    # Rows with a first difference come in index order from reconstructions_by_run_first_diff (a partial
    # index over exactly those rows, holding the category too): a page reads about offset + limit entries.
    # Rows without one follow in sample order; reaching them costs a count of the first part.
    text_filter = "s." in where
    if text_filter:
        head_sql = (
            f"SELECT {_MISMATCH_COLS} FROM reconstructions r INDEXED BY reconstructions_by_run_first_diff "
            f"JOIN samples s ON s.pk = r.sample_pk WHERE {where} AND r.first_diff IS NOT NULL "
            "ORDER BY r.first_diff, r.sample_pk LIMIT ? OFFSET ?"
        )
        head_args: tuple[Any, ...] = (*args, limit, offset)
    else:
        # the page's keys from the index alone (nothing read for the rows OFFSET skips), then `limit` joins
        head_sql = (
            f"SELECT {_MISMATCH_COLS} FROM (SELECT r.sample_pk AS pk FROM reconstructions r "
            f"INDEXED BY reconstructions_by_run_first_diff WHERE {where} AND r.first_diff IS NOT NULL "
            "ORDER BY r.first_diff, r.sample_pk LIMIT ? OFFSET ?) AS page "
            "CROSS JOIN reconstructions r ON r.run_id = ? AND r.sample_pk = page.pk JOIN samples s ON s.pk = r.sample_pk"
        )
        head_args = (*args, limit, offset, args[0])
    head = sorted(
        (MismatchRow(*r) for r in conn.execute(head_sql, head_args)), key=lambda m: (m.first_diff, m.sample_pk)
    )
    if len(head) >= limit:
        return head
    if head:
        with_diff = offset + len(head)
    else:
        join = " JOIN samples s ON s.pk = r.sample_pk" if text_filter else ""
        with_diff = conn.execute(
            f"SELECT COUNT(*) FROM reconstructions r INDEXED BY reconstructions_by_run_first_diff{join} "
            f"WHERE {where} AND r.first_diff IS NOT NULL",
            args,
        ).fetchone()[0]
    # with a verdict filter the (run, category, sample) index reads only those verdicts' rows (then sorts)
    hint = " INDEXED BY reconstructions_by_run_category" if "r.category IN" in where else ""
    tail = conn.execute(
        f"SELECT {_MISMATCH_COLS} FROM reconstructions r{hint} JOIN samples s ON s.pk = r.sample_pk "
        f"WHERE {where} AND r.first_diff IS NULL ORDER BY r.sample_pk LIMIT ? OFFSET ?",
        (*args, limit - len(head), max(0, offset - with_diff)),
    )
    return head + [MismatchRow(*r) for r in tail]


def mismatch_count(
    conn: sqlite3.Connection,
    run_id: int,
    verdicts: Iterable[str] | None = ("text_mismatch", "structure_mismatch"),
    text: str | None = None,
) -> int:
    """How many rows `mismatch_page` pages through with the same filters."""
    where, args = _mismatch_where(run_id, verdicts, text)
    join = " JOIN samples s ON s.pk = r.sample_pk" if text else ""
    return conn.execute(f"SELECT COUNT(*) FROM reconstructions r{join} WHERE {where}", args).fetchone()[0]


# ---------------------------------------------------------------------------------------------- one sample

_RESPONSE_COLS = (
    "id, attempt, endpoint, provider, model, finish_reason, reasoning, content, tool_calls, prompt_tokens, "
    "completion_tokens, reasoning_tokens, cached_tokens, cost_usd, latency_ms, ttft_ms, error_class, error, created_at"
)


def _response(r: tuple[Any, ...]) -> ResponseRow:
    vals = list(r)
    vals[8] = json.loads(vals[8]) if vals[8] else None
    return ResponseRow(*vals)


def sample_detail(conn: sqlite3.Connection, run_id: int, sample_id: str) -> SampleDetail | None:
    """The sample, its every attempt, the response its reconstruction came from, and that reconstruction."""
    s = conn.execute(
        "SELECT pk, sample_id, dataset, state, attempts, messages, tools, reference_ids, reference_finish, "
        "error_class, last_error FROM samples WHERE run_id = ? AND sample_id = ?",
        (run_id, sample_id),
    ).fetchone()
    if s is None:
        return None
    pk = s[0]
    log = tuple(
        _response(r)
        for r in conn.execute(f"SELECT {_RESPONSE_COLS} FROM responses WHERE sample_pk = ? ORDER BY id", (pk,))
    )
    rec = conn.execute(
        "SELECT response_id, profile, tokenizer, strategy, repair, roundtrip, notes, output_ids, reference_ids, "
        "category, first_diff, n_tokens, ref_len, explanation, detail FROM reconstructions WHERE sample_pk = ?",
        (pk,),
    ).fetchone()
    reconstruction = None
    if rec is not None:
        detail = json.loads(rec[14] or "{}")
        reconstruction = ReconstructionRow(
            response_id=rec[0],
            profile=rec[1],
            tokenizer=rec[2],
            strategy=rec[3],
            repair=rec[4],
            roundtrip=None if rec[5] is None else bool(rec[5]),
            notes=tuple(json.loads(rec[6] or "[]")),
            output_ids=unpack_ids(rec[7]) or (),
            reference_ids=unpack_ids(rec[8]),
            category=rec[9],
            first_diff=rec[10],
            n_tokens=rec[11],
            ref_len=rec[12],
            explanation=rec[13],
            spans=tuple(tuple(sp) for sp in detail.get("spans", ())),
        )
    response = None
    if reconstruction is not None and reconstruction.response_id is not None:
        response = next((r for r in log if r.id == reconstruction.response_id), None)
    if response is None:
        response = next((r for r in reversed(log) if r.error_class is None), None)
    return SampleDetail(
        pk=pk,
        sample_id=s[1],
        dataset=s[2],
        state=s[3],
        attempts=s[4],
        messages=json.loads(s[5]),
        tools=json.loads(s[6]) if s[6] is not None else None,
        reference_ids=unpack_ids(s[7]),
        reference_finish=s[8],
        error_class=s[9],
        last_error=s[10],
        response=response,
        reconstruction=reconstruction,
        attempts_log=log,
    )


def reconstruction_ids(
    conn: sqlite3.Connection, run_id: int, sample_id: str
) -> tuple[tuple[int, ...], tuple[int, ...] | None] | None:
    """(reconstructed ids, reference ids or None) for the diff view; None when the sample has no reconstruction."""
    r = conn.execute(
        "SELECT r.output_ids, COALESCE(r.reference_ids, s.reference_ids) FROM reconstructions r "
        "JOIN samples s ON s.pk = r.sample_pk WHERE s.run_id = ? AND s.sample_id = ?",
        (run_id, sample_id),
    ).fetchone()
    if r is None:
        return None
    return unpack_ids(r[0]) or (), unpack_ids(r[1])


# ---------------------------------------------------------------------------------------------- events, jobs


def events_tail(conn: sqlite3.Connection, run_id: int | None, n: int = 100, *, after_id: int = 0) -> list[EventRow]:
    """The last n events of the run (None: events of no run), oldest first; `after_id` polls for new ones only."""
    if run_id is None:
        sql = "SELECT id, ts, level, kind, message FROM events WHERE run_id IS NULL AND id > ? ORDER BY id DESC LIMIT ?"
        args: tuple[Any, ...] = (after_id, n)
    else:
        sql = "SELECT id, ts, level, kind, message FROM events WHERE run_id = ? AND id > ? ORDER BY id DESC LIMIT ?"
        args = (run_id, after_id, n)
    return [EventRow(*r) for r in reversed(conn.execute(sql, args).fetchall())]


_JOB_COLS = (
    "id, run_id, name, executor, state, n_shards, output_dir, external_id, error, created_at, started_at, ended_at, spec"
)


def jobs(conn: sqlite3.Connection, run_id: int | None = None) -> list[JobRow]:
    """Extraction jobs, newest first (all runs when run_id is None)."""
    if run_id is None:
        rows = conn.execute(f"SELECT {_JOB_COLS} FROM jobs ORDER BY id DESC").fetchall()
    else:
        rows = conn.execute(f"SELECT {_JOB_COLS} FROM jobs WHERE run_id = ? ORDER BY id DESC", (run_id,)).fetchall()
    return [JobRow(*r[:12], json.loads(r[12] or "{}")) for r in rows]


def job_shards(conn: sqlite3.Connection, job_id: int) -> list[JobShardRow]:
    """A job's shards in shard order."""
    return [
        JobShardRow(*r)
        for r in conn.execute(
            "SELECT job_id, shard, state, pid, external_id, done, total, tokens, exit_code, log_path, output_path, "
            "error, started_at, ended_at FROM job_shards WHERE job_id = ? ORDER BY shard",
            (job_id,),
        )
    ]
