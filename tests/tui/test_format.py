"""The TUI's number formats: a count never takes more than the cells its docstring promises."""

from __future__ import annotations

from app.tui.format import count


def test_a_count_is_rounded_down_into_at_most_four_cells_below_ten_million():
    assert [count(n) for n in (0, 999, 1_000, 1_250, 9_999, 10_000, 999_999, 1_000_000, 9_999_999)] == [
        "0",
        "999",
        "1.0k",
        "1.2k",
        "9.9k",
        "10k",
        "999k",
        "1.0M",
        "9.9M",
    ]
    assert max(len(count(n)) for n in range(0, 10_000_000, 997)) == 4
    assert count(12_345_678) == "12M" and count(123_456_789) == "123M"
