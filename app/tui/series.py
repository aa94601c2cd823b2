"""The dashboard's plot data: the run's 10 s buckets, read from the database in both faces and kept here.

In-process and attached, the plots come from the same rows (`app.store.queries.series_since`, through the
source's `RunReader`), so both faces draw the same curves; the tiles beside them show the same totals
(the cost plot ends at the run's spend, the match-rate plot at the measured rate and its n). The time
axis runs from the run's first stored response to now while the engine runs or pauses, and stops at the
run's last response once it is done, stopped, failed or its engine is gone (the series freeze).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from app.engine.snapshot import MetricsSnapshot
from app.store.queries import SERIES_BUCKET_S, SeriesChunk, series_since
from app.tui import format as fmt
from widgets.time_plot import PlotSeries

PLOTS = ("throughput", "match", "cost")  # the order `t` cycles through at 80 columns
PLOT_TITLES = {"throughput": "tok/s", "match": "match (measured)", "cost": "spent"}


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next read starts (row ids already summed)."""

    responses: int = 0
    reconstructions: int = 0


def read_chunk(source: object, cursor: Cursor) -> SeriesChunk | None:
    """The rows stored after `cursor`, summed per bucket (call off the UI thread); None for a source with no
    database (the screen tests' in-memory source)."""
    reader = getattr(source, "reader", None)  # both app.tui.db_source sources read through a RunReader
    if reader is None:
        return None
    return reader.call(series_since, reader.run_id, cursor.responses, cursor.reconstructions)


class RunSeries:
    """Per-bucket sums of the run, grown chunk by chunk (UI thread only)."""

    def __init__(self) -> None:
        self._buckets: dict[int, list] = {}  # bucket -> [tokens, responses, cost, verified, matched]
        self.cursor = Cursor()
        self.caught_up = False
        self.first_at: float | None = None  # the run's first and latest stored attempt
        self.last_at: float | None = None

    def add(self, chunk: SeriesChunk) -> None:
        """Merge one read (rows are read once: the cursors only move forward)."""
        for b in chunk.buckets:
            row = self._buckets.setdefault(b.bucket, [0, 0, 0.0, 0, 0])
            row[0] += b.tokens
            row[1] += b.responses
            row[2] += b.cost_usd
            row[3] += b.verified
            row[4] += b.matched
            if b.first_at is not None:
                self.first_at = b.first_at if self.first_at is None else min(self.first_at, b.first_at)
            if b.last_at is not None:
                self.last_at = b.last_at if self.last_at is None else max(self.last_at, b.last_at)
        self.cursor = Cursor(chunk.response_cursor, chunk.reconstruction_cursor)
        self.caught_up = chunk.caught_up

    @property
    def empty(self) -> bool:
        return not self._buckets

    def measured(self) -> tuple[int, int]:
        """(verified, matched) over the whole run: what the match-rate plot ends at."""
        return (sum(r[3] for r in self._buckets.values()), sum(r[4] for r in self._buckets.values()))

    def spent(self) -> float:
        """The cost of every stored attempt: what the cost plot ends at."""
        return sum(r[2] for r in self._buckets.values())

    def window(self, snap: MetricsSnapshot, now: float | None = None) -> tuple[int, int, float, float]:
        """(first bucket, last bucket, start time, end time) of the time axis: from the first stored attempt
        to now while the engine runs or pauses, else to the last stored attempt (frozen, and the same in
        both faces: both read these times from the database)."""
        first_b, last_b = min(self._buckets), max(self._buckets)
        start = self.first_at if self.first_at is not None else first_b * SERIES_BUCKET_S
        last = self.last_at if self.last_at is not None else (last_b + 1) * SERIES_BUCKET_S
        live = snap.state in ("running", "paused") and snap.engine not in ("gone", "stopped", "never")
        end = max(time.time() if now is None else now, last) if live else last
        end = max(end, start + 1.0)  # one second at least, so a first bucket has a rate
        return int(start // SERIES_BUCKET_S), int(end // SERIES_BUCKET_S), start, end

    def plots(self, snap: MetricsSnapshot, now: float | None = None) -> dict[str, PlotSeries]:
        """The three plots (PLOTS) of the run up to `now` (or frozen at its end)."""
        if self.empty:
            return {name: PlotSeries(PLOT_TITLES[name], 0.0, SERIES_BUCKET_S, ()) for name in PLOTS}
        first, last, start, end = self.window(snap, now)
        tokens: list[float | None] = []
        spans: list[float] = []
        cost: list[float | None] = []
        match: list[float | None] = []
        spent = 0.0
        verified = matched = 0
        for b in range(first, last + 1):
            row = self._buckets.get(b)
            lo, hi = max(b * SERIES_BUCKET_S, start), min((b + 1) * SERIES_BUCKET_S, end)
            spans.append(max(hi - lo, 0.0))
            tokens.append(float(row[0]) if row else 0.0)
            if row:
                spent += row[2]
                verified += row[3]
                matched += row[4]
            cost.append(spent)
            match.append(matched / verified if verified else None)
        rate = snap.rate.tok_s_10s
        return {
            "throughput": PlotSeries(PLOT_TITLES["throughput"], start, SERIES_BUCKET_S, tuple(tokens), tuple(spans),
                                     "rate", "count", f"10 s: {rate:,.0f}"),
            "match": PlotSeries(PLOT_TITLES["match"], start, SERIES_BUCKET_S, tuple(match), tuple(spans), "level",
                                "percent", f"{fmt.percent(matched, verified)} n={verified:,}" if verified else "no probes yet",
                                floor=None),
            "cost": PlotSeries(PLOT_TITLES["cost"], start, SERIES_BUCKET_S, tuple(cost), tuple(spans), "level",
                               "money", f"{fmt.money(spent)} · {fmt.money(snap.cost_per_hour)}/h"),
        }
