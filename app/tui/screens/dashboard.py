"""The home screen: run state, throughput, latency, cost, reconstruction, errors, plots over time, endpoints,
jobs, events."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, ProgressBar, Static

from app.engine.record.snapshot import WITH_FAILURES, EndpointLive, FinishedFigures, LiveFigures, RunRecord, state_words
from app.records import Category
from app.tui import format as fmt
from app.tui.fetch import Fetched, FetchFailed, fetch_in_thread
from app.tui.series import PLOTS, RunSeries, read_chunk
from app.tui.source import ConversationCounts, SeriesChunk
from widgets.event_tail import EventLine, EventTail
from widgets.jobs_table import JobRow, JobsTable
from widgets.metric_tile import MetricTile
from widgets.time_plot import TimePlot

if TYPE_CHECKING:
    from textual import getters

    from app.tui.monitor import MonitorApp

REFRESH_S = 0.5
EVENTS_FETCHED = 12  # the event box shows the newest that fit (up to 12 at 120x40)
# the endpoints table: (key, label, width); the endpoint column's width follows the names (see _endpoint_width)
ENDPOINT_COLUMNS = (
    ("endpoint", "endpoint", 8),
    ("done", "done", 7),
    ("failed", "failed", 6),
    ("flight", "flight", 7),
    ("req/s", "req/s", 5),
    ("p50", "p50", 6),
    ("p95", "p95", 6),
    ("cost", "cost", 8),
)
# after an endpoint's name, how far its text path is proven (app.store.verification's states, `fidelity` per provider)
TRUST_MARKS = {"verified": "✓", "prior only": "~", "unverified": "?"}
ENDPOINT_NAME_MAX = 40  # an endpoint name longer than this (or than the room left) shows as its alias, e.g. `#2`

# Every abbreviation the dashboard uses, with its meaning: the help screen (`?`) lists them. A tile line uses a
# word from here or a whole word; a test reads every tile and checks it.
GLOSSARY: tuple[tuple[str, str], ...] = (
    (
        "tok/s, req/s",
        "output tokens and answers per second: the engine's last 10 s (1m: its last minute); "
        "avg: over the whole run, once it is finished",
    ),
    (
        "p50, p95",
        "median and 95th percentile latency, request to last byte (the engine's last 5 minutes while "
        "it runs, every answer once finished)",
    ),
    ("ttft", "95th percentile time to the first token"),
    ("flight a/b", "requests on the wire / the concurrency limit"),
    ("waiting", "samples between requests (a retry's wait) or being reconstructed and stored"),
    (
        "limit reasons",
        "growing · at ceiling · 429 cooldown (cooling down after 429) · latency up (latency "
        "rising) · pinned (set by the operator) · mixed (endpoints differ)",
    ),
    ("cap", "the capacity proven so far (shown once every endpoint has one)"),
    ("rate $/h, proj.", "what the engine spends per hour; the projected total cost"),
    ("avg $/h", "a finished run's cost per hour over its span"),
    (
        "exact, benign, corrupt",
        "verdicts against the reference: the same ids; the same text with another BPE split; different text or layout",
    ),
    ("trunc", "truncated: stopped at max_tokens (no end-of-turn; the export leaves it out unless asked)"),
    ("no ref", "no reference to judge the ids against"),
    ("suspect", "reconstructed from text with a sign it may not be the model's ids (left out of exports)"),
    (
        "interv (cmp fb healed think prompt repeat)",
        "samples a server intervened on, by kind (cmp: prompt compressed, fb: another provider answered, healed: "
        "the answer rewritten, think: a thinking budget closed the reasoning, prompt: the prompt cut or counted "
        "otherwise, repeat: a repetition stop; left out of exports)",
    ),
    ("verified", "true ids, the model's own: from the server or logprobs"),
    (
        "ref-checked",
        "checked against a reference: reconstructed from text and judged by a reference (its verdict above)",
    ),
    ("unchecked", "reconstructed from text with neither true ids nor a reference"),
    (
        "match N% n=M",
        "of M measured answers (true ids whose text-only reconstruction was also compared), N% came out "
        "the same text: the text path's fidelity",
    ),
    (
        "✓ ~ ? after an endpoint",
        "its text path verified by probes with true ids / only a known server's steps, "
        "no probe yet / unverified (the least proven of its upstream providers; "
        "`eaglewatch fidelity` says each and what would verify it)",
    ),
    ("failed, retried", "samples that failed for good; failed requests that were tried again"),
    ("5xx, 429, …", "failed requests by error class"),
)
# The conversations tile's words (shown, with the GLOSSARY, only for a run of whole conversations).
CONVERSATION_GLOSSARY: tuple[tuple[str, str], ...] = (
    ("done a/b", "conversations: a of the b (the tile's title) ended with every turn done"),
    ("open", "conversations not ended: not started, a turn in flight, or a later turn ready"),
    ("diverged, div", "conversations ended where the model's tool calls differed from the recorded ones (stop policy)"),
    ("failed (conv.)", "conversations ended by a turn that failed for good"),
    ("trunc (conv.)", "conversations ended by an answer cut at max_tokens before their last turn"),
    ("skipped (conv.)", "conversations ended by a skipped turn (e.g. its prompt too long)"),
    (
        "off-policy, off-pol",
        "turns whose history holds recorded tool results replayed after a divergent call (replay policy)",
    ),
    ("turns done, pending", "turns by state: answered; ready to be sent"),
    ("flight (turns)", "turns leased: on the wire or being stored"),
    ("wait", "turns waiting on their parent turn's answer (their request is not written yet)"),
    ("failed, skipped (turns)", "turns that failed for good; turns skipped (their conversation ended before them)"),
)


@dataclass(frozen=True, slots=True)
class DashboardData:
    """One poll's worth of data, fetched off the UI thread."""

    record: RunRecord
    jobs: tuple[JobRow, ...]
    events: tuple[EventLine, ...]
    series: SeriesChunk | None = None  # the plots' rows stored since the last poll (None: no database)


