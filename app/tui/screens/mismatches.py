"""Every non-exact sample, paged from SQLite: only the visible page is ever in the table."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from app.records import Category
from app.tui.fetch import FetchFailed, Fetched, fetch_in_thread
from app.tui.source import MISMATCH_ORDERS, MISMATCH_VERDICTS, MismatchPage, MismatchRow
from widgets.page_table import PageTable

PAGE_SIZE = 50
COLUMNS = (("sample", 16), ("dataset", 8), ("verdict", 11), ("1st diff", 8), ("ref", 6), ("rec", 6), ("≠ tok", 5))
VERDICT_LABELS = {
    Category.BPE_EQUIVALENT: "benign bpe",
    Category.TEXT_MISMATCH: "✗ text",
    Category.STRUCTURE_MISMATCH: "✗ structure",
    Category.TRUNCATED: "truncated",
    Category.UNCHECKED: "unchecked",
}


class MismatchesScreen(Screen):
    """A PageTable holding one page; `[`/`]` (or moving past an edge) fetch the next page in a thread.

    Sort orders and the text filter are the store's (`app.store.queries.MISMATCH_ORDERS`: `o` cycles them;
    `/` matches sample id, dataset or explanation).
    """

    class PageLoaded(Fetched):
        """A MismatchPage (`result`) arrived."""

    class PageFailed(FetchFailed):
        """The page could not be read."""

    BINDINGS = [
        Binding("enter", "open_diff", "Diff", id="mismatches.diff"),
        Binding("slash", "filter", "Filter", id="mismatches.filter"),
        Binding("v", "cycle_verdict", "Verdict", id="mismatches.verdict"),
        Binding("o", "cycle_order", "Sort", id="mismatches.sort"),
        Binding("s", "open_sample", "Sample", show=False, id="mismatches.sample"),
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
        self._footer_keys: tuple[bool, ...] = ()
        self._loading = False

    def compose(self) -> ComposeResult:
        yield Static(id="mismatch-caption")
        yield Input(placeholder="filter by sample id, dataset or text (enter to apply, esc to cancel)", id="mismatch-filter")
        yield PageTable(COLUMNS, id="mismatch-table")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one("#mismatch-table", PageTable)
        self.query_one("#mismatch-filter", Input).display = False
        table.focus()
        self.load()

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
        self._update_caption()
        self._fetch(self.verdicts, self.text_filter, self.order, self.row_offset, after, before)

    def _fetch(
        self, verdicts: tuple[str, ...], text: str, order: str, offset: int, after: MismatchRow | None, before: MismatchRow | None
    ) -> None:
        source = self.app.source
        fetch_in_thread(
            self,
            lambda: source.mismatch_page(verdicts, text, order, offset, PAGE_SIZE, after=after, before=before),
            self.PageLoaded, self.PageFailed, group="mismatch-page", exclusive=True,
        )

    @on(PageLoaded)
    def _page_loaded(self, message: PageLoaded) -> None:
        self.show_page(message.result)

    @on(PageFailed)
    def _page_failed(self, message: PageFailed) -> None:
        self._loading = False
        self._update_caption()
        self.notify(f"cannot read mismatches: {message.error}", severity="error", timeout=8)

    def show_page(self, page: MismatchPage) -> None:
        """Put one page in the table (UI thread)."""
        self.page = page
        self._loading = False
        self.query_one("#mismatch-table", PageTable).show(
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
            cursor=self._cursor_after_load,
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
        filters = f"verdict: {self.verdict_filter or 'all non-exact'}"
        if self.text_filter:
            filters += f" · text: {self.text_filter!r}"
        self.query_one("#mismatch-caption", Static).update(
            f"mismatches · {shown} · {filters} · sorted by {MISMATCH_ORDERS[self.order]}", layout=False
        )

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
