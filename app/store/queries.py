"""The read side of the run database: every query the faces run (TUI in-process and attached, `status`,
`watch`, `reprocess`), over plain read-only sqlite3 connections that WAL lets run beside the writer.

Functions take the connection first and return the records of `app.store.rows`; none writes.
`RunReader` holds one connection for one run behind a lock, for faces that query from thread workers.

The mismatch list (`mismatch_page`) has ONE set of sort orders (`MISMATCH_ORDERS`) and ONE text filter:
- sample / recent: sample order, ascending / descending (samples are leased in pk order, so `recent` is
  newest results first); keyset pages over the (run, category, sample) index, about `limit` index entries
  per verdict at any depth;
- verdict: by category, then sample; keyset over the same index;
- first_diff: earliest first difference first (rows without one last); the partial (run, first_diff) index;
- n_diff: most tokens differing first; the (run, n_diff) index;
- longest: most reconstructed tokens first; the (run, category, n_tokens) index (schema v5), one range per
  verdict, pages turned by key like sample order.
first_diff and n_diff read about offset + limit index entries. With a text filter, first_diff, n_diff and
longest sort every match once and reuse that order for SORT_CACHE_S (a page is then a slice and a lookup).
The text filter matches a literal substring (LIKE wildcards are escaped) of the sample id, the dataset or
the verdict's explanation.

Over ~450 lines on purpose: this is the ONE read module; splitting the mismatch paging out
would bring back a second place to look for the faces' SQL.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from app.errors import InputError
from app.records import VERDICTS, Category
from app.store import tallies
from app.store.count_records import (
    EndpointCounts,
    ProviderCounts,
    RunCounts,
    RunLatency,
    SampleStates,
    fold_answers,
    percentiles_of,
)
from app.store.db import connect_readonly
from app.store.ids import unpack_ids
from app.store.rows import (
    EVAL_REQUEST_COLUMNS,
    RECONSTRUCTION_SELECT,
    RUN_SELECT,
    ConversationCounts,
    ConversationRow,
    EvalRequestRow,
    EventRow,
    JobShardRow,
    JobSummary,
    MismatchPage,
    MismatchRow,
    ReconstructionRow,
    RunRow,
    SampleDetail,
    StoredCompletion,
    TurnRow,
    conversation_status,
    decode_completion,
    decode_eval_request,
    decode_reconstruction,
    decode_run,
    loads,
)
from app.store.schema import SAMPLE_STATES

__all__ = [
    "connect_readonly",
    "RunReader",
    "RunRow",
    "MismatchRow",
    "MismatchPage",
    "MismatchQuery",
    "SampleDetail",
    "EventRow",
    "JobSummary",
    "JobShardRow",
    "MISMATCH_ORDERS",
    "MISMATCH_VERDICTS",
    "SORT_CACHE_S",
    "SortCache",
    "list_runs",
    "run_by_name",
    "resolve_run",
    "state_counts",
    "verdict_counts",
    "strategy_counts",
    "cost_total",
    "run_counts",
    "run_latency",
    "data_version",
    "mismatch_page",
    "mismatch_count",
    "sample_detail",
    "reconstruction_of",
    "latest_completions",
    "events_tail",
    "job_summaries",
    "latest_shard_log",
    "conversation_counts",
    "conversation_turns",
    "conversation_page",
]

T = TypeVar("T")

# The verdicts the mismatch list shows (everything but exact), in filter-cycling order.
MISMATCH_VERDICTS: tuple[Category, ...] = tuple(v for v in VERDICTS if v != Category.EXACT)
# Sort orders of the mismatch list: key -> caption (see the module docstring for how each is served).
MISMATCH_ORDERS: dict[str, str] = {
    "sample": "sample id",
    "recent": "most recent first",
    "verdict": "verdict",
    "first_diff": "first difference",
    "n_diff": "tokens differing (most first)",
    "longest": "longest first",
}
SORT_CACHE_S = 10.0  # how long a computed sort order (no index serves it) is reused


# ============================================================================================== runs


def list_runs(conn: sqlite3.Connection) -> list[RunRow]:
    """Every run in the database, oldest first."""
    return [decode_run(r) for r in conn.execute(f"SELECT {RUN_SELECT} FROM runs ORDER BY id")]


def run_by_name(conn: sqlite3.Connection, name: str) -> RunRow | None:
    """The run called `name`, or None."""
    r = conn.execute(f"SELECT {RUN_SELECT} FROM runs WHERE name = ?", (name,)).fetchone()
    return decode_run(r) if r else None


def resolve_run(conn: sqlite3.Connection, name: str | None, *, db_label: str = "the database") -> RunRow:
    """The run named `name`, or the only run when `name` is None; InputError naming the choices otherwise.

    The one way every face chooses the run of a database.
    """
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


# ============================================================================================== counts


def state_counts(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Samples per state; every state present (0 when none). Reads the maintained tally."""
    out = dict.fromkeys(SAMPLE_STATES, 0)
    out.update(tallies.sample_counts(conn, run_id))
    return out