TONES = {"good": "bold green", "live": "bold green", "warn": "bold yellow", "bad": "bold red", "plain": "bold"}


def status_line(rec: RunRecord, width: int = 200) -> Text:
    """`● RUNNING  demo · 412/1,000 (41.2%) · elapsed 1m23s · ETA 2m00s` in `width` cells (app.engine.record.snapshot
    .state_words says the state; a finished run's elapsed is frozen and it has no ETA). When narrow, the share
    goes first (the progress bar below shows it), then the failures' total (the counts show it)."""
    words = state_words(rec)
    ended, total = rec.counts.samples.ended, rec.total
    eta = rec.eta_s is not None or (rec.finished is None and rec.state == "running")
    short_detail = words.detail
    if words.label == WITH_FAILURES:
        short_detail = f"{rec.failed:,} failed"
    candidates = []
    for detail, share in ((words.detail, True), (words.detail, False), (short_detail, False)):
        text = Text()
        text.append(words.label, style=TONES[words.tone])
        if detail:
            text.append(f" ({detail})", style=TONES[words.tone])
        if rec.engine_gone:
            text.append(" · keys off", style="dim")  # the keys would queue commands nothing reads
        text.append(f"  {rec.run_name}", style="bold")
        text.append(f" · {ended:,}/{total:,}" + (f" ({fmt.percent(ended, total)})" if share else ""))
        text.append(f" · elapsed {fmt.duration(rec.elapsed_s)}")
        if eta:
            text.append(f" · ETA {fmt.duration(rec.eta_s)}")
        candidates.append(text)
    return next((t for t in candidates if t.cell_len <= width), candidates[-1])


def engine_gone(rec: RunRecord) -> bool:
    """A record whose run is live in the database while its engine stopped beating (crashed)."""
    return rec.engine_gone


