"""The one control interface over a run (architecture rule 5).

In-process faces call the engine's implementation directly; an attached viewer uses
`app.store`'s command queue implementation, which writes a row to the `commands` table that the
engine polls. Both satisfy this protocol.
"""

from __future__ import annotations

from typing import Protocol


class RunControl(Protocol):
    async def pause(self, now: bool = False) -> None:
        """Lease nothing new; with now=True also cancel in-flight requests (providers may still bill)."""

    async def resume(self) -> None:
        """Continue leasing after a pause (operator, budget or run-stopping error)."""

    async def set_concurrency(self, limit: int) -> None:
        """Set the in-flight limit, clamped to the configured min/max."""

    async def job_command(self, job_id: int, verb: str) -> None:
        """Pause, resume or cancel an extraction job (verb: pause | resume | cancel)."""
