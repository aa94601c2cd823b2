"""What the engine does when its store stops taking writes, and when it takes them again.

The `StoreGate` (app.engine.health.writes) retries every write the database refuses for a transient reason and calls
`StoreHealth.changed` when writing stops or works again. While it is blocked the scheduler leases nothing; a full
disk also pauses the run with an event naming the filesystem and what to free. When it writes again, the state
changes and events the store refused meanwhile are written and the scheduler is woken.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.engine.health.events import EventLog
from app.engine.health.writes import disk_full_advice
from app.engine.work.run_state import RunState
from app.store.run_store import StoreWriteError


class StoreHealth:
    """The engine's reactions to the store's health (module doc)."""

    def __init__(self, *, state: RunState, events: EventLog, db_path: Path, wake: asyncio.Event) -> None:
        self._state = state
        self._events = events
        self._db_path = db_path
        self._wake = wake  # the scheduler's

    def changed(self, error: StoreWriteError | None) -> None:
        """The gate's word: writes fail with `error`, or (None) they work again."""
        loop = asyncio.get_running_loop()
        if error is None:
            loop.create_task(self._recovered())
            self._wake.set()  # the scheduler leases again, or (paused) sets idle once nothing is in flight
            return
        if error.kind == "full":
            advice = disk_full_advice(self._db_path)
            if self._state.running:
                self._state.hold("paused", f"disk full: {advice}"[:300])
            self._events.note(
                "error",
                "store",
                f"{advice}. The run is paused; finished results are held and stored as soon as the disk has room",
            )
        else:
            self._events.note(
                "warning",
                "store",
                f"the database refuses writes ({error}); leasing is paused and "
                "finished results are held until it writes again",
            )

    async def _recovered(self) -> None:
        self._events.note("info", "store", "the database writes again; held results are being stored")
        await self._state.write_unsaved()
        await self._events.flush()
