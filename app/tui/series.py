"""The dashboard's plot data: the run's 10 s buckets, read from the database in both faces and kept here.

In-process and attached, the plots come from the same rows (`app.store.queries.series_since`, through the
source's `series_since`), so both faces draw the same curves; the tiles beside them show the same totals
(the cost plot ends at the run's spend, the match-rate plot at the measured rate and its n: both the store's,
with the record's definitions). The time axis runs from the run's first stored response to now while an
engine moves the run, and stops at the run's last response once the record is finished (done, or no engine
beats: the series freeze).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.engine.record.snapshot import RunRecord
from app.tui import format as fmt
from app.tui.source import SERIES_BUCKET_S, DataSource, SeriesChunk
from widgets.time_plot import PlotSeries

PLOTS = ("throughput", "match", "cost")  # the order `t` cycles through at 80 columns
PLOT_TITLES = {"throughput": "tok/s", "match": "match (measured)", "cost": "spent"}


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next read starts (row ids already summed)."""

    responses: int = 0
    reconstructions: int = 0


def read_chunk(source: DataSource, cursor: Cursor) -> SeriesChunk | None:
    """The rows stored after `cursor`, summed per bucket (call off the UI thread); None for a source with no
    database (the screen tests' in-memory source)."""
    return source.series_since(cursor.responses, cursor.reconstructions)


