"""The home screen: run state, throughput, latency, cost, reconstruction, errors, endpoints, jobs, events."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, ProgressBar, Static

from app.engine.snapshot import MetricsSnapshot
from app.records import BENIGN_VERDICTS, CORRUPT_VERDICTS, Category
from app.tui import format as fmt
from app.tui.fetch import FetchFailed, Fetched, fetch_in_thread
from widgets.event_tail import EventLine, EventTail
from widgets.jobs_table import JobRow, JobsTable
from widgets.metric_tile import MetricTile
from widgets.throughput_spark import ThroughputSpark

REFRESH_S = 0.5
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


def throughput_lines(snap: MetricsSnapshot, width: int = 40) -> tuple[str, ...]:
    """The throughput tile in `width` columns: rates, latency, TTFT, requests on the wire / the limit and what
    waits, and the limit's reason and measured capacity (fewer letters when narrow; never wrapped)."""
    rate = snap.rate
    lines = [
        f"req/s {rate.req_s_10s:6.1f}  1m {rate.req_s_1m:.1f}",
        f"tok/s {rate.tok_s_10s:6.0f}  1m {rate.tok_s_1m:.0f}",
        f"p50 {fmt.ms(snap.latency_p50_ms)}  p95 {fmt.ms(snap.latency_p95_ms)}",
        _fit(width, f"ttft p50 {fmt.ms(snap.ttft_p50_ms)}  p95 {fmt.ms(snap.ttft_p95_ms)}",
             f"ttft {fmt.ms(snap.ttft_p50_ms)} p95 {fmt.ms(snap.ttft_p95_ms)}"),
    ]
    if not snap.concurrency_limit:
        # No live engine to ask (attached, engine stopped or gone): leased samples are what is out.
        lines.append(f"leased {snap.leased:,}")
        return tuple(lines)
    a, b, w = snap.in_flight, snap.concurrency_limit, snap.waiting
    lines.append(_fit(width, f"in flight {a}/{b}  waiting {w}", f"in flight {a}/{b} wait {w}", f"flight {a}/{b} wait {w}"))
    lines.append(limit_line(snap, width))
    return tuple(lines)


def limit_line(snap: MetricsSnapshot, width: int = 40) -> str:
    """`limit 24 at ceiling · capacity 24`: the adaptive limit, why it is there, what was measured."""
    reasons = {e.limit_reason for e in snap.endpoints if e.limit_reason}
    reason = reasons.pop() if len(reasons) == 1 else ("mixed" if reasons else "")
    caps = [e.capacity for e in snap.endpoints]
    cap = str(sum(caps)) if caps and all(c is not None for c in caps) else "?"
    n, short = snap.concurrency_limit, COMPACT_REASONS.get(reason, reason)
    return _fit(width, f"limit {n} {reason} · capacity {cap}", f"limit {n} {reason} · cap {cap}",
                f"limit {n} {short} cap {cap}", f"lim {n} {short} cap {cap}").replace("  ", " ")


def cost_lines(snap: MetricsSnapshot) -> tuple[str, ...]:
    lines = [
        f"spent {fmt.money(snap.cost_usd)}",
        f"rate  {fmt.money(snap.cost_per_hour)}/h",
        f"proj. {fmt.money(snap.projected_cost_usd)}",
    ]
    if snap.budget_usd:
        fraction = snap.cost_usd / snap.budget_usd
        lines.append(f"budget {fmt.money(snap.budget_usd)} {100 * fraction:.0f}%")
        lines.append(fmt.bar(fraction, 16))
    else:
        lines.append("budget none")
    return tuple(lines)


def reconstruction_lines(snap: MetricsSnapshot) -> tuple[str, ...]:
    counts = dict(snap.verdicts)
    checked = sum(n for verdict, n in counts.items() if verdict != Category.UNCHECKED)
    exact = counts.get(Category.EXACT, 0)
    benign = sum(counts.get(v, 0) for v in BENIGN_VERDICTS if v != Category.EXACT)
    corrupt = sum(counts.get(v, 0) for v in CORRUPT_VERDICTS)
    strategies = sorted(snap.strategies, key=lambda item: -item[1])
    total_strategies = sum(n for _, n in strategies)
    mix = " ".join(f"{name} {100 * n / total_strategies:.0f}%" for name, n in strategies[:3]) or "-"
    measured = snap.measured  # live match rate: probes with true ids whose text-only rebuild matched
    last = (f"match {fmt.percent(measured.exact + measured.benign, measured.verified)} n={measured.verified:,}"
            if measured.verified else f"mix {mix}")
    return (
        f"exact   {exact:>7,} {fmt.percent(exact, checked):>6}",
        f"benign  {benign:>7,} {fmt.percent(benign, checked):>6}",
        f"corrupt {corrupt:>7,} {fmt.percent(corrupt, checked):>6}",
        f"  text {counts.get(Category.TEXT_MISMATCH, 0):,} · structure {counts.get(Category.STRUCTURE_MISMATCH, 0):,}",
        f"trunc {counts.get(Category.TRUNCATED, 0):,} · unchecked {counts.get(Category.UNCHECKED, 0):,}",
        last,
    )


