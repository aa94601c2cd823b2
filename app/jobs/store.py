"""Job and shard state in the run database (`jobs`, `job_shards` of `app.store.schema`).

The executors write through a plain `sqlite3` connection (WAL, busy timeout) of their own: job state
changes are rare (a few per second at most), and any process — the launcher, the TUI, `eaglewatch jobs
cancel` — can open the same file, so the database is the control channel between them. The statements
live in `app.store.job_rows`; this class holds the connection and turns the stored spec into a `JobSpec`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from app.errors import InputError
from app.jobs.spec import JobSpec
from app.store import job_rows
from app.store.job_rows import FINAL_STATES, JobRow
from app.store.rows import JobShardRow

__all__ = ["FINAL_STATES", "Job", "JobShard", "JobStore"]

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


class JobStore:
    """Reads and writes job rows; each write is its own short transaction."""

    def __init__(self, path: Path, *, create: bool = True, readonly: bool = False) -> None:
        self.path = Path(path)
        # readonly: faces polling job state (no write lock, safe from a thread)
        self.conn = job_rows.connect_reader(self.path) if readonly else job_rows.connect(self.path, create=create)

    def close(self) -> None:
        self.conn.close()

    # --- jobs -----------------------------------------------------------------------------------
    def create_job(self, spec: JobSpec, executor: str, run_id: int | None = None) -> int:
        """Insert a job and its shards (all pending); return the job id."""
        with job_rows.immediate(self.conn):
            return job_rows.insert_job(
                self.conn,
                run_id=run_id,
                name=spec.name,
                executor=executor,
                spec=spec.to_json(),
                output_dir=str(spec.output_dir),
                shard_logs=[(s, str(spec.stdout_log(s))) for s in spec.shards],
                now=time.time(),
            )

    def job(self, job_id: int) -> Job:
        """The job row; InputError naming the database when there is no such job."""
        row = job_rows.job_row(self.conn, job_id)
        if row is None:
            raise InputError(f"{self.path}: no job with id {job_id}; `eaglewatch jobs --db {self.path}` lists them")
        return _job(row)

    def jobs(self) -> list[Job]:
        """All jobs, newest first."""
        return [_job(r) for r in job_rows.job_rows(self.conn)]

    def set_job(self, job_id: int, **fields: object) -> None:
        """Update job columns (state, external_id, error, started_at, ended_at)."""
        if not fields:
            return
        with job_rows.immediate(self.conn):
            job_rows.update_job(self.conn, job_id, fields, time.time())

    def set_paused(self, job_id: int, paused: bool) -> None:
        """Record the operator's pause (start no new shards) so every process and a restart see it."""
        job = self.job(job_id)
        if job.state in FINAL_STATES:
            return
        self.set_job(job_id, state="paused" if paused else "running")

    # --- shards ---------------------------------------------------------------------------------
    def shards(self, job_id: int) -> list[JobShard]:
        """The job's shards in shard order."""
        return job_rows.shard_rows(self.conn, job_id)

    def set_shard(self, job_id: int, shard: int, **fields: object) -> None:
        """Update one shard's columns."""
        if not fields:
            return
        with job_rows.immediate(self.conn):
            job_rows.update_shard(self.conn, job_id, shard, fields, time.time())

    def cancel_shards(self, job_id: int, shards: list[int] | None = None) -> list[JobShard]:
        """Mark not-yet-final shards cancelled (all when `shards` is None); return them as they were before."""
        before = [
            s for s in self.shards(job_id) if s.state not in FINAL_STATES and (shards is None or s.shard in shards)
        ]
        with job_rows.immediate(self.conn):
            job_rows.cancel_shards(self.conn, job_id, [s.shard for s in before], time.time())
        return before


def _job(row: JobRow) -> Job:
    return Job(
        id=row.id,
        name=row.name,
        executor=row.executor,
        state=row.state,
        paused=row.state == "paused",
        n_shards=row.n_shards,
        output_dir=row.output_dir,
        external_id=row.external_id,
        error=row.error,
        created_at=row.created_at,
        started_at=row.started_at,
        ended_at=row.ended_at,
        spec=JobSpec.from_json(row.spec),
    )
