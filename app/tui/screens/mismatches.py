"""Every non-exact sample, paged from SQLite: only the visible page is ever in the table."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.cells import cell_len
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from app.engine.record.snapshot import LIVE_STATES
from app.records import Category
from app.tui.fetch import Fetched, FetchFailed, fetch_in_thread
from app.tui.format import duration
from app.tui.source import MISMATCH_ORDERS, MISMATCH_VERDICTS, MismatchPage, MismatchRow
from widgets.page_table import PageTable

if TYPE_CHECKING:
    from textual import getters

    from app.tui.monitor import MonitorApp

PAGE_SIZE = 50
LIVE_REFRESH_S = 2.0  # while the run goes on, the page is re-read this often (slower when reads are slow)
COLUMNS = (("sample", 16), ("dataset", 8), ("verdict", 11), ("1st diff", 8), ("ref", 6), ("rec", 6), ("≠ tok", 5))
VERDICT_LABELS: dict[str, str] = {
    Category.BPE_EQUIVALENT: "benign bpe",
    Category.TEXT_MISMATCH: "✗ text",
    Category.STRUCTURE_MISMATCH: "✗ structure",
    Category.TRUNCATED: "truncated",
    Category.UNCHECKED: "no ref",  # no reference to judge it (the verdict `unchecked`; see the glossary)
}


def column_widths(rows: tuple[MismatchRow, ...], room: int) -> tuple[int, ...]:
    """COLUMNS' widths for a page within `room` cells: the dataset column gets the width of the page's longest
    dataset name (never cut while the sample column keeps its 16), the sample column the rest it can use."""
    widths = [w for _, w in COLUMNS]
    fixed = sum(widths[2:]) + len(COLUMNS)
    left = max(room - fixed, widths[0] + widths[1])
    need_dataset = max([widths[1], *(len(r.dataset) for r in rows)])
    need_sample = max([widths[0], *(len(r.sample_id) for r in rows)])
    widths[1] = min(need_dataset, left - widths[0])
    widths[0] = min(need_sample, left - widths[1])
    return tuple(widths)


def run_goes_on(app: MonitorApp) -> bool:
    """True while the run's rows may still change: an in-process engine that is live, or a run whose last polled
    state is not finished (an attached viewer cannot tell more without reading)."""
    if app.source.live:
        return True
    rec = getattr(app, "last_record", None)
    # a live state whose engine exited or is gone writes nothing more; one with no heartbeat at all may be
    # written by an engine from before heartbeats
    return rec is None or (rec.state in LIVE_STATES and rec.engine not in ("gone", "stopped"))


class MismatchesScreen(Screen):
    """A PageTable holding one page; `[`/`]` (or moving past an edge) fetch the next page in a thread.

    Sort orders and the text filter are the store's (`app.store.queries.MISMATCH_ORDERS`: `o` cycles them;
    `/` matches sample id, dataset or explanation). While the run goes on the page is re-read every
    `live_refresh_s` (after a read of d seconds, not before 3d more: a slow database never piles up), keeping
    the cursor on the same sample and the rows where they were on screen; the caption says how old the page
    is, and `r` re-reads it now.
    """

    if TYPE_CHECKING:  # self.app: textual's typing hook (nothing at run time)
        app = getters.app(MonitorApp)

    class PageLoaded(Fetched):
        """A MismatchPage (`result`) arrived."""

    class PageFailed(FetchFailed):
        """The page could not be read."""

    class PageRefreshed(Fetched):
        """A live re-read of the current page arrived: `result` is (generation, seconds taken, MismatchPage)."""

    class RefreshFailed(FetchFailed):
        """A live re-read failed (said in the caption; the next one tries again)."""

    BINDINGS = [
        Binding("enter", "open_diff", "Diff", id="mismatches.diff"),
        Binding("slash", "filter", "Filter", id="mismatches.filter"),
        Binding("v", "cycle_verdict", "Verdict", id="mismatches.verdict"),
        Binding("o", "cycle_order", "Sort", id="mismatches.sort"),
        Binding("s", "open_sample", "Sample", show=False, id="mismatches.sample"),
        Binding("r", "refresh_page", "Refresh", show=False, id="mismatches.refresh"),
        Binding("right_square_bracket", "page(1)", "Next page", show=False, id="mismatches.next_page"),
        Binding("left_square_bracket", "page(-1)", "Prev page", show=False, id="mismatches.previous_page"),
        Binding("escape", "back", "Back", id="mismatches.back"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.verdict_filter: str | None = None
        self.text_filter = ""
        self.order = "sample"
        self.row_offset = 0
        self.page: MismatchPage | None = None
        self._cursor_after_load = 0
        self._footer_keys: tuple[bool | None, ...] = ()
        self._loading = False
        self.live_refresh_s = LIVE_REFRESH_S
        self._generation = 0  # bumped by every load the operator asks for: older re-reads are dropped
        self._refreshing = False
        self._updated_at: float | None = None  # time.monotonic() of the page shown
        self._not_before = 0.0
        self._refresh_error: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="mismatch-caption")
        yield Input(
            placeholder="filter by sample id, dataset or text (enter to apply, esc to cancel)", id="mismatch-filter"
        )
        yield PageTable(COLUMNS, id="mismatch-table")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one("#mismatch-table", PageTable)
        self.query_one("#mismatch-filter", Input).display = False
        table.focus()
        self.load()
        self._clock = self.set_interval(1.0, self._tick)

    def on_screen_suspend(self) -> None:
        self._clock.pause()  # a diff opened from here: no re-reads behind it

    def on_screen_resume(self) -> None:
        self._clock.resume()
        self._tick()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("open_diff", "open_sample"):
            return bool(self.page and self.page.rows)
        if action == "page" and self.page is not None:
            step = parameters[0] if parameters else 1
            if step == 1 and self.row_offset + PAGE_SIZE >= self.page.total:
                return False
            if step == -1 and self.row_offset == 0:
                return False
        return True

    # --- data ------------------------------------------------------------------------------
    @property
    def verdicts(self) -> tuple[str, ...]:
        return (self.verdict_filter,) if self.verdict_filter else MISMATCH_VERDICTS

    def load(self, cursor: int = 0, after: MismatchRow | None = None, before: MismatchRow | None = None) -> None:
        """Fetch the page at `self.row_offset` (by key after/before a row when turning pages) off the UI thread."""
        self._cursor_after_load = cursor
        self._loading = True
        self._generation += 1
        self._update_caption()
        self._fetch(self.verdicts, self.text_filter, self.order, self.row_offset, after, before)

    def _fetch(
        self,
        verdicts: tuple[str, ...],
        text: str,
        order: str,
        offset: int,
        after: MismatchRow | None,
        before: MismatchRow | None,
    ) -> None:
        source = self.app.source
        fetch_in_thread(
            self,
            lambda: source.mismatch_page(verdicts, text, order, offset, PAGE_SIZE, after=after, before=before),
            self.PageLoaded,
            self.PageFailed,
            group="mismatch-page",
            exclusive=True,
        )

    @on(PageLoaded)
    def _page_loaded(self, message: PageLoaded) -> None:
        self._updated_at = time.monotonic()
        self._refresh_error = None
        self.show_page(message.result)

    # --- live refresh ------------------------------------------------------------------------
    def run_goes_on(self) -> bool:
        """True while new mismatches may still come (`run_goes_on`)."""
        return run_goes_on(self.app)

    def _tick(self) -> None:
        """Once a second: re-read the page when it is due, and say how old the shown page is."""
        now = time.monotonic()
        if (
            self.run_goes_on()
            and self._updated_at is not None
            and now - self._updated_at >= self.live_refresh_s
            and now >= self._not_before
        ):
            self.refresh_page()
        self._update_caption()

    def action_refresh_page(self) -> None:
        self._not_before = 0.0
        self.refresh_page()

    def refresh_page(self) -> None:
        """Re-read the page shown (same filters, order and offset) off the UI thread, unless a read is running."""
        if self._loading or self._refreshing or self.page is None:
            return
        self._refreshing = True
        generation, source = self._generation, self.app.source
        verdicts, text, order, offset = self.verdicts, self.text_filter, self.order, self.row_offset

        def fetch() -> tuple[int, float, MismatchPage]:
            started = time.monotonic()
            page = source.mismatch_page(verdicts, text, order, offset, PAGE_SIZE)
            return generation, time.monotonic() - started, page

        fetch_in_thread(self, fetch, self.PageRefreshed, self.RefreshFailed, group="mismatch-refresh")

    @on(PageRefreshed)
    def _page_refreshed(self, message: PageRefreshed) -> None:
        generation, took, page = message.result
        self._refreshing = False
        self._not_before = time.monotonic() + 3 * took
        if generation != self._generation or self._loading:
            return  # the operator turned a page or changed a filter meanwhile: that load brings fresh rows
        self._updated_at = time.monotonic()
        self._refresh_error = None
        if page != self.page:
            self.show_page(page, keep_place=True)
        else:
            self._update_caption()

    @on(RefreshFailed)
    def _refresh_failed(self, message: RefreshFailed) -> None:
        self._refreshing = False
        self._refresh_error = str(message.error)
        self._update_caption()

    @on(PageFailed)
    def _page_failed(self, message: PageFailed) -> None:
        self._loading = False
        self._update_caption()
        self.notify(f"cannot read mismatches: {message.error}", severity="error", timeout=8)

    def show_page(self, page: MismatchPage, *, keep_place: bool = False) -> None:
        """Put one page in the table (UI thread). With `keep_place` (a live re-read) the cursor stays on the
        sample it was on (on the same row number when that sample left the page) and that row where it was on
        screen."""
        table = self.query_one("#mismatch-table", PageTable)
        cursor, scroll_y = self._cursor_after_load, 0
        if keep_place and self.page is not None:
            was = self.selected_sample()
            old_cursor, old_scroll = table.cursor_row, int(table.scroll_offset.y)
            ids = [row.sample_id for row in page.rows]
            cursor = ids.index(was) if was in ids else min(old_cursor, max(len(ids) - 1, 0))
            scroll_y = old_scroll + cursor - old_cursor
        self.page = page
        self._loading = False
        room = (table.scrollable_content_region.width or self.size.width) - 2
        table.set_widths(column_widths(page.rows, room))
        table.show(
            [
                (
                    row.sample_id,
                    row.dataset,
                    VERDICT_LABELS.get(row.category, row.category),
                    "-" if row.first_diff is None else f"{row.first_diff:,}",
                    "-" if row.ref_len is None else f"{row.ref_len:,}",
                    f"{row.rec_len:,}",
                    f"{row.n_diff:,}",
                )
                for row in page.rows
            ],
            cursor=cursor,
            scroll_y=scroll_y,
        )
        self._update_caption()
        # Re-render the footer only when a key's availability changed (it recomposes: not free).
        keys = (bool(page.rows), self.check_action("page", (1,)), self.check_action("page", (-1,)))
        if keys != self._footer_keys:
            self._footer_keys = keys
            self.refresh_bindings()

    def _update_caption(self) -> None:
        page = self.page
        shown = "loading…"
        if page is not None and not self._loading:
            if page.total == 0:
                shown = "no samples match"
            else:
                shown = f"rows {page.offset + 1:,}–{page.offset + len(page.rows):,} of {page.total:,}"
        verdict = (
            VERDICT_LABELS.get(self.verdict_filter, self.verdict_filter) if self.verdict_filter else "all non-exact"
        )
        text = f" · text: {self.text_filter!r}" if self.text_filter else ""
        order = MISMATCH_ORDERS[self.order]
        fresh, short = self._freshness()
        # the longest wording that fits one line (80 columns first); how old the page is always shows
        candidates = (
            f"mismatches · {shown} · verdict: {verdict}{text} · sorted by {order}{fresh}",
            f"mismatches · {shown} · {verdict}{text} · by {order}{short}",
            f"mismatches · {shown} · {verdict}{text}{short}",
            f"mismatches · {shown}{text}{short}",
        )
        room = self.query_one("#mismatch-caption", Static).content_region.width or self.size.width - 2
        caption = next((c for c in candidates if cell_len(c) <= room), candidates[-1])
        self.query_one("#mismatch-caption", Static).update(caption, layout=False)

    def _freshness(self) -> tuple[str, str]:
        """How old the shown page is, in words (long and short): "updated 4 s ago · r refresh"."""
        if self._refresh_error is not None:
            return " · could not re-read: r retries", " · read failed: r retries"
        if self._updated_at is None or self._loading:
            return "", ""
        age = max(time.monotonic() - self._updated_at, 0.0)
        ago = f"{int(age)} s" if age < 60 else duration(age)
        return f" · updated {ago} ago · r refresh", f" · {ago} ago · r refresh"

    def selected_sample(self) -> str | None:
        """The sample id under the cursor, or None."""
        table = self.query_one("#mismatch-table", PageTable)
        if not self.page or not self.page.rows:
            return None
        return self.page.rows[min(table.cursor_row, len(self.page.rows) - 1)].sample_id

    # --- actions ---------------------------------------------------------------------------
    @on(PageTable.RowSelected, "#mismatch-table")
    def row_selected(self) -> None:
        self.action_open_diff()

    @on(PageTable.EdgeReached, "#mismatch-table")
    def edge_reached(self, event: PageTable.EdgeReached) -> None:
        """Moving past the last (first) row of a page turns to the next (previous) page."""
        if self.check_action("page", (event.direction,)):
            self.action_page(event.direction)

    def action_open_diff(self) -> None:
        sample_id = self.selected_sample()
        if sample_id is not None:
            self.app.open_diff(sample_id)

    def action_open_sample(self) -> None:
        sample_id = self.selected_sample()
        if sample_id is not None:
            self.app.open_sample(sample_id)

    def action_filter(self) -> None:
        box = self.query_one("#mismatch-filter", Input)
        box.display = True
        box.value = self.text_filter
        box.focus()

    @on(Input.Submitted, "#mismatch-filter")
    def apply_filter(self, event: Input.Submitted) -> None:
        self.text_filter = event.value.strip()
        self.row_offset = 0
        event.input.display = False
        self.query_one("#mismatch-table").focus()
        self.load()

    def action_cycle_verdict(self) -> None:
        options = (None, *MISMATCH_VERDICTS)
        self.verdict_filter = options[(options.index(self.verdict_filter) + 1) % len(options)]
        self.row_offset = 0
        self.load()

    def action_cycle_order(self) -> None:
        orders = list(MISMATCH_ORDERS)
        self.order = orders[(orders.index(self.order) + 1) % len(orders)]
        self.row_offset = 0
        self.load()

    def action_page(self, step: int) -> None:
        if self.page is None:
            return
        new_offset = self.row_offset + step * PAGE_SIZE
        if new_offset < 0 or new_offset >= max(self.page.total, 1):
            return
        self.row_offset = new_offset
        rows = self.page.rows
        if step > 0:
            self.load(cursor=0, after=rows[-1] if rows else None)
        else:
            self.load(cursor=PAGE_SIZE - 1, before=rows[0] if rows else None)

    def action_back(self) -> None:
        box = self.query_one("#mismatch-filter", Input)
        if box.display:
            box.display = False
            self.query_one("#mismatch-table").focus()
            return
        self.app.pop_screen()
