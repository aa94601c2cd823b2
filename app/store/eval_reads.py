"""The eval monitor's reads of an eval run (schema v11 (eval)): the light rows a running tally needs, read by id
after a cursor (each stored request is read once), a page of requests for the requests table, one request whole,
and the figures that change rarely (the prompts to send, the run's state).

The tally and the page walk `eval_requests`' rowid (`id > ?`, the table's primary key; `+run_id` keeps SQLite off
the `(run_id, endpoint, id)` index, which would read every row of the run and sort them), so a poll over a run of
100k requests reads only what was stored since the last one.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from app.store.rows import EVAL_REQUEST_COLUMNS, EvalRequestRow, decode_eval_request, loads

TALLY_CHUNK = 3_000  # rows read per poll at most: a viewer catching up stays well under 50 ms a poll (52 ms at 5,000)


@dataclass(frozen=True, slots=True)
class EvalTallyRow:
    """What a running tally needs of one stored request (no output ids, no raw figures)."""

    id: int
    sample_pk: int
    endpoint: str
    category: str | None
    failed: bool
    completion_tokens: int
    tokens_per_s: float | None
    ttft_ms: float | None
    itl_ms: float | None
    accepted: int | None
    steps: int | None
    drafted: int | None
    per_position: tuple[int, ...] | None
    loop: bool
    measured: bool  # the server reported acceptance figures (spec_source set)
    created_at: float


@dataclass(frozen=True, slots=True)
class EvalRequestLine:
    """One line of the requests table."""

    id: int
    sample_id: str
    endpoint: str
    category: str | None
    error: str | None
    completion_tokens: int
    tokens_per_s: float | None
    accepted: int | None
    steps: int | None
    loop: bool

    @property
    def acceptance_length(self) -> float | None:
        return None if not self.steps or self.accepted is None else 1.0 + self.accepted / self.steps


def tally_rows_after(
    conn: sqlite3.Connection, run_id: int, after_id: int, limit: int = TALLY_CHUNK
) -> list[EvalTallyRow]:
    """Up to `limit` of the run's stored requests with an id above `after_id`, in id order."""
    out: list[EvalTallyRow] = []
    for r in conn.execute(
        "SELECT id, sample_pk, endpoint, category, error IS NOT NULL, completion_tokens, tokens_per_s, ttft_ms, "
        "itl_ms, accepted, steps, drafted, per_position, loop, spec_source IS NOT NULL, created_at "
        "FROM eval_requests WHERE id > ? AND +run_id = ? ORDER BY id LIMIT ?",
        (after_id, run_id, limit),
    ):
        per_position = loads(r[12]) if r[12] is not None else None
        out.append(
            EvalTallyRow(
                r[0],
                r[1],
                r[2],
                r[3],
                bool(r[4]),
                r[5],
                r[6],
                r[7],
                r[8],
                r[9],
                r[10],
                r[11],
                tuple(per_position) if isinstance(per_position, list) else None,
                bool(r[13]),
                bool(r[14]),
                r[15],
            )  # fmt: skip
        )
    return out


def prompts_to_send(conn: sqlite3.Connection, run_id: int) -> int:
    """The run's prompts that are sent (not skipped): an eval sends each to each of its endpoints."""
    return conn.execute("SELECT COUNT(*) FROM samples WHERE run_id = ? AND state != 'skipped'", (run_id,)).fetchone()[0]


def run_state(conn: sqlite3.Connection, run_id: int) -> tuple[str, str | None, float]:
    """(state, reason, updated_at) of the run."""
    row = conn.execute("SELECT state, reason, updated_at FROM runs WHERE id = ?", (run_id,)).fetchone()
    return (row[0], row[1], row[2] or 0.0) if row else ("idle", None, 0.0)


def request_lines(
    conn: sqlite3.Connection, run_id: int, *, before_id: int | None = None, limit: int = 200
) -> list[EvalRequestLine]:
    """A page of the run's requests, newest first, below `before_id` (None: from the newest)."""
    rows = conn.execute(
        "SELECT e.id, s.sample_id, e.endpoint, e.category, e.error, e.completion_tokens, e.tokens_per_s, e.accepted, "
        "e.steps, e.loop FROM eval_requests e JOIN samples s ON s.pk = e.sample_pk "
        "WHERE e.id < ? AND +e.run_id = ? ORDER BY e.id DESC LIMIT ?",
        (before_id if before_id is not None else 2**62, run_id, limit),
    )
    return [EvalRequestLine(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], bool(r[9])) for r in rows]


def request_whole(conn: sqlite3.Connection, run_id: int, request_id: int) -> tuple[str, EvalRequestRow] | None:
    """(sample id, the stored row) of one request of the run, or None."""
    row = conn.execute(
        f"SELECT s.sample_id, {', '.join('e.' + c.strip() for c in EVAL_REQUEST_COLUMNS.split(','))} "
        "FROM eval_requests e JOIN samples s ON s.pk = e.sample_pk WHERE e.id = ? AND e.run_id = ?",
        (request_id, run_id),
    ).fetchone()
    return None if row is None else (row[0], decode_eval_request(row[1:]))