def verdict_counts(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Reconstructions per verdict category; every category of VERDICTS present. Reads the maintained tally."""
    out = {str(v): 0 for v in VERDICTS}
    out.update(tallies.verdict_counts(conn, run_id))
    return out


def strategy_counts(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Reconstructions per strategy (server_ids, logprobs, canonical, none), most used first."""
    counts = tallies.strategy_counts(conn, run_id)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def cost_total(conn: sqlite3.Connection, run_id: int) -> float:
    """Dollars spent by the run so far (the sum over every stored attempt). Reads the maintained tally."""
    return float(sum(t.cost_usd for t in tallies.response_tallies(conn, run_id)))


def run_counts(conn: sqlite3.Connection, run_id: int) -> RunCounts:
    """The counts part of the run's record (app.store.count_records.RunCounts), read from the maintained tallies:
    the one function every face takes its counts from, so each number has one definition.

    About a dozen small reads whatever the run's size, plus one index probe per failed sample (failed samples
    are few): cheap enough for a dashboard polling at 2 Hz. They run in one read transaction (unless the caller
    holds one), so the counts are of one moment even while the engine writes.
    """
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        return _run_counts(conn, run_id)
    finally:
        if own:
            conn.execute("COMMIT")


def _run_counts(conn: sqlite3.Connection, run_id: int) -> RunCounts:
    responses = tallies.response_tallies(conn, run_id)
    finals = tallies.final_failures_by_endpoint(conn, run_id)
    quality = tallies.quality_tallies(conn, run_id)
    errors: dict[str, int] = {}
    endpoints = []
    for name in sorted({t.endpoint for t in responses}):
        mine = [t for t in responses if t.endpoint == name]
        failed_requests = [(t.error_class or "", t.n) for t in mine if not t.ok]
        for cls, n in failed_requests:
            errors[cls] = errors.get(cls, 0) + n
        final = finals.get(name, 0)
        endpoints.append(
            EndpointCounts(
                name=name,
                completed=sum(t.n for t in mine if t.ok),
                failed=final,
                retried=max(0, sum(n for _, n in failed_requests) - final),
                errors_by_class=tuple(sorted(failed_requests)),
                cost_usd=sum(t.cost_usd for t in mine),
                completion_tokens=sum(t.completion_tokens for t in mine if t.ok),
            )
        )
    groups: dict[tuple[str, str | None], list[tallies.QualityTally]] = {}
    for row in quality:
        groups.setdefault((row.endpoint, row.provider), []).append(row)
    first, last = tallies.response_span(conn, run_id)
    conversations = conversation_counts(conn, run_id)
    intervened, by_kind = intervention_counts(conn, run_id)
    return RunCounts(
        intervened=intervened,
        interventions=by_kind,
        samples=SampleStates(**state_counts(conn, run_id)),
        conversations=conversations if conversations.total else None,
        cost_usd=sum(t.cost_usd for t in responses),
        requests=sum(t.n for t in responses),
        completion_tokens=sum(e.completion_tokens for e in endpoints),
        errors_by_class=tuple(sorted(errors.items())),
        failed_by_class=tuple(sorted(tallies.failed_by_class(conn, run_id).items())),
        retried=sum(e.retried for e in endpoints),
        answers=fold_answers(quality),
        strategies=tuple(strategy_counts(conn, run_id).items()),
        endpoints=tuple(endpoints),
        providers=tuple(
            ProviderCounts(e, p, fold_answers(rows))
            for (e, p), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
        ),
        first_at=first,
        last_at=last,
    )


def intervention_counts(conn: sqlite3.Connection, run_id: int) -> tuple[int, tuple[tuple[str, int], ...]]:
    """(samples with any server intervention, samples per intervention kind, by kind): the ledger's rows are few
    (one per intervened answer's kind), read through their (run_id, kind) index."""
    by_kind = conn.execute(
        "SELECT kind, COUNT(DISTINCT sample_pk) FROM interventions WHERE run_id = ? GROUP BY kind ORDER BY kind",
        (run_id,),
    ).fetchall()
    if not by_kind:
        return 0, ()
    total = conn.execute("SELECT COUNT(DISTINCT sample_pk) FROM interventions WHERE run_id = ?", (run_id,)).fetchone()
    return int(total[0]), tuple((str(k), int(n)) for k, n in by_kind)


def run_intervention_flags(conn: sqlite3.Connection, run_id: int) -> dict[tuple[int, int | None], tuple[str, ...]]:
    """The run's ledger as the kinds recorded per (sample, response); a NULL response marks the whole sample.
    `reprocess` puts them back on the reconstructions it replaces (the ledger, not the flags, is what holds them)."""
    found: dict[tuple[int, int | None], list[str]] = {}
    for pk, response_id, kind in conn.execute(
        "SELECT sample_pk, response_id, kind FROM interventions WHERE run_id = ? ORDER BY id", (run_id,)
    ):
        kinds = found.setdefault((pk, response_id), [])
        if kind not in kinds:
            kinds.append(kind)
    return {key: tuple(kinds) for key, kinds in found.items()}


def sample_interventions(conn: sqlite3.Connection, sample_pk: int) -> list[tuple[int | None, str, str]]:
    """A sample's ledger of server interventions: (response id, kind, detail) in the order they were stored."""
    return [
        (r[0], str(r[1]), str(r[2]))
        for r in conn.execute(
            "SELECT response_id, kind, detail FROM interventions WHERE sample_pk = ? ORDER BY id", (sample_pk,)
        )
    ]


def data_version(conn: sqlite3.Connection) -> int:
    """A number that changes whenever another connection commits to the database (`PRAGMA data_version`): a
    reader that keeps one re-reads only after a change."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def run_latency(conn: sqlite3.Connection, run_id: int) -> RunLatency:
    """Latency and TTFT percentiles over every answer of the run, overall and per endpoint (a finished run's
    figures). Reads one (endpoint, latency, ttft) triple per answer: call it once per finished run, not per poll."""
    per: dict[str, tuple[list[float], list[float]]] = {}
    n = 0
    for endpoint, latency, ttft in conn.execute(
        "SELECT endpoint, latency_ms, ttft_ms FROM responses WHERE run_id = ? AND error_class IS NULL", (run_id,)
    ):
        n += 1
        lat, first = per.setdefault(endpoint, ([], []))
        if latency is not None:
            lat.append(float(latency))
        if ttft is not None:
            first.append(float(ttft))
    every = ([v for lat, _ in per.values() for v in lat], [v for _, first in per.values() for v in first])
    return RunLatency(
        n, percentiles_of(*every), tuple((name, percentiles_of(*values)) for name, values in sorted(per.items()))
    )


# ============================================================================================== conversations


def conversation_counts(conn: sqlite3.Connection, run_id: int) -> ConversationCounts:
    """The run's conversations by how they stand, its turns by state and its off-policy turns
    (`app.store.rows.ConversationCounts`). Reads the maintained `turn_tallies` (a handful of rows at any size);
    counts the samples table instead while the tally is behind (rows inserted with plain SQL)."""
    from app.conversation import DIVERGED, ENDED_CLASSES, PARENT_TRUNCATED

    if tallies.samples_current(conn):
        rows = conn.execute(
            "SELECT state, first, last, off_policy, error_class, n FROM turn_tallies WHERE run_id = ? AND n != 0",
            (run_id,),
        ).fetchall()
    else:
        rows = conn.execute(
            "SELECT state, turn = 1, turn = turns, off_policy, CASE WHEN state IN ('failed', 'skipped') "
            "THEN COALESCE(error_class, '') ELSE '' END, COUNT(*) FROM samples "
            "WHERE run_id = ? AND conversation_id IS NOT NULL GROUP BY 1, 2, 3, 4, 5",
            (run_id,),
        ).fetchall()
    c: dict[str, int] = dict.fromkeys(
        (
            "total",
            "done",
            "diverged",
            "failed",
            "truncated",
            "ended_skipped",
            "not_started",
            "in_flight",
            "waiting_on_parent",
            "off_policy",
        ),
        0,
    )
    turns = dict.fromkeys(SAMPLE_STATES, 0)
    for state, first, last, off, error_class, n in rows:
        turns[state] = turns.get(state, 0) + n
        c["total"] += n if first else 0
        c["off_policy"] += n if off else 0
        if state == "done" and last:
            c["done"] += n
        elif state == "failed":
            c["failed"] += n
        elif state == "skipped":
            if error_class == DIVERGED:
                c["diverged"] += n
            elif error_class == PARENT_TRUNCATED:
                c["truncated"] += n
            elif error_class not in ENDED_CLASSES:
                c["ended_skipped"] += n
        elif state == "pending" and first:
            c["not_started"] += n
        elif state == "leased":
            c["in_flight"] += n
            c["waiting_on_parent"] += 0 if last else n
    ended = c["done"] + c["diverged"] + c["failed"] + c["truncated"] + c["ended_skipped"]
    return ConversationCounts(
        total=c["total"],
        done=c["done"],
        diverged=c["diverged"],
        failed=c["failed"],
        truncated=c["truncated"],
        ended_skipped=c["ended_skipped"],
        open=max(0, c["total"] - ended),
        not_started=c["not_started"],
        in_flight=c["in_flight"],
        waiting_on_parent=c["waiting_on_parent"],
        turns=turns,
        off_policy_turns=c["off_policy"],
    )


def conversation_turns(conn: sqlite3.Connection, run_id: int, conversation_id: str) -> list[TurnRow]:
    """Every turn of one conversation in order, with its verdict where it has a reconstruction (the conversation
    view; enter on a turn opens its token diff by `sample_id`)."""
    rows = conn.execute(
        "SELECT s.pk, s.sample_id, s.turn, s.turns, s.state, s.error_class, s.last_error, s.off_policy, r.category, "
        "r.n_tokens, r.first_diff FROM samples AS s LEFT JOIN reconstructions AS r ON r.sample_pk = s.pk "
        "WHERE s.run_id = ? AND s.conversation_id = ? ORDER BY s.turn",
        (run_id, conversation_id),
    ).fetchall()
    return [
        TurnRow(int(r[0]), str(r[1]), int(r[2]), int(r[3]), str(r[4]), r[5], r[6], bool(r[7]), r[8], r[9], r[10])
        for r in rows
    ]


def conversation_page(
    conn: sqlite3.Connection, run_id: int, *, after_pk: int = 0, limit: int = 50
) -> list[ConversationRow]:
    """Up to `limit` conversations in ingest order after the one whose turn 1 has row key `after_pk` (keyset
    paging: ~limit index entries at any depth), each with how it stands (`rows.conversation_status`)."""
    firsts = conn.execute(
        "SELECT pk, conversation_id, dataset, turns FROM samples WHERE run_id = ? AND turn = 1 AND pk > ? "
        "ORDER BY pk LIMIT ?",
        (run_id, after_pk, limit),
    ).fetchall()
    if not firsts:
        return []
    ids = json.dumps([r[1] for r in firsts])
    by_conv: dict[str, list[tuple[int, str, str | None, int]]] = {}
    for cid, turn, state, error_class, off in conn.execute(
        "SELECT s.conversation_id, s.turn, s.state, s.error_class, s.off_policy FROM json_each(?2) AS j "
        "CROSS JOIN samples AS s ON s.run_id = ?1 AND s.conversation_id = j.value ORDER BY s.conversation_id, "
        "s.turn",
        (run_id, ids),
    ):
        by_conv.setdefault(cid, []).append((int(turn), str(state), error_class, int(off)))
    out = []
    for pk, cid, dataset, turns in firsts:
        states = by_conv.get(cid, [])
        status, at = conversation_status([(t, s, e) for t, s, e, _ in states])
        out.append(
            ConversationRow(
                str(cid),
                str(dataset),
                int(turns),
                sum(1 for _, s, _, _ in states if s == "done"),
                status,
                at,
                any(o for *_, o in states),
                int(pk),
            )
        )
    return out


# ============================================================================================== mismatches


class SortCache:
    """Orders computed by sorting every match (no index serves them), kept SORT_CACHE_S per filter."""

    def __init__(self, ttl_s: float = SORT_CACHE_S) -> None:
        self.ttl_s = ttl_s
        self._orders: dict[tuple[Any, ...], tuple[float, list[int]]] = {}

    def get(self, key: tuple[Any, ...], compute: Callable[[], list[int]]) -> list[int]:
        """The cached order for `key`, or `compute()`'s (then kept)."""
        now = time.monotonic()
        hit = self._orders.get(key)
        if hit is None or now - hit[0] > self.ttl_s:
            hit = self._orders[key] = (now, compute())
        return hit[1]

    def clear(self) -> None:
        """Forget every order (the next page of each sorts again)."""
        self._orders.clear()


_COLUMNS = "r.sample_pk, r.category, r.first_diff, r.ref_len, r.n_tokens, r.n_diff"
_FROM = "reconstructions AS r"
# CROSS JOIN keeps reconstructions outermost: a text filter then reads only the chosen verdicts' rows.
_CROSS = "reconstructions AS r CROSS JOIN samples AS s ON s.pk = r.sample_pk"
# sort keys of the orders served by sorting in Python, over (pk, first_diff, n_diff, n_tokens); each ends in
# the pk, so pages are stable, and matches SQL's NULLS-last ordering of the indexed paths
_SORT_KEYS: dict[str, Callable[[tuple[Any, ...]], tuple[Any, ...]]] = {
    "first_diff": lambda r: (r[1] is None, r[1] or 0, r[0]),
    "n_diff": lambda r: (r[2] is None, -(r[2] or 0), r[0]),
    "longest": lambda r: (-(r[3] or 0), r[0]),
}


# orders served whole by one index over every reconstruction: order -> (index, column sorted descending)
_INDEXES = {"n_diff": ("reconstructions_by_run_n_diff", "n_diff")}


# The trigram index needs 3 characters; a 1-2 character filter (rare) falls back to the LIKE scan.
_TRIGRAM = 3


def _text_condition(text: str | None) -> tuple[str, list[Any]]:
    """The SQL (samples joined as `s`) matching `text` literally in a sample id, dataset or explanation.

    Three characters or more walk the trigram index `mismatch_text` (schema v5), and match the rows still
    queued for it (`mismatch_text_pending`, schema v6: at most a few thousand) with LIKE; both paths match a
    literal, case-insensitive (ASCII) substring, so results do not depend on the length of the text nor on
    whether a row is indexed yet. (CROSS JOIN keeps the queue the outer loop: the planner would otherwise walk
    every sample and look each up in the queue, 18 ms on 100k rows even with the queue empty.)
    """
    if not text:
        return "", []
    pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    if len(text) >= _TRIGRAM:
        phrase = '"' + text.replace('"', '""') + '"'  # one FTS5 phrase: every character literal
        sql = (
            " AND r.sample_pk IN (SELECT rowid FROM mismatch_text WHERE mismatch_text MATCH ?"
            " UNION ALL SELECT q.sample_pk FROM mismatch_text_pending q CROSS JOIN samples qs ON qs.pk = q.sample_pk"
            " CROSS JOIN reconstructions qr ON qr.sample_pk = q.sample_pk WHERE qs.sample_id LIKE ? ESCAPE '\\'"
            " OR qs.dataset LIKE ? ESCAPE '\\' OR qr.explanation LIKE ? ESCAPE '\\')"
        )
        return sql, [phrase, pattern, pattern, pattern]
    sql = " AND (s.sample_id LIKE ? ESCAPE '\\' OR s.dataset LIKE ? ESCAPE '\\' OR r.explanation LIKE ? ESCAPE '\\')"
    return sql, [pattern, pattern, pattern]


def _verdicts(verdicts: Iterable[str] | None) -> tuple[str, ...]:
    chosen = tuple(sorted({str(v) for v in (VERDICTS if verdicts is None else verdicts)}))
    unknown = [v for v in chosen if v not in VERDICTS]
    if unknown:
        raise ValueError(f"unknown verdicts {unknown}; expected some of {', '.join(VERDICTS)}")
    return chosen


def mismatch_count(
    conn: sqlite3.Connection, run_id: int, verdicts: Iterable[str] | None = MISMATCH_VERDICTS, text: str | None = None
) -> int:
    """How many rows `mismatch_page` pages through with the same filters (verdicts None: every verdict)."""
    chosen = _verdicts(verdicts)
    if not chosen:
        return 0
    text_sql, text_args = _text_condition(text)
    return conn.execute(
        f"SELECT COUNT(*) FROM {_CROSS if text_sql else _FROM} WHERE r.run_id = ? "
        f"AND r.category IN ({', '.join('?' * len(chosen))}){text_sql}",
        [run_id, *chosen, *text_args],
    ).fetchone()[0]


@dataclass(frozen=True)
class MismatchQuery:
    """What one page of the mismatch list asks for: the filter (`verdicts`, None: all; `text`), the sort
    (`order`, one of MISMATCH_ORDERS) and the page (`offset`, `limit`; with `after` / `before`, a row of the
    neighbouring page, the sample / recent / verdict / longest orders turn pages by key and `offset` is only
    reported back)."""

    verdicts: Iterable[str] | None = MISMATCH_VERDICTS
    text: str | None = None
    order: str = "sample"
    offset: int = 0
    limit: int = 50
    after: MismatchRow | None = None
    before: MismatchRow | None = None


def mismatch_page(
    conn: sqlite3.Connection, run_id: int, query: MismatchQuery | None = None, *, cache: SortCache | None = None
) -> MismatchPage:
    """One page of reconstructions as `query` asks (its filter, sort and page; None: the first page of the
    mismatches by sample). `cache` keeps sorted orders between calls (a RunReader passes its own)."""
    query = query if query is not None else MismatchQuery()
    verdicts, text, order = query.verdicts, query.text, query.order
    offset, limit, after, before = query.offset, query.limit, query.after, query.before
    if order not in MISMATCH_ORDERS:
        raise ValueError(f"unknown order {order!r}; expected one of {', '.join(MISMATCH_ORDERS)}")
    chosen = _verdicts(verdicts)
    offset, limit = max(0, offset), max(0, limit)
    if not chosen:
        return MismatchPage((), 0, offset)
    text_sql, text_args = _text_condition(text)
    q = _Query(conn, run_id, chosen, text_sql, text_args)
    total = mismatch_count(conn, run_id, chosen, text)
    if order in ("sample", "recent"):
        rows = q.by_sample(offset, limit, after, before, descending=order == "recent")
    elif order == "verdict":
        rows = q.by_verdict(offset, limit, after, before)
    elif order == "longest" and not text_sql:
        rows = q.by_length(offset, limit, after, before)
    else:
        rows = q.sorted(order, offset, limit, cache if cache is not None else SortCache(0.0))
    names = q.names([row[0] for row in rows])
    page = tuple(
        MismatchRow(names[pk][0], names[pk][1], category, first, ref_len, n_tokens, n_diff or 0, pk)
        for pk, category, first, ref_len, n_tokens, n_diff in rows
        if pk in names
    )
    return MismatchPage(page, total, offset)


class _Query:
    """The SQL of one mismatch_page call (connection, run, verdicts and text filter bound)."""

    def __init__(
        self, conn: sqlite3.Connection, run_id: int, verdicts: tuple[str, ...], text_sql: str, text_args: list[Any]
    ) -> None:
        self.conn, self.run_id, self.verdicts = conn, run_id, verdicts
        self.text_sql, self.text_args = text_sql, text_args
        self.source = _CROSS if text_sql else _FROM
        self.marks = ", ".join("?" * len(verdicts))

    def by_sample(
        self, offset: int, limit: int, after: MismatchRow | None, before: MismatchRow | None, *, descending: bool
    ) -> list[tuple[Any, ...]]:
        # One index range per verdict, each cut at `need` rows, merged: no sort over all matches.
        backwards = before is not None
        anchor = before.pk if before else after.pk if after else None
        skip = 0 if anchor is not None else offset
        down = descending != backwards  # the direction this query walks
        direction, compare = ("DESC", "<") if down else ("ASC", ">")
        if anchor is None:
            anchor = 2**63 - 1 if down else -1
        parts, args = [], []
        for verdict in self.verdicts:
            parts.append(
                f"SELECT * FROM (SELECT {_COLUMNS} FROM {self.source} WHERE r.run_id = ? AND r.category = ? "
                f"AND r.sample_pk {compare} ?{self.text_sql} ORDER BY r.sample_pk {direction} LIMIT ?)"
            )
            args += [self.run_id, verdict, anchor, *self.text_args, skip + limit]
        sql = " UNION ALL ".join(parts) + f" ORDER BY 1 {direction} LIMIT ? OFFSET ?"
        rows = self.conn.execute(sql, [*args, limit, skip]).fetchall()
        return rows[::-1] if backwards else rows

    def by_verdict(
        self, offset: int, limit: int, after: MismatchRow | None, before: MismatchRow | None
    ) -> list[tuple[Any, ...]]:
        where = f"r.run_id = ? AND r.category IN ({self.marks}){self.text_sql}"
        args: list[Any] = [self.run_id, *self.verdicts, *self.text_args]
        direction, skip = "ASC", offset
        key = after or before
        if key is not None:
            compare = ">" if after is not None else "<"
            where += f" AND (r.category {compare} ? OR (r.category = ? AND r.sample_pk {compare} ?))"
            args += [key.category, key.category, key.pk]
            direction, skip = ("ASC" if after is not None else "DESC"), 0
        rows = self.conn.execute(
            f"SELECT {_COLUMNS} FROM {self.source} WHERE {where} "
            f"ORDER BY r.category {direction}, r.sample_pk {direction} LIMIT ? OFFSET ?",
            [*args, limit, skip],
        ).fetchall()
        return rows[::-1] if direction == "DESC" else rows

    def by_length(
        self, offset: int, limit: int, after: MismatchRow | None, before: MismatchRow | None
    ) -> list[tuple[Any, ...]]:
        # Per verdict, (run, category, n_tokens DESC, sample_pk) index ranges cut at `need` keys, merged.
        # Turning a page by key reads two ranges per verdict from the anchor (its length's remaining
        # samples, then shorter / longer rows), about `limit` keys each, whatever the depth.
        key = after or before
        back = before is not None
        hint = "reconstructions AS r INDEXED BY reconstructions_by_run_category_length"
        skip = 0 if key is not None else offset
        need = skip + limit
        # walking forward: longest first, then sample order; backward: the exact reverse
        order = "r.n_tokens ASC, r.sample_pk DESC" if back else "r.n_tokens DESC, r.sample_pk ASC"
        parts, args = [], []
        for verdict in self.verdicts:
            ranges: list[tuple[str, list[Any]]] = [("", [])]
            if key is not None:
                ranges = [
                    (f" AND r.n_tokens = ? AND r.sample_pk {'<' if back else '>'} ?", [key.rec_len, key.pk]),
                    (f" AND r.n_tokens {'>' if back else '<'} ?", [key.rec_len]),
                ]
            for cond, cond_args in ranges:
                parts.append(
                    f"SELECT * FROM (SELECT r.sample_pk, r.n_tokens FROM {hint} WHERE r.run_id = ? "
                    f"AND r.category = ?{cond} ORDER BY {order} LIMIT ?)"
                )
                args += [self.run_id, verdict, *cond_args, need]
        merged = "2 ASC, 1 DESC" if back else "2 DESC, 1 ASC"  # 2: n_tokens, 1: sample_pk
        sql = " UNION ALL ".join(parts) + f" ORDER BY {merged} LIMIT ? OFFSET ?"
        pks = [row[0] for row in self.conn.execute(sql, [*args, limit, skip])]
        return self.rows_for(pks[::-1] if back else pks)

    def sorted(self, order: str, offset: int, limit: int, cache: SortCache) -> list[tuple[Any, ...]]:
        if not self.text_sql and order == "first_diff":
            # Rows with a first difference come in order from a partial index: a page reads about
            # offset + limit index entries. Only a page reaching past them (rows without one) sorts.
            pks = self._pks(
                "SELECT r.sample_pk FROM reconstructions AS r INDEXED BY reconstructions_by_run_first_diff "
                f"WHERE r.run_id = ? AND r.category IN ({self.marks}) AND r.first_diff IS NOT NULL "
                "ORDER BY r.first_diff, r.sample_pk LIMIT ? OFFSET ?",
                offset,
                limit,
            )
            if len(pks) == limit:
                return self.rows_for(pks)
        if not self.text_sql and order in _INDEXES:
            # These indexes hold every reconstruction (NULL n_diff, from rows written outside the store, last):
            # a page reads about offset + limit index entries and is complete even when short.
            index, column = _INDEXES[order]
            return self.rows_for(
                self._pks(
                    f"SELECT r.sample_pk FROM reconstructions AS r INDEXED BY {index} "
                    f"WHERE r.run_id = ? AND r.category IN ({self.marks}) "
                    f"ORDER BY r.{column} DESC, r.sample_pk LIMIT ? OFFSET ?",
                    offset,
                    limit,
                )
            )

        def compute() -> list[int]:
            rows = self.conn.execute(
                f"SELECT r.sample_pk, r.first_diff, r.n_diff, r.n_tokens FROM {self.source} "
                f"WHERE r.run_id = ? AND r.category IN ({self.marks}){self.text_sql}",
                [self.run_id, *self.verdicts, *self.text_args],
            ).fetchall()
            rows.sort(key=_SORT_KEYS[order])
            return [row[0] for row in rows]

        key = (self.run_id, self.verdicts, self.text_sql, tuple(self.text_args), order)
        return self.rows_for(cache.get(key, compute)[offset : offset + limit])

    def _pks(self, sql: str, offset: int, limit: int) -> list[int]:
        return [row[0] for row in self.conn.execute(sql, [self.run_id, *self.verdicts, limit, offset])]

    def rows_for(self, pks: list[int]) -> list[tuple[Any, ...]]:
        """The page's rows, in the order of `pks`."""
        if not pks:
            return []
        found = {
            row[0]: row
            for row in self.conn.execute(
                f"SELECT {_COLUMNS} FROM {_FROM} WHERE r.sample_pk IN ({', '.join('?' * len(pks))})", pks
            )
        }
        return [found[pk] for pk in pks if pk in found]

    def names(self, pks: list[int]) -> dict[int, tuple[str, str]]:
        """pk -> (sample id, dataset) of the page's samples."""
        if not pks:
            return {}
        rows = self.conn.execute(
            f"SELECT pk, sample_id, dataset FROM samples WHERE pk IN ({', '.join('?' * len(pks))})", pks
        )
        return {pk: (sample_id, dataset) for pk, sample_id, dataset in rows}


# ============================================================================================== one sample


def reconstruction_of(conn: sqlite3.Connection, run_id: int, sample_id: str) -> ReconstructionRow | None:
    """The sample's current reconstruction (reference ids: the row's, else the sample's), or None."""
    cur = conn.execute(
        f"SELECT {', '.join('r.' + c for c in RECONSTRUCTION_SELECT.split(', '))}, s.reference_ids AS sample_ref "
        "FROM reconstructions AS r JOIN samples AS s ON s.pk = r.sample_pk WHERE s.run_id = ? AND s.sample_id = ?",
        (run_id, sample_id),
    )
    row = cur.fetchone()
    if row is None:
        return None
    mapping = {d[0]: v for d, v in zip(cur.description, row)}
    if mapping["reference_ids"] is None:
        mapping["reference_ids"] = mapping["sample_ref"]
    return decode_reconstruction(mapping)


def sample_detail(
    conn: sqlite3.Connection, run_id: int, sample_id: str, *, keep_raw: bool = False
) -> SampleDetail | None:
    """The sample, its latest attempt and its verdict (None: no such sample). `keep_raw` is the run's
    `[run] keep_raw`, carried along so a face can say why a raw body is absent."""
    sample = conn.execute(
        "SELECT pk, sample_id, dataset, state, messages, last_error, reference_ids FROM samples "
        "WHERE run_id = ? AND sample_id = ?",
        (run_id, sample_id),
    ).fetchone()
    if sample is None:
        return None
    pk, sid, dataset, state, messages, last_error, reference = sample
    rec = conn.execute("SELECT category, strategy FROM reconstructions WHERE sample_pk = ?", (pk,)).fetchone()
    response = conn.execute(
        "SELECT endpoint, finish_reason, reasoning, content, tool_calls, usage, cost_usd, latency_ms, ttft_ms, "
        "error, raw FROM responses WHERE sample_pk = ? ORDER BY attempt DESC, id DESC LIMIT 1",
        (pk,),
    ).fetchone()
    common = dict(
        sample_id=sid,
        dataset=dataset,
        state=state,
        prompt=loads(messages, []),
        category=rec[0] if rec else None,
        strategy=rec[1] if rec else None,
        keep_raw=keep_raw,
        reference_ids=unpack_ids(reference),
        interventions=tuple((kind, detail) for _, kind, detail in sample_interventions(conn, pk)),
    )
    if response is None:
        return SampleDetail(**common, error=last_error)
    endpoint, finish, reasoning, content, calls, usage, cost, latency, ttft, error, raw = response
    if raw:
        value = loads(raw)
        if value is not None:  # re-indented for reading (orjson's indent keeps no non-ASCII choice)
            raw = json.dumps(value, indent=2, ensure_ascii=False)
    return SampleDetail(
        **common,
        reasoning=reasoning,
        content=content,
        tool_calls=loads(calls, []),
        usage=loads(usage, {}),
        cost_usd=cost or 0.0,
        latency_ms=latency,
        ttft_ms=ttft,
        endpoint=endpoint,
        finish_reason=finish,
        error=error or last_error,
        raw=raw,
    )


def latest_completions(conn: sqlite3.Connection, run_id: int) -> list[StoredCompletion]:
    """Each sample's latest successful attempt with content, as a Completion, in sample order."""
    cur = conn.execute(
        "SELECT s.pk AS sample_pk, s.sample_id AS sample_id, s.reference_ids AS sample_ref, r.* FROM samples s "
        "JOIN responses r ON r.id = (SELECT id FROM responses WHERE sample_pk = s.pk AND error_class IS NULL "
        "AND content IS NOT NULL ORDER BY attempt DESC, id DESC LIMIT 1) WHERE s.run_id = ? ORDER BY s.pk",
        (run_id,),
    )
    names = [d[0] for d in cur.description]
    out = []
    for values in cur:
        row = dict(zip(names, values))
        out.append(
            StoredCompletion(
                row["sample_pk"], row["sample_id"], row["id"], unpack_ids(row["sample_ref"]), decode_completion(row)
            )
        )
    return out


# ============================================================================================== events, jobs


def events_tail(conn: sqlite3.Connection, run_id: int | None, n: int = 100, *, after_id: int = 0) -> list[EventRow]:
    """The last n events of the run (None: events of no run), oldest first; `after_id` polls for new ones only."""
    if run_id is None:
        sql = "SELECT id, ts, level, kind, message FROM events WHERE run_id IS NULL AND id > ? ORDER BY id DESC LIMIT ?"
        args: tuple[Any, ...] = (after_id, n)
    else:
        sql = "SELECT id, ts, level, kind, message FROM events WHERE run_id = ? AND id > ? ORDER BY id DESC LIMIT ?"
        args = (run_id, after_id, n)
    return [EventRow(*r) for r in reversed(conn.execute(sql, args).fetchall())]


def job_summaries(conn: sqlite3.Connection, run_id: int, limit: int = 200) -> list[JobSummary]:
    """Jobs of the run (and jobs recorded without a run), newest first, with shard progress."""
    rows = conn.execute(
        "SELECT j.id, j.name, j.state, j.executor, j.n_shards, COALESCE(SUM(sh.state = 'done'), 0), "
        "COALESCE(SUM(sh.tokens), 0), j.updated_at, MAX(sh.log_path) "
        "FROM jobs AS j LEFT JOIN job_shards AS sh ON sh.job_id = j.id "
        "WHERE j.run_id = ? OR j.run_id IS NULL GROUP BY j.id ORDER BY j.id DESC LIMIT ?",
        (run_id, limit),
    ).fetchall()
    return [JobSummary(*r) for r in rows]


def latest_shard_log(conn: sqlite3.Connection, job_id: int) -> tuple[int, Path] | None:
    """(shard, log path) of the job's most recently updated shard that has a log, or None."""
    row = conn.execute(
        "SELECT shard, log_path FROM job_shards WHERE job_id = ? AND log_path IS NOT NULL "
        "ORDER BY updated_at DESC, shard DESC LIMIT 1",
        (job_id,),
    ).fetchone()
    return (row[0], Path(row[1])) if row else None


# ============================================================================================== one run, shared


class RunReader:
    """One run of one database for a face that queries from thread workers: one connection, one lock."""

    def __init__(self, database: Path, run_name: str | None = None) -> None:
        self.database = Path(database)
        self._conn = connect_readonly(self.database)
        self._lock = threading.Lock()
        self.sort_cache = SortCache()
        try:
            run = resolve_run(self._conn, run_name, db_label=str(self.database))
        except BaseException:
            self._conn.close()
            raise
        self.run: RunRow = run

    @property
    def run_id(self) -> int:
        return self.run.id

    @property
    def run_name(self) -> str:
        return self.run.name

    @property
    def keep_raw(self) -> bool:
        """The run's `[run] keep_raw`, as stored with its config."""
        return bool((self.run.config.get("run") or {}).get("keep_raw"))

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(connection, *args, **kwargs) under the lock (any read function of this module, or another's)."""
        with self._lock:
            return fn(self._conn, *args, **kwargs)

    def mismatch_page(
        self,
        verdicts: Sequence[str],
        text: str,
        order: str,
        offset: int,
        limit: int,
        *,
        after: MismatchRow | None = None,
        before: MismatchRow | None = None,
    ) -> MismatchPage:
        """`mismatch_page` over this run, with this reader's sort cache."""
        query = MismatchQuery(verdicts, text, order, offset, limit, after, before)
        return self.call(mismatch_page, self.run_id, query, cache=self.sort_cache)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()


# ============================================================================================== time series
# The dashboard's plots (throughput, measured match rate, cost over time) in both faces: per 10 s bucket of
# wall-clock time, read by rowid range after a cursor so a face reads each stored row once (an attached
# viewer of a 1M-sample run catches up in chunks of SERIES_CHUNK ids, then reads only what is new).

SERIES_BUCKET_S = 10  # the engine's HISTORY_BUCKET_S: one bucket of the throughput history
SERIES_CHUNK = 250_000  # ids read per call at most (bounds one poll's cost while catching up)


@dataclass(frozen=True, slots=True)
class SeriesBucket:
    """One 10 s bucket (`bucket` * SERIES_BUCKET_S is its unix start): output tokens and count of successful
    responses, cost of every attempt, measured answers (true ids whose text-only reconstruction was compared) and how
    many of them matched (the same text), and when
    its first and last attempts were stored (where a plot's time axis starts and, once the run ends, stops)."""

    bucket: int
    tokens: int = 0
    responses: int = 0
    cost_usd: float = 0.0
    measured: int = 0
    matched: int = 0
    first_at: float | None = None  # the earliest and latest response stored in this bucket (None: none)
    last_at: float | None = None


@dataclass(frozen=True, slots=True)
class SeriesChunk:
    """What `series_since` read: the buckets touched by rows with ids in (cursor, new cursor], the new cursors,
    and whether it reached the newest rows (False: call again to catch up)."""

    buckets: tuple[SeriesBucket, ...]
    response_cursor: int
    reconstruction_cursor: int
    caught_up: bool


def series_since(
    conn: sqlite3.Connection,
    run_id: int,
    response_cursor: int = 0,
    reconstruction_cursor: int = 0,
    *,
    chunk: int = SERIES_CHUNK,
) -> SeriesChunk:
    """The run's responses and measured reconstructions stored after the cursors (row ids), summed per bucket.

    Each table is read by one rowid range of at most `chunk` ids (`+run_id` keeps the planner off the run
    indexes, which would read the whole run for every call); a measured
    reconstruction carries the `text_path:<verdict>` flag (app.tokens.flags), and it matched when that
    verdict is benign (app.records.BENIGN_VERDICTS: the same text), as the record's measured counts have it.
    """
    from app.records import BENIGN_VERDICTS
    from app.tokens.flags import TEXT_PATH

    sums: dict[int, list] = {}
    newest_response = conn.execute("SELECT MAX(id) FROM responses").fetchone()[0] or 0
    top_response = min(newest_response, response_cursor + chunk)
    for b, tokens, ok, cost, first, last in conn.execute(
        f"SELECT CAST(created_at / {SERIES_BUCKET_S} AS INTEGER) AS b, "
        "SUM(CASE WHEN error_class IS NULL THEN completion_tokens ELSE 0 END), SUM(error_class IS NULL), "
        "SUM(cost_usd), MIN(created_at), MAX(created_at) FROM responses WHERE id > ? AND id <= ? AND +run_id = ? "
        "GROUP BY b",
        (response_cursor, top_response, run_id),
    ):
        sums[int(b)] = [int(tokens or 0), int(ok or 0), float(cost or 0.0), 0, 0, first, last]
    newest_rec = conn.execute("SELECT MAX(id) FROM reconstructions").fetchone()[0] or 0
    top_rec = min(newest_rec, reconstruction_cursor + chunk)
    benign = {str(v) for v in BENIGN_VERDICTS}
    for created, flags in conn.execute(
        "SELECT created_at, flags FROM reconstructions WHERE id > ? AND id <= ? AND +run_id = ? "
        "AND instr(flags, ?) > 0",
        (reconstruction_cursor, top_rec, run_id, TEXT_PATH),
    ):
        verdict = _text_path_verdict(flags, TEXT_PATH)
        if verdict is None:
            continue
        row = sums.setdefault(int(created // SERIES_BUCKET_S), [0, 0, 0.0, 0, 0, None, None])
        row[3] += 1
        row[4] += verdict in benign
    buckets = tuple(SeriesBucket(b, *row) for b, row in sorted(sums.items()))
    return SeriesChunk(buckets, top_response, top_rec, top_response == newest_response and top_rec == newest_rec)


def _text_path_verdict(flags: str, prefix: str) -> str | None:
    """The verdict after `prefix` in a flags column (a JSON list; a plain comma list is tolerated)."""
    try:
        items = json.loads(flags)
    except ValueError:
        items = flags.split(",")
    if not isinstance(items, list):
        return None
    return next((str(f)[len(prefix) :] for f in items if str(f).startswith(prefix)), None)


__all__ += ["SERIES_BUCKET_S", "SeriesBucket", "SeriesChunk", "series_since"]


# ---------------------------------------------------------------------------------------------- the mix


@dataclass(frozen=True, slots=True)
class MixRow:
    """One (dataset, category) of a run: `prompts` ingested, `answers` reconstructed, `loss_tokens` (the output
    tokens a drafter trains on), and how many answers hold reasoning or tool calls."""

    dataset: str
    category: str
    prompts: int
    answers: int
    loss_tokens: int
    reasoning: int
    tool_calls: int
    languages: tuple[tuple[str, int], ...] = ()  # prompts per script (app.datasets.script_of), most first

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, with the shares of answers that reason and that call tools."""
        out = asdict(self)
        out["languages"] = dict(self.languages)
        out["reasoning_share"] = round(self.reasoning / self.answers, 4) if self.answers else None
        out["tool_call_share"] = round(self.tool_calls / self.answers, 4) if self.answers else None
        return out

    @property
    def label(self) -> str:
        """`dataset` when the row's category is the dataset's name (no category column), else `dataset · category`."""
        return self.dataset if self.category == self.dataset else f"{self.dataset} · {self.category}"

    def top_languages(self, n: int) -> tuple[tuple[str, float], ...]:
        """The `n` scripts most of this row's prompts are in, each with its share of the row's prompts (0..1)."""
        return tuple((script, count / self.prompts) for script, count in self.languages[:n] if self.prompts)


def mix_total(rows: Sequence[MixRow]) -> MixRow:
    """The whole run as one MixRow (dataset and category "all"): the sum of `rows`, its scripts merged, most first."""
    languages: dict[str, int] = {}
    for row in rows:
        for script, count in row.languages:
            languages[script] = languages.get(script, 0) + count
    return MixRow(
        "all",
        "all",
        sum(r.prompts for r in rows),
        sum(r.answers for r in rows),
        sum(r.loss_tokens for r in rows),
        sum(r.reasoning for r in rows),
        sum(r.tool_calls for r in rows),
        tuple(sorted(languages.items(), key=lambda item: (-item[1], item[0]))),
    )


# a sample's answer is its latest response with content (a retried sample has failed attempts before it); loss
# tokens are that answer's completion tokens
_MIX = (
    "SELECT s.dataset, COALESCE(s.category, s.dataset), COUNT(*), COUNT(p.id), "
    "COALESCE(SUM(p.completion_tokens), 0), "
    "COALESCE(SUM(p.reasoning_tokens > 0 OR COALESCE(p.reasoning, '') != ''), 0), "
    "COALESCE(SUM(COALESCE(p.tool_calls, '') NOT IN ('', '[]', 'null')), 0) "
    "FROM samples AS s "
    "LEFT JOIN (SELECT sample_pk, MAX(id) AS id FROM responses WHERE run_id = ?1 AND content IS NOT NULL "
    "           GROUP BY sample_pk) AS a ON a.sample_pk = s.pk "
    "LEFT JOIN responses AS p ON p.id = a.id "
    "WHERE s.run_id = ?1 GROUP BY 1, 2 ORDER BY 1, 2"
)


_LANGUAGES = (
    "SELECT dataset, COALESCE(category, dataset), COALESCE(language, 'unknown'), COUNT(*) FROM samples "
    "WHERE run_id = ? GROUP BY 1, 2, 3 ORDER BY 4 DESC, 3"
)


def dataset_mix(conn: sqlite3.Connection, run_id: int) -> tuple[MixRow, ...]:
    """The run's mix by (dataset, category), in name order, with its prompts' scripts."""
    languages: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for dataset, category, language, n in conn.execute(_LANGUAGES, (run_id,)):
        languages.setdefault((dataset, category), []).append((language, n))
    return tuple(
        MixRow(
            dataset, category, prompts, answers, loss, reasoning, tools, tuple(languages.get((dataset, category), ()))
        )
        for dataset, category, prompts, answers, loss, reasoning, tools in conn.execute(_MIX, (run_id,))
    )


__all__ += ["MixRow", "dataset_mix", "mix_total"]


# ============================================================================================== eval runs


def run_kind(conn: sqlite3.Connection, run_id: int) -> str:
    """'eval' or 'generate' (schema v11 (eval)'s `runs.kind`)."""
    row = conn.execute("SELECT kind FROM runs WHERE id = ?", (run_id,)).fetchone()
    return row[0] if row else "generate"


def eval_requests(conn: sqlite3.Connection, run_id: int) -> list[EvalRequestRow]:
    """Every stored request of an eval run, in the order they were answered."""
    return [
        decode_eval_request(r)
        for r in conn.execute(
            f"SELECT {EVAL_REQUEST_COLUMNS} FROM eval_requests WHERE run_id = ? ORDER BY id", (run_id,)
        )
    ]
