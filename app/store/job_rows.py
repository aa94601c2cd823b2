"""The jobs tables' statements and row codecs (`jobs`, `job_shards` of `app.store.schema`).

The launcher keeps job state through a plain synchronous `sqlite3` connection of its own (`connect`: WAL,
busy timeout, migrated first), apart from the run store's async writer: job state changes are rare (a few
per second at most), and any process — the launcher, the monitor, `eaglewatch jobs cancel` — opens the same
file, so the database is the control channel between them. `app.jobs.store.JobStore` is the only caller;
it turns the spec JSON into a `JobSpec` (the store does not know the jobs package).

Every write function runs its statements in the caller's transaction: wrap a change in `immediate(conn)`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.errors import InputError
from app.store.db import configure, connect_readonly, migrate
from app.store.rows import JobShardRow

FINAL_STATES = frozenset({"done", "failed", "cancelled"})
# the columns a job's and a shard's updates may set (updated_at is always set)
JOB_FIELDS = frozenset({"state", "external_id", "error", "started_at", "ended_at"})
SHARD_FIELDS = (
    "state",
    "pid",
    "external_id",
    "done",
    "total",
    "tokens",
    "exit_code",
    "log_path",
    "output_path",
    "error",
    "started_at",
    "ended_at",
)
_SHARD_SELECT = ", ".join(("job_id", "shard", *SHARD_FIELDS))
_JOB_SELECT = (
    "id, name, executor, state, n_shards, output_dir, external_id, error, created_at, started_at, ended_at, spec"
)


@dataclass(frozen=True, slots=True)
class JobRow:
    """One row of `jobs`; `spec` is the JobSpec as the JSON it was stored as."""

    id: int
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
    spec: str


def connect(path: Path, *, create: bool = True) -> sqlite3.Connection:
    """Open (creating and migrating if needed) the run database for job bookkeeping, in autocommit mode."""
    path = Path(path)
    # job bookkeeping opens the database on every poll: the whole-file quick_check is left to the verbs that
    # open it once (run, ingest, export, status)
    migrate(path, create=create, check=False)
    try:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        configure(conn, busy_timeout_s=30.0)
    except sqlite3.DatabaseError as exc:
        raise InputError(
            f"{path}: cannot be used as a run database ({exc}); pass the eaglewatch.db of the run"
        ) from exc
    return conn


def connect_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection for faces that poll job state (no write lock; safe from a thread)."""
    return connect_readonly(Path(path), check=False)


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One short write transaction (BEGIN IMMEDIATE: the write lock is taken up front), rolled back on error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def insert_job(
    conn: sqlite3.Connection,
    *,
    run_id: int | None,
    name: str,
    executor: str,
    spec: str,
    output_dir: str,
    shard_logs: Sequence[tuple[int, str]],
    now: float,
) -> int:
    """Insert a pending job and its pending shards (shard number, stdout log path); return the job id."""
    cur = conn.execute(
        "INSERT INTO jobs (run_id, name, executor, spec, state, n_shards, output_dir, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
        (run_id, name, executor, spec, len(shard_logs), output_dir, now, now),
    )
    assert cur.lastrowid is not None  # an INSERT sets it
    job_id = cur.lastrowid
    conn.executemany(
        "INSERT INTO job_shards (job_id, shard, state, log_path, updated_at) VALUES (?, ?, 'pending', ?, ?)",
        [(job_id, shard, log, now) for shard, log in shard_logs],
    )
    return job_id


def job_row(conn: sqlite3.Connection, job_id: int) -> JobRow | None:
    """The job with this id, or None."""
    row = conn.execute(f"SELECT {_JOB_SELECT} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return JobRow(*row) if row is not None else None


def job_rows(conn: sqlite3.Connection) -> list[JobRow]:
    """Every job, newest first."""
    return [JobRow(*r) for r in conn.execute(f"SELECT {_JOB_SELECT} FROM jobs ORDER BY id DESC")]


def update_job(conn: sqlite3.Connection, job_id: int, fields: Mapping[str, object], now: float) -> None:
    """Set the given columns of one job (names from JOB_FIELDS) and its updated_at."""
    _check_columns(fields, JOB_FIELDS, "jobs")
    cols = "".join(f"{k} = ?, " for k in fields)
    conn.execute(f"UPDATE jobs SET {cols}updated_at = ? WHERE id = ?", (*fields.values(), now, job_id))


def shard_rows(conn: sqlite3.Connection, job_id: int) -> list[JobShardRow]:
    """The job's shards in shard order."""
    rows = conn.execute(f"SELECT {_SHARD_SELECT} FROM job_shards WHERE job_id = ? ORDER BY shard", (job_id,))
    return [JobShardRow(*r) for r in rows]


def update_shard(conn: sqlite3.Connection, job_id: int, shard: int, fields: Mapping[str, object], now: float) -> None:
    """Set the given columns of one shard (names from SHARD_FIELDS) and its updated_at."""
    _check_columns(fields, SHARD_FIELDS, "job_shards")
    cols = "".join(f"{k} = ?, " for k in fields)
    conn.execute(
        f"UPDATE job_shards SET {cols}updated_at = ? WHERE job_id = ? AND shard = ?",
        (*fields.values(), now, job_id, shard),
    )


def cancel_shards(conn: sqlite3.Connection, job_id: int, shards: Iterable[int], now: float) -> None:
    """Mark these shards cancelled by the operator, each only while it is not yet in a final state."""
    conn.executemany(
        "UPDATE job_shards SET state = 'cancelled', error = 'cancelled by operator', ended_at = ?, updated_at = ?"
        " WHERE job_id = ? AND shard = ? AND state NOT IN ('done','failed','cancelled')",
        [(now, now, job_id, shard) for shard in shards],
    )


def _check_columns(fields: Mapping[str, object], allowed: Iterable[str], table: str) -> None:
    # column names go into the statement's text: only known ones, so a caller's typo fails loudly here
    unknown = sorted(set(fields) - set(allowed))
    if unknown:
        raise ValueError(f"{table} has no updatable column {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")
