"""What every executor shares: retrying failed shards and waiting for a job to finish."""

from __future__ import annotations

import time

from app.jobs.job_status import JobStatus
from app.jobs.store import JobStore


class Executor:
    """Base of LocalExecutor and SlurmExecutor: subclasses provide `poll(job_id) -> JobStatus`."""

    store: JobStore
    poll_interval_s: float = 0.5

    def poll(self, job_id: int) -> JobStatus:  # pragma: no cover - overridden
        raise NotImplementedError

    def retry(self, job_id: int) -> None:
        """Put failed and cancelled shards back to pending (the next poll starts or submits them again; a shard's
        done-marker is still checked first)."""
        for s in self.store.shards(job_id):
            if s.state in ("failed", "cancelled"):
                self.store.set_shard(
                    job_id, s.shard, state="pending", error=None, exit_code=None, pid=None, external_id=None
                )
        self.store.set_job(job_id, state="pending", ended_at=None)

    def wait(
        self, job_id: int, *, interval: float | None = None, on_status=None, timeout: float | None = None
    ) -> JobStatus:
        """Poll until the job is final (or `timeout` seconds passed); call `on_status` with each snapshot."""
        interval = self.poll_interval_s if interval is None else interval
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.poll(job_id)
            if on_status is not None:
                on_status(status)
            if status.finished or (end is not None and time.monotonic() > end):
                return status
            time.sleep(interval)