class RunSeries:
    """Per-bucket sums of the run, grown chunk by chunk (UI thread only)."""

    def __init__(self) -> None:
        self._buckets: dict[int, list] = {}  # bucket -> [tokens, responses, cost, measured, matched]
        self.cursor = Cursor()
        self.caught_up = False
        self.first_at: float | None = None  # the run's first and latest stored attempt
        self.last_at: float | None = None
        # the plots' values for every bucket before the newest, kept between polls (a 24 h run has 8,640
        # buckets; a poll recomputes only the buckets that changed since), and where new rows changed them
        self._prefix = _Prefix(0, 0.0)
        self._dirty_from: int | None = None

    def add(self, chunk: SeriesChunk) -> None:
        """Merge one read (rows are read once: the cursors only move forward)."""
        if chunk.buckets:
            touched = chunk.buckets[0].bucket  # buckets come sorted
            self._dirty_from = touched if self._dirty_from is None else min(self._dirty_from, touched)
        for b in chunk.buckets:
            row = self._buckets.setdefault(b.bucket, [0, 0, 0.0, 0, 0])
            row[0] += b.tokens
            row[1] += b.responses
            row[2] += b.cost_usd
            row[3] += b.measured
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
        """(measured, matched) over the whole run: what the match-rate plot ends at."""
        return (sum(r[3] for r in self._buckets.values()), sum(r[4] for r in self._buckets.values()))

    def spent(self) -> float:
        """The cost of every stored attempt: what the cost plot ends at."""
        return sum(r[2] for r in self._buckets.values())

    def _prefix_upto(self, first: int, last: int, start: float) -> _Prefix:
        """The kept values of buckets first .. last - 1, recomputed from the first bucket that changed."""
        p = self._prefix
        if (p.first, p.start) != (first, start):
            p = _Prefix(first, start)
        keep = last - first
        if self._dirty_from is not None:
            keep = min(keep, max(self._dirty_from - first, 0))
        if keep < len(p.tokens):
            p = p.cut(keep)
        for b in range(first + len(p.tokens), last):
            row = self._buckets.get(b)
            lo, hi = max(b * SERIES_BUCKET_S, start), (b + 1) * SERIES_BUCKET_S
            p.tokens.append(float(row[0]) if row else 0.0)
            p.spans.append(max(hi - lo, 0.0))
            if row:
                p.spent += row[2]
                p.measured += row[3]
                p.matched += row[4]
            p.cost.append(p.spent)
            p.checked.append((p.measured, p.matched))
            p.match.append(p.matched / p.measured if p.measured else None)
        self._prefix, self._dirty_from = p, None
        return p

    def window(self, rec: RunRecord, now: float | None = None) -> tuple[int, int, float, float]:
        """(first bucket, last bucket, start time, end time) of the time axis: from the first stored attempt
        to now while an engine moves the run, else (a finished record) to the last stored attempt (frozen, and
        the same in both faces: both read these times from the database)."""
        first_b, last_b = min(self._buckets), max(self._buckets)
        start = self.first_at if self.first_at is not None else first_b * SERIES_BUCKET_S
        last = self.last_at if self.last_at is not None else (last_b + 1) * SERIES_BUCKET_S
        live = rec.finished is None
        end = max(time.time() if now is None else now, last) if live else last
        end = max(end, start + 1.0)  # one second at least, so a first bucket has a rate
        return int(start // SERIES_BUCKET_S), int(end // SERIES_BUCKET_S), start, end

    def plots(self, rec: RunRecord, now: float | None = None) -> dict[str, PlotSeries]:
        """The three plots (PLOTS) of the run up to `now` (or frozen at its end)."""
        if self.empty:
            return {name: PlotSeries(PLOT_TITLES[name], 0.0, SERIES_BUCKET_S, ()) for name in PLOTS}
        first, last, start, end = self.window(rec, now)
        p = self._prefix_upto(first, last, start)
        # the last bucket (its span ends at `end`, which moves with the clock) is never kept in the prefix
        row = self._buckets.get(last)
        spent, measured, matched = p.spent, p.measured, p.matched
        if row:
            spent, measured, matched = spent + row[2], measured + row[3], matched + row[4]
        lo = max(last * SERIES_BUCKET_S, start)
        tokens = (*p.tokens, float(row[0]) if row else 0.0)
        spans = (*p.spans, max(end - lo, 0.0))
        cost = (*p.cost, spent)
        match = (*p.match, matched / measured if measured else None)
        if rec.finished is None and rec.live is not None:
            now_rate, per_hour = f"10 s: {rec.live.rate.tok_s_10s:,.0f}", f"{fmt.money(rec.live.cost_per_hour)}/h"
        else:
            fin = rec.finished
            now_rate = f"avg {fin.tok_s:,.0f}" if fin is not None else "avg -"
            per_hour = f"avg {fmt.money(fin.cost_per_hour if fin is not None else None)}/h"
        return {
            "throughput": PlotSeries(
                PLOT_TITLES["throughput"],
                start,
                SERIES_BUCKET_S,
                tuple(tokens),
                tuple(spans),
                "rate",
                "count",
                now_rate,
            ),
            "match": PlotSeries(
                PLOT_TITLES["match"],
                start,
                SERIES_BUCKET_S,
                tuple(match),
                tuple(spans),
                "level",
                "percent",
                f"{fmt.percent(matched, measured)} n={measured:,}" if measured else "none measured yet",
                floor=None,
            ),
            "cost": PlotSeries(
                PLOT_TITLES["cost"],
                start,
                SERIES_BUCKET_S,
                tuple(cost),
                tuple(spans),
                "level",
                "money",
                f"{fmt.money(spent)} · {per_hour}",
            ),
        }


@dataclass(slots=True)
class _Prefix:
    """Plot values of the buckets from `first` on (every bucket but the newest), with the running totals."""

    first: int
    start: float
    tokens: list = field(default_factory=list)
    spans: list = field(default_factory=list)
    cost: list = field(default_factory=list)
    match: list = field(default_factory=list)
    checked: list = field(default_factory=list)  # (measured, matched) so far, per bucket
    spent: float = 0.0
    measured: int = 0
    matched: int = 0

    def cut(self, n: int) -> _Prefix:
        """The first `n` buckets only (the running totals recounted from what is kept)."""
        out = _Prefix(self.first, self.start)
        if n <= 0:
            return out
        out.tokens, out.spans, out.cost, out.match = self.tokens[:n], self.spans[:n], self.cost[:n], self.match[:n]
        out.checked = self.checked[:n]
        out.spent = out.cost[-1]
        out.measured, out.matched = out.checked[-1]
        return out
