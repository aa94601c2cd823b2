"""JobStatus: an immutable snapshot of one job and its shards, and how a job's state follows its shards."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from app.jobs.store import FINAL_STATES, Job, JobShard, JobStore


@dataclass(frozen=True)
class JobStatus:
    """A job with its shards as last refreshed; `counts` maps shard state to number of shards."""

    job: Job
    shards: tuple[JobShard, ...]

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(s.state for s in self.shards))

    @property
    def done_items(self) -> int:
        return sum(s.done for s in self.shards)

    @property
    def total_items(self) -> int:
        return sum(s.total for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def finished(self) -> bool:
        return self.job.state in FINAL_STATES

    def failures(self) -> list[JobShard]:
        """Failed shards, each with its exit code, error sentence and log path."""
        return [s for s in self.shards if s.state == "failed"]

    def summary(self) -> str:
        """One line for a progress display: state, shard counts, items and tokens."""
        c = self.counts
        parts = [f"{k} {c[k]}" for k in ("running", "submitted", "pending", "done", "failed", "cancelled") if c.get(k)]
        items = f"{self.done_items}/{self.total_items} items" if self.total_items else f"{self.done_items} items"
        return (
            f"job {self.job.id} {self.job.name}: {self.job.state}; shards: {', '.join(parts)}; {items}; "
            f"{self.tokens} tokens"
        )


def settle_job_state(store: JobStore, job_id: int) -> JobStatus:
    """Derive the job's state from its shards (all final → done/failed/cancelled), store it, return a snapshot."""
    job = store.job(job_id)
    shards = store.shards(job_id)
    states = {s.state for s in shards}
    if shards and states <= FINAL_STATES:
        state = "failed" if "failed" in states else "cancelled" if "cancelled" in states else "done"
    elif states & {"running", "submitted"}:
        state = "running"
    elif any(s.state in FINAL_STATES for s in shards):
        state = "running"  # between shards: some finished, the rest not started yet
    else:
        state = "pending"
    raw_state = "paused" if job.paused and state not in FINAL_STATES else state
    if raw_state != job.state or (state in FINAL_STATES and job.ended_at is None):
        fields: dict[str, object] = {}
        if state in FINAL_STATES:
            fields["state"] = state
            fields["ended_at"] = job.ended_at or time.time()
            if job.paused:
                store.set_paused(job_id, False)
        elif not job.paused:
            fields["state"] = state
            fields["ended_at"] = None
        if state == "running" and job.started_at is None:
            fields["started_at"] = time.time()
        store.set_job(job_id, **fields)
        job = store.job(job_id)
    return JobStatus(job=job, shards=tuple(shards))


def status_to_dict(status: JobStatus) -> dict:
    """A JSON-ready view of a snapshot (for `--json` output): the job, its counts, and every shard."""
    job = status.job
    return {
        "id": job.id,
        "name": job.name,
        "executor": job.executor,
        "state": job.state,
        "paused": job.paused,
        "external_id": job.external_id,
        "output_dir": job.output_dir,
        "error": job.error,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "counts": status.counts,
        "done_items": status.done_items,
        "total_items": status.total_items,
        "tokens": status.tokens,
        "shards": [
            {
                "shard": s.shard,
                "state": s.state,
                "done": s.done,
                "total": s.total,
                "tokens": s.tokens,
                "exit_code": s.exit_code,
                "pid": s.pid,
                "external_id": s.external_id,
                "log_path": s.log_path,
                "output_path": s.output_path,
                "error": s.error,
                "started_at": s.started_at,
                "ended_at": s.ended_at,
            }
            for s in status.shards
        ],
    }
