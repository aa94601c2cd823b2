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
from rich.style import Style
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from app.records import AlignedToken, Alignment

GUTTER = 7  # "▶12345" + the row's mark: current-difference pointer, then the side's token index
REC_GUTTER = 6  # "12345 " the reconstructed side's token index, side by side
# Both gutters widen past 5 digits for samples of 100k+ tokens (`TokenDiffView.index_gutter`), so an index never
# pushes the row's last cells off screen.
SEPARATOR = " │ "
REFERENCE, RECONSTRUCTED = "reference", "reconstructed"
NARROW_WIDTH = 100  # below this many cells the view stacks reference above reconstructed
NEWLINE_MARKS = ("⏎", "↵", "\n")


@dataclass(frozen=True, slots=True)
class DiffRow:
    """One display row: the block it belongs to, its role and the tokens on each side.

    role: "equal" (both sides the same), "pair" (side by side differing), "ref" / "rec"
    (stacked layout: one side of a differing block). `position` is the first token's index on the
    reference side and `rec_position` on the reconstructed side (None where that side has no token on the row):
    each side's gutter shows its own index, never the other's.
    """

    block: int
    role: str
    left: tuple[AlignedToken, ...]
    right: tuple[AlignedToken, ...]
    position: int | None
    rec_position: int | None = None


def token_label(token: AlignedToken, with_id: bool) -> str:
    """How one token is shown: its visible text, prefixed by its id where ids matter."""
    # The row break already shows a newline; a raw "\n" must never reach a Segment.
    text = token.text.replace("\n", "") if token.text else "∅"
    return f"[{token.id}]{text}" if with_id and token.id >= 0 else text


def split_long(tokens: tuple[AlignedToken, ...], width: int, with_id: bool) -> tuple[AlignedToken, ...]:
    """Tokens whose label is wider than `width` cut into pieces that fit (nothing is ever clipped off screen).

    The first piece keeps the id (shown as `[id]` where ids are shown); the rest continue its text.
    """
    width = max(width, 4)
    out: list[AlignedToken] = []
    for token in tokens:
        label = token_label(token, with_id)
        if cell_len(label) <= width:
            out.append(token)
            continue
        prefix = f"[{token.id}]" if with_id else ""
        newline = "\n" if token.text.endswith("\n") else ""
        text, first = token.text.replace("\n", ""), True
        while text or first:
            room = width - (cell_len(prefix) if first else 1)
            piece = _clip(text, max(room, 1)) or text[:1]
            text = text[len(piece) :]
            piece += newline if not text else ""  # the row still breaks after a newline token
            if first:
                out.append(AlignedToken(token.id, piece, token.special))
            else:
                out.append(AlignedToken(-1, "↪" + piece, token.special))  # id -1: a continuation, no id shown
            first = False
    return tuple(out)


