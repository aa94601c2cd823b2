"""TokenDiffView: reference vs reconstructed tokens, aligned, drawn line by line (Line API).

Takes a plain `app.records.Alignment` and never tokenises anything itself. The display model (rows
of tokens wrapped to the current width) is rebuilt only when the width or the layout changes;
strips are cached per (row, width, layout, current difference), as toolong does, so a 32k-token
sample opens and scrolls at the cost of the visible rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.segment import Segment
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from app.records import AlignedToken, Alignment

GUTTER = 7  # "123456 " ref position column
SEPARATOR = " │ "
NARROW_WIDTH = 100  # below this many cells the view stacks reference above reconstructed
NEWLINE_MARKS = ("⏎", "↵", "\n")


@dataclass(frozen=True, slots=True)
class DiffRow:
    """One display row: the block it belongs to, its role and the tokens on each side.

    role: "equal" (both sides the same), "pair" (side by side differing), "ref" / "rec"
    (stacked layout: one side of a differing block). `position` is the first token's index on the
    reference side (or the reconstructed side for "rec" rows), for the gutter.
    """

    block: int
    role: str
    left: tuple[AlignedToken, ...]
    right: tuple[AlignedToken, ...]
    position: int | None


def token_label(token: AlignedToken, with_id: bool) -> str:
    """How one token is shown: its visible text, prefixed by its id where ids matter."""
    # The row break already shows a newline; a raw "\n" must never reach a Segment.
    text = token.text.replace("\n", "") if token.text else "∅"
    return f"[{token.id}]{text}" if with_id else text


def wrap_tokens(
    tokens: tuple[AlignedToken, ...], width: int, with_id: bool
) -> list[tuple[AlignedToken, ...]]:
    """Split tokens into rows no wider than `width` cells; a newline token ends its row."""
    rows: list[tuple[AlignedToken, ...]] = []
    current: list[AlignedToken] = []
    used = 0
    width = max(width, 4)
    for token in tokens:
        cells = min(cell_len(token_label(token, with_id)), width)
        if current and used + cells > width:
            rows.append(tuple(current))
            current, used = [], 0
        current.append(token)
        used += cells
        if token.text.endswith(NEWLINE_MARKS):
            rows.append(tuple(current))
            current, used = [], 0
    if current or not rows:
        rows.append(tuple(current))
    return rows


def build_rows(alignment: Alignment, side_width: int, stacked: bool, show_ids: bool) -> tuple[list[DiffRow], list[int]]:
    """Wrap every block into display rows; returns the rows and each differing block's first row."""
    rows: list[DiffRow] = []
    hunk_rows: list[int] = []
    for index, block in enumerate(alignment.blocks):
        if block.equal:
            wrapped = wrap_tokens(block.ref, side_width, show_ids)
            position = block.ref_start
            for line in wrapped:
                rows.append(DiffRow(index, "equal", line, line, position))
                position += len(line)
            continue
        hunk_rows.append(len(rows))
        left = wrap_tokens(block.ref, side_width, True) if block.ref else []
        right = wrap_tokens(block.rec, side_width, True) if block.rec else []
        if stacked:
            position = block.ref_start
            for line in left:
                rows.append(DiffRow(index, "ref", line, (), position))
                position += len(line)
            position = block.rec_start
            for line in right:
                rows.append(DiffRow(index, "rec", (), line, position))
                position += len(line)
            if not left and not right:
                rows.append(DiffRow(index, "ref", (), (), block.ref_start))
            continue
        left_pos, right_pos = block.ref_start, block.rec_start
        for i in range(max(len(left), len(right), 1)):
            lline = left[i] if i < len(left) else ()
            rline = right[i] if i < len(right) else ()
            rows.append(DiffRow(index, "pair", lline, rline, left_pos if lline else None))
            left_pos += len(lline)
            right_pos += len(rline)
    return rows, hunk_rows


