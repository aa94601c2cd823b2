"""The monitor hosting a real engine Run (built-in simulator on loopback) on the same event loop."""

from __future__ import annotations

import json
from pathlib import Path

from app.config import apply_overrides, load_config
from app.engine.run import Run
from app.store.run_store import RunStore
from app.store.store_records import SampleInput
from app.tui.app import make_app
from app.tui.db_source import InProcessSource
from app.tui.screens.confirm import ConfirmScreen
from app.tui.screens.dashboard import DashboardScreen


async def settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def test_pause_and_resume_keys_reach_the_engine(tmp_path: Path, sample_data_dir: Path) -> None:
    config = apply_overrides(load_config(sample_data_dir / "demo.toml"), {"run.database": str(tmp_path / "demo.db")})
    references = {}
    for line in (sample_data_dir / "reference.jsonl").read_text().splitlines()[:40]:
        record = json.loads(line)
        references[record["id"]] = tuple(record["output_ids"])
    prompts = [json.loads(line) for line in (sample_data_dir / "prompts.openai.jsonl").read_text().splitlines()]
    store = await RunStore.open(config.run.database)
    engine = None
    try:
        run_id = await store.ensure_run(config.run.name, config.redacted())
        await store.ingest(
            run_id,
            [
                SampleInput(p["id"], "prompts", p["messages"], p.get("tools"), references[p["id"]])
                for p in prompts
                if p["id"] in references
            ],
        )
        engine = Run(config, store, db_path=config.run.database)
        await engine.start()
        app = make_app(InProcessSource(run=engine, config=config))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert isinstance(app.screen, DashboardScreen)
            assert app.source.live
            await pilot.press("p")
            await settle(pilot)
            assert engine.state == "paused" and engine.state_reason == "operator"
            app.screen.poll()
            await settle(pilot)
            assert "PAUSED" in str(app.screen.query_one("#run-status").render())
            await pilot.press("p")
            await settle(pilot)
            assert engine.state == "running"
            await pilot.press("q")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)  # the run is live: ask first
            await pilot.press("y")
            await pilot.pause()
    finally:
        if engine is not None:
            await engine.close(cancel_in_flight=True)
        await store.close()


async def test_set_concurrency_key_changes_the_engines_limit(tmp_path: Path, sample_data_dir: Path) -> None:
    from app.tui.screens.confirm import NumberScreen

    config = apply_overrides(load_config(sample_data_dir / "demo.toml"), {"run.database": str(tmp_path / "demo.db")})
    prompts = [json.loads(line) for line in (sample_data_dir / "prompts.openai.jsonl").read_text().splitlines()]
    store = await RunStore.open(config.run.database)
    engine = None
    try:
        run_id = await store.ensure_run(config.run.name, config.redacted())
        await store.ingest(
            run_id, [SampleInput(p["id"], "prompts", p["messages"], p.get("tools"), None) for p in prompts]
        )
        engine = Run(config, store, db_path=config.run.database)
        await engine.start()
        await engine.pause()  # nothing finishes meanwhile: the key stays available (running or paused)
        before = engine.snapshot().live.concurrency_limit
        assert before != 12
        app = make_app(InProcessSource(run=engine, config=config))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert app.check_action("set_concurrency", ()) is True
            await pilot.press("c")
            await settle(pilot)
            assert isinstance(app.screen, NumberScreen)
            assert str(before) in str(app.screen.query_one("#number-question").render())
            await pilot.press(*["backspace"] * 4, "0", "enter")  # 0 is refused: the prompt stays and says why
            await settle(pilot)
            assert isinstance(app.screen, NumberScreen)
            assert "not a whole number >= 1" in str(app.screen.query_one("#number-hint").render())
            await pilot.press("backspace", "1", "2", "enter")
            await settle(pilot)
            assert isinstance(app.screen, DashboardScreen)
            assert engine.snapshot().live.concurrency_limit == 12
    finally:
        if engine is not None:
            await engine.close(cancel_in_flight=True)
        await store.close()
