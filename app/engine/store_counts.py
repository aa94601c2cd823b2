"""The store's counts of a run as the engine that hosts it last read them, for the record `Run.snapshot()` returns.

The counts part of a run's record is always the store's (`app.store.queries.run_counts`); an engine re-reads
it through a read-only connection of its own only after the database changed (`PRAGMA data_version`, which a
commit of any other connection moves): in a worker thread while the run is running, so the event loop never
waits on SQLite, and at once while it is not (paused, done or closed: nothing to slow down, and what a caller
then reads is exact).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import weakref
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.store.count_records import RunCounts

_FOLLOWERS: weakref.WeakKeyDictionary[Any, CountsFollower] = weakref.WeakKeyDictionary()


class CountsFollower:
    """One run's `RunCounts`, re-read when the database changed (see the module docstring)."""

    def __init__(self, database: Path, run_id: int) -> None:
        self.database = Path(database)
        self.run_id = run_id
        self._counts = RunCounts()
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._lock = threading.Lock()  # one read at a time: the thread's and a synchronous one
        self._reading: asyncio.Future | None = None

    def counts(self, *, background: bool) -> RunCounts:
        """The counts as last read; with `background` (on a running event loop) a re-read is started in a
        thread and shows in a later call, else the re-read happens now."""
        if background and self._version is not None:  # the first read is made at once: never an empty record
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                if self._reading is None or self._reading.done():
                    self._reading = loop.run_in_executor(None, self._refresh)
                return self._counts
        self._refresh()
        return self._counts

    def _refresh(self) -> None:
        from app.store.queries import connect_readonly, data_version, run_counts

        with self._lock:
            try:
                if self._conn is None:
                    self._conn = connect_readonly(self.database, check=False)
                    weakref.finalize(self, self._conn.close)
                version = data_version(self._conn)
                if version == self._version:
                    return
                counts = run_counts(self._conn, self.run_id)
            except (sqlite3.Error, OSError, InputError):
                return  # the database cannot be read just now: keep the last counts, try again on the next call
            self._counts, self._version = counts, version


def follower_of(run: Any, database: Path, run_id: int) -> CountsFollower:
    """The follower of `run` (an engine Run), made on first use and kept for the run's lifetime."""
    follower = _FOLLOWERS.get(run)
    if follower is None or follower.run_id != run_id or follower.database != Path(database):
        follower = _FOLLOWERS[run] = CountsFollower(database, run_id)
    return follower
