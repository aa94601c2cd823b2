"""SVG snapshots of every screen over fixed in-memory data (no clock, no engine, no database).

Update after an intended visual change with:
    python -m pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest

from app.tui.app import EaglewatchApp
from app.tui.screens import conversations, mismatches, mix
from tests.tui.sources import ConversationSource, MemorySource

SIZES = [(80, 24), (120, 40)]


class _FrozenClock:
    """`time` as the list screens see it, its monotonic clock stopped: their "updated N s ago" says 0 s however
    long a loaded machine takes from the page's read to the snapshot (it said 1 s in one full run in ten)."""

    def __getattr__(self, name: str):
        return getattr(time, name)

    @staticmethod
    def monotonic() -> float:
        return 1000.0


@pytest.fixture(autouse=True)
def frozen_page_clock(monkeypatch):
    for module in (conversations, mismatches, mix):
        monkeypatch.setattr(module, "time", _FrozenClock())


async def settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def keys(*pressed: str):
    """A run_before that presses keys, letting the data workers finish after each."""

    async def run_before(pilot) -> None:
        await settle(pilot)
        for key in pressed:
            await pilot.press(key)
            await settle(pilot)

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
def test_dashboard(snap_compare, size) -> None:
    assert snap_compare(EaglewatchApp(MemorySource()), terminal_size=size, run_before=keys())


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
def test_mismatches(snap_compare, size) -> None:
    assert snap_compare(EaglewatchApp(MemorySource()), terminal_size=size, run_before=keys("m"))


@pytest.mark.parametrize("size", SIZES, ids=["80x24-stacked", "120x40-side-by-side"])
def test_token_diff(snap_compare, size) -> None:
    assert snap_compare(EaglewatchApp(MemorySource()), terminal_size=size, run_before=keys("m", "enter", "n"))


def test_token_diff_with_ids(snap_compare) -> None:
    assert snap_compare(EaglewatchApp(MemorySource()), terminal_size=(120, 40), run_before=keys("m", "enter", "i"))


def test_sample_detail(snap_compare) -> None:
    assert snap_compare(EaglewatchApp(MemorySource()), terminal_size=(80, 24), run_before=keys("m", "enter", "s"))


def test_jobs(snap_compare) -> None:
    assert snap_compare(EaglewatchApp(MemorySource()), terminal_size=(80, 24), run_before=keys("j"))


def test_help(snap_compare) -> None:
    assert snap_compare(EaglewatchApp(MemorySource()), terminal_size=(80, 24), run_before=keys("question_mark"))


def test_paused_dashboard_in_ansi_theme(snap_compare) -> None:
    app = EaglewatchApp(MemorySource(state="paused"), theme="ansi-dark")
    assert snap_compare(app, terminal_size=(80, 24), run_before=keys())


def test_dashboard_with_conversations(snap_compare) -> None:
    assert snap_compare(EaglewatchApp(ConversationSource()), terminal_size=(80, 24), run_before=keys())


def test_conversations(snap_compare) -> None:
    assert snap_compare(EaglewatchApp(ConversationSource()), terminal_size=(80, 24), run_before=keys("C"))


def test_conversation_turns_in_flight(snap_compare) -> None:
    # conv-oa-02: two turns done, the third in flight, the last two waiting on it
    assert snap_compare(
        EaglewatchApp(ConversationSource()), terminal_size=(80, 24), run_before=keys("C", "down", "enter")
    )


def test_conversation_turns_diverged(snap_compare) -> None:
    assert snap_compare(
        EaglewatchApp(ConversationSource()), terminal_size=(80, 24), run_before=keys("C", "down", "down", "enter")
    )


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
def test_mix(snap_compare, size) -> None:
    assert snap_compare(EaglewatchApp(MemorySource()), terminal_size=size, run_before=keys("x"))
