"""The sample screen says what a server did to the sample (the intervention ledger), at 80x24, over a real run
database (attached face)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from app.store.db import migrate
from app.tui.app import EaglewatchApp
from app.tui.db_source import AttachedSource
from app.tui.screens.sample import SampleScreen
from tests.tui.fit import cuts, screen_text

DETAIL = "OpenRouter answered on attempt 2: tried SimFirst (503), Sim (200)"


async def _settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def test_the_sample_screen_lists_the_servers_interventions_at_80x24(run_db: Path) -> None:
    db = run_db  # the test's own copy
    migrate(db)
    conn = sqlite3.connect(db)
    with conn:  # every done sample fell back: whichever the screen opens has one
        conn.execute(
            "INSERT INTO interventions (run_id, sample_pk, kind, detail, created_at) "
            "SELECT run_id, pk, 'provider_fallback', ?, ? FROM samples WHERE state = 'done'",
            (DETAIL, time.time()),
        )
    conn.close()
    app = EaglewatchApp(AttachedSource(db))
    async with app.run_test(size=(80, 24)) as pilot:
        await _settle(pilot)
        await pilot.press("m")
        await _settle(pilot)
        await pilot.press("enter")
        await _settle(pilot)
        await pilot.press("s")
        await _settle(pilot)
        screen = app.screen
        assert isinstance(screen, SampleScreen)
        assert screen.detail is not None and screen.detail.interventions == (("provider_fallback", DETAIL),)
        text = "\n".join(screen_text(screen))
        assert "server interventions" in text and "provider_fallback: OpenRouter answered on attempt 2" in text
        assert cuts(screen) == []
