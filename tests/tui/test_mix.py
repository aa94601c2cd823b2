"""The mix screen (`x`) over a real three-dataset run database (tests.mix_run), attached, at 80x24 and 120x40:
per dataset and category the shares of prompts, answers and loss tokens, the reasoning and tool-call shares of its
answers and its prompts' scripts, every name and number whole; the highlighted row in words below; the help explains
its words; `r` re-reads the store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.store.run_store import RunStore
from app.store.store_records import SampleInput
from app.tui.app import EaglewatchApp
from app.tui.db_source import AttachedSource
from app.tui.screens.help import HelpScreen
from app.tui.screens.mix import MIX_GLOSSARY, MixScreen
from tests.mix_run import build_mix_db
from tests.tui.fit import cuts, screen_text
from tests.tui.test_tile_labels import _help_text
from widgets.page_table import PageTable

SIZES = [(80, 24), (120, 40)]
# (label, prompts, answers, loss, reason, tools) of each table row, as tests.mix_run writes them; then the run
ROWS = [
    ("kimi-tool-use", "30.0%", "26.7%", "14.3%", "0.0%", "62.5%"),
    ("openthoughts · code", "20.0%", "20.0%", "42.9%", "100.0%", "0.0%"),
    ("openthoughts · math", "10.0%", "13.3%", "21.4%", "100.0%", "0.0%"),
    ("ultrachat-200k-train-sft", "40.0%", "40.0%", "21.4%", "25.0%", "0.0%"),
    ("all", "100.0%", "100.0%", "100.0%", "43.3%", "16.7%"),
]


@pytest.fixture(scope="module")
def mix_template(tmp_path_factory) -> Path:
    return asyncio.run(build_mix_db(tmp_path_factory.mktemp("mix-template") / "mix.db"))


@pytest.fixture
def mix_db(tmp_path: Path, mix_template: Path) -> Path:
    import sqlite3

    path = tmp_path / "mix.db"
    source, copy = sqlite3.connect(mix_template), sqlite3.connect(path)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()
    return path


async def settle(pilot) -> None:
    for _ in range(4):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def _open_mix(pilot) -> MixScreen:
    await settle(pilot)
    await pilot.press("x")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, MixScreen)
    return screen


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
async def test_the_mix_screen_shows_every_dataset_and_category_whole(mix_db: Path, size) -> None:
    app = EaglewatchApp(AttachedSource(mix_db))
    async with app.run_test(size=size) as pilot:
        screen = await _open_mix(pilot)
        assert cuts(screen) == []
        text = screen_text(screen)
        assert not any("…" in line for line in text), text
        table = screen.query_one(PageTable)
        shown = [table.row_text(i).split() for i in range(table.row_count)]
        for cells, (label, *shares) in zip(shown, ROWS, strict=True):
            assert " ".join(cells[: len(label.split())]) == label
            assert cells[len(label.split()) : len(label.split()) + 5] == shares
        assert "CJK 67%" in table.row_text(0)
        assert "Cyrillic 100%" in table.row_text(2)
        assert text[0].strip().startswith("mix of 40 prompts · 30 answers · 2,800 loss tokens")


async def test_the_highlighted_row_is_said_in_full_below_the_table(mix_db: Path) -> None:
    app = EaglewatchApp(AttachedSource(mix_db))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await _open_mix(pilot)
        for _ in range(3):
            await pilot.press("down")
        await pilot.pause()
        detail = " ".join(" ".join(screen_text(screen)[-6:]).split())
        assert (
            "ultrachat-200k-train-sft: 16 prompts (40.0%) · 12 answers (40.0%) · 600 loss tokens (21.4%) · "
            "reasoning in 3 (25.0%) · tool calls in 0 (0.0%) · scripts Latin 16"
        ) in detail
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, MixScreen)


async def test_r_reads_the_mix_again_from_the_store(mix_db: Path) -> None:
    app = EaglewatchApp(AttachedSource(mix_db))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await _open_mix(pilot)
        store = await RunStore.open(mix_db)
        try:
            await store.ingest(
                1, [SampleInput(f"new-{i}", "kimi-tool-use", [{"role": "user", "content": "你好"}]) for i in range(10)]
            )
        finally:
            await store.close()
        await pilot.press("r")
        await settle(pilot)
        assert screen_text(screen)[0].strip().startswith("mix of 50 prompts")
        assert screen.rows[0].prompts == 22
        assert screen.query_one(PageTable).row_text(0).split()[1] == "44.0%"


async def test_the_help_lists_the_mix_key_and_explains_the_mix_words(mix_db: Path) -> None:
    app = EaglewatchApp(AttachedSource(mix_db))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "Dataset mix" in {c.title for c in app.get_system_commands(app.screen)}
        await pilot.press("question_mark")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert "x Mix: datasets, categories, scripts (nav.mix)" in _help_text(app.screen)
        await pilot.press("escape")
        await _open_mix(pilot)
        await pilot.press("question_mark")
        await settle(pilot)
        help_text = _help_text(app.screen)
        for entry, meaning in MIX_GLOSSARY:
            assert f"{entry} {meaning}" in help_text
