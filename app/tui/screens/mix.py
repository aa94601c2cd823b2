"""The run's mix (`x` on the dashboard): per dataset and category its share of the run's prompts, answers and loss
tokens, the share of its answers that reason and that call tools, and the scripts its prompts are in; the whole
run last. Read from the store (`app.store.queries.dataset_mix`, the rows `status` and the export manifest show)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.tui.fetch import Fetched, FetchFailed, fetch_in_thread
from app.tui.screens.conversations import LIVE_REFRESH_S, _age, _caption, stretch
from app.tui.screens.mismatches import run_goes_on
from app.tui.source import MixRow, mix_total
from widgets.page_table import PageTable

if TYPE_CHECKING:
    from textual import getters

    from app.tui.monitor import MonitorApp

# (label, minimum width): the name and the scripts grow into the room left (names first)
MIX_COLUMNS = (
    ("dataset · category", 18),
    ("prompts", 7),
    ("answers", 7),
    ("loss", 6),
    ("reason", 6),
    ("tools", 6),
    ("scripts", 9),
)
NAME, SCRIPTS = 0, len(MIX_COLUMNS) - 1
MIX_GLOSSARY: tuple[tuple[str, str], ...] = (
    ("prompts, answers", "this row's share of the run's prompts ingested and of its answers stored"),
    ("loss", "this row's share of the run's loss tokens: the output tokens of its answers, what a drafter trains on"),
    ("reason, tools", "the share of this row's answers that hold reasoning, that call tools"),
    ("scripts", "the scripts its prompts are written in (a guess from their letters), most first"),
    ("dataset · category", "a dataset with a category column has a row per category; all: the whole run"),
)


def percent(part: int, whole: int) -> str:
    """`40.0%`, or `-` when there is nothing to share."""
    return f"{100 * part / whole:.1f}%" if whole else "-"


def scripts_words(row: MixRow, width: int) -> str:
    """The row's top scripts with their shares in at most `width` cells: three, else two, else the first."""
    top = row.top_languages(3)
    candidates = [" ".join(f"{s} {100 * share:.0f}%" for s, share in top[:n]) for n in (3, 2, 1)] or ["-"]
    return next((c for c in candidates if cell_len(c) <= width), candidates[-1]) or "-"


def mix_cells(row: MixRow, total: MixRow, scripts_width: int) -> tuple[str, ...]:
    """One row as the table shows it (`total`: the whole run, what the first three shares are of)."""
    return (
        row.label,
        percent(row.prompts, total.prompts),
        percent(row.answers, total.answers),
        percent(row.loss_tokens, total.loss_tokens),
        percent(row.reasoning, row.answers),
        percent(row.tool_calls, row.answers),
        scripts_words(row, scripts_width),
    )


def mix_detail(row: MixRow, total: MixRow) -> str:
    """Everything about one row in words, its name whole (the highlighted row, under the table)."""
    scripts = " · ".join(f"{s} {n:,}" for s, n in row.languages) or "none"
    return (
        f"{row.label}: {row.prompts:,} prompts ({percent(row.prompts, total.prompts)}) · {row.answers:,} answers "
        f"({percent(row.answers, total.answers)}) · {row.loss_tokens:,} loss tokens "
        f"({percent(row.loss_tokens, total.loss_tokens)}) · reasoning in {row.reasoning:,} "
        f"({percent(row.reasoning, row.answers)}) · tool calls in {row.tool_calls:,} "
        f"({percent(row.tool_calls, row.answers)}) · scripts {scripts}"
    )


