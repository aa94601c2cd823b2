"""Job control from any process (TUI, `eaglewatch jobs`): everything goes through the database and the OS/Slurm.

A local job's launcher (`eaglewatch extract`) sees a pause or a cancel made here at its next poll; a
cancel also signals the shard processes directly, and a Slurm job is held, released or cancelled with
`scontrol`/`scancel` right away. The TUI calls these functions (from a worker thread: they may block for
a few seconds while a cancelled process is given its grace period).
"""

from __future__ import annotations

from pathlib import Path

from app.jobs.job_status import JobStatus
from app.jobs.local import LocalExecutor
from app.jobs.slurm import SlurmExecutor
from app.jobs.store import FINAL_STATES, Job, JobStore


def list_jobs(db: Path) -> list[Job]:
    """All jobs in the run database, newest first (read-only connection)."""
    store = JobStore(db, readonly=True)
    try:
        return store.jobs()
    finally:
        store.close()


def job_status(db: Path, job_id: int, *, refresh: bool = False) -> JobStatus:
    """One job with its shards (progress, exit codes, log paths); `refresh` asks the OS/Slurm first."""
    store = JobStore(db, create=False) if refresh else JobStore(db, readonly=True)
    try:
        job = store.job(job_id)
        if refresh and job.state not in FINAL_STATES:
            return _executor(store, job).poll(job_id, launch=False)
        return JobStatus(job=job, shards=tuple(store.shards(job_id)))
    finally:
        store.close()


def pause_job(db: Path, job_id: int, *, stop_running: bool = False) -> None:
    """Start no new shards (Slurm: hold pending tasks); `stop_running` SIGSTOPs running local shards."""
    _call(db, job_id, "pause", stop_running=stop_running)


def resume_job(db: Path, job_id: int) -> None:
    """Undo a pause (Slurm: release; local: SIGCONT, and the launcher starts pending shards again)."""
    _call(db, job_id, "resume")


def cancel_job(db: Path, job_id: int, shard: int | None = None, *, grace_s: float = 10.0) -> None:
    """Cancel a whole job or one shard; recorded as cancelled (not failed); blocks until local processes end."""
    store = JobStore(db, create=False)
    try:
        ex = _executor(store, store.job(job_id), grace_s=grace_s)
        ex.cancel(job_id, shard, wait=True)
    finally:
        store.close()


def retry_job(db: Path, job_id: int) -> None:
    """Put failed and cancelled shards back to pending; the job's launcher (or the next `extract --job`) runs them."""
    _call(db, job_id, "retry")


def _call(db: Path, job_id: int, verb: str, **kw) -> None:
    store = JobStore(db, create=False)
    try:
        getattr(_executor(store, store.job(job_id)), verb)(job_id, **kw)
    finally:
        store.close()


def _executor(store: JobStore, job: Job, grace_s: float = 10.0):
    if job.executor == "slurm":
        return SlurmExecutor(store)
    return LocalExecutor(store, [], grace_s=grace_s)
