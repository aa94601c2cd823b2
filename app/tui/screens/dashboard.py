"""The home screen: run state, throughput, latency, cost, reconstruction, errors, plots over time, endpoints,
jobs, events."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, ProgressBar, Static

from app.engine.snapshot import MetricsSnapshot
from app.records import BENIGN_VERDICTS, CORRUPT_VERDICTS, Category
from app.tui import format as fmt
from app.tui.fetch import FetchFailed, Fetched, fetch_in_thread
from app.tui.series import PLOTS, RunSeries, read_chunk
from app.tui.source import SeriesChunk
from widgets.event_tail import EventLine, EventTail
from widgets.jobs_table import JobRow, JobsTable
from widgets.metric_tile import MetricTile
from widgets.time_plot import TimePlot

REFRESH_S = 0.5
EVENTS_FETCHED = 12  # the event box shows the newest that fit (up to 12 at 120x40)
STATE_LABELS = {
    "running": "● RUNNING",
    "paused": "‖ PAUSED",
    "stopping": "■ STOPPING",
    "done": "✓ DONE",
    "stopped": "■ STOPPED",
    "failed": "✗ FAILED",
    "idle": "○ IDLE",
}
ENDPOINT_COLUMNS = (("endpoint", 12), ("done", 7), ("failed", 6), ("flight", 6), ("req/s", 5), ("p50", 7), ("p95", 7), ("cost", 8))


@dataclass(frozen=True, slots=True)
class DashboardData:
    """One poll's worth of data, fetched off the UI thread."""

    snapshot: MetricsSnapshot
    jobs: tuple[JobRow, ...]
    events: tuple[EventLine, ...]
    series: SeriesChunk | None = None  # the plots' rows stored since the last poll (None: no database)


def status_line(snap: MetricsSnapshot) -> Text:
    """`● RUNNING demo · 412/1,000 (41.2%) · elapsed 1m23s · ETA 2m00s` (reason after PAUSED/STOPPED)."""
    text = Text()
    if engine_gone(snap):
        # the database says running (or paused) but nothing beats: say what is true, and that no key acts
        text.append(f"✗ {snap.engine_text or 'ENGINE GONE'}", style="bold red")
        text.append(" · keys off", style="dim")  # the keys would queue commands nothing reads
    else:
        label = STATE_LABELS.get(snap.state, snap.state.upper())
        style = {"running": "bold green", "paused": "bold yellow", "failed": "bold red", "stopped": "bold red"}.get(
            snap.state, "bold"
        )
        text.append(label, style=style)
        if snap.state_reason:
            text.append(f" ({snap.state_reason})", style=style)
    finished = snap.done + snap.failed + snap.skipped
    text.append(f"  {snap.run_name}", style="bold")
    text.append(f" · {finished:,}/{snap.total:,} ({fmt.percent(finished, snap.total)})")
    if engine_gone(snap):
        return text  # elapsed and ETA mean nothing for a dead engine (and 80 columns are few)
    text.append(f" · elapsed {fmt.duration(snap.elapsed_s)}")
    if snap.state == "running":
        text.append(f" · ETA {fmt.duration(snap.eta_s)}")
    return text


def engine_gone(snap: MetricsSnapshot) -> bool:
    """An attached snapshot whose run is live in the database while its engine stopped beating (crashed)."""
    return snap.engine == "gone" and snap.state not in ("done", "failed")


# the limiter's reasons (app.engine.limiter.REASONS) in fewer letters, for tiles narrower than the full words
COMPACT_REASONS = {"growing": "grow", "at ceiling": "ceiling", "cooling down after 429": "429 wait",
                   "latency rising": "lat. up", "pinned": "pinned", "mixed": "mixed"}


def _fit(width: int, *candidates: str) -> str:
    """The first candidate that fits `width` columns (the last one when none does)."""
    return next((c for c in candidates if len(c) <= width), candidates[-1])


FULL_LINES = 6  # lines of every tile at 120 columns and more
COMPACT_LINES = 4  # lines of every tile under 120 columns (80x24 shows the endpoints, jobs and events too)