class MixScreen(Screen):
    """The run's mix: one row per (dataset, category) of `app.store.queries.dataset_mix`, then the whole run; the
    highlighted row in full below. Re-read every `live_refresh_s` while the run goes on (not before 3x the last
    read's time more), off the UI thread; `r` re-reads now."""

    if TYPE_CHECKING:  # self.app: textual's typing hook (nothing at run time)
        app = getters.app(MonitorApp)

    class MixLoaded(Fetched):
        """(generation, seconds taken, rows) (`result`) arrived."""

    class MixFailed(FetchFailed):
        """The mix could not be read."""

    BINDINGS = [
        Binding("r", "refresh_mix", "Refresh", show=False, id="mix.refresh"),
        Binding("escape", "app.pop_screen", "Back", id="mix.back"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: tuple[MixRow, ...] = ()
        self.total: MixRow | None = None
        self.live_refresh_s = LIVE_REFRESH_S
        self._generation = 0
        self._loading = False
        self._updated_at: float | None = None
        self._not_before = 0.0
        self._error: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("mix · loading…", id="mix-caption")
        yield PageTable(MIX_COLUMNS, id="mix-table")
        yield Static("", id="mix-detail")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one(PageTable)
        table.focus()
        self.watch(table, "cursor_row", self._show_detail, init=False)
        self.load()
        self._clock = self.set_interval(1.0, self._tick)

    def on_screen_suspend(self) -> None:
        self._clock.pause()

    def on_screen_resume(self) -> None:
        self._clock.resume()
        self._tick()

    def glossary(self) -> tuple[tuple[str, str], ...]:
        """The words the mix table abbreviates (the help screen lists them)."""
        return MIX_GLOSSARY

    def load(self) -> None:
        """Read the mix off the UI thread."""
        self._loading = True
        self._generation += 1
        generation, source = self._generation, self.app.source

        def fetch() -> tuple[int, float, tuple[MixRow, ...]]:
            started = time.monotonic()
            rows = tuple(source.dataset_mix())
            return generation, time.monotonic() - started, rows

        fetch_in_thread(self, fetch, self.MixLoaded, self.MixFailed, group="dataset-mix", exclusive=True)

    @on(MixLoaded)
    def _mix_loaded(self, message: MixLoaded) -> None:
        generation, took, rows = message.result
        if generation != self._generation:
            return
        self._loading = False
        self._error = None
        self._updated_at = time.monotonic()
        self._not_before = self._updated_at + 3 * took
        self.show_mix(rows)

    @on(MixFailed)
    def _mix_failed(self, message: MixFailed) -> None:
        self._loading = False
        self._error = str(message.error)
        self._show_caption()

    def show_mix(self, rows: tuple[MixRow, ...]) -> None:
        """Put the mix in the table (UI thread), the cursor kept on its row; the whole run last when it has more
        than one row."""
        table = self.query_one(PageTable)
        self.rows = rows
        self.total = mix_total(rows)
        shown = (*rows, self.total) if len(rows) > 1 else rows
        room = (table.scrollable_content_region.width or self.size.width) - 2
        names = max([MIX_COLUMNS[NAME][1], *(cell_len(r.label) for r in shown)])
        widths = stretch(MIX_COLUMNS, {NAME: names, SCRIPTS: 40}, room)
        table.set_widths(widths)
        table.show(
            [mix_cells(r, self.total, widths[SCRIPTS]) for r in shown],
            cursor=table.cursor_row,
            scroll_y=int(table.scroll_offset.y),
        )
        self._show_caption()
        self._show_detail()

    @property
    def shown(self) -> tuple[MixRow, ...]:
        """The table's rows: the mix, then the whole run when there is more than one."""
        if self.total is None:
            return ()
        return (*self.rows, self.total) if len(self.rows) > 1 else self.rows

    @property
    def selected(self) -> MixRow | None:
        """The row under the cursor, or None."""
        shown = self.shown
        if not shown:
            return None
        return shown[min(self.query_one(PageTable).cursor_row, len(shown) - 1)]

    def _show_caption(self) -> None:
        caption = self.query_one("#mix-caption", Static)
        room = caption.content_region.width or self.size.width - 2
        if self._error is not None:
            caption.update(Text(f"mix: cannot read it: {self._error} · r retries", style="bold red"))
            return
        if self.total is None:
            caption.update("mix · loading…")
            return
        if not self.rows:
            caption.update("mix · this run has no samples yet")
            return
        t = self.total
        datasets = len({r.dataset for r in self.rows})
        ago = _age(self._updated_at)
        head = f"mix of {t.prompts:,} prompts · {t.answers:,} answers · {t.loss_tokens:,} loss tokens"
        caption.update(
            _caption(
                (
                    f"{head} · {datasets} datasets · updated {ago} ago",
                    f"{head} · updated {ago} ago",
                    head,
                    f"mix of {t.prompts:,} prompts · {t.answers:,} answers · {t.loss_tokens:,} loss",
                ),
                room,
            ),
            layout=False,
        )

    def _show_detail(self) -> None:
        """The highlighted row in full (its name whole however narrow the table)."""
        row = self.selected
        detail = self.query_one("#mix-detail", Static)
        detail.update(Text(mix_detail(row, self.total)) if row is not None and self.total is not None else "")

    def _tick(self) -> None:
        now = time.monotonic()
        if (
            not self._loading
            and self._updated_at is not None
            and now - self._updated_at >= self.live_refresh_s
            and now >= self._not_before
            and run_goes_on(self.app)
        ):
            self.load()
        elif self.total is not None:
            self._show_caption()

    def action_refresh_mix(self) -> None:
        self.load()
