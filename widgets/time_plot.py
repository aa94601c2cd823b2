"""TimePlot: a titled bar plot of one series over time, with a value axis and a time axis, in plain text.

The caller gives a `PlotSeries`: one value per fixed-width time bucket, and how buckets combine when the
plot has fewer columns than buckets (`rate`: sum of amounts over sum of seconds covered, e.g. tokens per
second; `level`: the last value, e.g. a cumulative cost or rate). The widget picks how many buckets go in
one column from its own width, so the plot always spans the whole series, and says that width in its title
(one meaning per number: the window is on screen). Nothing is drawn wider than the widget.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual.widget import Widget

EIGHTHS = " ▁▂▃▄▅▆▇█"
Y_GUTTER = 7  # value labels ("$12.34", "1,530", "98.5%") plus one space


@dataclass(frozen=True, slots=True)
class PlotSeries:
    """One plot's data: `start` (unix time of the first bucket's start), `step_s` seconds per bucket,
    `values` per bucket (None: no data there), `spans` the seconds each bucket covers (rate mode; the first
    and the current bucket are partial), `mode` rate | level, `unit` count | money | percent; `title` names
    the quantity and `now_label` the value the tiles show beside it."""

    title: str
    start: float
    step_s: float
    values: tuple[float | None, ...]
    spans: tuple[float, ...] = ()
    mode: str = "rate"
    unit: str = "count"
    now_label: str = ""
    floor: float | None = 0.0  # the value axis's bottom (None: from the data, for a rate near 100%)


def fmt_value(value: float, unit: str) -> str:
    """A value-axis label of at most 6 cells."""
    if unit == "money":
        if value >= 1000:
            return f"${value / 1000:.1f}k"
        return f"${value:.2f}" if value >= 1 or value == 0 else f"${value:.3f}"[:6]
    if unit == "percent":
        return f"{100 * value:.1f}%" if value < 1 else "100%"
    if value == 0:
        return "0"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def fmt_span(seconds: float) -> str:
    """A column's width in time: `10s`, `1m`, `2m30s`, `1h`."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"


def clock(ts: float) -> str:
    """UTC `HH:MM` (UTC like every clock of the monitor, so screenshots do not depend on the zone)."""
    return time.strftime("%H:%M", time.gmtime(ts))


def columns_of(series: PlotSeries, width: int) -> tuple[list[float | None], int]:
    """The series combined into at most `width` columns: (column values, buckets per column)."""
    n = len(series.values)
    if n == 0 or width <= 0:
        return [], 1
    per = max(1, math.ceil(n / width))
    out: list[float | None] = []
    for lo in range(0, n, per):
        chunk = series.values[lo : lo + per]
        if series.mode == "rate":
            spans = series.spans[lo : lo + per] if series.spans else (series.step_s,) * len(chunk)
            covered = sum(s for v, s in zip(chunk, spans) if v is not None)
            amount = sum(v for v in chunk if v is not None)
            out.append(amount / covered if covered > 0 else None)
        else:
            known = [v for v in chunk if v is not None]
            out.append(known[-1] if known else None)
    return out, per


