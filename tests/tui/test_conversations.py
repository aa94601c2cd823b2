"""Whole conversations in the monitor, at 80x24 over real runs (Pilot): the dashboard's conversations tile counts
them as the store does; `C` lists them with `turn k of T` and how each stands; enter lists a conversation's turns
with their verdicts, and enter on a turn opens that turn's token diff. In-process (an engine that ran sample_data's
16 conversations on the built-in simulator) and attached (the same run's database file). A single-turn run shows
no trace of it."""

from __future__ import annotations

import re
import sqlite3
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from rich.cells import cell_len

from app.conversation import turn_sample_id
from app.engine.session import open_run
from app.store import queries
from app.store.run_store import RunStore
from app.tui.app import EaglewatchApp, make_app
from app.tui.db_source import AttachedSource, InProcessSource
from app.tui.screens.conversations import PAGE_SIZE, STATUS_LABELS, ConversationScreen, ConversationsScreen
from app.tui.screens.dashboard import (
    CONVERSATION_GLOSSARY,
    CONVERSATION_WIDTH,
    GLOSSARY,
    DashboardScreen,
    conversation_lines,
)
from app.tui.screens.diff import DiffScreen
from app.tui.screens.help import HelpScreen
from app.tui.source import ConversationCounts
from tests.tui.conftest import conversation_config
from tests.tui.fit import cuts, screen_text
from tests.tui.test_tile_labels import PLAIN, _help_text, _words
from widgets.page_table import PageTable

FACES = ["in-process", "attached"]


async def settle(pilot) -> None:
    for _ in range(4):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


@asynccontextmanager
async def monitor(face: str, database: Path, tmp_path: Path, sample_data_dir: Path):
    """The monitor at 80x24 over a finished run of sample_data's conversations: in-process (an engine hosted here
    that ran it) or attached (`database`, the same run built once per session)."""
    if face == "attached":
        app = EaglewatchApp(AttachedSource(database))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            yield app, pilot, database
        return
    config = conversation_config(tmp_path, sample_data_dir)
    async with open_run(config) as opened:
        import asyncio

        await asyncio.wait_for(opened.run.wait(), 60)
        app = make_app(InProcessSource(run=opened.run, config=config))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            yield app, pilot, Path(config.run.database)
            app.exit()


def counts_of(database: Path) -> ConversationCounts:
    conn = sqlite3.connect(database)
    try:
        return queries.conversation_counts(conn, 1)
    finally:
        conn.close()


def page_of(database: Path, **kw):
    conn = sqlite3.connect(database)
    try:
        return queries.conversation_page(conn, 1, **kw)
    finally:
        conn.close()


def rows_of(screen) -> list[str]:
    table = screen.query_one(PageTable)
    return [table.row_text(i) for i in range(table.row_count)]


async def open_conversation(pilot, conversation_id: str) -> ConversationScreen:
    """From the dashboard: `C`, the cursor down to `conversation_id`, enter."""
    await pilot.press("C")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, ConversationsScreen)
    index = [r.conversation_id for r in screen.rows].index(conversation_id)
    await pilot.press(*["down"] * index, "enter")
    await settle(pilot)
    assert isinstance(pilot.app.screen, ConversationScreen)
    return pilot.app.screen


@pytest.mark.parametrize("face", FACES)
async def test_the_dashboard_counts_the_conversations_as_the_store_does(
    face, conversation_db, tmp_path, sample_data_dir
) -> None:
    async with monitor(face, conversation_db, tmp_path, sample_data_dir) as (app, pilot, database):
        screen = app.screen
        assert isinstance(screen, DashboardScreen)
        tile = screen.query_one("#tile-conversations")
        counts = counts_of(database)
        assert (counts.total, counts.done, counts.diverged, counts.open) == (16, 15, 1, 0)
        assert tile.display and tile._shown == conversation_lines(counts, tile.content_size.width)
        shown = "\n".join(screen_text(screen))
        for item in (
            "done 15/16",
            "open 0",
            "diverged 1",
            "failed 0",
            "off-policy 0",
            f"turns done {counts.turns['done']}",
            "wait 0",
            f"skipped {counts.turns['skipped']}",
        ):
            assert item in shown, item
        assert cuts(screen) == []


@pytest.mark.parametrize("face", FACES)
async def test_the_conversation_view_lists_each_conversation_with_turn_k_of_t_and_its_status(
    face, conversation_db, tmp_path, sample_data_dir
) -> None:
    async with monitor(face, conversation_db, tmp_path, sample_data_dir) as (app, pilot, database):
        await pilot.press("C")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, ConversationsScreen)
        expected = page_of(database)
        assert [r.conversation_id for r in screen.rows] == [r.conversation_id for r in expected]
        lines = rows_of(screen)
        assert len(lines) == 16
        for line, row in zip(lines, expected):
            assert line.split()[0] == row.conversation_id
            assert f"turn {row.at_turn} of {row.turns}" in line and STATUS_LABELS[row.status] in line
        (diverged,) = [line for line in lines if "diverged" in line]
        assert diverged.startswith("conv-oa-03") and "turn 2 of 5" in diverged and "1/5" in diverged
        assert all("✓ done" in line for line in lines if line is not diverged)
        assert cuts(screen) == []


