"""The engine's one home for sample counts per state: its live mirror and the store's record of them.

`SampleCounts` is the engine's live count, moved only by named transitions beside the store calls. The store is the
truth (`RunStore.counts`); these counts mirror it between reads so the snapshot costs no I/O. Each transition is
called right after the store call that makes the same change has committed.

`CountsFollower` holds the store's counts of a run (`app.store.count_records.RunCounts`) as the engine that hosts it
last read them, for the record `Run.snapshot()` returns. The counts part of a run's record is always the store's
(`app.store.queries.run_counts`); an engine re-reads it through a read-only connection of its own only after the
database changed (`PRAGMA data_version`, which a commit of any other connection moves): in a worker thread while the
run is running, so the event loop never waits on SQLite, and at once while it is not (paused, done or closed:
nothing to slow down, and what a caller then reads is exact).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.store.count_records import RunCounts
from app.store.schema import SAMPLE_STATES


class SampleCounts:
    """Samples per state (app.store.schema.SAMPLE_STATES) as this engine last knew them."""

    def __init__(self, stored: dict[str, int] | None = None) -> None:
        self._c: Counter[str] = Counter(dict.fromkeys(SAMPLE_STATES, 0))
        if stored:
            self.reset(stored)

    def reset(self, stored: dict[str, int]) -> None:
        """Take the store's counts as they are (after a read of the whole run)."""
        self._c = Counter({**dict.fromkeys(SAMPLE_STATES, 0), **stored})

    def leased(self, n: int) -> None:
        """n pending samples were leased (RunStore.lease)."""
        self._move("pending", "leased", n)

    def released(self, n: int = 1) -> None:
        """n leased samples went back to pending unused (RunStore.release)."""
        self._move("leased", "pending", n)

    def ended(self, state: str) -> None:
        """A leased sample ended as `state` (done or failed: RunStore.record_result / record_failure)."""
        self._move("leased", state, 1)

    def followed(self, ready: int, skipped: int) -> None:
        """A conversation turn's end made `ready` waiting turns pending and `skipped` of them skipped (the
        conversation ended there), in the transaction that stored it."""
        self._move("waiting", "pending", ready)
        self._move("waiting", "skipped", skipped)

    def _move(self, src: str, dst: str, n: int) -> None:
        if n:
            self._c[src] -= n
            self._c[dst] += n

    def __getitem__(self, state: str) -> int:
        return max(0, self._c[state])

    @property
    def total(self) -> int:
        return sum(max(0, v) for v in self._c.values())

    @property
    def remaining(self) -> int:
        """Samples still to end (pending, leased, or a conversation's turn waiting on its parent)."""
        return self["pending"] + self["leased"] + self["waiting"]


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