class TimePlot(Widget):
    """Title line, `height - 2` rows of bars with the value axis on the left, and the time axis below."""

    DEFAULT_CSS = """
    TimePlot { height: 6; min-height: 4; width: 1fr; }
    TimePlot > .timeplot--bar { color: $success; }
    TimePlot > .timeplot--axis { color: $text-muted; }
    TimePlot > .timeplot--title { color: $text-accent; text-style: bold; }
    """
    COMPONENT_CLASSES = {"timeplot--bar", "timeplot--axis", "timeplot--title"}

    def __init__(self, series: PlotSeries | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._series = series

    @property
    def series(self) -> PlotSeries | None:
        return self._series

    def show(self, series: PlotSeries) -> None:
        """Replace the data (a no-op when unchanged)."""
        if series != self._series:
            self._series = series
            self.refresh()

    def lines(self, width: int, height: int) -> list[Text]:
        """The plot as `height` lines of at most `width` cells (what render draws; tests read it)."""
        s = self._series
        bar = self.get_component_rich_style("timeplot--bar", partial=True) if self.is_mounted else None
        axis = self.get_component_rich_style("timeplot--axis", partial=True) if self.is_mounted else None
        title_style = self.get_component_rich_style("timeplot--title", partial=True) if self.is_mounted else None
        rows = max(height - 2, 1)
        plot_w = max(width - Y_GUTTER, 1)
        if s is None or not s.values:
            head = Text((s.title if s else "plot") + " · no data yet", style=title_style or "", no_wrap=True)
            return [_crop(head, width)] + [Text("")] * (height - 1)
        cols, per = columns_of(s, plot_w)
        known = [v for v in cols if v is not None]
        hi = max(known, default=0.0)
        lo = s.floor if s.floor is not None else _nice_floor(min(known, default=0.0))
        if s.unit == "percent":
            hi = 1.0
        if hi <= lo:
            hi = lo + (1.0 if s.unit != "percent" else 0.01)
        title = _title(s, fmt_span(per * s.step_s), width, title_style, axis)
        out = [_crop(title, width)]
        for r in range(rows - 1, -1, -1):  # top row first
            line = Text(no_wrap=True)
            label = fmt_value(hi, s.unit) if r == rows - 1 else (fmt_value(lo, s.unit) if r == 0 else "")
            line.append(f"{label:>{Y_GUTTER - 1}}│", style=axis or "")
            cells = []
            for v in cols:
                if v is None:
                    cells.append(" ")
                    continue
                eighths = int(round((min(max(v, lo), hi) - lo) / (hi - lo) * rows * 8))
                if v > lo and eighths == 0:
                    eighths = 1  # a non-zero value never vanishes
                cells.append(EIGHTHS[min(max(eighths - 8 * r, 0), 8)])
            line.append("".join(cells), style=bar or "")
            out.append(_crop(line, width))
        end = s.start + sum(s.spans) if s.spans else s.start + len(s.values) * s.step_s
        out.append(
            _crop(Text(time_axis(s.start, end, max(len(cols), 1), width), style=axis or "", no_wrap=True), width)
        )
        return out[:height]

    def render(self) -> Text:
        size = self.content_size
        lines = self.lines(size.width, size.height)
        text = Text(no_wrap=True, overflow="crop")
        for n, line in enumerate(lines):
            if n:
                text.append("\n")
            text.append_text(line)
        return text


def _title(s: PlotSeries, window: str, width: int, style, muted) -> Text:
    """`output tok/s (1m avg) · last 10 s 254`, dropping the parts that do not fit `width` (never cut)."""
    avg = f" ({window} avg)" if s.mode == "rate" else ""
    now = f" · {s.now_label}" if s.now_label else ""
    for parts in ((s.title, avg, now), (s.title, "", now), (s.title, avg, ""), (s.title, "", "")):
        if cell_len("".join(parts)) <= width:
            break
    text = Text(no_wrap=True)
    text.append(parts[0], style=style or "")
    text.append(parts[1], style=muted or "")
    text.append(parts[2])
    return text


def time_axis(start: float, end: float, n_cols: int, width: int) -> str:
    """`      └14:02 ── 17m00s ── 14:19 UTC`: wall-clock times (UTC) at the start and end of the drawn columns
    and the time between them, in `width` cells at most (the parts that do not fit are left out)."""
    left, right, span = clock(start), clock(end) + " UTC", fmt_span(end - start)
    room = max(n_cols, 1)
    lead = " " * (Y_GUTTER - 1) + "└"
    for parts in ((left, span, right), (left, "", right), (left, "", "")):
        fixed = sum(len(p) for p in parts)
        if parts[1]:
            gap = max(room - fixed, 6)
            dash = gap - 2 - len(parts[1])
            middle = " " + "─" * max(dash // 2, 1) + " " + parts[1] + " " + "─" * max(dash - dash // 2, 1) + " "
            middle = middle if dash >= 2 else " " + parts[1] + " "
        else:
            middle = " " * max(room - fixed, 1) if parts[2] else ""
        line = lead + parts[0] + middle + parts[2]
        if cell_len(line) <= width:
            return line
    return lead[:width]


def _nice_floor(value: float) -> float:
    """A value-axis bottom a little under `value` (rates near 100% keep their detail)."""
    return max(0.0, math.floor(value * 10) / 10 - 0.1) if value <= 1 else 0.0


def _crop(text: Text, width: int) -> Text:
    text = text.copy()
    text.truncate(max(width, 0), overflow="crop")
    return text