def error_lines(snap: MetricsSnapshot) -> tuple[str, ...]:
    if not snap.errors_by_class:
        return (f"none  (failed {snap.failed:,})", f"retried {snap.retried:,}")
    ranked = sorted(snap.errors_by_class, key=lambda item: -item[1])
    lines = [f"{name[:14]:<14} {n:>6,}" for name, n in ranked[:4]]
    lines.append(f"failed samples {snap.failed:,}")
    lines.append(f"retried {snap.retried:,}")
    return tuple(lines)


class DashboardScreen(Screen):
    """Polls the data source at ~2 Hz in a thread worker; only the message handlers touch widgets.

    Each poll ends in `Polled` (its data) or `PollFailed`; `Polled` bubbles on to the App, which keeps
    the latest snapshot for its key checks (the screen writes nothing of the App's).
    """

    class Polled(Fetched):
        """One poll's DashboardData (`result`), fetched off the UI thread."""

    class PollFailed(FetchFailed):
        """A poll could not read the run."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide"), (160, "-xwide")]

    BINDINGS = [
        Binding("m", "app.show_mismatches", "Mismatches", id="nav.mismatches"),
        Binding("j", "app.show_jobs", "Jobs", id="nav.jobs"),
    ]

    def compose(self) -> ComposeResult:
        yield Static(id="run-status")
        yield ProgressBar(id="run-progress", show_eta=False)
        with VerticalScroll(id="dashboard-body"):
            with Grid(id="tiles"):
                yield MetricTile("throughput", id="tile-throughput")
                yield MetricTile("cost", id="tile-cost")
                yield MetricTile("reconstruction", id="tile-reconstruction")
                yield MetricTile("errors", id="tile-errors")
            yield ThroughputSpark(id="spark")
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
        self.poll()
        self._timer = self.set_interval(REFRESH_S, self.poll)

    def on_screen_suspend(self) -> None:
        self._timer.pause()

    def on_screen_resume(self) -> None:
        self._timer.resume()
        self.poll()

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

        def fetch() -> DashboardData:
            snap = snapshot if snapshot is not None else source.snapshot()
            return DashboardData(snap, tuple(source.jobs()), tuple(source.events(6)))

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
        with self.app.batch_update():
            self.query_one("#run-status", Static).update(status_line(snap), layout=False)
            progress = self.query_one("#run-progress", ProgressBar)
            progress.update(total=max(snap.total, 1), progress=snap.done + snap.failed + snap.skipped)
            self._last = snap
            self._show_throughput()
            self.query_one("#tile-cost", MetricTile).show(*cost_lines(snap))
            self.query_one("#tile-reconstruction", MetricTile).show(*reconstruction_lines(snap))
            self.query_one("#tile-errors", MetricTile).show(*error_lines(snap))
            peak = max(snap.throughput_history, default=0.0)
            self.query_one("#spark", ThroughputSpark).show(
                snap.throughput_history, f"output tok/s per 10 s, peak {peak:,.0f}"
            )
            self._show_endpoints(snap)
            self.query_one("#dashboard-jobs", JobsTable).show(data.jobs)
            self.query_one("#events", EventTail).show(data.events)

    def _show_throughput(self) -> None:
        """The throughput tile in its current width (its lines pick fewer letters when the tile is narrow)."""
        if self._last is not None:
            tile = self.query_one("#tile-throughput", MetricTile)
            tile.show(*throughput_lines(self._last, tile.content_size.width or 40))

    def on_resize(self) -> None:
        # a new size may change the grid (2 or 4 tiles a row): refit once the layout has the new widths
        self.call_after_refresh(self._show_throughput)

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