async def test_enter_on_a_conversation_lists_its_turns_with_their_verdicts(
    conversation_db, tmp_path, sample_data_dir
) -> None:
    async with monitor("attached", conversation_db, tmp_path, sample_data_dir) as (app, pilot, database):
        screen = await open_conversation(pilot, "conv-oa-01")
        conn = sqlite3.connect(database)
        turns = queries.conversation_turns(conn, 1, "conv-oa-01")
        conn.close()
        lines = rows_of(screen)
        assert [line.split()[:4] for line in lines] == [
            [f"{t.turn}/{t.turns}", t.sample_id, "✓", "done"] for t in turns
        ]
        assert all(f"{t.n_tokens:,}" in line and "exact" in line for t, line in zip(turns, lines))
        header = "\n".join(screen_text(screen)[:1])
        assert "conv-oa-01 · ✓ done at turn 4 of 4 · 4/4" in header
        assert cuts(screen) == []


async def test_the_diverged_conversation_shows_as_diverged_at_its_turn(
    conversation_db, tmp_path, sample_data_dir
) -> None:
    async with monitor("attached", conversation_db, tmp_path, sample_data_dir) as (app, pilot, _):
        screen = await open_conversation(pilot, "conv-oa-03")
        text = screen_text(screen)
        assert "conv-oa-03 · ✗ diverged at turn 2 of 5 · 1/5" in text[0]
        lines = rows_of(screen)
        assert "exact" in lines[0] and "✓ done" in lines[0]
        assert lines[1].split()[:3] == ["2/5", "conv-oa-03#2", "skipped"] and lines[1].endswith("diverged")
        assert all(line.endswith("parent_skipped") for line in lines[2:])
        # the cursor starts on the turn where it diverged, whose error names the differing call in full
        assert screen.selected.sample_id == "conv-oa-03#2"
        shown = " ".join(" ".join(text).split())
        assert "turn 2: diverged: turn 1: tool call 0 (search) has arguments" in shown
        assert cuts(screen) == []


@pytest.mark.parametrize("face", FACES)
async def test_enter_on_a_turn_opens_the_token_diff_of_its_sample(
    face, conversation_db, tmp_path, sample_data_dir
) -> None:
    async with monitor(face, conversation_db, tmp_path, sample_data_dir) as (app, pilot, _):
        screen = await open_conversation(pilot, "conv-oa-02")
        await pilot.press("home", "down", "enter")  # turn 2 (the cursor starts on the last turn: all done)
        await settle(pilot)
        diff = app.screen
        assert isinstance(diff, DiffScreen) and diff.sample_id == turn_sample_id("conv-oa-02", 2)
        assert diff.diff is not None and diff.diff.sample_id == "conv-oa-02#2" and diff.diff.category == "exact"
        assert "sample conv-oa-02#2 · exact" in screen_text(diff)[0]
        await pilot.press("escape")
        await settle(pilot)
        assert app.screen is screen


