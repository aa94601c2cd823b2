"""PageTable: a light row-cursor table for one page of plain string rows, drawn with the Line API.

Textual's DataTable renders every cell through Rich and measures rows on add; for a page that is
replaced on every page turn that costs ~100 ms. PageTable draws Segments straight from the strings,
with a sticky header, and tells its owner when the cursor tries to leave the page (to fetch the next).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.segment import Segment
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip


def fit(text: str, width: int) -> str:
    """`text` cut (with …) or padded to exactly `width` cells."""
    cells = cell_len(text)
    if cells <= width:
        return text + " " * (width - cells)
    out, used = [], 0
    for char in text:
        w = cell_len(char)
        if used + w > width - 1:
            break
        out.append(char)
        used += w
    return "".join(out) + "…" + " " * (width - 1 - used)


class PageTable(ScrollView, can_focus=True):
    """Columns of fixed width; `show(rows)` replaces the page; enter posts RowSelected."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page_cursor(-1)", "Page up", show=False),
        Binding("pagedown", "page_cursor(1)", "Page down", show=False),
        Binding("home", "first", "First", show=False),
        Binding("end", "last", "Last", show=False),
        Binding("enter", "select", "Select", show=False),
    ]

    COMPONENT_CLASSES = {"pagetable--header", "pagetable--cursor", "pagetable--odd"}

    DEFAULT_CSS = """
    PageTable { height: 1fr; background: $surface; }
    PageTable > .pagetable--header { color: $text; background: $panel; text-style: bold; }
    PageTable > .pagetable--cursor { color: $block-cursor-foreground; background: $block-cursor-background;
    text-style: bold; }
    PageTable:blur > .pagetable--cursor { background: $block-cursor-blurred-background; text-style: bold; }
    PageTable > .pagetable--odd { background: $boost; }
    """

    class RowSelected(Message):
        """Enter on row `index` of the page."""

        def __init__(self, table: PageTable, index: int) -> None:
            super().__init__()
            self.table = table
            self.index = index

        @property
        def control(self) -> PageTable:
            return self.table

    class EdgeReached(Message):
        """The cursor tried to move past the page: `direction` is 1 (after the last row) or -1 (before the first)."""

        def __init__(self, table: PageTable, direction: int) -> None:
            super().__init__()
            self.table = table
            self.direction = direction

        @property
        def control(self) -> PageTable:
            return self.table

    cursor_row: reactive[int] = reactive(0)

    def __init__(self, columns: Sequence[tuple[str, int]], **kwargs) -> None:
        super().__init__(**kwargs)
        self.columns = tuple(columns)
        self.rows: tuple[tuple[str, ...], ...] = ()
        self._line_width = sum(width for _, width in self.columns) + len(self.columns)

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def set_widths(self, widths: Sequence[int]) -> None:
        """Give the columns new widths (same labels, same order), e.g. the width a page's names need."""
        columns = tuple((label, int(w)) for (label, _), w in zip(self.columns, widths))
        if columns != self.columns:
            self.columns = columns
            self._line_width = sum(width for _, width in columns) + len(columns)
            self.virtual_size = Size(self._line_width, len(self.rows) + 1)
            self.refresh()

    def show(self, rows: Sequence[tuple[str, ...]], cursor: int = 0, *, scroll_y: int = 0) -> None:
        """Replace the page and put the cursor on row `cursor` (clamped), the view scrolled to `scroll_y`
        (then moved only as far as the cursor needs to stay visible): a live refresh passes the old scroll."""
        self.rows = tuple(rows)
        self.virtual_size = Size(self._line_width, len(self.rows) + 1)
        self.set_reactive(PageTable.cursor_row, min(max(cursor, 0), max(len(self.rows) - 1, 0)))
        self.scroll_to(y=max(scroll_y, 0), animate=False)
        self._follow_cursor()
        self.refresh()

    def watch_cursor_row(self, old: int, new: int) -> None:
        self._follow_cursor()
        self.refresh()

    def _follow_cursor(self) -> None:
        # Row i is drawn on virtual line i + 1 (line 0 is the sticky header).
        visible = max(self.scrollable_content_region.height - 1, 1)
        top = self.scroll_offset.y
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + visible:
            self.scroll_to(y=self.cursor_row - visible + 1, animate=False)

    # --- actions ---------------------------------------------------------------------------
    def action_cursor(self, step: int) -> None:
        target = self.cursor_row + step
        if target < 0 or target >= len(self.rows):
            self.post_message(self.EdgeReached(self, 1 if step > 0 else -1))
            return
        self.cursor_row = target

    def action_page_cursor(self, step: int) -> None:
        visible = max(self.scrollable_content_region.height - 1, 1)
        target = self.cursor_row + step * visible
        if target >= len(self.rows) and self.cursor_row == len(self.rows) - 1:
            self.post_message(self.EdgeReached(self, 1))
        elif target < 0 and self.cursor_row == 0:
            self.post_message(self.EdgeReached(self, -1))
        else:
            self.cursor_row = min(max(target, 0), max(len(self.rows) - 1, 0))

    def action_first(self) -> None:
        self.cursor_row = 0

    def action_last(self) -> None:
        self.cursor_row = max(len(self.rows) - 1, 0)

    def action_select(self) -> None:
        if self.rows:
            self.post_message(self.RowSelected(self, self.cursor_row))

    def row_text(self, index: int) -> str:
        """Row `index` as the table shows it (for tests)."""
        return " ".join(fit(cell, width) for cell, (_, width) in zip(self.rows[index], self.columns)).rstrip()

    # --- rendering -------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            style = self.get_component_rich_style("pagetable--header")
            text = " ".join(fit(label, w) for label, w in self.columns)
            return Strip([Segment(" " + text, style)]).crop_extend(
                self.scroll_offset.x, self.scroll_offset.x + width, style
            )
        index = self.scroll_offset.y + y - 1
        if index >= len(self.rows):
            return Strip.blank(width, base)
        if index == self.cursor_row:
            style = self.get_component_rich_style("pagetable--cursor")
        elif index % 2:
            style = base + self.get_component_rich_style("pagetable--odd")
        else:
            style = base
        text = " ".join(fit(cell, w) for cell, (_, w) in zip(self.rows[index], self.columns))
        return Strip([Segment(" " + text, style)]).crop_extend(
            self.scroll_offset.x, self.scroll_offset.x + width, style
        )

    def on_resize(self) -> None:
        self._follow_cursor()
