"""The run's state as this engine holds it (idle | running | paused | done, with why) and as the store has it.

`RunState` is the one place the state changes. `set` changes it and writes it (`runs.state`, `runs.reason`); a
write the store refuses leaves it `unsaved`, written again by `write_unsaved` once the store takes writes (the
store-health part calls it). `hold` changes it at once, before any await, for the deciders that must stop the
scheduler from starting another request in the same turn of the loop (a run-stopping error, the quality gate, a
full disk, a scheduler error); the write follows with their `set` or pause. Two events tell the faces: `idle` (done,
or paused with nothing in flight: `Run.wait` returns) and `finished` (every sample ended: `Run.wait_finished`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from app.store.run_store import RunStore, StoreWriteError


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How a run ended in this process: done (every sample ended) or paused (with the reason)."""

    state: str
    reason: str | None
    stopping_error: bool = False


class RunState:
    """The run's state, its reason, whether a run-stopping error paused it, and the clocks of its life here."""

    def __init__(self, *, store: RunStore) -> None:
        self._store = store
        self.run_id: int | None = None  # set once the run exists in the store
        self.current = "idle"
        self.reason: str | None = None
        self.stopping_error = False  # a run-stopping provider error paused it (the headless exit code says so)
        self.unsaved = False  # the store refused the last change: `write_unsaved` writes it
        # paused in a hurry (`hold`) by a part whose pause() that returns the leases is still to run: not idle yet
        self.pause_pending = False
        self.idle = asyncio.Event()
        self.finished = asyncio.Event()
        self.started_at = time.time()
        self.started_m = time.monotonic()
        self.ended_m: float | None = None  # when the run reached done: elapsed time and $/h freeze there

    @property
    def running(self) -> bool:
        return self.current == "running"

    @property
    def outcome(self) -> RunOutcome:
        """The state now, as a RunOutcome."""
        return RunOutcome(self.current, self.reason, self.stopping_error)

    def elapsed_s(self, now_m: float) -> float:
        """Seconds since this engine started the run, frozen once it is done."""
        end = self.ended_m if self.current == "done" and self.ended_m is not None else now_m
        return end - self.started_m

    def hold(self, state: str, reason: str | None) -> None:
        """Change the state now, with no await (written by the caller's next `set`, or by `write_unsaved`)."""
        self.current, self.reason = state, reason
        self.unsaved = True

    def stop_for_error(self, reason: str) -> bool:
        """A run-stopping error: pause now (`hold`) if running; True for the first such error, which tells the
        operator and pauses through the control path."""
        if not self.running:
            return False
        self.hold("paused", reason[:200])
        self.stopping_error = True
        return True

    async def set(self, state: str, reason: str | None) -> None:
        """Change the state and write it; a write the store refuses is left `unsaved`."""
        self.current, self.reason = state, reason
        if self.run_id is None:
            return
        try:
            await self._store.set_run_state(self.run_id, state, reason)
            self.unsaved = False
        except StoreWriteError:
            self.unsaved = True  # written when the store recovers

    async def write_unsaved(self) -> None:
        """Write a change the store refused earlier (nothing when every change is written)."""
        if self.unsaved:
            await self.set(self.current, self.reason)

    async def end(self) -> None:
        """Every sample ended: done, with the clock stopped (`finish` then tells the waiters)."""
        self.ended_m = time.monotonic()
        await self.set("done", None)

    def finish(self) -> None:
        """Set `finished` and `idle`: `Run.wait_finished` and `Run.wait` return."""
        self.finished.set()
        self.idle.set()

    def check_idle(self, in_flight: int) -> None:
        """Set `idle` when the run is done, or paused with nothing in flight (and no hurried pause still to run:
        a headless engine that woke now would close with leases the pause was about to return)."""
        if self.pause_pending:
            return
        if self.current == "done" or (self.current == "paused" and not in_flight):
            self.idle.set()
