"""The engine's heartbeat: one `engine_heartbeats` row per run, written about once a second with the live snapshot.

Attached viewers and `status` show this engine's numbers from it and tell a crashed engine by its age
(`app.store.heartbeat`: the row's ops and liveness; `app.engine.record.codec`: the snapshot as JSON). Beats go
through the `StoreGate`: a store that refuses writes delays a beat (each retry writes a fresh one) and never ends
the task. A clean close writes the final snapshot and `stopped_at`, so readers say "exited", not "gone".
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable

from app.engine.health.events import EventLog
from app.engine.health.writes import StoreGate
from app.engine.record.codec import snapshot_to_json
from app.engine.record.snapshot import RunRecord
from app.store.heartbeat import BEAT_INTERVAL_S, beat_op, stop_op, this_host
from app.store.run_store import RunStore

LASTING_ERROR_PAUSE_S = 60.0  # after a write error that is not transient: one warning, then a beat a minute


class HeartbeatWriter:
    """Writes the run's heartbeat rows from `snapshot()` (the Run's live view)."""

    def __init__(
        self,
        *,
        store: RunStore,
        gate: StoreGate,
        events: EventLog,
        run_id: int,
        started_at: float,
        snapshot: Callable[[], RunRecord],
    ) -> None:
        self._store = store
        self._gate = gate
        self._events = events
        self._run_id = run_id
        self._started_at = started_at
        self._snapshot = snapshot

    def _op(self, *, final: bool) -> Callable[[sqlite3.Connection], None]:
        snap = snapshot_to_json(self._snapshot())
        if final:
            return stop_op(self._run_id, pid=os.getpid(), now=time.time(), snapshot_json=snap)
        return beat_op(
            self._run_id,
            pid=os.getpid(),
            host=this_host(),
            started_at=self._started_at,
            now=time.time(),
            snapshot_json=snap,
        )

    async def run(self) -> None:
        """Beat about once a second until cancelled."""
        while True:
            try:
                await self._gate.commit(lambda: self._store.write(self._op(final=False)))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a lasting store error: say so once a minute at most, keep beating
                self._events.note("warning", "store", f"could not write the engine heartbeat: {exc}")
                await asyncio.sleep(LASTING_ERROR_PAUSE_S)
            await asyncio.sleep(BEAT_INTERVAL_S)

    async def stop(self) -> None:
        """A clean close: the final snapshot and `stopped_at`."""
        try:
            await self._store.write(self._op(final=True))
        except Exception:
            pass  # readers then call it gone once the beats are stale: still true enough
