"""Reusable Textual widgets that take plain data (no engine, store or tokenizer imports)."""

from widgets.event_tail import EventLine, EventTail
from widgets.jobs_table import JobRow, JobsTable
from widgets.metric_tile import MetricTile
from widgets.time_plot import PlotSeries, TimePlot
from widgets.token_diff import TokenDiffView

__all__ = ["EventLine", "EventTail", "JobRow", "JobsTable", "MetricTile", "PlotSeries", "TimePlot", "TokenDiffView"]
