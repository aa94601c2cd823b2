"""The engine's heartbeat: who is running a run, when it last said so, and what it saw.

The engine upserts one row per run about once a second (through the store's writer, inside its batch
transactions) with its live snapshot as JSON; a clean exit sets `stopped_at`. Readers (the attached viewer,
`status`) judge liveness from the row alone, so a SIGKILLed engine is called gone a few seconds after its
last beat, on any machine that can read the database; on the engine's own host the pid is checked too, which
tells a crash at once.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

# A viewer polls at 1-4 Hz and the engine beats at 1 Hz: three missed beats (plus a slow commit) is a crash.
BEAT_INTERVAL_S = 1.0
STALE_AFTER_S = 4.0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The last beat of the engine that runs (or ran) a run."""

    run_id: int
    pid: int
    host: str
    started_at: float
    beat_at: float
    stopped_at: float | None
    snapshot_json: str | None


@dataclass(frozen=True, slots=True)
class Liveness:
    """What a reader can say about a run's engine now.

    state: running (beats are fresh) | stopped (it exited cleanly) | gone (it stopped beating: a crash or a
    lost machine) | never (no engine has run it: ingested only, or written before heartbeats existed).
    """

    state: str
    age_s: float | None = None
    pid: int | None = None
    host: str | None = None

    @property
    def alive(self) -> bool:
        return self.state == "running"

    @property
    def text(self) -> str:
        """One line for a status bar: 'ENGINE GONE (last seen 12 s ago, pid 4242 on gpu-1)'."""
        if self.state == "running":
            return f"engine pid {self.pid} on {self.host}"
        if self.state == "gone":
            return f"ENGINE GONE (last seen {_age(self.age_s)} ago, pid {self.pid} on {self.host})"
        if self.state == "stopped":
            return f"engine exited {_age(self.age_s)} ago"
        return "no engine has run this"

    @property
    def short(self) -> str:
        """The status line's words when the engine is gone: 'ENGINE GONE (last seen 12 s ago)'; else `text`."""
        if self.state == "gone":
            return f"ENGINE GONE (last seen {_age(self.age_s)} ago)"
        return self.text


def this_host() -> str:
    """The name a beat records for this machine."""
    return socket.gethostname()


def beat_op(
    run_id: int, *, pid: int, host: str, started_at: float, now: float, snapshot_json: str | None
) -> Callable[[sqlite3.Connection], None]:
    """A store write op that records one beat (and clears a previous engine's stopped_at)."""

    def op(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO engine_heartbeats (run_id, pid, host, started_at, beat_at, stopped_at, snapshot) "
            "VALUES (?, ?, ?, ?, ?, NULL, ?) ON CONFLICT (run_id) DO UPDATE SET pid = excluded.pid, "
            "host = excluded.host, started_at = excluded.started_at, beat_at = excluded.beat_at, "
            "stopped_at = NULL, snapshot = excluded.snapshot",
            (run_id, pid, host, started_at, now, snapshot_json),
        )

    return op


def stop_op(run_id: int, *, pid: int, now: float, snapshot_json: str | None) -> Callable[[sqlite3.Connection], None]:
    """A store write op for a clean exit: the final snapshot, and stopped_at (only if this pid still owns the row)."""

    def op(conn: sqlite3.Connection) -> None:
        conn.execute(
            "UPDATE engine_heartbeats SET stopped_at = ?, beat_at = ?, snapshot = COALESCE(?, snapshot) "
            "WHERE run_id = ? AND pid = ?",
            (now, now, snapshot_json, run_id, pid),
        )

    return op


def read_heartbeat(conn: sqlite3.Connection, run_id: int) -> Heartbeat | None:
    """The run's heartbeat row, or None when no engine has beaten for it."""
    row = conn.execute(
        "SELECT run_id, pid, host, started_at, beat_at, stopped_at, snapshot FROM engine_heartbeats WHERE run_id = ?",
        (run_id,),
    ).fetchone()
    return Heartbeat(*row) if row else None


def liveness(
    hb: Heartbeat | None,
    now: float,
    *,
    stale_after_s: float = STALE_AFTER_S,
    host: str | None = None,
    pid_alive: Callable[[int], bool] | None = None,
) -> Liveness:
    """Judge a heartbeat at `now`: stale beats are a gone engine; on the engine's own host a dead pid is too."""
    if hb is None:
        return Liveness("never")
    age = max(0.0, now - hb.beat_at)
    if hb.stopped_at is not None:
        return Liveness("stopped", max(0.0, now - hb.stopped_at), hb.pid, hb.host)
    local = hb.host == (host if host is not None else this_host())
    dead = local and not (pid_alive or process_alive)(hb.pid)
    if age > stale_after_s or dead:
        return Liveness("gone", age, hb.pid, hb.host)
    return Liveness("running", age, hb.pid, hb.host)


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine (zombies count as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().split(b") ", 1)[-1][:1] != b"Z"
    except OSError:
        return True


def _age(age_s: float | None) -> str:
    s = int(round(age_s or 0.0))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h"
