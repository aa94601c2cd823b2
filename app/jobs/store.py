"""Job and shard state in the run database (`jobs`, `job_shards` of `app.store.schema`).

The executors write through a plain `sqlite3` connection (WAL, busy timeout) of their own: job state
changes are rare (a few per second at most), and any process — the launcher, the TUI, `eaglewatch jobs
cancel` — can open the same file, so the database is the control channel between them.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from app.errors import InputError
from app.jobs.spec import JobSpec
from app.store.db import configure, connect_readonly, migrate
from app.store.queries import JobShardRow

FINAL_STATES = frozenset({"done", "failed", "cancelled"})
SHARD_FIELDS = (
    "state", "pid", "external_id", "done", "total", "tokens", "exit_code", "log_path", "output_path",
    "error", "started_at", "ended_at",
)


# One shard of a job as stored (state, pid / Slurm task id, progress, exit code, log path): the same record
# the read queries return.
JobShard = JobShardRow


@dataclass(frozen=True)
class Job:
    """One job as stored; `paused` is True while the operator holds it (no new shards start)."""

    id: int
    name: str
    executor: str
    state: str
    paused: bool
    n_shards: int
    output_dir: str | None
    external_id: str | None
    error: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    spec: JobSpec


def connect(path: Path, *, create: bool = True) -> sqlite3.Connection:
    """Open (creating and migrating if needed) the run database for job bookkeeping."""
    path = Path(path)
    # job bookkeeping opens the database on every poll: the whole-file quick_check is left to the verbs that
    # open it once (run, ingest, export, status)
    migrate(path, create=create, check=False)
    try:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        configure(conn, busy_timeout_s=30.0)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{path}: cannot be used as a run database ({exc}); pass the eaglewatch.db of the run") from exc
    conn.row_factory = sqlite3.Row
    return conn


class JobStore:
    """Reads and writes job rows; each write is its own short transaction."""

    def __init__(self, path: Path, *, create: bool = True, readonly: bool = False) -> None:
        self.path = Path(path)
        if readonly:  # faces polling job state: no write lock, safe from a thread
            self.conn = connect_readonly(self.path, check=False)
            self.conn.row_factory = sqlite3.Row
        else:
            self.conn = connect(self.path, create=create)

    def close(self) -> None:
        self.conn.close()

    # --- jobs -----------------------------------------------------------------------------------
    def create_job(self, spec: JobSpec, executor: str, run_id: int | None = None) -> int:
        """Insert a job and its shards (all pending); return the job id."""
        now = time.time()
        with self._tx():
            cur = self.conn.execute(
                "INSERT INTO jobs (run_id, name, executor, spec, state, n_shards, output_dir, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
                (run_id, spec.name, executor, spec.to_json(), len(spec.shards), str(spec.output_dir), now, now),
            )
            job_id = int(cur.lastrowid)
            self.conn.executemany(
                "INSERT INTO job_shards (job_id, shard, state, log_path, updated_at) VALUES (?, ?, 'pending', ?, ?)",
                [(job_id, s, str(spec.stdout_log(s)), now) for s in spec.shards],
            )
        return job_id

    def job(self, job_id: int) -> Job:
        """The job row; InputError naming the database when there is no such job."""
        row = self.conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise InputError(f"{self.path}: no job with id {job_id}; `eaglewatch jobs --db {self.path}` lists them")
        return self._job(row)

    def jobs(self) -> list[Job]:
        """All jobs, newest first."""
        return [self._job(r) for r in self.conn.execute("SELECT * FROM jobs ORDER BY id DESC")]

    def _job(self, row: sqlite3.Row) -> Job:
        state = row["state"]
        paused = state == "paused"
        return Job(
            id=row["id"], name=row["name"], executor=row["executor"], state=state, paused=paused,
            n_shards=row["n_shards"], output_dir=row["output_dir"], external_id=row["external_id"],
            error=row["error"],
            created_at=row["created_at"], started_at=row["started_at"], ended_at=row["ended_at"],
            spec=JobSpec.from_json(row["spec"]),
        )

    def set_job(self, job_id: int, **fields: object) -> None:
        """Update job columns (state, external_id, error, started_at, ended_at)."""
        if not fields:
            return
        fields["updated_at"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx():
            self.conn.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*fields.values(), job_id))

    def set_paused(self, job_id: int, paused: bool) -> None:
        """Record the operator's pause (start no new shards) so every process and a restart see it."""
        job = self.job(job_id)
        if job.state in FINAL_STATES:
            return
        self.set_job(job_id, state="paused" if paused else "running")

    # --- shards ---------------------------------------------------------------------------------
    def shards(self, job_id: int) -> list[JobShard]:
        """The job's shards in shard order."""
        rows = self.conn.execute("SELECT * FROM job_shards WHERE job_id = ? ORDER BY shard", (job_id,))
        return [JobShard(**{k: r[k] for k in ("job_id", "shard", *SHARD_FIELDS)}) for r in rows]

    def set_shard(self, job_id: int, shard: int, **fields: object) -> None:
        """Update one shard's columns."""
        if not fields:
            return
        fields["updated_at"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx():
            self.conn.execute(f"UPDATE job_shards SET {cols} WHERE job_id = ? AND shard = ?", (*fields.values(), job_id, shard))

    def cancel_shards(self, job_id: int, shards: list[int] | None = None) -> list[JobShard]:
        """Mark not-yet-final shards cancelled (all when `shards` is None); return them as they were before."""
        before = [s for s in self.shards(job_id) if s.state not in FINAL_STATES and (shards is None or s.shard in shards)]
        now = time.time()
        with self._tx():
            for s in before:
                self.conn.execute(
                    "UPDATE job_shards SET state = 'cancelled', error = 'cancelled by operator', ended_at = ?, updated_at = ?"
                    " WHERE job_id = ? AND shard = ? AND state NOT IN ('done','failed','cancelled')",
                    (now, now, job_id, s.shard),
                )
        return before

    def _tx(self) -> _Tx:
        return _Tx(self.conn)


class _Tx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, *_exc: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
