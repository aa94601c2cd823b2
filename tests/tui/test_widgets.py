"""The reusable widgets over plain data: token diff layout and navigation, the page table."""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import App, ComposeResult

from app.records import AlignBlock, AlignedToken, Alignment
from tests.tui.sources import sample_alignment
from widgets.page_table import PageTable, fit
from widgets.token_diff import TokenDiffView, build_rows, token_label, wrap_tokens


def tokens(*texts: str) -> tuple[AlignedToken, ...]:
    return tuple(AlignedToken(100 + i, t) for i, t in enumerate(texts))


def test_rows_never_exceed_the_side_width_and_break_after_newlines() -> None:
    toks = tokens("Hello", "·world", ".↵\n", "Next", "·line", *["·x"] * 30)
    rows = wrap_tokens(toks, 14, with_id=False)
    assert [t.text for t in rows[0]] == ["Hello", "·world", ".↵\n"]
    assert all(sum(cell_len(token_label(t, False)) for t in row) <= 14 for row in rows)
    assert sum(len(row) for row in rows) == len(toks)


def test_a_newline_never_reaches_the_screen_as_a_raw_character() -> None:
    assert "\n" not in token_label(AlignedToken(13, ".↵\n"), with_id=True)
    assert token_label(AlignedToken(13, ".↵\n"), with_id=True) == "[13].↵"


def test_side_by_side_rows_pad_the_shorter_side_and_mark_each_difference() -> None:
    ref = tokens("a", "b")
    rec = tuple(AlignedToken(200 + i, "x" * 9) for i in range(6))
    alignment = Alignment((AlignBlock(True, 0, 0, ref, ref), AlignBlock(False, 2, 2, ref, rec)), 4, 8)
    rows, hunks = build_rows(alignment, 20, stacked=False, show_ids=False)
    assert hunks == [1]
    assert rows[0].role == "equal"
    diff_rows = rows[1:]
    assert all(r.role == "pair" for r in diff_rows)
    assert len(diff_rows) > 1 and diff_rows[-1].left == ()  # the reference side ran out: padded


def test_stacked_rows_show_reference_then_reconstruction() -> None:
    rows, hunks = build_rows(sample_alignment(1), 60, stacked=True, show_ids=False)
    roles = [r.role for r in rows]
    first = hunks[0]
    assert roles[first : first + 2] == ["ref", "rec"]


class DiffHost(App):
    def compose(self) -> ComposeResult:
        yield TokenDiffView()


async def test_diff_view_opens_32k_tokens_and_walks_every_difference() -> None:
    equal = tuple(AlignedToken(i % 500, f"t{i % 500}") for i in range(1000))
    blocks, pos = [], 0
    for _k in range(32):
        blocks.append(AlignBlock(True, pos, pos, equal, equal))
        pos += len(equal)
        blocks.append(
            AlignBlock(False, pos, pos, (AlignedToken(7, "·NOR"),), (AlignedToken(8, "·N"), AlignedToken(9, "OR")))
        )
        pos += 1
    alignment = Alignment(tuple(blocks), pos, pos + 32)
    app = DiffHost()
    async with app.run_test(size=(120, 40)) as pilot:
        view = app.query_one(TokenDiffView)
        view.set_alignment(alignment)
        await pilot.pause()
        assert view.diff_count == 32 and view.current_diff == 0
        seen = set()
        for _ in range(32):
            view.action_next_diff()
            seen.add(view.current_diff)
        assert seen == set(range(32))  # n wraps around through every difference
        view.goto_diff(31)
        await pilot.pause()
        assert view.scroll_offset.y > 0
        text = "\n".join(view.row_text(y) for y in range(view.row_count))
        assert "[7]·NOR" in text and "[8]·N[9]OR" in text


async def test_narrow_diff_view_stacks_and_wide_one_sits_side_by_side() -> None:
    for width, stacked in ((80, True), (140, False)):
        app = DiffHost()
        async with app.run_test(size=(width, 30)) as pilot:
            view = app.query_one(TokenDiffView)
            view.set_alignment(sample_alignment(2))
            await pilot.pause()
            assert view.stacked is stacked
            assert ("│" in view.row_text(0)) is (not stacked)


