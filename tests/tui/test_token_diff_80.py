"""The token diff at 80×24, read off the screen: every token's text whole on its side, in both layouts."""

from __future__ import annotations

import pytest

from app.records import AlignBlock, AlignedToken, Alignment
from app.tokens import load_tokenizer
from app.tokens.align import align
from app.tui.app import EaglewatchApp
from app.tui.screens.diff import DiffScreen
from app.tui.source import SampleDiff
from tests.tui.sources import MemorySource
from widgets.token_diff import SEPARATOR, TokenDiffView, token_label

REF_TEXT = (
    'The total is 24830 tokens, not 4830.\n北京的天气怎么样？🙂🚀 done.\n\t\tindented = {"city": "Paris"}\n'
    "================================================================\n"
    "                                spaces before; 1234567890123 digits<|im_end|>"
)
REC_TEXT = (
    'The total is 24831 tokens, not 4830.\n北京的天气很好？🙂 done!\n\t indented = {"city": "Pariss"}\n'
    "================================================================\n"
    "                               spaces before; 1234567890123 digits<|im_end|>"
)


def _alignment(tok) -> Alignment:
    """A real alignment of two edited texts, plus a differing token wider than any side (an id of 5 digits)."""
    ref, rec = tok.encode(REF_TEXT), tok.encode(REC_TEXT)
    al = align(ref, rec, tok)
    long = AlignBlock(
        False, al.ref_len, al.rec_len, (AlignedToken(24830, "x" * 70),), (AlignedToken(163586, "y" * 45),)
    )
    return Alignment(al.blocks + (long,), al.ref_len + 1, al.rec_len + 1)


class DiffSource(MemorySource):
    def __init__(self, alignment: Alignment) -> None:
        super().__init__()
        self.alignment = alignment

    def sample_diff(self, sample_id: str) -> SampleDiff:
        return SampleDiff(sample_id, "text_mismatch", "corrupt: test", self.alignment, "canonical")


def _screen_lines(app) -> list[str]:
    """The whole screen as text, one string per terminal line (what the compositor draws)."""
    return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]


async def _rendered_rows(pilot, view: TokenDiffView) -> tuple[str, dict[int, str]]:
    """The view's header line and every display row as drawn on the screen, scrolling through all of them."""
    region = view.region
    height = region.height
    rows: dict[int, str] = {}
    header = ""
    y = 0
    while True:
        view.scroll_to(y=y, animate=False)
        await pilot.pause()
        lines = _screen_lines(pilot.app)[region.y : region.y + height]
        scroll = int(view.scroll_offset.y)
        header = lines[0]
        for k, line in enumerate(lines[1:]):
            index = scroll + k
            if index < view.row_count:
                rows[index] = line[:-1] if view.show_vertical_scrollbar else line  # the scrollbar's cell
        if scroll + height - 1 >= view.row_count:
            return header, rows
        y = scroll + height - 1


def _expected(tokens: tuple[AlignedToken, ...], with_id: bool) -> str:
    return "".join(token_label(t, with_id) for t in tokens).replace(" ", "")


def _drawn(cells: list[str]) -> str:
    # spaces on screen are padding only (a token's spaces are drawn as ·); ↪ starts a cut token's next piece
    return "".join(cells).replace(" ", "").replace("↪", "")


async def _check_layout(pilot, view: TokenDiffView, alignment: Alignment, stacked: bool) -> None:
    header, rows = await _rendered_rows(pilot, view)
    assert "reference" in header and "reconstructed" in header
    assert len(rows) == view.row_count
    ref_cells: list[str] = []
    rec_cells: list[str] = []
    for index in range(view.row_count):
        line = rows[index]
        if stacked:
            mark, text = line[view.index_gutter - 1], line[view.index_gutter + 1 :]
            assert mark in " -+", line
            if mark in " -":
                ref_cells.append(text)
            if mark in " +":
                rec_cells.append(text)
        else:
            assert SEPARATOR in line, line
            left, right = line.split(SEPARATOR, 1)
            ref_cells.append(left[view.index_gutter :])
            rec_cells.append(right[view.rec_index_gutter :])
    want_ref = "".join(_expected(b.ref, not b.equal) for b in alignment.blocks)
    want_rec = "".join(_expected(b.rec, not b.equal) for b in alignment.blocks)
    assert "…" not in "".join(ref_cells + rec_cells)  # nothing clipped
    assert _drawn(ref_cells) == want_ref  # every reference token whole, in order
    assert _drawn(rec_cells) == want_rec
    assert "[24830]" in _drawn(ref_cells)
    # each side's own index, whole, at the start of every row that starts a token
    for index, row in enumerate(view._rows):
        line = rows[index]
        own = row.rec_position if row.role == "rec" else row.position
        if own is not None:
            assert line[1 : view.index_gutter - 1].strip() == str(own), line
        if not stacked and row.rec_position is not None:
            assert line.split(SEPARATOR, 1)[1][: view.rec_index_gutter].strip() == str(row.rec_position), line


async def _open_diff(pilot) -> TokenDiffView:
    """Open the token diff screen (its alignment loads in a worker) and return its view."""
    pilot.app.open_diff("s00001")
    for _ in range(4):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    assert isinstance(pilot.app.screen, DiffScreen)
    return pilot.app.screen.query_one(TokenDiffView)


async def _check_at_80(alignment: Alignment) -> None:
    app = EaglewatchApp(DiffSource(alignment))
    async with app.run_test(size=(80, 24)) as pilot:
        view = await _open_diff(pilot)
        assert view.stacked  # 80 columns stack by default
        await _check_layout(pilot, view, alignment, stacked=True)
        await pilot.press("u")  # side by side at 80 columns
        await pilot.pause()
        assert not view.stacked
        await _check_layout(pilot, view, alignment, stacked=False)


async def test_every_token_is_drawn_whole_at_80_columns_in_both_layouts(tokenizer) -> None:
    await _check_at_80(_alignment(tokenizer))


async def test_every_kimi_token_is_drawn_whole_at_80_columns_in_both_layouts(kimi_tokenizer_dir) -> None:
    await _check_at_80(_alignment(load_tokenizer(kimi_tokenizer_dir)))


async def test_indexes_past_five_digits_widen_the_gutter_and_cut_nothing() -> None:
    words = tuple(AlignedToken(900 + k, w) for k, w in enumerate(["·the", "·total", "·is", "·24830", "·again"] * 8))
    alignment = Alignment(
        (
            AlignBlock(True, 123_400, 123_401, words, words),
            AlignBlock(
                False,
                123_440,
                123_441,
                (AlignedToken(24830, "24830"),),
                (AlignedToken(24831, "24831"), AlignedToken(7, "·x")),
            ),
            AlignBlock(True, 123_441, 123_443, words, words),
        ),
        1_234_567,
        1_234_568,
    )
    await _check_at_80(alignment)


@pytest.mark.parametrize("stacked", [True, False])
async def test_the_current_difference_keeps_its_marks_at_80_columns(tokenizer, stacked: bool) -> None:
    alignment = _alignment(tokenizer)
    app = EaglewatchApp(DiffSource(alignment))
    async with app.run_test(size=(80, 24)) as pilot:
        view = await _open_diff(pilot)
        view.force_stacked = stacked
        await pilot.press("n")
        await pilot.pause()
        lines = _screen_lines(app)[view.region.y + 1 : view.region.bottom]
        current = [line for line in lines if line.startswith("▶")]
        assert current
        marks = {line[view.index_gutter - 1] for line in current}
        assert marks <= ({"-", "+"} if stacked else {"≠"}) and marks
