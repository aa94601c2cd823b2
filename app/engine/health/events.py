"""The engine's operator events: kept in memory for in-process faces and written to the `events` table.

An event the store cannot take now (a locked or full database) is kept and written once it writes again,
so the log in the database stays complete and no write failure reaches the operator as a traceback.
"""

from __future__ import annotations

import time
from collections import deque

from app.engine.health.writes import StoreGate
from app.store.queries import EventRow
from app.store.run_store import RunStore, StoreWriteError

EngineEvent = EventRow  # an operator event as the engine wrote it (also in the `events` table)


class EventLog:
    """The latest 1,000 events in memory; every event also to the store, late when it refuses writes."""

    def __init__(self, store: RunStore, gate: StoreGate) -> None:
        self.store = store
        self.run_id: int | None = None  # set once the run exists in the store
        self._gate = gate
        self._events: deque[EngineEvent] = deque(maxlen=1000)
        self._seq = 0
        self._unsaved: deque[tuple[str, str, str]] = deque(maxlen=1000)
        self._flushing = False  # one flush at a time: two would write the same event and pop another

    def _remember(self, level: str, kind: str, message: str) -> None:
        self._seq += 1
        self._events.append(EngineEvent(self._seq, time.time(), level, kind, message))

    def note(self, level: str, kind: str, message: str) -> None:
        """Record an event now (no await): in memory at once, in the store at the next `flush`."""
        self._remember(level, kind, message)
        if self.run_id is not None:
            self._unsaved.append((level, kind, message))

    async def add(self, level: str, kind: str, message: str) -> None:
        """Record an event in memory and in the store (kept for `flush` while the store refuses writes)."""
        self._remember(level, kind, message)
        if self.run_id is None:
            return
        if self._gate.blocked is not None:
            self._unsaved.append((level, kind, message))
            return
        try:
            await self.store.add_event(self.run_id, level, kind, message)
        except StoreWriteError:
            self._unsaved.append((level, kind, message))

    async def flush(self) -> None:
        """Write the events the store could not take, oldest first, while it takes them. A flush already under
        way writes what is noted meanwhile too, so a second one returns at once."""
        if self._flushing:
            return
        self._flushing = True
        try:
            while self._unsaved and self._gate.blocked is None and self.run_id is not None:
                level, kind, message = self._unsaved[0]
                try:
                    await self.store.add_event(self.run_id, level, kind, message)
                except StoreWriteError:
                    return
                self._unsaved.popleft()
        finally:
            self._flushing = False

    def since(self, after_id: int) -> list[EngineEvent]:
        """Events after `after_id` (the latest 1,000 are kept)."""
        return [e for e in self._events if e.id > after_id]