class TokenDiffView(ScrollView, can_focus=True):
    """Side-by-side (or stacked, when narrow) aligned token diff with n/N between differences."""

    BINDINGS = [
        Binding("n", "next_diff", "Next diff", id="diff.next"),
        Binding("N", "previous_diff", "Prev diff", id="diff.previous"),
        Binding("i", "toggle_ids", "Ids", show=False, id="diff.ids"),
        Binding("u", "toggle_layout", "Layout", show=False, id="diff.layout"),
        Binding("g", "scroll_home", "Top", show=False, id="diff.top"),
        Binding("G", "scroll_end", "Bottom", show=False, id="diff.bottom"),
    ]

    COMPONENT_CLASSES = {
        "tokendiff--equal-a",
        "tokendiff--equal-b",
        "tokendiff--delete",
        "tokendiff--insert",
        "tokendiff--delete-b",
        "tokendiff--insert-b",
        "tokendiff--gutter",
        "tokendiff--current",
        "tokendiff--special",
        "tokendiff--separator",
    }

    DEFAULT_CSS = """
    TokenDiffView {
        height: 1fr;
        background: $surface;
        scrollbar-size-vertical: 1;
    }
    TokenDiffView > .tokendiff--equal-a { color: $text; }
    TokenDiffView > .tokendiff--equal-b { color: $text; background: $boost; }
    TokenDiffView > .tokendiff--delete { color: $text; background: $error 35%; }
    TokenDiffView > .tokendiff--delete-b { color: $text; background: $error 55%; }
    TokenDiffView > .tokendiff--insert { color: $text; background: $success 35%; }
    TokenDiffView > .tokendiff--insert-b { color: $text; background: $success 55%; }
    TokenDiffView > .tokendiff--gutter { color: $text-muted; }
    TokenDiffView > .tokendiff--current { color: $warning; text-style: bold; }
    TokenDiffView > .tokendiff--special { color: $accent; text-style: bold; }
    TokenDiffView > .tokendiff--separator { color: $text-muted; }
    """

    class DiffChanged(Message):
        """The current difference changed: `index` of `total` (index -1 when there is none)."""

        def __init__(self, view: "TokenDiffView", index: int, total: int) -> None:
            super().__init__()
            self.view = view
            self.index = index
            self.total = total

        @property
        def control(self) -> "TokenDiffView":
            return self.view

    show_ids: reactive[bool] = reactive(False)
    force_stacked: reactive[bool | None] = reactive(None)
    current_diff: reactive[int] = reactive(-1)

    def __init__(self, alignment: Alignment | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._alignment = alignment or Alignment(blocks=(), ref_len=0, rec_len=0)
        self._rows: list[DiffRow] = []
        self._hunk_rows: list[int] = []
        self._model_key: tuple | None = None
        self._model_stacked = False
        self._strips: LRUCache[tuple, Strip] = LRUCache(1024)

    # --- data ------------------------------------------------------------------------------
    @property
    def alignment(self) -> Alignment:
        return self._alignment

    @property
    def diff_count(self) -> int:
        return len(self._alignment.diff_blocks)

    def set_alignment(self, alignment: Alignment) -> None:
        """Show another alignment, scrolled to its first difference."""
        self._alignment = alignment
        self._model_key = None
        self._strips.clear()
        self.current_diff = -1
        self._ensure_model()
        self.scroll_to(0, 0, animate=False)
        if self._hunk_rows:
            self.call_after_refresh(self.goto_diff, 0)
        else:
            self.post_message(self.DiffChanged(self, -1, 0))

    @property
    def stacked(self) -> bool:
        if self.force_stacked is not None:
            return self.force_stacked
        return self.size.width < NARROW_WIDTH

    def _side_width(self, stacked: bool) -> int:
        width = max(self.size.width - self.scrollbar_size_vertical, 20)
        if stacked:
            return width - GUTTER - 2
        return max((width - GUTTER - len(SEPARATOR)) // 2, 8)

    def _ensure_model(self) -> None:
        stacked = self.stacked
        key = (self.size.width, stacked, self.show_ids, id(self._alignment))
        if key == self._model_key:
            return
        self._rows, self._hunk_rows = build_rows(self._alignment, self._side_width(stacked), stacked, self.show_ids)
        self._model_key = key
        self._model_stacked = stacked
        self._strips.clear()
        self.virtual_size = Size(max(self.size.width - self.scrollbar_size_vertical, 1), len(self._rows))

    def on_resize(self) -> None:
        self._ensure_model()
        if 0 <= self.current_diff < len(self._hunk_rows):
            self.scroll_to(y=max(self._hunk_rows[self.current_diff] - 2, 0), animate=False)

    def watch_show_ids(self) -> None:
        self._ensure_model()
        self.refresh()

    def watch_force_stacked(self) -> None:
        self._ensure_model()
        self.refresh()

    def watch_current_diff(self) -> None:
        self._strips.clear()
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    # --- navigation ------------------------------------------------------------------------
    def goto_diff(self, index: int) -> None:
        """Scroll so that difference `index` (wrapping around) sits near the top."""
        self._ensure_model()
        if not self._hunk_rows:
            return
        index %= len(self._hunk_rows)
        self.current_diff = index
        self.scroll_to(y=max(self._hunk_rows[index] - 2, 0), animate=False)
        self.post_message(self.DiffChanged(self, index, len(self._hunk_rows)))

    def action_next_diff(self) -> None:
        self.goto_diff(self.current_diff + 1)

    def action_previous_diff(self) -> None:
        self.goto_diff(self.current_diff - 1 if self.current_diff >= 0 else -1)

    def action_toggle_ids(self) -> None:
        self.show_ids = not self.show_ids

    def action_toggle_layout(self) -> None:
        self.force_stacked = not self.stacked

    def row_text(self, y: int) -> str:
        """The plain text of display row `y` (for tests and copy)."""
        self._ensure_model()
        return "".join(segment.text for segment in self._render_row(y, self.size.width)).rstrip()

    @property
    def row_count(self) -> int:
        self._ensure_model()
        return len(self._rows)

    # --- rendering -------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        self._ensure_model()
        row_index = self.scroll_offset.y + y
        width = self.scrollable_content_region.width
        key = (row_index, width, self._model_key, self.current_diff)
        strip = self._strips.get(key)
        if strip is None:
            strip = Strip(self._render_row(row_index, width)).adjust_cell_length(width, self.rich_style)
            self._strips[key] = strip
        return strip

    def _tokens(self, tokens: tuple[AlignedToken, ...], width: int, kind: str, with_id: bool) -> list[Segment]:
        styles = (self.get_component_rich_style(f"tokendiff--{kind}"),)
        if kind == "equal-a":
            styles = (styles[0], self.get_component_rich_style("tokendiff--equal-b"))
        else:
            styles = (styles[0], self.get_component_rich_style(f"tokendiff--{kind}-b"))
        special = self.get_component_rich_style("tokendiff--special")
        segments: list[Segment] = []
        used = 0
        for n, token in enumerate(tokens):
            label = token_label(token, with_id)
            cells = cell_len(label)
            if used + cells > width:
                label = _clip(label, max(width - used - 1, 0)) + "…"
                cells = cell_len(label)
            style = styles[n % 2]
            if token.special:
                style = style + special
            segments.append(Segment(label, style))
            used += cells
            if used >= width:
                break
        if used < width:
            segments.append(Segment(" " * (width - used), self.rich_style))
        return segments

    def _render_row(self, row_index: int, width: int) -> list[Segment]:
        base = self.rich_style
        if row_index >= len(self._rows):
            return [Segment(" " * width, base)]
        row = self._rows[row_index]
        gutter_style = self.get_component_rich_style("tokendiff--gutter")
        is_current = (
            0 <= self.current_diff < len(self._hunk_rows)
            and self._alignment.diff_blocks[self.current_diff] == row.block
        )
        marker_style = self.get_component_rich_style("tokendiff--current") if is_current else gutter_style
        position = "" if row.position is None else str(row.position)
        segments = [Segment(f"{position:>{GUTTER - 1}}", gutter_style)]
        marks = {"equal": " ", "pair": "≠", "ref": "-", "rec": "+"}
        segments.append(Segment("▶" if is_current and row.role != "equal" else marks[row.role], marker_style))
        if self._model_stacked:
            side = max(width - GUTTER - 2, 4)
            segments.append(Segment(" ", base))
            if row.role == "equal":
                segments += self._tokens(row.left, side, "equal-a", self.show_ids)
            elif row.role == "ref":
                segments += self._tokens(row.left, side, "delete", True)
            else:
                segments += self._tokens(row.right, side, "insert", True)
            return segments
        side = self._side_width(False)
        separator = Segment(SEPARATOR, self.get_component_rich_style("tokendiff--separator"))
        if row.role == "equal":
            segments += self._tokens(row.left, side, "equal-a", self.show_ids)
            segments.append(separator)
            segments += self._tokens(row.right, side, "equal-a", self.show_ids)
        else:
            segments += self._tokens(row.left, side, "delete", True)
            segments.append(separator)
            segments += self._tokens(row.right, side, "insert", True)
        return segments


def _clip(text: str, cells: int) -> str:
    out = []
    used = 0
    for char in text:
        w = cell_len(char)
        if used + w > cells:
            break
        out.append(char)
        used += w
    return "".join(out)


__all__ = ["TokenDiffView", "DiffRow", "build_rows", "wrap_tokens", "token_label"]
