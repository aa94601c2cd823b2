"""The eval monitor's screens: the eval dashboard, the requests table and one request's output.

The dashboard polls `EvalSource.poll` (~2 Hz, in a thread worker; a poll reads only the requests stored since the
last) and shows, for the endpoint in focus (`e` the next): the mean acceptance length over time, per-position
acceptance bars and the by-category table; for every endpoint the acceptance figures, tokens/s and the speedup over
the baseline; the guards (the verdicts, whatever list the figures give); the newest events. The stored report's
bootstrap intervals come on a throttle (`EvalSource.report`, a worker of its own) or on `i`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, ProgressBar, Static

from app.eval.live import ACCEPTED, BONUS, BUCKET_S, REJECTED, EndpointFigures, EvalFigures
from app.tui import format as fmt
from app.tui.eval_source import EvalPoll, EvalRequestLine, EvalSource, EvalStatus, RequestOutput
from app.tui.fetch import Fetched, FetchFailed, fetch_in_thread
from widgets.acceptance_bars import acceptance_lines
from widgets.event_tail import EventTail
from widgets.metric_tile import MetricTile
from widgets.time_plot import PlotSeries, TimePlot

if TYPE_CHECKING:
    from textual import getters

    from app.tui.monitor import MonitorApp

REFRESH_S = 0.5
REPORT_AUTO_MAX = 20_000  # up to this many stored requests the intervals refresh on their own (above: `i`)
REPORT_EVERY_S = 30.0  # at least this long between two reports, and 5x the last one's duration
REQUESTS_SHOWN = 500
TILE_LINES = 5
TONES = {"running": "bold green", "paused": "bold yellow", "done": "bold green", "failed": "bold red"}
SPAN_STYLES = {ACCEPTED: "bold green", REJECTED: "bold red", BONUS: "bold cyan"}

GLOSSARY: tuple[tuple[str, str], ...] = (
    (
        "τ",
        "mean acceptance length: 1 + accepted drafts / draft steps, per request, then averaged over requests "
        "(loops left out; requests without figures counted apart)",
    ),  # fmt: skip
    ("tw", "token-weighted acceptance length: 1 + Σ accepted / Σ steps (what the server's counters give)"),
    ("n", "requests with acceptance figures (loops left out)"),
    ("CI", "95 % bootstrap interval of τ (the stored report, refreshed on a throttle or with i)"),
    ("×", "speedup: the endpoint's mean tokens/s over the baseline endpoint's"),
    ("p1, p2, …", "per-position acceptance: the share of draft steps that accepted draft position k"),
    ("no fig", "answers that carried no acceptance figures (never averaged in as zero)"),
)


def eval_source(node: Any) -> EvalSource:
    """The App's source, an EvalSource (the eval screens run only in the eval monitor)."""
    source = node.app.source
    assert isinstance(source, EvalSource)
    return source