# the limiter's reasons (app.engine.capacity.limiter.REASONS) in the glossary's words, for tiles narrower than the full
# ones
COMPACT_REASONS = {
    "growing": "growing",
    "at ceiling": "at ceiling",
    "cooling down after 429": "429 cooldown",
    "latency rising": "latency up",
    "pinned": "pinned",
    "mixed": "mixed",
}


def _fit(width: int, *candidates: str) -> str:
    """The first candidate that fits `width` columns (the last one when none does). Candidates differ only in
    how a word or a number is written (GLOSSARY abbreviations, fmt.count), never in what they show."""
    return next((c for c in candidates if len(c) <= width), candidates[-1])


FULL_LINES = 6  # lines of every tile at 120 columns and 32 rows or more
COMPACT_LINES = 5  # lines of every tile under 120 columns or 32 rows (80x24 shows the tables and events too)


def _lines(lines: list[str], n: int) -> tuple[str, ...]:
    """Exactly `n` lines (blank ones added), so every tile of a row has the designed height."""
    return tuple(lines[:n]) + ("",) * max(0, n - len(lines))


def _pack(items: list[str], width: int, n: int, sep: str = "  ") -> list[str]:
    """`items` ("label value") packed into at most `n` lines of `width` (`sep` apart), none split."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        elif len(lines) < n:
            lines.append(item)
        else:
            lines[-1] += sep + item  # more items than room: never dropped (the tile shows … at its edge)
    return lines


def limit_words(endpoints: tuple[EndpointLive, ...], compact: bool) -> tuple[str, str | None]:
    """(the limit's reason over every endpoint, the summed proven capacity or None while any is unknown)."""
    reasons = {e.limit_reason for e in endpoints if e.limit_reason}
    reason = reasons.pop() if len(reasons) == 1 else ("mixed" if reasons else "")
    caps = [e.capacity for e in endpoints]
    cap = str(sum(c for c in caps if c is not None)) if caps and all(c is not None for c in caps) else None
    return (COMPACT_REASONS.get(reason, reason) if compact else reason), cap


def throughput_lines(rec: RunRecord, width: int = 40, compact: bool = False) -> tuple[str, ...]:
    """The throughput tile: the engine's rates, percentiles, requests in flight / the limit, what waits and
    why the limit is where it is; for a finished run, averages and percentiles over the whole run."""
    n = COMPACT_LINES if compact else FULL_LINES
    ms = fmt.short_ms if compact else fmt.ms
    fin, live = rec.finished, rec.live
    if fin is not None or live is None:
        fin = fin or FinishedFigures()
        p = fin.percentiles
        latency = (
            [f"p95 {ms(p.latency_p95_ms)} ttft {ms(p.ttft_p95_ms)}"]
            if compact
            else [
                f"p50 {ms(p.latency_p50_ms)}  p95 {ms(p.latency_p95_ms)}",
                _fit(width, f"ttft p50 {ms(p.ttft_p50_ms)} p95 {ms(p.ttft_p95_ms)}", f"ttft {ms(p.ttft_p95_ms)}"),
            ]
        )
        return _lines(
            [
                f"avg tok/s {fin.tok_s:,.0f}",
                f"avg req/s {fin.req_s:,.1f}",
                *latency,
                f"leased {rec.counts.samples.leased:,}",
            ],
            n,
        )
    rate = live.rate
    reason, cap = limit_words(live.endpoints, False)
    short = COMPACT_REASONS.get(reason, reason)
    with_cap = f" · capacity {cap}" if cap is not None else ""
    short_cap = f" cap {cap}" if cap is not None else ""
    limit = _fit(
        width,
        f"limit {reason}{with_cap}",
        f"limit {short}{with_cap}",
        f"limit {short}{short_cap}",
        f"{short}{short_cap}",
    )
    flight = f"{live.in_flight}/{live.concurrency_limit}"
    if compact:
        return _lines(
            [
                _fit(width, f"tok/s {rate.tok_s_10s:,.0f}", f"tok/s {fmt.count(round(rate.tok_s_10s))}"),
                f"p95 {ms(live.latency_p95_ms)} ttft {ms(live.ttft_p95_ms)}",
                _fit(width, f"in flight {flight}", f"flight {flight}"),
                f"waiting {live.waiting:,}",
                limit,
            ],
            n,
        )
    return _lines(
        [
            f"req/s {rate.req_s_10s:,.1f}  1m {rate.req_s_1m:,.1f}",
            _fit(
                width,
                f"tok/s {rate.tok_s_10s:,.0f}  1m {rate.tok_s_1m:,.0f}",
                f"tok/s {rate.tok_s_10s:,.0f} 1m {rate.tok_s_1m:,.0f}",
            ),
            f"p50 {ms(live.latency_p50_ms)}  p95 {ms(live.latency_p95_ms)}",
            _fit(width, f"ttft p50 {ms(live.ttft_p50_ms)} p95 {ms(live.ttft_p95_ms)}", f"ttft {ms(live.ttft_p95_ms)}"),
            _fit(width, f"in flight {flight}  waiting {live.waiting:,}", f"flight {flight} waiting {live.waiting:,}"),
            limit,
        ],
        n,
    )


def cost_lines(rec: RunRecord, width: int = 40, compact: bool = False) -> tuple[str, ...]:
    """Spent, the spending rate and the projection (a finished run: its average $/h, no projection), the budget."""
    spent = rec.cost_usd
    if rec.finished is not None or rec.live is None:
        per_hour = rec.finished.cost_per_hour if rec.finished is not None else 0.0
        lines = [f"spent {fmt.money(spent)}", f"avg {fmt.money(per_hour)}/h"]
    else:
        lines = [
            f"spent {fmt.money(spent)}",
            f"rate  {fmt.money(rec.live.cost_per_hour)}/h",
            f"proj. {fmt.money(rec.live.projected_cost_usd)}",
        ]
    if rec.budget_usd:
        fraction = spent / rec.budget_usd
        share = f"{100 * fraction:.0f}%"
        if len(f"budget {fmt.money(rec.budget_usd)} {share}") <= width:
            lines += [f"budget {fmt.money(rec.budget_usd)} {share}", fmt.bar(fraction, min(16, width))]
        else:  # a large budget: its share goes before the bar
            lines += [
                f"budget {fmt.money(rec.budget_usd)}",
                f"{share} " + fmt.bar(fraction, min(16, width) - len(share) - 1),
            ]
    else:
        lines.append("budget none")
    return _lines(lines, COMPACT_LINES if compact else FULL_LINES)


def reconstruction_lines(rec: RunRecord, width: int = 40, compact: bool = False) -> tuple[str, ...]:
    """What the stored ids are: every verdict class (exact, benign, corrupt, truncated, no reference), the
    suspects, the verification classes and the measured match rate (app.records' vocabulary)."""
    a = rec.counts.answers
    exact, benign = a.verdict(Category.EXACT), a.verdict(Category.BPE_EQUIVALENT)
    corrupt, trunc, no_ref = a.corrupt, a.truncated, a.verdict(Category.UNCHECKED)
    match = f"match {fmt.percent(a.measured_matched, a.measured)} n={a.measured:,}" if a.measured else "measured 0"

    def pair(first: str, x: int, second: str, y: int, *shorter: str) -> str:
        """`first x · second y`, in fewer cells when narrow: shorter labels (GLOSSARY), then rounded counts."""
        labels = [(first, second), *((first, s) for s in shorter)]
        return _fit(
            width,
            f"{first} {x:,} · {second} {y:,}",
            *(f"{a} {x:,} {b} {y:,}" for a, b in labels),
            *(f"{a} {fmt.count(x)} {b} {fmt.count(y)}" for a, b in labels),
        )

    verified = _fit(
        width,
        f"verified {a.verified:,} of {a.answers:,}",
        f"verified {a.verified:,}/{a.answers:,}",
        f"verified {fmt.count(a.verified)}/{fmt.count(a.answers)}",
    )
    if compact:
        return _lines(
            [
                pair("exact", exact, "benign", benign),
                pair("corrupt", corrupt, "trunc", trunc),
                pair("no ref", no_ref, "suspect", a.suspects),
                verified,
                match,
            ],
            COMPACT_LINES,
        )
    return _lines(
        [
            pair("exact", exact, "benign", benign),
            pair("corrupt", corrupt, "truncated", trunc, "trunc"),
            pair("no reference", no_ref, "suspect", a.suspects)
            if len(f"no reference {no_ref:,} · suspect {a.suspects:,}") <= width
            else pair("no ref", no_ref, "suspect", a.suspects),
            verified,
            pair("ref-checked", a.checked, "unchecked", a.unchecked),
            match,
        ],
        FULL_LINES,
    )


# the tile's short words for the intervention kinds (app.engine.interventions.KINDS; GLOSSARY "interv")
_KIND_SHORT = {
    "context_compression": "cmp",
    "provider_fallback": "fb",
    "response_healing": "healed",
    "thinking_budget": "think",
    "prompt_truncated": "prompt",
    "prompt_tokens_differ": "prompt",
    "repetition_stop": "repeat",
}


def _intervention_items(intervened: int, by_kind: tuple[tuple[str, int], ...], width: int) -> list[str]:
    """The errors tile's item for the samples a server intervened on: `interv 5 (cmp 2 think 3)`, or
    `interv 5` where the kinds do not fit `width`; none with none."""
    if not intervened:
        return []
    kinds: dict[str, int] = {}
    for kind, n in by_kind:
        word = _KIND_SHORT.get(kind, "other")
        kinds[word] = kinds.get(word, 0) + n
    detail = " ".join(f"{k} {fmt.count(n)}" for k, n in kinds.items())
    return [
        _fit(
            width,
            f"interv {intervened:,} ({detail})",
            f"interv {fmt.count(intervened)} ({detail})",
            f"interv {fmt.count(intervened)}",
        )
    ]


CONVERSATION_LINES = 4  # the conversations tile: two lines of conversations, two of turns (fits the plot row)
CONVERSATION_WIDTH = 42  # its lines' width (app.tcss gives the tile this much inside its border and padding)


def conversation_lines(conv: ConversationCounts, width: int = CONVERSATION_WIDTH) -> tuple[str, ...]:
    """The conversations tile (its title says how many): conversations done of all, open, diverged, failed,
    truncated (and ended skipped when any), the off-policy turns; then the turns by state (done, in flight, waiting
    on their parent, pending, failed, skipped). Each half packs into two lines of `width`; when they do not fit,
    the numbers are written shorter (fmt.count, the total left to the title) and the items closer together."""
    turns = conv.turns

    def items(n: Callable[[int], str], of_total: bool, short: bool) -> tuple[list[str], list[str]]:
        ended = [f"skipped {n(conv.ended_skipped)}"] if conv.ended_skipped else []
        done = f"done {n(conv.done)}/{n(conv.total)}" if of_total else f"done {n(conv.done)}"
        diverged, off_policy = ("div", "off-pol") if short else ("diverged", "off-policy")
        conversations = [
            done,
            f"open {n(conv.open)}",
            f"{diverged} {n(conv.diverged)}",
            f"failed {n(conv.failed)}",
            f"trunc {n(conv.truncated)}",
            *ended,
            f"{off_policy} {n(conv.off_policy_turns)}",
        ]
        by_state = [
            f"turns done {n(turns.get('done', 0))}",
            f"flight {n(turns.get('leased', 0))}",
            f"wait {n(turns.get('waiting', 0))}",
            f"pending {n(turns.get('pending', 0))}",
            f"failed {n(turns.get('failed', 0))}",
            f"skipped {n(turns.get('skipped', 0))}",
        ]
        return conversations, by_state

    def whole(v: int) -> str:
        return f"{v:,}"

    lines: list[str] = []
    for n, of_total, sep, short in (
        (whole, True, " · ", False),
        (whole, True, "  ", False),
        (fmt.count, True, "  ", False),
        (fmt.count, False, " ", False),
        (fmt.count, False, " ", True),
    ):
        first, second = items(n, of_total, short)
        lines = _pack(first, width, 2, sep) + _pack(second, width, 2, sep)
        if all(len(line) <= width for line in lines):
            break
    return _lines(lines, CONVERSATION_LINES)


def conversation_title(conv: ConversationCounts) -> str:
    """The conversations tile's title: how many conversations the run has."""
    return f"conversations {conv.total:,}"


def error_lines(rec: RunRecord, width: int = 40, compact: bool = False) -> tuple[str, ...]:
    """Every class of failed request with its count, then the samples a server intervened on (by kind where that
    fits), failed samples and retried requests."""
    n = COMPACT_LINES if compact else FULL_LINES
    c = rec.counts
    failed, retried = f"failed {c.samples.failed:,}", f"retried {c.retried:,}"
    # failed samples, the samples a server intervened on and retried requests, in as few lines as they go
    items = [failed, *_intervention_items(c.intervened, c.interventions, width), retried]
    tail = min((_pack(items, width, len(items), sep) for sep in (" · ", " ")), key=len)
    if not c.errors_by_class:
        return _lines(["none", *tail], n)
    ranked = sorted(c.errors_by_class, key=lambda item: (-item[1], item[0]))
    body = _pack([f"{name} {count:,}" for name, count in ranked], width, n - len(tail))
    if any(len(line) > width for line in body):
        body = _pack([f"{name} {fmt.count(count)}" for name, count in ranked], width, n - len(tail))
    return _lines([*body, *tail], n)


class DashboardScreen(Screen):
    """Polls the data source at ~2 Hz in a thread worker; only the message handlers touch widgets.

    Each poll ends in `Polled` (its data) or `PollFailed`; `Polled` bubbles on to the App, which keeps
    the latest snapshot for its key checks (the screen writes nothing of the App's).

    Layout (app.tcss): under 120 columns one plot shows at a time (`t` shows the next); under 120 columns or
    32 rows the tiles are compact (COMPACT_LINES each); under 32 rows the boxes draw only their top edge, so
    80x24 shows the tiles, a plot, the endpoints, the jobs and the events at once (the jobs screen `j` and
    `m` hold the details). A run of whole conversations adds the conversations tile beside the plots (under 160
    columns, beside one plot at a time; `C` lists the conversations); a run without any shows no trace of it.
    """

    if TYPE_CHECKING:  # self.app: textual's typing hook (nothing at run time)
        app = getters.app(MonitorApp)

    class Polled(Fetched):
        """One poll's DashboardData (`result`), fetched off the UI thread."""

    class PollFailed(FetchFailed):
        """A poll could not read the run."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide"), (160, "-xwide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]

    BINDINGS = [
        Binding("m", "app.show_mismatches", "Mismatches", id="nav.mismatches"),
        Binding("j", "app.show_jobs", "Jobs", id="nav.jobs"),
        Binding("C", "app.show_conversations", "Conversations", id="nav.conversations"),
        # off the footer (at most ~7 keys at 80 columns): the help and the palette list it
        Binding("x", "app.show_mix", "Mix: datasets, categories, scripts", show=False, id="nav.mix"),
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
                # a run of whole conversations only (hidden otherwise: a single-turn run's layout is unchanged)
                yield MetricTile("conversations", id="tile-conversations")
            with Horizontal(id="tables"):
                yield DataTable(id="endpoints", cursor_type="none", zebra_stripes=True)
                yield JobsTable(id="dashboard-jobs")
            yield EventTail(id="events")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#endpoints", DataTable).border_title = "endpoints"
        self._endpoint_widths: tuple[int, ...] = ()
        self.endpoint_aliases: dict[str, str] = {}  # alias -> a name too long for the table (the help lists them)
        self.query_one("#dashboard-jobs", JobsTable).border_title = "jobs"
        self.query_one("#events", EventTail).border_title = "events"
        self._polling = False
        self._not_before = 0.0
        self._fetch_started = 0.0
        self._endpoint_rows: dict[str, tuple[str, ...]] = {}
        self._last: RunRecord | None = None
        self.query_one("#tile-conversations", MetricTile).display = False
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
        """True under 120 columns, and under 160 beside the conversations tile: one plot at a time (`t` the next)."""
        return self.has_class("-narrow") or (self.has_class("-wide") and self.has_class("-conversations"))

    def poll(self) -> None:
        """Start one fetch unless the previous one is still running or was slow (a slow DB never piles up).

        After a fetch that took d seconds the next waits 2d more, so reading a huge database attached
        takes at most about a third of a core and the UI stays responsive.
        """
        if self._polling or time.monotonic() < self._not_before:
            return
        self._polling = True
        self._fetch_started = time.monotonic()
        # An in-process engine's live figures are its memory, owned by this loop: take them here; the rest of
        # the record (the store's counts) is read in the thread
        self._fetch(self.app.source.live_figures())

    def _fetch(self, live: LiveFigures | None) -> None:
        source = self.app.source
        cursor = self.series.cursor
        n_events = EVENTS_FETCHED

        def fetch() -> DashboardData:
            return DashboardData(
                source.record(live), tuple(source.jobs()), tuple(source.events(n_events)), read_chunk(source, cursor)
            )

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
        self.query_one("#run-status", Static).update(
            Text(f"cannot read the run: {exc}", style="bold red"), layout=False
        )

    def apply(self, data: DashboardData) -> None:
        """Render one poll (called on the UI thread)."""
        self._fetched()
        rec = data.record
        if data.series is not None:
            self.series.add(data.series)
            if not data.series.caught_up:
                self._not_before = 0.0  # still reading a big run's history: the next poll continues at once
        with self.app.batch_update():
            status = self.query_one("#run-status", Static)
            status.update(status_line(rec, status.content_region.width or self.size.width - 2), layout=False)
            progress = self.query_one("#run-progress", ProgressBar)
            progress.update(total=max(rec.total, 1), progress=rec.counts.samples.ended)
            self._last = rec
            self._show_tiles()
            self._show_plots()
            self._show_endpoints(rec)
            self.query_one("#dashboard-jobs", JobsTable).show(data.jobs)
            self.query_one("#events", EventTail).show(data.events)

    def _show_tiles(self) -> None:
        """Every tile in its current width and mode (lines pick fewer letters when the tile is narrow)."""
        rec = self._last
        if rec is None:
            return
        compact = self.compact
        for tile_id, lines in (
            ("throughput", throughput_lines),
            ("cost", cost_lines),
            ("reconstruction", reconstruction_lines),
            ("errors", error_lines),
        ):
            tile = self.query_one(f"#tile-{tile_id}", MetricTile)
            tile.show(*lines(rec, tile.content_size.width or 40, compact))
        conv, tile = rec.counts.conversations, self.query_one("#tile-conversations", MetricTile)
        if (conv is not None) != tile.display:
            tile.display = conv is not None
            self.set_class(conv is not None, "-conversations")  # from 120 to 159 columns: one plot beside it
            self.refresh_bindings()
        if conv is not None:
            tile.border_title = conversation_title(conv)
            tile.show(*conversation_lines(conv, tile.content_size.width or CONVERSATION_WIDTH))

    def _show_plots(self) -> None:
        if self._last is None:
            return
        for name, series in self.series.plots(self._last).items():
            self.query_one(f"#plot-{name}", TimePlot).show(series)

    def glossary(self) -> tuple[tuple[str, str], ...]:
        """The words the dashboard abbreviates (GLOSSARY; CONVERSATION_GLOSSARY while the conversations tile shows),
        and the endpoint names shown as their alias."""
        aliases = tuple((alias, f"endpoint {name}") for alias, name in self.endpoint_aliases.items())
        conversations = self._last is not None and self._last.counts.conversations is not None
        return GLOSSARY + (CONVERSATION_GLOSSARY if conversations else ()) + aliases

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

    def _show_endpoints(self, rec: RunRecord) -> None:
        """One row per endpoint: its counts over the run (the store's), its live figures while an engine runs
        it, else its figures over the run. Names get the width they need; one longer than the room shows as
        its alias (`#2`), which the help lists."""
        table = self.query_one("#endpoints", DataTable)
        rows = endpoint_rows(rec)
        marks = {r[0]: TRUST_MARKS.get(rec.endpoint_trust(r[0]) or "", "") for r in rows}
        mark_w = 1 if any(marks.values()) else 0  # "✓" right after each name: its text path's proof
        room = (table.content_region.width or self.size.width - 2) - 2 * len(ENDPOINT_COLUMNS) - 1 - mark_w
        widths, aliases = endpoint_widths(rows, room)
        widths = (widths[0] + mark_w, *widths[1:])
        self.endpoint_aliases = aliases
        alias_of = {name: alias for alias, name in aliases.items()}
        if widths != self._endpoint_widths:
            table.clear(columns=True)
            for (key, label, _), width in zip(ENDPOINT_COLUMNS, widths):
                table.add_column(label, width=width, key=key)
            self._endpoint_widths, self._endpoint_rows = widths, {}
        for name, *rest in rows:  # rows are keyed by the endpoint's name; the first cell may be its alias
            cells = (alias_of.get(name, name) + marks[name], *rest)
            old = self._endpoint_rows.get(name)
            if old is None:
                table.add_row(*cells, key=name)
            elif old != cells:
                for (key, _, _), value, before in zip(ENDPOINT_COLUMNS, cells, old):
                    if value != before:
                        table.update_cell(name, key, value)
            self._endpoint_rows[name] = cells


def endpoint_rows(rec: RunRecord) -> list[tuple[str, ...]]:
    """The endpoints table's cells: every endpoint the store has counted or the engine runs, by name."""
    counts = {e.name: e for e in rec.counts.endpoints}
    live = {e.name: e for e in rec.live.endpoints} if rec.live is not None and rec.finished is None else {}
    out: list[tuple[str, ...]] = []
    for name in [*live, *(n for n in counts if n not in live)]:
        c = counts.get(name)
        done, failed, cost = (c.completed, c.failed, c.cost_usd) if c is not None else (0, 0, 0.0)
        if name in live:
            e = live[name]
            flight, req_s, p50, p95 = (
                f"{e.in_flight}/{e.concurrency_limit}",
                e.rate.req_s_10s,
                e.latency_p50_ms,
                e.latency_p95_ms,
            )
        else:
            req_s, p = rec.finished.endpoint(name) if rec.finished is not None else (0.0, None)
            flight, p50, p95 = "-", p.latency_p50_ms if p else None, p.latency_p95_ms if p else None
        out.append(
            (
                name,
                f"{done:,}",
                f"{failed:,}",
                flight,
                f"{req_s:.1f}",
                fmt.short_ms(p50),
                fmt.short_ms(p95),
                fmt.money(cost),
            )
        )
    return out


def endpoint_widths(rows: list[tuple[str, ...]], room: int) -> tuple[tuple[int, ...], dict[str, str]]:
    """Column widths that fit every cell, and the aliases (`#1` -> name) of endpoint names longer than the room
    left for them: a name is shown whole or as its alias, never cut."""
    widths = [max([w, *(len(r[i]) for r in rows)]) for i, (_, _, w) in enumerate(ENDPOINT_COLUMNS)]
    name_room = max(8, room - sum(widths[1:]))
    longest = max([8, *(len(r[0]) for r in rows)])
    aliases: dict[str, str] = {}
    if longest > min(name_room, ENDPOINT_NAME_MAX):
        for i, r in enumerate(rows, 1):
            if len(r[0]) > min(name_room, ENDPOINT_NAME_MAX):
                aliases[f"#{i}"] = r[0]
        longest = max([8, *(len(r[0]) for r in rows if r[0] not in aliases.values()), *(len(a) for a in aliases)])
    widths[0] = longest
    return tuple(widths), aliases
