"""The run store's maintained tallies (schema versions 3 and 6): per-run counts read in
O(states + endpoints + verdicts).

Triggers keep `sample_tallies` (UPDATE / DELETE), `response_tallies`, `reconstruction_tallies` and
`quality_tallies` (v6: answers per endpoint, provider and what they are) in the writers' own transactions; sample
INSERTs are counted by `RunStore.ingest` per chunk (`add_ingested`).
A tool that inserts samples with plain SQL must call `recount(conn)` afterwards; until it does, readers
notice (MAX(samples.pk) is above `tally_marks.samples_max_pk`) and count the samples table instead.
Every reader here takes any sqlite3 connection (read-only is fine) and returns plain dicts / tuples.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from app.store.schema import QUALITY_RECOUNT

__all__ = [
    "ResponseTally",
    "QualityTally",
    "add_ingested",
    "add_ingested_rows",
    "samples_current",
    "sample_counts",
    "failed_by_class",
    "final_failures_by_endpoint",
    "response_tallies",
    "verdict_counts",
    "strategy_counts",
    "quality_tallies",
    "response_span",
    "recount",
]

_MARK = "samples_max_pk"
_SAMPLE_KEY = "CASE WHEN state = 'failed' THEN COALESCE(error_class, '') ELSE '' END"
_TURN_KEY = "CASE WHEN state IN ('failed', 'skipped') THEN COALESCE(error_class, '') ELSE '' END"


@dataclass(frozen=True, slots=True)
class ResponseTally:
    """Responses of one run at one endpoint with one outcome (ok, or failed with `error_class`)."""

    endpoint: str
    ok: bool
    error_class: str | None  # None when ok
    n: int
    truncated: int
    cost_usd: float
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class QualityTally:
    """Stored answers (reconstructions) of one run that share an endpoint, upstream provider, verdict, ids source
    (server | logprobs | text), text-path verdict ('' not measured), suspect flag, truncation and prompt check
    ('' not checked)."""

    endpoint: str  # '' when the answer has no response row
    provider: str | None  # None when the endpoint reported none
    category: str
    ids_source: str
    text_path: str
    suspect: bool
    truncated: bool
    prompt_check: str
    n: int


# ---------------------------------------------------------------------------------------------- writers


def _max_pk(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COALESCE(MAX(pk), 0) FROM samples").fetchone()[0])


def _mark(conn: sqlite3.Connection) -> int | None:
    row = conn.execute("SELECT value FROM tally_marks WHERE name = ?", (_MARK,)).fetchone()
    return None if row is None else int(row[0])


def add_ingested(conn: sqlite3.Connection, run_id: int, added: int, max_pk_before: int) -> None:
    """Count `added` newly inserted pending samples of `run_id` (call in the inserting transaction).

    `max_pk_before` is MAX(samples.pk) just before the insert: the mark advances only if the tally was
    complete then, so rows inserted earlier behind the tally's back keep readers on the exact count.
    """
    if added:
        conn.execute(
            "INSERT INTO sample_tallies (run_id, state, error_class, n) VALUES (?, 'pending', '', ?) "
            "ON CONFLICT (run_id, state, error_class) DO UPDATE SET n = n + excluded.n",
            (run_id, added),
        )
    if _mark(conn) == max_pk_before:
        conn.execute("UPDATE tally_marks SET value = ? WHERE name = ?", (_max_pk(conn), _MARK))


def add_ingested_rows(conn: sqlite3.Connection, run_id: int, max_pk_before: int) -> None:
    """Count the samples of `run_id` inserted above `max_pk_before` by state (pending, and waiting for a
    conversation's later turns), and the conversation turns among them in `turn_tallies` (schema v8); call in the
    inserting transaction, as `add_ingested`."""
    conn.execute(
        "INSERT INTO sample_tallies (run_id, state, error_class, n) "
        "SELECT run_id, state, '', COUNT(*) FROM samples WHERE run_id = ? AND pk > ? GROUP BY state "
        "ON CONFLICT (run_id, state, error_class) DO UPDATE SET n = n + excluded.n",
        (run_id, max_pk_before),
    )
    conn.execute(
        "INSERT INTO turn_tallies (run_id, state, first, last, off_policy, error_class, n) "
        "SELECT run_id, state, turn = 1, turn = turns, off_policy, '', COUNT(*) FROM samples "
        "WHERE run_id = ? AND pk > ? AND conversation_id IS NOT NULL GROUP BY 2, 3, 4, 5 "
        "ON CONFLICT (run_id, state, first, last, off_policy, error_class) DO UPDATE SET n = n + excluded.n",
        (run_id, max_pk_before),
    )
    if _mark(conn) == max_pk_before:
        conn.execute("UPDATE tally_marks SET value = ? WHERE name = ?", (_max_pk(conn), _MARK))


def recount(conn: sqlite3.Connection, run_id: int | None = None) -> None:
    """Rebuild the tallies of `run_id` (every run when None) from the rows themselves, in one savepoint."""
    where, args = ("", ()) if run_id is None else (" WHERE run_id = ?", (run_id,))
    conn.execute("SAVEPOINT tally_recount")
    try:
        for table in (
            "sample_tallies",
            "response_tallies",
            "reconstruction_tallies",
            "quality_tallies",
            "turn_tallies",
        ):
            conn.execute(f"DELETE FROM {table}{where}", args)
        conn.execute(
            "INSERT INTO turn_tallies (run_id, state, first, last, off_policy, error_class, n) "
            f"SELECT run_id, state, turn = 1, turn = turns, off_policy, {_TURN_KEY}, COUNT(*) FROM samples"
            f"{where or ' WHERE 1'} AND conversation_id IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6",
            args,
        )
        conn.execute(
            f"INSERT INTO sample_tallies (run_id, state, error_class, n) SELECT run_id, state, {_SAMPLE_KEY}, COUNT(*) "
            f"FROM samples{where} GROUP BY 1, 2, 3",
            args,
        )
        conn.execute(
            "INSERT INTO response_tallies (run_id, endpoint, ok, error_class, n, truncated, cost_usd, "
            "completion_tokens) "
            "SELECT run_id, endpoint, error_class IS NULL, COALESCE(error_class, ''), COUNT(*), "
            "SUM(error_class IS NULL AND finish_reason IS 'length'), TOTAL(cost_usd), SUM(completion_tokens) "
            f"FROM responses{where} GROUP BY 1, 2, 3, 4",
            args,
        )
        conn.execute(
            "INSERT INTO reconstruction_tallies (run_id, category, strategy, n) "
            f"SELECT run_id, category, strategy, COUNT(*) FROM reconstructions{where} GROUP BY 1, 2, 3",
            args,
        )
        conn.execute(QUALITY_RECOUNT.format(where=where.replace("run_id", "r.run_id")), args)
        mark = _mark(conn)
        others_behind = (
            run_id is not None
            and mark is not None
            and conn.execute("SELECT 1 FROM samples WHERE pk > ? AND run_id != ? LIMIT 1", (mark, run_id)).fetchone()
            is not None
        )
        if not others_behind:
            conn.execute(
                "INSERT INTO tally_marks (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = "
                "excluded.value",
                (_MARK, _max_pk(conn)),
            )
    except BaseException:
        conn.execute("ROLLBACK TO tally_recount")
        conn.execute("RELEASE tally_recount")
        raise
    conn.execute("RELEASE tally_recount")


# ---------------------------------------------------------------------------------------------- readers


def samples_current(conn: sqlite3.Connection) -> bool:
    """Whether sample_tallies includes every sample row (False after a plain-SQL insert, until recount)."""
    mark = _mark(conn)
    return mark is not None and _max_pk(conn) <= mark


def sample_counts(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Samples per state (only states the run has); counted from the table when the tally is behind."""
    if samples_current(conn):
        rows = conn.execute(
            "SELECT state, SUM(n) FROM sample_tallies WHERE run_id = ? GROUP BY state HAVING SUM(n) != 0", (run_id,)
        ).fetchall()
    else:
        rows = conn.execute("SELECT state, COUNT(*) FROM samples WHERE run_id = ? GROUP BY state", (run_id,)).fetchall()
    return {str(state): int(n) for state, n in rows}


def failed_by_class(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Failed samples per error class (samples whose error_class is NULL are left out)."""
    if samples_current(conn):
        rows = conn.execute(
            "SELECT error_class, n FROM sample_tallies WHERE run_id = ? AND state = 'failed' AND error_class != '' "
            "AND n != 0",
            (run_id,),
        ).fetchall()
    else:
        rows = conn.execute(
            "SELECT error_class, COUNT(*) FROM samples WHERE run_id = ? AND state = 'failed' "
            "AND error_class IS NOT NULL GROUP BY error_class",
            (run_id,),
        ).fetchall()
    return {str(k): int(n) for k, n in rows}


def final_failures_by_endpoint(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Failed samples per endpoint of their last request: what the engine's per-endpoint `failed` counts
    (`EndpointMetrics.record_error(final=True)`), so both faces give the column one meaning. Samples that failed
    before any request reached an endpoint are left out. One index probe per failed sample (samples_by_run_state,
    then responses_by_sample): failed samples are few."""
    rows = conn.execute(
        "SELECT r.endpoint, COUNT(*) FROM samples s JOIN responses r ON r.sample_pk = s.pk "
        "AND r.attempt = (SELECT MAX(attempt) FROM responses WHERE sample_pk = s.pk) "
        "WHERE s.run_id = ? AND s.state = 'failed' AND r.error_class IS NOT NULL GROUP BY r.endpoint",
        (run_id,),
    ).fetchall()
    return {str(k): int(n) for k, n in rows if k}


def response_tallies(conn: sqlite3.Connection, run_id: int) -> list[ResponseTally]:
    """The run's response tallies, by endpoint then outcome (rows with no response left are skipped)."""
    rows = conn.execute(
        "SELECT endpoint, ok, error_class, n, truncated, cost_usd, completion_tokens FROM response_tallies "
        "WHERE run_id = ? AND n != 0 ORDER BY endpoint, ok DESC, error_class",
        (run_id,),
    ).fetchall()
    return [
        ResponseTally(str(r[0]), bool(r[1]), None if r[1] else str(r[2]), int(r[3]), int(r[4]), float(r[5]), int(r[6]))
        for r in rows
    ]


def verdict_counts(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Reconstructions per verdict category (only categories present)."""
    rows = conn.execute(
        "SELECT category, SUM(n) FROM reconstruction_tallies WHERE run_id = ? GROUP BY category HAVING SUM(n) != 0",
        (run_id,),
    ).fetchall()
    return {str(k): int(n) for k, n in rows}


def strategy_counts(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Reconstructions per strategy (only strategies present)."""
    rows = conn.execute(
        "SELECT strategy, SUM(n) FROM reconstruction_tallies WHERE run_id = ? GROUP BY strategy HAVING SUM(n) != 0",
        (run_id,),
    ).fetchall()
    return {str(k): int(n) for k, n in rows}


def quality_tallies(conn: sqlite3.Connection, run_id: int) -> list[QualityTally]:
    """The run's stored answers grouped by endpoint, provider and what they are (rows with none left skipped)."""
    rows = conn.execute(
        "SELECT endpoint, provider, category, ids_source, text_path, suspect, truncated, prompt_check, n "
        "FROM quality_tallies WHERE run_id = ? AND n != 0",
        (run_id,),
    ).fetchall()
    return [
        QualityTally(str(e), str(p) or None, str(c), str(s), str(t), bool(su), bool(tr), str(pc), int(n))
        for e, p, c, s, t, su, tr, pc, n in rows
    ]


def response_span(conn: sqlite3.Connection, run_id: int) -> tuple[float | None, float | None]:
    """(first, last) time a response of the run was stored (unix s; None, None before any): two probes of the
    (run_id, created_at) index."""
    first = conn.execute("SELECT MIN(created_at) FROM responses WHERE run_id = ?", (run_id,)).fetchone()[0]
    last = conn.execute("SELECT MAX(created_at) FROM responses WHERE run_id = ?", (run_id,)).fetchone()[0]
    return first, last
