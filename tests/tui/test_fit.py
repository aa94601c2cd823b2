"""80x24 first, and 120x40 used: every screen fits with nothing cut (tests/tui/fit.py says what cut means).

Real screens (`App.run_test` at both sizes) over a real run database (attached) and over a real engine on the
built-in simulator (in-process). The checker is itself checked: a layout shrunk on purpose must fail it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from rich.cells import cell_len

from app.config import apply_overrides, load_config
from app.engine.run import Run
from app.store.run_store import RunStore
from app.store.store_records import SampleInput
from app.tui.app import EaglewatchApp, make_app
from app.tui.db_source import AttachedSource, InProcessSource
from app.tui.screens.confirm import ConfirmScreen, NumberScreen
from app.tui.screens.dashboard import COMPACT_LINES, FULL_LINES, DashboardScreen
from app.tui.screens.diff import DiffScreen
from app.tui.screens.help import HelpScreen
from app.tui.screens.jobs import JobsScreen
from app.tui.screens.mismatches import MismatchesScreen
from app.tui.screens.sample import SampleScreen
from app.tui.series import PLOTS
from tests.tui.fit import blank_rows, cuts, screen_text
from widgets.event_tail import EventTail
from widgets.time_plot import TimePlot

SIZES = [(80, 24), (120, 40)]
IDS = ["80x24", "120x40"]


async def settle(pilot) -> None:
    for _ in range(4):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def with_probes(run_db: Path) -> Path:
    """The fixture run with measured samples (the text_path flag the engine's probes store): every third
    reconstruction measured, one in four of those corrupt."""
    conn = sqlite3.connect(run_db)
    with conn:
        conn.execute(
            "UPDATE reconstructions SET flags = CASE WHEN (id / 3) % 4 = 0 "
            "THEN '[\"text_path:text_mismatch\"]' ELSE '[\"text_path:exact\"]' END WHERE id % 3 = 0"
        )
    conn.close()
    return run_db


def assert_tiles_fit(screen: DashboardScreen) -> None:
    """Every tile shows its designed number of lines, each within the tile's width, all of them visible."""
    designed = COMPACT_LINES if screen.size.width < 120 or screen.size.height < 32 else FULL_LINES
    for tile in screen.query("#tiles MetricTile"):  # the four tiles (a conversations tile has its own test)
        lines = tile._shown
        assert lines is not None and len(lines) == designed, (tile.id, lines)
        width, height = tile.content_size
        assert height == designed, (tile.id, tile.content_size)
        for line in lines:
            assert cell_len(line) <= width, (tile.id, line, width)


def assert_plots_fit(screen: DashboardScreen) -> None:
    shown = [p for p in screen.query(TimePlot) if p.display]
    assert len(shown) == (1 if screen.one_plot else len(PLOTS))
    assert screen.one_plot == (
        screen.size.width < 120 or (screen.size.width < 160 and screen.has_class("-conversations"))
    )
    for plot in shown:
        width, height = plot.content_size
        lines = plot.lines(width, height)
        assert len(lines) == height >= 4
        assert all(cell_len(line.plain) <= width for line in lines)
        assert lines[0].plain.startswith(plot.series.title)
        if plot.series.values:
            assert "UTC" in lines[-1].plain  # the time axis, with its wall-clock ends


def assert_dashboard_fits(screen: DashboardScreen) -> None:
    assert cuts(screen) == []
    assert_tiles_fit(screen)
    assert_plots_fit(screen)
    endpoints, jobs, events = (screen.query_one(s) for s in ("#endpoints", "#dashboard-jobs", "#events"))
    for table in (endpoints, jobs):
        # its title edge, the header and a row when it has one, on screen
        assert table.region.height >= 2 + min(table.row_count, 1), table.id
        assert screen.region.contains_region(table.region), table.id
    assert isinstance(events, EventTail) and events.lines_shown >= 2 and screen.region.contains_region(events.region)
    if screen.size.height >= 32:  # the space is used (the plots grow): no blank rows
        assert blank_rows(screen) <= 1, "\n".join(screen_text(screen))


@pytest.mark.parametrize(
    "size", SIZES + [(100, 30), (80, 40), (120, 24), (160, 50)], ids=IDS + ["100x30", "80x40", "120x24", "160x50"]
)
async def test_attached_dashboard_fits(run_db: Path, size) -> None:
    app = EaglewatchApp(AttachedSource(with_probes(run_db)))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, DashboardScreen)
        assert_dashboard_fits(screen)
        if size[0] < 120:  # one plot at a time: `t` shows each in turn, each fits
            for name in PLOTS[1:] + PLOTS[:1]:
                await pilot.press("t")
                await pilot.pause()
                assert screen.shown_plot == name and screen.query_one(f"#plot-{name}").display
                assert cuts(screen) == []
                assert_plots_fit(screen)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_every_other_screen_fits(run_db: Path, size) -> None:
    app = EaglewatchApp(AttachedSource(run_db))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        for key, kind in (("P", ConfirmScreen), ("c", NumberScreen)):  # pause-now's billing warning, the limit
            await pilot.press(key)
            await settle(pilot)
            assert isinstance(app.screen, kind)
            assert cuts(app.screen) == [], kind.__name__
            await pilot.press("escape")
            await settle(pilot)
        for key, kind in (("m", MismatchesScreen), ("enter", DiffScreen), ("s", SampleScreen)):
            await pilot.press(key)
            await settle(pilot)
            assert isinstance(app.screen, kind)
            assert cuts(app.screen) == [], kind.__name__
        await pilot.press("escape", "escape", "escape")
        await settle(pilot)
        await pilot.press("j")
        await settle(pilot)
        assert isinstance(app.screen, JobsScreen)
        assert cuts(app.screen) == []
        await pilot.press("question_mark")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert cuts(app.screen) == []
        await pilot.press("escape", "escape")
        await settle(pilot)
        await pilot.press("ctrl+p")
        await settle(pilot)
        assert type(app.screen).__name__ == "CommandPalette"
        assert cuts(app.screen) == []