def status_line(status: EvalStatus, figures: EvalFigures, width: int = 200) -> Text:
    """`● RUNNING  eval-a · 812/2,000 (40.6%) · 4 in flight · 2 failed · elapsed 1m23s` in `width` cells."""
    state = status.state
    text = Text(no_wrap=True)
    mark = "❚❚" if state == "paused" else "●"
    label = state.upper()
    if status.engine_gone:
        label += f" · {status.engine_text}"
    text.append(f"{mark} {label}", style=TONES.get(state, "bold"))
    ended = figures.answered + figures.failed
    parts = [f"  {status.run_name}", f" · {ended:,}/{status.total:,}"]
    share = f" ({fmt.percent(ended, status.total)})"
    tail = []
    if status.in_flight is not None and state in ("running", "paused"):
        tail.append(f" · {status.in_flight} in flight")
    if figures.failed:
        tail.append(f" · {figures.failed:,} failed")
    if figures.first_at is not None and figures.last_at is not None:
        tail.append(f" · elapsed {fmt.duration(figures.last_at - figures.first_at)}")
    for candidate in ((*parts, share, *tail), (*parts, *tail), tuple(parts)):
        if text.cell_len + sum(len(p) for p in candidate) <= width:
            break
    text.append(candidate[0], style="bold")
    text.append("".join(candidate[1:]))
    return text


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def acceptance_tile(figures: EvalFigures, cis: dict[str, list[float] | None], width: int) -> list[str]:
    """Per endpoint: `name τ 2.41 tw 2.39 n 812` and `  tok/s 1,234 ×1.82 CI 2.38-2.45`; the baseline's tok/s."""
    lines: list[str] = []
    for e in figures.endpoints:
        if e.baseline:
            lines.append(f"{e.name} (base) tok/s {_num(e.tokens_per_s, 0)}")
            continue
        head = f"{e.name} τ {_num(e.mean_acceptance_length)} tw {_num(e.token_weighted)} n {e.requests:,}"
        if len(head) > width:
            head = f"{e.name} τ {_num(e.mean_acceptance_length)} n {fmt.count(e.requests)}"
        lines.append(head)
        second = [f"tok/s {_num(e.tokens_per_s, 0)}"]
        if e.speedup is not None:
            second.append(f"×{e.speedup:.2f}")
        ci = cis.get(e.name)
        if ci:
            second.append(f"CI {ci[0]:.2f}-{ci[1]:.2f}")
        if e.no_acceptance:
            second.append(f"no fig {e.no_acceptance:,}")
        lines.append("  " + " ".join(second))
    if not lines:
        lines.append("no requests stored yet")
    return lines[:TILE_LINES]


def guard_lines(verdicts: tuple[dict[str, str], ...] | list[dict[str, str]]) -> Text:
    """The verdicts, each `▲ name: message` (any verdict the figures give, named as they name it)."""
    if not verdicts:
        return Text("✓ no verdicts: acceptance reported, no dead drafter, no loops", style="green")
    text = Text()
    for n, v in enumerate(verdicts):
        if n:
            text.append("\n")
        text.append(f"▲ {v.get('verdict', '?')}", style="bold yellow")
        text.append(f": {v.get('message', '')}")
    return text


def merged_verdicts(live: tuple[dict[str, str], ...], report: dict[str, Any] | None) -> list[dict[str, str]]:
    """The running verdicts, then any verdict of the stored report the running figures do not give (a kind only the
    whole rows can tell): every verdict the report names shows, the running ones stay fresh."""
    seen = {(v.get("verdict"), v.get("message", "").split(":", 1)[0]) for v in live}
    out = list(live)
    for v in (report or {}).get("verdicts") or ():
        if (v.get("verdict"), str(v.get("message", "")).split(":", 1)[0]) not in seen and not any(
            v.get("verdict") == w.get("verdict") for w in live
        ):
            out.append(v)
    return out