def _lines(lines: list[str], n: int) -> tuple[str, ...]:
    """Exactly `n` lines (blank ones added), so every tile of a row has the designed height."""
    return tuple(lines[:n]) + ("",) * max(0, n - len(lines))


def short_ms(value: float | None) -> str:
    """`310ms` / `6.4s` (fmt.ms without the space, for compact tiles)."""
    return fmt.ms(value).replace(" ", "")


def throughput_lines(snap: MetricsSnapshot, width: int = 40, compact: bool = False) -> tuple[str, ...]:
    """The throughput tile in `width` columns: rates, latency, TTFT, requests on the wire / the limit and what
    waits, and the limit's reason and measured capacity (fewer letters when narrow; never wrapped)."""
    rate = snap.rate
    a, b, w = snap.in_flight, snap.concurrency_limit, snap.waiting
    if compact:
        lines = [
            _fit(width, f"tok/s {rate.tok_s_10s:,.0f} 1m {rate.tok_s_1m:,.0f}", f"tok/s {rate.tok_s_10s:,.0f}"),
            _fit(width, f"p95 {short_ms(snap.latency_p95_ms)} ttft {short_ms(snap.ttft_p95_ms)}",
                 f"p95 {short_ms(snap.latency_p95_ms)}"),
        ]
        if not b:  # no live engine to ask (attached, engine stopped or gone): leased samples are what is out
            lines.append(f"leased {snap.leased:,}")
        else:
            lines.append(_fit(width, f"flight {a}/{b} wait {w}", f"{a}/{b} wait {w}", f"{a}/{b}"))
            lines.append(limit_line(snap, width))
        return _lines(lines, COMPACT_LINES)
    lines = [
        f"req/s {rate.req_s_10s:6.1f}  1m {rate.req_s_1m:.1f}",
        f"tok/s {rate.tok_s_10s:6.0f}  1m {rate.tok_s_1m:.0f}",
        f"p50 {fmt.ms(snap.latency_p50_ms)}  p95 {fmt.ms(snap.latency_p95_ms)}",
        _fit(width, f"ttft p50 {fmt.ms(snap.ttft_p50_ms)}  p95 {fmt.ms(snap.ttft_p95_ms)}",
             f"ttft {fmt.ms(snap.ttft_p50_ms)} p95 {fmt.ms(snap.ttft_p95_ms)}"),
    ]
    if not b:
        lines.append(f"leased {snap.leased:,}")
        return _lines(lines, FULL_LINES)
    lines.append(_fit(width, f"in flight {a}/{b}  waiting {w}", f"in flight {a}/{b} wait {w}", f"flight {a}/{b} wait {w}"))
    lines.append(limit_line(snap, width))
    return _lines(lines, FULL_LINES)


def limit_line(snap: MetricsSnapshot, width: int = 40) -> str:
    """`limit 24 at ceiling · capacity 24`: the adaptive limit, why it is there, what was measured."""
    reasons = {e.limit_reason for e in snap.endpoints if e.limit_reason}
    reason = reasons.pop() if len(reasons) == 1 else ("mixed" if reasons else "")
    caps = [e.capacity for e in snap.endpoints]
    cap = str(sum(caps)) if caps and all(c is not None for c in caps) else "?"
    n, short = snap.concurrency_limit, COMPACT_REASONS.get(reason, reason)
    return _fit(width, f"limit {n} {reason} · capacity {cap}", f"limit {n} {reason} · cap {cap}",
                f"limit {n} {short} cap {cap}", f"lim {n} {short} cap {cap}", f"lim {n} {short}",
                f"lim {n}").replace("  ", " ")


def cost_lines(snap: MetricsSnapshot, width: int = 40, compact: bool = False) -> tuple[str, ...]:
    """Spent, $/h, the projection and the budget (with a bar when there is room)."""
    lines = [
        f"spent {fmt.money(snap.cost_usd)}",
        f"rate  {fmt.money(snap.cost_per_hour)}/h",
        f"proj. {fmt.money(snap.projected_cost_usd)}",
    ]
    if snap.budget_usd:
        fraction = snap.cost_usd / snap.budget_usd
        lines.append(_fit(width, f"budget {fmt.money(snap.budget_usd)} {100 * fraction:.0f}%",
                          f"budget {100 * fraction:.0f}%"))
        if not compact:
            lines.append(fmt.bar(fraction, min(16, width)))
    else:
        lines.append("budget none")
    return _lines(lines, COMPACT_LINES if compact else FULL_LINES)


