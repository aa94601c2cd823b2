"""Reading a run's record (app.engine.record.snapshot.RunRecord) from its database, for every face but the engine
itself.

The counts are the store's (`app.store.queries.run_counts`); the live figures are the ones given (this process
hosts the engine) or the engine's heartbeat's while it beats (app.store.heartbeat, decoded by
app.engine.record.codec); finished figures, over the whole run from its rows, once it is done or no engine
beats. Works over any read-only sqlite3 connection, from any thread.
"""

from __future__ import annotations

import time
from typing import Any

from app.engine.record.codec import live_from_json
from app.engine.record.snapshot import IN_PROCESS, LIVE_STATES, LiveFigures, RunRecord, finished_figures
from app.store import queries
from app.store.count_records import RunCounts, RunLatency
from app.store.heartbeat import liveness, read_heartbeat
from app.store.verification import trust_of


class LatencyCache:
    """Keeps a finished run's percentiles (one read of every answer) until its rows change."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._value: RunLatency | None = None

    def get(self, conn: Any, run_id: int, counts: RunCounts) -> RunLatency:
        key = (run_id, counts.requests, counts.last_at)
        if self._value is None or key != self._key:
            self._value, self._key = queries.run_latency(conn, run_id), key
        return self._value


def read_record(
    conn: Any,
    run_name: str,
    *,
    live: LiveFigures | None = None,
    now: float | None = None,
    latency: LatencyCache | None = None,
) -> RunRecord:
    """The record of run `run_name` read through `conn` (a read-only sqlite3 connection; any thread).

    `live`: the engine's live figures when this process hosts it (taken on its loop); otherwise they come from
    the engine's heartbeat while it beats. Finished figures replace live ones once the run is done or no
    engine beats. `latency` keeps a finished run's percentiles between calls.
    """
    now = time.time() if now is None else now
    run = queries.resolve_run(conn, run_name)
    counts = queries.run_counts(conn, run.id)
    state, reason = run.state, run.reason
    if live is not None:
        engine, engine_text = IN_PROCESS, "engine in this process"
        state, reason = live.state, live.state_reason
    else:
        beat = read_heartbeat(conn, run.id)
        seen = liveness(beat, now)
        engine, engine_text = seen.state, seen.short
        if seen.alive and beat is not None and beat.snapshot_json:
            try:
                live = live_from_json(beat.snapshot_json)
            except (ValueError, TypeError, KeyError):  # a torn or foreign beat: no live figures this time
                live = None
            if live is not None and state in LIVE_STATES:
                state, reason = live.state, live.state_reason
    finished = None
    if state == "done" or live is None:
        finished = finished_figures(counts, (latency or LatencyCache()).get(conn, run.id, counts))
    budget = (run.config.get("limits") or {}).get("budget_usd")
    return RunRecord(
        run_name=run.name,
        state=state,
        counts=counts,
        state_reason=reason,
        engine=engine,
        engine_text=engine_text,
        live=live,
        finished=finished,
        budget_usd=budget,
        read_at=now,
        trust=tuple(trust_of(conn, counts.providers)),
    )


__all__ = ["LatencyCache", "read_record"]