async def start_engine(tmp_path: Path, sample_data_dir: Path, samples: int = 40):
    """A real engine Run over the demo config and the built-in simulator (as tests/tui/test_in_process does),
    over the first `samples` prompts that have references."""
    overrides = {"run.database": str(tmp_path / "demo.db")}
    for n in (0, 1):  # no hangs (a hang waits out its 20 s timeout), a short latency tail, unpaced streams: quick
        overrides |= {
            f"endpoints[{n}].simulator.faults.hang": 0.0,
            f"endpoints[{n}].simulator.latency_p95_ms": 600.0,
            f"endpoints[{n}].simulator.tokens_per_s": 0.0,
        }
    config = apply_overrides(load_config(sample_data_dir / "demo.toml"), overrides)
    references = {}
    for line in (sample_data_dir / "reference.jsonl").read_text().splitlines()[:samples]:
        record = json.loads(line)
        references[record["id"]] = tuple(record["output_ids"])
    prompts = [json.loads(line) for line in (sample_data_dir / "prompts.openai.jsonl").read_text().splitlines()]
    store = await RunStore.open(config.run.database)
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
    return config, store, engine


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_in_process_dashboard_fits(tmp_path: Path, sample_data_dir: Path, size) -> None:
    config, store, engine = await start_engine(tmp_path, sample_data_dir)
    try:
        app = make_app(InProcessSource(run=engine, config=config))
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            for _ in range(20):  # until some responses are stored, so the plots have rows to draw
                if not app.screen.series.empty:
                    break
                await pilot.pause(0.2)
                app.screen.poll()
                await settle(pilot)
            assert not app.screen.series.empty
            assert_dashboard_fits(app.screen)
            app.exit()
    finally:
        await engine.close()
        await store.close()


class Shrunk(EaglewatchApp):
    """The monitor with its compact tiles one row too short: what the fit check must catch."""

    CSS_PATH = str(Path(__file__).resolve().parents[2] / "app" / "tui" / "app.tcss")
    CSS = "DashboardScreen.-short.-narrow #tiles MetricTile { height: 5; }"


async def test_the_fit_check_fails_on_a_layout_that_cuts(run_db: Path) -> None:
    app = Shrunk(AttachedSource(run_db))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        found = cuts(app.screen)
        assert any("MetricTile#tile-" in problem and "needs 5 rows and has 4" in problem for problem in found), found
        with pytest.raises(AssertionError):
            assert_tiles_fit(app.screen)