def reconstruction_lines(snap: MetricsSnapshot, width: int = 40, compact: bool = False,
                         measured: tuple[int, int] | None = None) -> tuple[str, ...]:
    """Verdict counts and shares; the last line is the measured match rate with its n (`measured`:
    (verified, matched) from the plots' rows when the face has them, else the snapshot's), or the
    strategy mix before the first probe."""
    counts = dict(snap.verdicts)
    checked = sum(n for verdict, n in counts.items() if verdict != Category.UNCHECKED)
    exact = counts.get(Category.EXACT, 0)
    benign = sum(counts.get(v, 0) for v in BENIGN_VERDICTS if v != Category.EXACT)
    corrupt = sum(counts.get(v, 0) for v in CORRUPT_VERDICTS)
    strategies = sorted(snap.strategies, key=lambda item: -item[1])
    total_strategies = sum(n for _, n in strategies)
    mix = " ".join(f"{name} {100 * n / total_strategies:.0f}%" for name, n in strategies[:3]) or "-"
    if measured is None:  # live match rate: probes with true ids whose text-only rebuild agreed
        m = snap.measured
        measured = (m.verified, m.exact + m.benign)
    verified, matched = measured
    last = _fit(width, f"match {fmt.percent(matched, verified)} n={verified:,}", f"match {fmt.percent(matched, verified)}"
                ) if verified else _fit(width, f"mix {mix}", "mix " + mix.split(" ")[0], "no probes")

    def count(label: str, n: int, pad: int) -> str:
        share = fmt.percent(n, checked)
        return _fit(width, f"{label:<{pad}} {n:>7,} {share:>6}", f"{label} {n:,} {share}", f"{label} {share}")

    if compact:
        return _lines([count("exact", exact, 0), count("benign", benign, 0), count("corrupt", corrupt, 0), last],
                      COMPACT_LINES)
    return _lines([
        count("exact", exact, 7),
        count("benign", benign, 7),
        count("corrupt", corrupt, 7),
        _fit(width, f"  text {counts.get(Category.TEXT_MISMATCH, 0):,} · structure {counts.get(Category.STRUCTURE_MISMATCH, 0):,}",
             f"  text {counts.get(Category.TEXT_MISMATCH, 0):,} · struct {counts.get(Category.STRUCTURE_MISMATCH, 0):,}"),
        _fit(width, f"trunc {counts.get(Category.TRUNCATED, 0):,} · unchecked {counts.get(Category.UNCHECKED, 0):,}",
             f"trunc {counts.get(Category.TRUNCATED, 0):,} · unchk {counts.get(Category.UNCHECKED, 0):,}"),
        last,
    ], FULL_LINES)


def error_lines(snap: MetricsSnapshot, width: int = 40, compact: bool = False) -> tuple[str, ...]:
    """The commonest error classes, failed samples and retries."""
    n_lines = COMPACT_LINES if compact else FULL_LINES
    tail = [f"failed {snap.failed:,}" if compact else f"failed samples {snap.failed:,}", f"retried {snap.retried:,}"]
    if not snap.errors_by_class:
        return _lines(["none", *tail], n_lines)
    ranked = sorted(snap.errors_by_class, key=lambda item: -item[1])
    name_w = max(width - 8, 6)
    lines = [f"{name[:name_w]:<{name_w}}{n:>8,}" if len(f"{n:,}") < 8 else f"{name[:width - 9]} {n:,}"
             for name, n in ranked[:n_lines - len(tail)]]
    return _lines([*lines, *tail], n_lines)