def wrap_tokens(tokens: tuple[AlignedToken, ...], width: int, with_id: bool) -> list[tuple[AlignedToken, ...]]:
    """Split tokens into rows no wider than `width` cells; a newline token ends its row; a token wider than
    a row is cut into pieces over several rows (`split_long`), never clipped."""
    rows: list[tuple[AlignedToken, ...]] = []
    current: list[AlignedToken] = []
    used = 0
    width = max(width, 4)
    for token in split_long(tokens, width, with_id):
        cells = cell_len(token_label(token, with_id))
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
            position, rec_position = block.ref_start, block.rec_start
            for line in wrapped:
                starts = _count(line) > 0  # a row of continuation pieces starts no token: no index
                rows.append(
                    DiffRow(index, "equal", line, line, position if starts else None, rec_position if starts else None)
                )
                n = _count(line)
                position += n
                rec_position += n
            continue
        hunk_rows.append(len(rows))
        left = wrap_tokens(block.ref, side_width, True) if block.ref else []
        right = wrap_tokens(block.rec, side_width, True) if block.rec else []
        if stacked:
            position = block.ref_start
            for line in left:
                rows.append(DiffRow(index, "ref", line, (), position if _count(line) else None))
                position += _count(line)
            position = block.rec_start
            for line in right:
                rows.append(DiffRow(index, "rec", (), line, None, position if _count(line) else None))
                position += _count(line)
            if not left and not right:
                rows.append(DiffRow(index, "ref", (), (), block.ref_start))
            continue
        left_pos, right_pos = block.ref_start, block.rec_start
        for i in range(max(len(left), len(right), 1)):
            lline = left[i] if i < len(left) else ()
            rline = right[i] if i < len(right) else ()
            rows.append(
                DiffRow(
                    index,
                    "pair",
                    lline,
                    rline,
                    left_pos if _count(lline) else None,
                    right_pos if _count(rline) else None,
                )
            )
            left_pos += _count(lline)
            right_pos += _count(rline)
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

        def __init__(self, view: TokenDiffView, index: int, total: int) -> None:
            super().__init__()
            self.view = view
            self.index = index
            self.total = total

        @property
        def control(self) -> TokenDiffView:
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
            return width - self.index_gutter - 2
        return max((width - self.index_gutter - len(SEPARATOR) - self.rec_index_gutter) // 2, 8)

    @property
    def index_gutter(self) -> int:
        """Cells before a row's tokens: the current-difference pointer, the token index and the row's mark."""
        return GUTTER + self._extra_digits

    @property
    def rec_index_gutter(self) -> int:
        """Cells of the reconstructed side's token index (side by side)."""
        return REC_GUTTER + self._extra_digits

    @property
    def _extra_digits(self) -> int:
        return max(len(str(max(self._alignment.ref_len, self._alignment.rec_len))) - 5, 0)

    def _ensure_model(self) -> None:
        stacked = self.stacked
        key = (self.size.width, stacked, self.show_ids, id(self._alignment))
        if key == self._model_key:
            return
        self._rows, self._hunk_rows = build_rows(self._alignment, self._side_width(stacked), stacked, self.show_ids)
        self._model_key = key
        self._model_stacked = stacked
        self._strips.clear()
        # one more line than the rows: the header naming each side stays on the first line of the view
        self.virtual_size = Size(max(self.size.width - self.scrollbar_size_vertical, 1), len(self._rows) + 1)

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
    def _render_header(self, width: int) -> list[Segment]:
        style = self.get_component_rich_style("tokendiff--gutter") + self.get_component_rich_style("tokendiff--current")
        delete = self.get_component_rich_style("tokendiff--delete")
        insert = self.get_component_rich_style("tokendiff--insert")
        if self._model_stacked:
            segs = [
                Segment(f"{'index':>{self.index_gutter - 1}} ", style),
                Segment(f"- {REFERENCE} (ground truth)", delete),
                Segment("  "),
                Segment(f"+ {RECONSTRUCTED} (eaglewatch)", insert),
            ]
        else:
            side = self._side_width(False)
            segs = [
                Segment(f"{'ref':>{self.index_gutter - 1}} ", style),
                Segment(f"{REFERENCE} (ground truth)"[:side].ljust(side), delete),
                Segment(SEPARATOR, self.get_component_rich_style("tokendiff--separator")),
                Segment(f"{'rec':<{self.rec_index_gutter}}", style),
                Segment(f"{RECONSTRUCTED} (eaglewatch)"[:side], insert),
            ]
        used = sum(cell_len(seg.text) for seg in segs)
        return segs + ([Segment(" " * (width - used))] if used < width else [])

    def render_line(self, y: int) -> Strip:
        self._ensure_model()
        width = self.scrollable_content_region.width
        if y == 0:
            return Strip(self._render_header(width)).adjust_cell_length(width, self.rich_style)
        row_index = self.scroll_offset.y + y - 1
        width = self.scrollable_content_region.width
        key = (row_index, width, self._model_key, self.current_diff)
        strip = self._strips.get(key)
        if strip is None:
            strip = Strip(self._render_row(row_index, width)).adjust_cell_length(width, self.rich_style)
            self._strips[key] = strip
        return strip

    def _tokens(self, tokens: tuple[AlignedToken, ...], width: int, kind: str, with_id: bool) -> list[Segment]:
        styles: tuple[Style, ...] = (self.get_component_rich_style(f"tokendiff--{kind}"),)
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
        # each side's own index: the reference's on the left (stacked: the row's side), the reconstructed one's beside
        # it
        own = row.rec_position if row.role == "rec" else row.position
        position = "" if own is None else str(own)
        pointer = "▶" if is_current and row.role != "equal" else " "
        segments = [Segment(pointer, marker_style), Segment(f"{position:>{self.index_gutter - 2}}", gutter_style)]
        marks = {"equal": " ", "pair": "≠", "ref": "-", "rec": "+"}
        segments.append(Segment(marks[row.role], marker_style))  # the mark keeps its meaning on the current one
        if self._model_stacked:
            side = max(width - self.index_gutter - 2, 4)
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
        rec_position = "" if row.rec_position is None else str(row.rec_position)
        rec_gutter = Segment(f"{rec_position:<{self.rec_index_gutter}}", gutter_style)
        if row.role == "equal":
            segments += self._tokens(row.left, side, "equal-a", self.show_ids)
            segments += [separator, rec_gutter]
            segments += self._tokens(row.right, side, "equal-a", self.show_ids)
        else:
            segments += self._tokens(row.left, side, "delete", True)
            segments += [separator, rec_gutter]
            segments += self._tokens(row.right, side, "insert", True)
        return segments


def _count(line: tuple[AlignedToken, ...]) -> int:
    """Tokens on a display row (continuation pieces of a cut token are not tokens of their own)."""
    return sum(1 for t in line if t.id >= 0)


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