class TableHost(App):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[object] = []

    def compose(self) -> ComposeResult:
        yield PageTable([("id", 6), ("name", 10)])

    def on_page_table_row_selected(self, event: PageTable.RowSelected) -> None:
        self.messages.append(("selected", event.index))

    def on_page_table_edge_reached(self, event: PageTable.EdgeReached) -> None:
        self.messages.append(("edge", event.direction))


async def test_page_table_moves_selects_and_reports_its_edges() -> None:
    app = TableHost()
    async with app.run_test(size=(40, 10)) as pilot:
        table = app.query_one(PageTable)
        table.show([(str(i), f"row {i}") for i in range(20)])
        table.focus()
        await pilot.press("end", "down", "enter", "home", "up")
        await pilot.pause()
        assert app.messages == [("edge", 1), ("selected", 19), ("edge", -1)]
        assert table.row_text(3) == "3      row 3"


def test_fit_pads_and_cuts_to_cells() -> None:
    assert fit("ab", 4) == "ab  "
    assert fit("abcdef", 4) == "abc…"
    assert cell_len(fit("日本語テキスト", 6)) == 6


def _lines(view: TokenDiffView, n: int) -> list[str]:
    return ["".join(seg.text for seg in view.render_line(y)._segments).rstrip() for y in range(n)]


def test_a_token_wider_than_its_side_is_cut_into_pieces_never_clipped() -> None:
    long = (AlignedToken(24830, "a" * 70),)
    rows = wrap_tokens(long, 20, with_id=True)
    labels = [token_label(t, True) for row in rows for t in row]
    assert labels[0].startswith("[24830]")  # the id is whole
    assert "".join(label.removeprefix("[24830]").lstrip("↪") for label in labels) == "a" * 70
    assert all(cell_len(label) <= 20 for label in labels)


async def test_the_header_names_each_side_and_the_current_difference_keeps_its_marks() -> None:
    for width, stacked in ((80, True), (120, False)):
        app = DiffHost()
        async with app.run_test(size=(width, 16)) as pilot:
            view = app.query_one(TokenDiffView)
            view.set_alignment(sample_alignment(2))
            await pilot.pause()
            await pilot.pause()
            lines = _lines(view, 14)
            assert "reference" in lines[0] and "reconstructed" in lines[0]  # the first line says which side is which
            current = [line for line in lines[1:] if line.startswith("▶")]
            if stacked:
                assert any("- [" in line for line in current) and any("+ [" in line for line in current)
            else:
                assert current and all("≠" in line for line in current)


async def test_side_by_side_shows_each_sides_own_index() -> None:
    app = DiffHost()
    async with app.run_test(size=(120, 30)) as pilot:
        view = app.query_one(TokenDiffView)
        view.set_alignment(sample_alignment(2))
        await pilot.pause()
        await pilot.pause()
        rows = [r for r in view._rows if r.role == "equal"]
        # after the first 1-vs-2 token difference the reconstructed side runs one index ahead of the reference
        later = [r for r in rows if r.position is not None and r.position > 18]
        assert later and all(r.rec_position == r.position + 1 for r in later[:3])
        text = _lines(view, 12)
        assert any(f"│ {later[0].rec_position}" in line for line in text)


async def test_at_80_columns_side_by_side_drops_no_character_of_a_long_id() -> None:
    alignment = Alignment((AlignBlock(False, 0, 0, (AlignedToken(24830, "x" * 60),), (AlignedToken(5, "b"),)),), 1, 1)
    app = DiffHost()
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.query_one(TokenDiffView)
        view.set_alignment(alignment)
        view.force_stacked = False
        await pilot.pause()
        text = "\n".join(_lines(view, 10))
        assert "[24830]" in text and text.count("x") == 60 and "…" not in text