async def test_a_run_without_conversations_offers_no_conversation_view(run_db: Path) -> None:
    app = EaglewatchApp(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = app.screen
        assert app.last_record is not None and app.last_record.counts.conversations is None
        assert not screen.query_one("#tile-conversations").display
        assert "nav.conversations" not in {b.binding.id for b in screen.active_bindings.values()}
        assert "Conversations" not in {c.title for c in app.get_system_commands(screen)}
        await pilot.press("C")
        await settle(pilot)
        assert app.screen is screen
        await pilot.press("question_mark")
        await settle(pilot)
        assert "Conversations" not in _help_text(app.screen) and "off-policy" not in _help_text(app.screen)


async def test_the_help_and_the_palette_offer_the_conversation_view_of_a_run_with_conversations(
    conversation_db: Path,
) -> None:
    app = EaglewatchApp(AttachedSource(conversation_db))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "Conversations" in {c.title for c in app.get_system_commands(app.screen)}
        await pilot.press("question_mark")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        help_text = _help_text(app.screen)
        assert "C Conversations (nav.conversations)" in help_text
        # every word of the conversations tile is plain or explained
        dashboard = app.screen_stack[-2]
        words = _words("\n".join(dashboard.query_one("#tile-conversations")._shown))
        explained = {w for entry, _ in GLOSSARY + CONVERSATION_GLOSSARY for w in _words(entry)}
        assert words - PLAIN - explained == set()
        for entry, meaning in CONVERSATION_GLOSSARY:
            assert " ".join(f"{entry} {meaning}".split()) in help_text


@pytest.mark.parametrize(
    "counts",
    [
        ConversationCounts(total=16, done=15, diverged=1, turns={"done": 64, "skipped": 4}),
        ConversationCounts(
            total=1_250_000,
            done=812_345,
            diverged=12_345,
            failed=1_234,
            truncated=9_876,
            ended_skipped=321,
            open=413_879,
            off_policy_turns=98_765,
            turns={
                "done": 4_100_000,
                "leased": 64,
                "waiting": 1_900_000,
                "pending": 412_345,
                "failed": 1_234,
                "skipped": 45_678,
            },
        ),
        ConversationCounts(
            total=9_999_999,
            done=8_888_888,
            diverged=7_777_777,
            failed=6_666_666,
            truncated=5_555_555,
            ended_skipped=4_444_444,
            open=3_333_333,
            off_policy_turns=2_222_222,
            turns={
                "done": 9_999_999,
                "leased": 9_999,
                "waiting": 8_888_888,
                "pending": 7_777_777,
                "failed": 6_666_666,
                "skipped": 5_555_555,
            },
        ),
    ],
    ids=["sample", "a million", "every count at its widest"],
)
def test_the_conversation_tile_shows_every_count_whole_in_its_width(counts) -> None:
    lines = conversation_lines(counts, CONVERSATION_WIDTH)
    assert len(lines) == 4 and all(cell_len(line) <= CONVERSATION_WIDTH for line in lines), lines
    labels = [
        ("done",),
        ("open",),
        ("diverged", "div"),
        ("failed",),
        ("trunc",),
        ("off-policy", "off-pol"),
        ("turns done",),
        ("flight",),
        ("wait",),
        ("pending",),
        ("skipped",),
    ]
    text = "  ".join(lines)
    for label in labels:
        assert any(re.search(rf"(^|\s){re.escape(word)} [0-9]", text) for word in label), label
    assert text.count("skipped") == 1 + bool(counts.ended_skipped)


async def _waiting_run(path: Path, conversations: int) -> None:
    """A run of `conversations` two-turn conversations, the first three with turn 1 leased (in flight, turn 2
    waiting on it), the rest not started."""
    from app.conversation import ConversationInput, split_turns

    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "bye"},
    ]
    store = await RunStore.open(path)
    try:
        run_id = await store.ensure_run("r")
        await store.ingest_conversations(
            run_id, [ConversationInput(f"c{i:03d}", "chats", None, split_turns(messages)) for i in range(conversations)]
        )
        leased = await store.lease(run_id, 3, 600)
        assert len(leased) == 3
    finally:
        await store.close()


async def test_pages_turn_by_key_and_live_states_read_in_words(tmp_path: Path) -> None:
    database = tmp_path / "run.db"
    await _waiting_run(database, PAGE_SIZE + 12)
    app = EaglewatchApp(AttachedSource(database))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("C")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, ConversationsScreen)
        first = [r.conversation_id for r in screen.rows]
        assert len(first) == PAGE_SIZE and screen.has_next
        lines = rows_of(screen)
        assert sum("in flight" in line for line in lines) == 3 and sum("not started" in line for line in lines) == 47
        await pilot.press("right_square_bracket")
        await settle(pilot)
        second = [r.conversation_id for r in screen.rows]
        assert second == [r.conversation_id for r in page_of(database, after_pk=screen.after_pk)]
        assert len(second) == 12 and not screen.has_next and not set(first) & set(second)
        assert "rows 51–62 (the last)" in screen_text(screen)[0]
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert [r.conversation_id for r in screen.rows] == first
        running = next(r.conversation_id for r in screen.rows if r.status == "running")
        await pilot.press("enter")  # the cursor went to the last row of the page turned back to
        await settle(pilot)
        assert isinstance(app.screen, ConversationScreen) and app.screen.conversation_id == first[-1]
        await pilot.press("escape")
        await settle(pilot)
        await pilot.press("home")
        index = first.index(running)
        await pilot.press(*["down"] * index, "enter")
        await settle(pilot)
        turns = rows_of(app.screen)
        assert "in flight" in turns[0] and "waiting on parent" in turns[1]
        assert "in flight at turn 1 of 2" in screen_text(app.screen)[0]
        assert cuts(app.screen) == []


@pytest.mark.parametrize(
    "size",
    [(80, 24), (120, 40), (100, 30), (80, 40), (120, 24), (160, 50)],
    ids=["80x24", "120x40", "100x30", "80x40", "120x24", "160x50"],
)
async def test_a_run_with_conversations_fits_every_size(conversation_db: Path, size) -> None:
    from tests.tui.test_fit import assert_dashboard_fits

    app = EaglewatchApp(AttachedSource(conversation_db))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        screen = app.screen
        assert_dashboard_fits(screen)
        tile = screen.query_one("#tile-conversations")
        assert tile.display and tile.content_size.height >= 4 and tile.content_size.width == CONVERSATION_WIDTH
        assert tile.border_title == "conversations 16"
        if size == (120, 40):
            screen_fits = []
            for keys in (("C",), ("enter",), ("enter",)):  # the list, a conversation's turns, a turn's diff
                await pilot.press(*keys)
                await settle(pilot)
                screen_fits.append((type(app.screen).__name__, cuts(app.screen)))
            assert screen_fits == [("ConversationsScreen", []), ("ConversationScreen", []), ("DiffScreen", [])]
