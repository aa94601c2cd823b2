"""The one control interface over a generation run (architecture rule 5).

The engine (`app.engine.run.Run`, carried out by `app.engine.steering.Steering`) implements it in-process; an
attached viewer's implementation writes a row to the `commands` table (verbs `pause` {"now": bool}, `resume`,
`set_concurrency` {"limit": n},
`retry_failed`) that the engine polls about once a second (`Steering.poll_commands`) and carries
out (`apply_command`). Extraction jobs are steered by the jobs runner, not through this interface.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class RunControl(Protocol):
    async def pause(self, now: bool = False) -> None:
        """Lease nothing new; with now=True also cancel in-flight requests (providers may still bill)."""

    async def resume(self) -> None:
        """Continue leasing after a pause (operator, budget, run-stopping error or a full disk)."""

    async def set_concurrency(self, limit: int) -> None:
        """Set the run's total in-flight limit, spread over the endpoints by weight, clamped to min/max."""

    async def retry_failed(self) -> None:
        """Put the run's failed samples back to pending, each with a fresh allowance of attempts."""
