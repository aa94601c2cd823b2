"""The mismatch list over a real run database that gains rows while the screen is open (80×24)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.cells import cell_len

from app.records import Completion, Reconstruction, Usage, Verdict
from app.store.run_store import RunStore
from app.store.store_records import ResultRecord, SampleInput
from app.tokens.align import diff_spans
from app.tui.app import EaglewatchApp
from app.tui.db_source import AttachedSource
from app.tui.screens.mismatches import MismatchesScreen
from widgets.page_table import PageTable


async def settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def add_mismatches(db: Path, tokenizer, sample_ids: list[str]) -> None:
    """Store new samples whose reconstructed ids differ from the reference (text_mismatch), as an engine would."""
    store = await RunStore.open(db)
    try:
        run_id = await store.ensure_run("demo", {})
        refs = {sid: tokenizer.encode(f"The answer to {sid} is the NAND gate.") for sid in sample_ids}
        await store.ingest(
            run_id,
            [
                SampleInput(sid, "chat", [{"role": "user", "content": sid}], None, tuple(refs[sid]))
                for sid in sample_ids
            ],
        )
        for sample in await store.lease(run_id, len(sample_ids), 600):
            ref = refs[sample.sample_id]
            rec = list(ref)
            rec[3] = (rec[3] + 1) % 1000 + 10
            spans = diff_spans(ref, rec)
            completion = Completion(
                content=tokenizer.decode(rec),
                reasoning="",
                finish_reason="stop",
                usage=Usage(prompt_tokens=10, completion_tokens=len(rec)),
                total_s=1.0,
                ttft_s=0.1,
            )
            await store.record_result(
                ResultRecord(
                    run_id,
                    sample.pk,
                    1,
                    "sim-a",
                    completion,
                    0.001,
                    Reconstruction(tuple(rec), "canonical"),
                    Verdict("text_mismatch", spans[0].ref_start, len(ref), len(rec), spans, "corrupt: added live"),
                    tuple(ref),
                    keep_raw=False,
                )
            )
    finally:
        await store.close()


async def set_state(db: Path, state: str) -> None:
    store = await RunStore.open(db)
    try:
        await store.set_run_state(await store.ensure_run("demo", {}), state)
    finally:
        await store.close()


async def open_list(pilot) -> MismatchesScreen:
    await settle(pilot)
    await pilot.press("m")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, MismatchesScreen) and screen.page is not None
    return screen


def caption(screen: MismatchesScreen) -> str:
    return str(screen.query_one("#mismatch-caption").render())


async def wait_for(pilot, condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.1)
        await pilot.pause()
    return condition()


async def test_new_mismatches_appear_live_and_the_cursor_stays_on_its_sample(run_db: Path, tokenizer) -> None:
    app = EaglewatchApp(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_list(pilot)
        screen.live_refresh_s = 0.2
        await pilot.press("o")  # most recent first: new results come in above the cursor
        await settle(pilot)
        assert screen.order == "recent"
        table = screen.query_one("#mismatch-table", PageTable)
        for _ in range(30):
            await pilot.press("down")  # far enough down that the table has scrolled
        await pilot.pause()
        before_total, before_id = screen.page.total, screen.selected_sample()
        before_cursor, before_scroll = table.cursor_row, int(table.scroll_offset.y)
        assert before_scroll > 0
        await add_mismatches(run_db, tokenizer, ["live-1", "live-2", "live-3"])
        assert await wait_for(pilot, lambda: screen.page.total == before_total + 3)
        await pilot.pause()
        assert [row.sample_id for row in screen.page.rows[:3]] == ["live-3", "live-2", "live-1"]
        assert screen.selected_sample() == before_id  # the cursor follows its sample
        assert table.cursor_row == before_cursor + 3
        assert int(table.scroll_offset.y) == before_scroll + 3  # the selected row stays where it was on screen
        text = caption(screen)
        assert f"of {before_total + 3}" in text and "ago · r refresh" in text and cell_len(text) <= 78


async def test_rows_added_past_the_page_change_only_the_total(run_db: Path, tokenizer) -> None:
    app = EaglewatchApp(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_list(pilot)  # sample order: new samples sort last
        screen.live_refresh_s = 0.2
        table = screen.query_one("#mismatch-table", PageTable)
        for _ in range(25):
            await pilot.press("down")
        await pilot.pause()
        before_rows, before_cursor, before_scroll = screen.page.rows, table.cursor_row, int(table.scroll_offset.y)
        before_total = screen.page.total
        await add_mismatches(run_db, tokenizer, ["live-1"])
        assert await wait_for(pilot, lambda: screen.page.total == before_total + 1)
        assert screen.page.rows == before_rows
        assert (table.cursor_row, int(table.scroll_offset.y)) == (before_cursor, before_scroll)
        assert f"rows 1–50 of {before_total + 1}" in caption(screen)


async def test_a_finished_run_is_not_re_read_but_says_how_stale_and_r_refreshes(run_db: Path, tokenizer) -> None:
    await set_state(run_db, "done")
    app = EaglewatchApp(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_list(pilot)
        assert app.last_record is not None and app.last_record.state == "done"
        assert not screen.run_goes_on()
        screen.live_refresh_s = 0.2
        for _ in range(4):
            await pilot.press("down")
        before_total, before_id = screen.page.total, screen.selected_sample()
        await add_mismatches(run_db, tokenizer, ["live-1"])
        ok = await wait_for(pilot, lambda: " 2 s ago · r refresh" in caption(screen), 6.0)
        assert ok, caption(screen)
        assert screen.page.total == before_total  # no live re-read for a finished run
        await pilot.press("r")
        assert await wait_for(pilot, lambda: screen.page.total == before_total + 1)
        assert screen.selected_sample() == before_id
        assert " 0 s ago · r refresh" in caption(screen)


async def test_a_page_turn_meanwhile_drops_the_older_re_read(run_db: Path, tokenizer) -> None:
    app = EaglewatchApp(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_list(pilot)
        screen.refresh_page()  # a re-read of page 1 in flight ...
        await pilot.press("right_square_bracket")  # ... while the operator turns to page 2
        await settle(pilot)
        assert screen.page.offset == 50 and screen.row_offset == 50
        assert "rows 51–100" in caption(screen)


async def test_in_process_the_list_follows_a_running_engine(tmp_path: Path, sample_data_dir: Path) -> None:
    """A real engine on this loop (the demo's simulators, the quirky one corrupting a few) adds mismatches
    while the list is open; the list grows without the cursor leaving its sample."""
    from app.config import apply_overrides, load_config
    from app.engine.fidelity.pool import build_reconstructor
    from app.engine.run import Run
    from app.tui.db_source import InProcessSource
    from tests.engine.conftest import sample_inputs

    config = apply_overrides(
        load_config(sample_data_dir / "demo.toml"),
        {"run.database": str(tmp_path / "demo.db"), "limits.concurrency_initial": 4, "limits.concurrency_max": 4},
    )
    store = await RunStore.open(config.run.database)
    engine = None
    try:
        run_id = await store.ensure_run(config.run.name, config.redacted())
        await store.ingest(run_id, sample_inputs(sample_data_dir))
        engine = Run(config, store, reconstructor=build_reconstructor(config), db_path=config.run.database)
        await engine.start()
        app = EaglewatchApp(InProcessSource(run=engine, config=config))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_list(pilot)
            screen.live_refresh_s = 0.2
            assert screen.run_goes_on()
            assert await wait_for(pilot, lambda: screen.page.total >= 2, 60)
            await pilot.press("down")
            first_total, selected = screen.page.total, screen.selected_sample()
            assert await wait_for(pilot, lambda: screen.page.total > first_total, 60)
            assert screen.selected_sample() == selected
            assert "ago · r refresh" in caption(screen)
    finally:
        if engine is not None:
            await engine.close(cancel_in_flight=True)
        await store.close()