class DashboardScreen(Screen):
    """Polls the data source at ~2 Hz in a thread worker; only the message handlers touch widgets.

    Each poll ends in `Polled` (its data) or `PollFailed`; `Polled` bubbles on to the App, which keeps
    the latest snapshot for its key checks (the screen writes nothing of the App's).

    Layout (app.tcss): under 120 columns one plot shows at a time (`t` shows the next); under 120 columns or
    32 rows the tiles are compact (COMPACT_LINES each); under 32 rows the boxes draw only their top edge, so
    80x24 shows the tiles, a plot, the endpoints, the jobs and the events at once (the jobs screen `j` and
    `m` hold the details).
    """

    class Polled(Fetched):
        """One poll's DashboardData (`result`), fetched off the UI thread."""

    class PollFailed(FetchFailed):
        """A poll could not read the run."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide"), (160, "-xwide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]

    BINDINGS = [
        Binding("m", "app.show_mismatches", "Mismatches", id="nav.mismatches"),
        Binding("j", "app.show_jobs", "Jobs", id="nav.jobs"),
        Binding("t", "next_plot", "Next plot", id="dash.plot"),
    ]

    def compose(self) -> ComposeResult:
        yield Static(id="run-status")
        yield ProgressBar(id="run-progress", show_eta=False)
        with Vertical(id="dashboard-body"):
            with Grid(id="tiles"):
                yield MetricTile("throughput", id="tile-throughput")
                yield MetricTile("cost", id="tile-cost")
                yield MetricTile("reconstruction", id="tile-reconstruction")
                yield MetricTile("errors", id="tile-errors")
            with Horizontal(id="plots"):
                for n, name in enumerate(PLOTS):
                    yield TimePlot(id=f"plot-{name}", classes="-shown" if n == 0 else "")
            with Horizontal(id="tables"):
                yield DataTable(id="endpoints", cursor_type="none", zebra_stripes=True)
                yield JobsTable(id="dashboard-jobs")
            yield EventTail(id="events")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        endpoints = self.query_one("#endpoints", DataTable)
        endpoints.border_title = "endpoints"
        for label, width in ENDPOINT_COLUMNS:
            endpoints.add_column(label, width=width, key=label)
        self.query_one("#dashboard-jobs", JobsTable).border_title = "jobs"
        self.query_one("#events", EventTail).border_title = "events"
        self._polling = False
        self._not_before = 0.0
        self._fetch_started = 0.0
        self._endpoint_rows: dict[str, tuple[str, ...]] = {}
        self._last: MetricsSnapshot | None = None
        self.series = RunSeries()
        self.shown_plot = PLOTS[0]
        self.poll()
        self._timer = self.set_interval(REFRESH_S, self.poll)

    def on_screen_suspend(self) -> None:
        self._timer.pause()

    def on_screen_resume(self) -> None:
        self._timer.resume()
        self.poll()

    @property
    def compact(self) -> bool:
        """True under 120 columns or 32 rows: compact tiles (COMPACT_LINES each)."""
        return self.has_class("-narrow") or self.has_class("-short")

    @property
    def one_plot(self) -> bool:
        """True under 120 columns: one plot at a time (`t` the next)."""
        return self.has_class("-narrow")

    def poll(self) -> None:
        """Start one fetch unless the previous one is still running or was slow (a slow DB never piles up).

        After a fetch that took d seconds the next waits 2d more, so reading a huge database attached
        takes at most about a third of a core and the UI stays responsive.
        """
        if self._polling or time.monotonic() < self._not_before:
            return
        self._polling = True
        self._fetch_started = time.monotonic()
        source = self.app.source
        # An in-process engine's snapshot is in memory and owned by this loop: take it here.
        snapshot = source.snapshot() if source.snapshot_on_loop else None
        self._fetch(snapshot)

    def _fetch(self, snapshot: MetricsSnapshot | None) -> None:
        source = self.app.source
        cursor = self.series.cursor
        n_events = EVENTS_FETCHED

        def fetch() -> DashboardData:
            snap = snapshot if snapshot is not None else source.snapshot()
            return DashboardData(snap, tuple(source.jobs()), tuple(source.events(n_events)), read_chunk(source, cursor))

        fetch_in_thread(self, fetch, self.Polled, self.PollFailed, group="dashboard-poll")

    @on(Polled)
    def _polled(self, message: Polled) -> None:
        try:
            self.apply(message.result)
        except Exception as exc:  # a rendering bug must not freeze the poll loop: say so and keep polling
            self._poll_failed(exc)

    @on(PollFailed)
    def _poll_error(self, message: PollFailed) -> None:
        self._poll_failed(message.error)

    def _fetched(self) -> None:
        now = time.monotonic()
        self._polling = False
        self._not_before = now + 2 * (now - self._fetch_started)

    def _poll_failed(self, exc: Exception) -> None:
        self._fetched()
        self.query_one("#run-status", Static).update(Text(f"cannot read the run: {exc}", style="bold red"), layout=False)

    def apply(self, data: DashboardData) -> None:
        """Render one poll (called on the UI thread)."""
        self._fetched()
        snap = data.snapshot
        if data.series is not None:
            self.series.add(data.series)
            if not data.series.caught_up:
                self._not_before = 0.0  # still reading a big run's history: the next poll continues at once
        with self.app.batch_update():
            self.query_one("#run-status", Static).update(status_line(snap), layout=False)
            progress = self.query_one("#run-progress", ProgressBar)
            progress.update(total=max(snap.total, 1), progress=snap.done + snap.failed + snap.skipped)
            self._last = snap
            self._show_tiles()
            self._show_plots()
            self._show_endpoints(snap)
            self.query_one("#dashboard-jobs", JobsTable).show(data.jobs)
            self.query_one("#events", EventTail).show(data.events)

    def measured(self) -> tuple[int, int] | None:
        """(verified, matched) from the plots' rows (the same numbers the match-rate plot ends at), or None
        where the source has no database (then the snapshot's)."""
        return None if self.series.empty else self.series.measured()

    def _show_tiles(self) -> None:
        """Every tile in its current width and mode (lines pick fewer letters when the tile is narrow)."""
        snap = self._last
        if snap is None:
            return
        compact = self.compact
        for tile_id, lines in (("throughput", throughput_lines), ("cost", cost_lines),
                               ("reconstruction", partial(reconstruction_lines, measured=self.measured())),
                               ("errors", error_lines)):
            tile = self.query_one(f"#tile-{tile_id}", MetricTile)
            tile.show(*lines(snap, tile.content_size.width or 40, compact))

    def _show_plots(self) -> None:
        if self._last is None:
            return
        for name, series in self.series.plots(self._last).items():
            self.query_one(f"#plot-{name}", TimePlot).show(series)

    def action_next_plot(self) -> None:
        """Show the next plot (under 120 columns one plot shows at a time)."""
        self.shown_plot = PLOTS[(PLOTS.index(self.shown_plot) + 1) % len(PLOTS)]
        for name in PLOTS:
            self.query_one(f"#plot-{name}", TimePlot).set_class(name == self.shown_plot, "-shown")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next_plot":
            return self.one_plot  # every plot shows at 120 columns: nothing to cycle
        return True

    def on_resize(self) -> None:
        # a new size may change the mode (compact or full tiles, one plot or three): refit once the layout
        # has the new widths, and show or hide `t`
        self.call_after_refresh(self._refit)

    def _refit(self) -> None:
        self._show_tiles()
        self.refresh_bindings()

    def _show_endpoints(self, snap: MetricsSnapshot) -> None:
        table = self.query_one("#endpoints", DataTable)
        for endpoint in snap.endpoints:
            cells = (
                endpoint.name,
                f"{endpoint.completed:,}",
                f"{endpoint.failed:,}",
                f"{endpoint.in_flight}/{endpoint.concurrency_limit}",
                f"{endpoint.rate.req_s_10s:.1f}",
                fmt.ms(endpoint.latency_p50_ms),
                fmt.ms(endpoint.latency_p95_ms),
                fmt.money(endpoint.cost_usd),
            )
            old = self._endpoint_rows.get(endpoint.name)
            if old is None:
                table.add_row(*cells, key=endpoint.name)
            elif old != cells:
                for (label, _), value, before in zip(ENDPOINT_COLUMNS, cells, old):
                    if value != before:
                        table.update_cell(endpoint.name, label, value)
            self._endpoint_rows[endpoint.name] = cells