def plot_series(e: EndpointFigures) -> PlotSeries:
    """The endpoint's mean acceptance length per 10 s bucket (gaps where nothing was answered)."""
    if not e.series:
        return PlotSeries(f"τ {e.name}", 0.0, BUCKET_S, (), mode="level", floor=1.0)
    start = e.series[0][0]
    values: list[float | None] = [None] * (int((e.series[-1][0] - start) // BUCKET_S) + 1)
    for b, v in e.series:
        values[int((b - start) // BUCKET_S)] = v
    return PlotSeries(
        f"τ {e.name}", start, BUCKET_S, tuple(values), mode="level", now_label=f"τ {_num(e.mean_acceptance_length)}",
        floor=1.0,
    )  # fmt: skip


class EvalDashboardScreen(Screen):
    """The eval run at a glance; polls at ~2 Hz (a slow read backs off), only message handlers touch widgets."""

    if TYPE_CHECKING:
        app = getters.app(MonitorApp)

    class Polled(Fetched):
        """One EvalPoll (`result`)."""

    class PollFailed(FetchFailed):
        """A poll could not read the run."""

    class Reported(Fetched):
        """The stored report (`result`, a dict) with its intervals."""

    class ReportFailed(FetchFailed):
        """The stored report could not be read."""

    BINDINGS = [
        Binding("r", "show_requests", "Requests", id="eval.requests"),
        Binding("e", "next_endpoint", "Next endpoint", id="eval.endpoint"),
        Binding("i", "report", "Intervals", id="eval.intervals"),
    ]

    def compose(self) -> ComposeResult:
        yield Static(id="eval-status")
        yield ProgressBar(id="eval-progress", show_eta=False)
        with Horizontal(id="eval-tiles"):
            yield MetricTile("acceptance", id="tile-acceptance")
            yield MetricTile("per position", id="tile-positions")
        yield TimePlot(id="eval-plot")
        yield Static(id="eval-guards")
        with Horizontal(id="eval-lower"):
            yield DataTable(id="eval-categories", cursor_type="none", zebra_stripes=True)
            yield EventTail(id="eval-events")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#eval-guards", Static).border_title = "guards"
        self.query_one("#eval-events", EventTail).border_title = "events"
        table = self.query_one("#eval-categories", DataTable)
        table.border_title = "by category"
        for key, label, width in (("category", "category", 12), ("n", "n", 6), ("tau", "τ", 5), ("tw", "tw", 5)):
            table.add_column(label, key=key, width=width)
        self.endpoint_index = 0
        self.last: EvalPoll | None = None
        self.report: dict[str, Any] | None = None
        self.report_at: float | None = None
        self._reporting = False
        self._report_not_before = 0.0
        self._polling = False
        self._not_before = 0.0
        self._started = 0.0
        self._category_rows: tuple[tuple[str, ...], ...] = ()
        self.poll()
        self._timer = self.set_interval(REFRESH_S, self.poll)

    def on_screen_suspend(self) -> None:
        self._timer.pause()

    def on_screen_resume(self) -> None:
        self._timer.resume()
        self.poll()

    # --- polling ---------------------------------------------------------------------------
    def poll(self) -> None:
        if self._polling or time.monotonic() < self._not_before:
            return
        self._polling = True
        self._started = time.monotonic()
        fetch_in_thread(self, eval_source(self).poll, self.Polled, self.PollFailed, group="eval-poll")

    def _fetched(self) -> None:
        now = time.monotonic()
        self._polling = False
        self._not_before = now + 2 * (now - self._started)

    @on(PollFailed)
    def _poll_failed(self, message: PollFailed) -> None:
        self._fetched()
        self.query_one("#eval-status", Static).update(Text(f"cannot read the run: {message.error}", style="bold red"))

    @on(Polled)
    def _polled(self, message: Polled) -> None:
        self._fetched()
        data: EvalPoll = message.result
        if not data.caught_up:
            self._not_before = 0.0  # still reading a big run's history: go on at once
        previous, self.last = self.last, data
        try:
            self.show(data)
        except Exception as exc:  # a rendering bug must not freeze the poll loop
            self.query_one("#eval-status", Static).update(Text(f"cannot show the run: {exc}", style="bold red"))
        if previous is None or previous.status.state != data.status.state:
            self.app.refresh_bindings()
        self._maybe_report(data, force=previous is not None and previous.status.state != data.status.state)

    def _maybe_report(self, data: EvalPoll, *, force: bool = False) -> None:
        if self._reporting or not data.caught_up or data.figures.stored == 0:
            return
        if not force and (data.figures.stored > REPORT_AUTO_MAX or time.monotonic() < self._report_not_before):
            return
        self.action_report()

    def action_report(self) -> None:
        """Read the stored report (bootstrap intervals, every verdict) in a worker of its own."""
        if self._reporting:
            return
        self._reporting = True
        started = time.monotonic()
        source = eval_source(self)

        def fetch() -> tuple[dict[str, Any], float]:
            return source.report(), time.monotonic() - started

        fetch_in_thread(self, fetch, self.Reported, self.ReportFailed, group="eval-report")

    @on(Reported)
    def _reported(self, message: Reported) -> None:
        self.report, took = message.result
        self.report_at = time.time()
        self._reporting = False
        self._report_not_before = time.monotonic() + max(REPORT_EVERY_S, 5 * took)
        if self.last is not None:
            self.show(self.last)

    @on(ReportFailed)
    def _report_failed(self, message: ReportFailed) -> None:
        self._reporting = False
        self._report_not_before = time.monotonic() + REPORT_EVERY_S
        self.notify(f"cannot read the eval report: {message.error}", severity="warning")

    # --- showing ---------------------------------------------------------------------------
    def focus_endpoint(self, figures: EvalFigures) -> EndpointFigures | None:
        """The endpoint whose plot, bars and categories show (`e` the next): the drafter endpoints in turn."""
        drafters = [e for e in figures.endpoints if not e.baseline]
        if not drafters:
            return None
        return drafters[self.endpoint_index % len(drafters)]

    def show(self, data: EvalPoll) -> None:
        figures = data.figures
        with self.app.batch_update():
            status = self.query_one("#eval-status", Static)
            status.update(status_line(data.status, figures, status.content_region.width or self.size.width - 2))
            progress = self.query_one("#eval-progress", ProgressBar)
            progress.update(total=max(data.status.total, 1), progress=figures.answered + figures.failed)
            cis = {
                name: (ep.get("figures") or {}).get("mean_acceptance_length_ci95")
                for name, ep in ((self.report or {}).get("endpoints") or {}).items()
            }
            tile = self.query_one("#tile-acceptance", MetricTile)
            tile.show(*acceptance_tile(figures, cis, tile.content_size.width or 38))
            focus = self.focus_endpoint(figures)
            bars = self.query_one("#tile-positions", MetricTile)
            bars.border_title = f"per position · {focus.name}" if focus else "per position"
            bars.show(*acceptance_lines(focus.per_position if focus else (), bars.content_size.width or 38, TILE_LINES))
            if focus is not None:
                self.query_one("#eval-plot", TimePlot).show(plot_series(focus))
            guards = self.query_one("#eval-guards", Static)
            guards.update(guard_lines(merged_verdicts(figures.verdicts, self.report)))
            self._show_categories(focus)
            self.query_one("#eval-events", EventTail).show(data.events)

    def _show_categories(self, focus: EndpointFigures | None) -> None:
        table = self.query_one("#eval-categories", DataTable)
        rows = tuple(
            (c.category, f"{c.requests:,}", _num(c.mean_acceptance_length), _num(c.token_weighted))
            for c in (focus.categories if focus else ())
        )
        if rows == self._category_rows:
            return
        self._category_rows = rows
        table.clear()
        for row in rows:
            table.add_row(*row, key=row[0])

    def action_next_endpoint(self) -> None:
        self.endpoint_index += 1
        if self.last is not None:
            self.show(self.last)

    def action_show_requests(self) -> None:
        self.app.push_screen(RequestsScreen(id="eval-requests"))

    def glossary(self) -> tuple[tuple[str, str], ...]:
        return GLOSSARY


class RequestsScreen(Screen):
    """The run's requests, newest first; Enter opens one's output."""

    if TYPE_CHECKING:
        app = getters.app(MonitorApp)

    class Loaded(Fetched):
        """A page of EvalRequestLine (`result`)."""

    class LoadFailed(FetchFailed):
        """The requests could not be read."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="requests.back"),
        Binding("g", "reload", "Reload", id="requests.reload"),
    ]

    def compose(self) -> ComposeResult:
        yield Static("requests · loading…", id="requests-caption")
        yield DataTable(id="requests-table", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one("#requests-table", DataTable)
        for key, label, width in (
            ("id", "id", 6),
            ("sample", "sample", 14),
            ("endpoint", "endpoint", 12),
            ("tau", "τ", 5),
            ("tokens", "tokens", 6),
            ("tps", "tok/s", 6),
            ("flag", "", 12),
        ):
            table.add_column(label, key=key, width=width)
        table.focus()
        self.action_reload()

    def action_reload(self) -> None:
        source = eval_source(self)
        fetch_in_thread(
            self, lambda: source.request_lines(limit=REQUESTS_SHOWN), self.Loaded, self.LoadFailed,
            group="eval-requests", exclusive=True,
        )  # fmt: skip

    @on(Loaded)
    def _loaded(self, message: Loaded) -> None:
        lines: list[EvalRequestLine] = list(message.result)
        table = self.query_one("#requests-table", DataTable)
        table.clear()
        baseline = eval_source(self).baseline
        for r in lines:
            flag = "error" if r.error else ("loop" if r.loop else "")
            if not flag:
                flag = "baseline" if r.endpoint == baseline else ("no fig" if r.steps is None else "")
            table.add_row(
                str(r.id), r.sample_id, r.endpoint, _num(r.acceptance_length), f"{r.completion_tokens:,}",
                _num(r.tokens_per_s, 0), flag, key=str(r.id),
            )  # fmt: skip
        shown = f"newest {len(lines):,}" if len(lines) == REQUESTS_SHOWN else f"{len(lines):,}"
        self.query_one("#requests-caption", Static).update(
            f"requests · {shown} · enter opens one's output (accepted drafts green, rejected red) · g reloads"
        )

    @on(LoadFailed)
    def _load_failed(self, message: LoadFailed) -> None:
        self.query_one("#requests-caption", Static).update(Text(f"cannot read the requests: {message.error}", "red"))

    @on(DataTable.RowSelected, "#requests-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.app.push_screen(RequestScreen(int(event.row_key.value)))


def output_text(out: RequestOutput) -> Text:
    """The request's header, legend and output, its spans styled by kind."""
    text = Text()
    tau = None if not out.steps or out.accepted is None else 1 + out.accepted / out.steps
    text.append(f"request {out.request_id} · sample {out.sample_id} · {out.endpoint}", style="bold")
    text.append(f" · {out.category or '(none)'}\n")
    figures = "no acceptance figures" if tau is None else f"τ {tau:.2f} · accepted {out.accepted} in {out.steps} steps"
    text.append(f"{out.n_tokens:,} tokens · {figures}")
    text.append(f" · tok/s {_num(out.tokens_per_s, 0)}" + (" · LOOP" if out.loop else "") + "\n")
    if out.error:
        text.append(f"error: {out.error}\n", style="bold red")
    if out.detailed:
        text.append("accepted draft", style=SPAN_STYLES[ACCEPTED])
        text.append(" · ")
        text.append("target token after a rejected draft", style=SPAN_STYLES[REJECTED])
        text.append(" · ")
        text.append("bonus token (all drafts accepted)", style=SPAN_STYLES[BONUS])
        text.append("\n")
    if out.note:
        text.append(out.note + "\n", style="dim")
    text.append("\n")
    for piece, kind in out.pieces:
        text.append(piece, style=SPAN_STYLES.get(kind, ""))
    return text


class RequestScreen(Screen):
    """One request's output, decoded, its drafts coloured where the server gave per-step detail."""

    if TYPE_CHECKING:
        app = getters.app(MonitorApp)

    class Loaded(Fetched):
        """The RequestOutput (`result`)."""

    class LoadFailed(FetchFailed):
        """The request could not be read."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back", id="request.back")]

    def __init__(self, request_id: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.request_id = request_id
        self.output: RequestOutput | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="request-body"):
            yield Static(f"request {self.request_id} · loading…", id="request-text")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#request-body").focus()
        source, request_id = eval_source(self), self.request_id
        fetch_in_thread(
            self, lambda: source.request_output(request_id), self.Loaded, self.LoadFailed, group="eval-request"
        )

    @on(Loaded)
    def _loaded(self, message: Loaded) -> None:
        self.output = message.result
        self.query_one("#request-text", Static).update(output_text(message.result))

    @on(LoadFailed)
    def _load_failed(self, message: LoadFailed) -> None:
        self.query_one("#request-text", Static).update(
            Text(f"request {self.request_id}: cannot read it: {message.error}", style="bold red")
        )
