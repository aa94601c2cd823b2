"""Pilot tests of the monitor over a real run database (attached face) at 80x24 and 120x40."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from app.tui.app import EaglewatchApp, parse_keymap
from app.tui.db_source import AttachedSource
from app.tui.screens.confirm import ConfirmScreen
from app.tui.screens.dashboard import DashboardScreen
from app.tui.screens.diff import DiffScreen
from app.tui.screens.help import HelpScreen
from app.tui.screens.jobs import JobsScreen
from app.tui.screens.mismatches import PAGE_SIZE, MismatchesScreen
from app.tui.screens.sample import SampleScreen
from widgets.token_diff import TokenDiffView

SIZES = [(80, 24), (120, 40)]


async def settle(pilot) -> None:
    """Let thread workers finish and their results reach the screen."""
    for _ in range(3):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def attached(run_db: Path, **kwargs) -> EaglewatchApp:
    return EaglewatchApp(AttachedSource(run_db, **kwargs))


@pytest.mark.parametrize("size", SIZES)
async def test_every_screen_is_reached_and_left(run_db: Path, size) -> None:
    app = attached(run_db)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, DashboardScreen)
        assert "demo" in str(app.screen.query_one("#run-status").render())
        await pilot.press("m")
        await settle(pilot)
        assert isinstance(app.screen, MismatchesScreen)
        assert app.screen.page is not None and app.screen.page.total == 160
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, DiffScreen)
        assert app.screen.diff is not None and app.screen.diff.sample_id == app.screen.sample_id
        await pilot.press("s")
        await settle(pilot)
        assert isinstance(app.screen, SampleScreen)
        assert app.screen.detail is not None and app.screen.detail.content
        await pilot.press("escape", "escape", "escape")
        await settle(pilot)
        assert isinstance(app.screen, DashboardScreen)
        await pilot.press("j")
        await settle(pilot)
        assert isinstance(app.screen, JobsScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape", "escape")
        await pilot.pause()
        assert isinstance(app.screen, DashboardScreen)


async def test_dashboard_shows_counts_from_the_database(run_db: Path) -> None:
    app = attached(run_db)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        recon = str(app.screen.query_one("#tile-reconstruction").render())
        assert "exact" in recon and "80" in recon  # 80 exact of 240 in the fixture
        status = str(app.screen.query_one("#run-status").render())
        assert "RUNNING" in status and "240/240" in status
        events = str(app.screen.query_one("#events").render())
        assert "429 rate limited" in events


async def test_pause_from_keyboard_queues_a_command_when_attached(run_db: Path) -> None:
    app = attached(run_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot)
    rows = sqlite3.connect(run_db).execute("SELECT verb, done_at FROM commands").fetchall()
    assert rows == [("pause", None)]


async def test_pause_now_asks_first_then_queues_a_cancelling_pause_when_attached(run_db: Path) -> None:
    app = attached(run_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("P")
        await settle(pilot)
        assert "may still bill" in str(app.screen.query_one("#confirm-question").render())
        await pilot.press("y")
        await settle(pilot)
    rows = sqlite3.connect(run_db).execute("SELECT verb, args FROM commands").fetchall()
    assert [(verb, json.loads(args)) for verb, args in rows] == [("pause", {"now": True})]


async def test_pause_now_declined_sends_nothing_in_process() -> None:
    from tests.tui.sources import MemorySource

    source = MemorySource(live=True)
    app = EaglewatchApp(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("P")
        await settle(pilot)
        await pilot.press("n")
        await settle(pilot)
        assert source.commands == []
        await pilot.press("P")
        await settle(pilot)
        await pilot.press("y")
        await settle(pilot)
    assert source.commands == [("pause_now",)]


async def test_readonly_viewer_hides_pause_and_sends_nothing(run_db: Path) -> None:
    app = attached(run_db, readonly=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.check_action("toggle_pause", ()) is False
        await pilot.press("p")
        await settle(pilot)
    assert sqlite3.connect(run_db).execute("SELECT COUNT(*) FROM commands").fetchone()[0] == 0


async def test_verdict_and_text_filters_narrow_the_mismatch_list(run_db: Path) -> None:
    app = attached(run_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("m")
        await settle(pilot)
        screen = app.screen
        await pilot.press("v")  # first verdict in the cycle: bpe_equivalent
        await settle(pilot)
        assert screen.page.total == 40
        assert {row.category for row in screen.page.rows} == {"bpe_equivalent"}
        await pilot.press("slash")
        await pilot.press(*"s001")
        await pilot.press("enter")
        await settle(pilot)
        assert screen.text_filter == "s001"
        assert screen.page.rows and all(row.sample_id.startswith("s001") for row in screen.page.rows)
        assert all(row.category == "bpe_equivalent" for row in screen.page.rows)
        assert "s001" in str(screen.query_one("#mismatch-caption").render())


async def test_mismatch_pages_turn_with_brackets_and_at_the_edge(run_db: Path) -> None:
    app = attached(run_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("m")
        await settle(pilot)
        screen = app.screen
        assert (screen.page.offset, len(screen.page.rows), screen.page.total) == (0, PAGE_SIZE, 160)
        await pilot.press("right_square_bracket")
        await settle(pilot)
        assert (screen.page.offset, len(screen.page.rows)) == (PAGE_SIZE, PAGE_SIZE)
        assert "rows 51–100 of 160" in str(screen.query_one("#mismatch-caption").render())
        await pilot.press("up")  # at the first row of page 2: back to page 1, cursor on its last row
        await settle(pilot)
        assert screen.page.offset == 0
        assert screen.query_one("#mismatch-table").cursor_row == PAGE_SIZE - 1


async def test_sort_by_tokens_differing_puts_the_largest_first(run_db: Path) -> None:
    app = attached(run_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("m")
        await settle(pilot)
        screen = app.screen
        while screen.order != "n_diff":
            await pilot.press("o")
            await settle(pilot)
        counts = [row.n_diff for row in screen.page.rows]
        assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]


async def test_diff_view_jumps_between_differences(run_db: Path) -> None:
    app = attached(run_db)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("m")
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        view = app.screen.query_one(TokenDiffView)
        assert view.diff_count >= 1
        assert view.current_diff == 0  # opens on the first difference
        assert "difference 1/" in str(app.screen.query_one("#diff-position").render())
        await pilot.press("n")
        await pilot.pause()
        assert view.current_diff == (1 % view.diff_count)
        await pilot.press("N")
        await pilot.pause()
        assert view.current_diff == 0
        header = str(app.screen.query_one("#diff-header").render())
        assert "benign" in header or "corrupt" in header or "truncated" in header


async def test_quit_asks_first_while_an_in_process_run_is_live() -> None:
    from tests.tui.sources import MemorySource

    app = EaglewatchApp(MemorySource(live=True))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(app.screen, DashboardScreen)
        await pilot.press("q", "y")
        await pilot.pause()
    assert app.return_code == 0


async def test_pause_and_resume_from_keyboard_reach_the_in_process_control() -> None:
    from tests.tui.sources import MemorySource

    source = MemorySource(live=True)
    app = EaglewatchApp(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot)
        # the dashboard backs off after a slow fetch (a loaded machine), so poll until the status catches up
        for _ in range(100):
            app.screen.poll()
            await settle(pilot)
            if "PAUSED" in str(app.screen.query_one("#run-status").render()):
                break
            await asyncio.sleep(0.05)
        assert "PAUSED" in str(app.screen.query_one("#run-status").render())
        await pilot.press("p")
        await settle(pilot)
    assert source.commands == [("pause",), ("resume",)]


async def test_cancelling_a_job_asks_then_records_it(run_db: Path) -> None:
    app = attached(run_db)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("j")
        await settle(pilot)
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await settle(pilot)
    states = sqlite3.connect(run_db).execute("SELECT state FROM job_shards WHERE job_id = 1 ORDER BY shard").fetchall()
    assert [s for (s,) in states] == ["done", "done", "cancelled", "cancelled"]


async def test_keys_can_be_remapped_by_binding_id(run_db: Path) -> None:
    app = EaglewatchApp(AttachedSource(run_db), keymap=parse_keymap("nav.mismatches=x"))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("x")
        await settle(pilot)
        assert isinstance(app.screen, MismatchesScreen)


def test_keymap_errors_name_the_bad_entry() -> None:
    with pytest.raises(ValueError, match="'nav.jobs'"):
        parse_keymap("nav.jobs")


def test_attached_source_refuses_an_unknown_run(run_db: Path) -> None:
    from app.errors import InputError

    with pytest.raises(InputError, match="no run named 'nope'"):
        AttachedSource(run_db, "nope")


async def test_set_concurrency_from_an_attached_viewer_queues_the_command(run_db: Path) -> None:
    from app.tui.screens.confirm import NumberScreen

    app = attached(run_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert any("(run.concurrency)" in text for _, text in app.screen.bindings_shown)  # in help, with its id
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("c")
        await settle(pilot)
        assert isinstance(app.screen, NumberScreen)
        await pilot.press("7", "enter")
        await settle(pilot)
        assert isinstance(app.screen, DashboardScreen)
        await pilot.press("c")
        await settle(pilot)
        await pilot.press("escape")  # cancelled: nothing more is sent
        await settle(pilot)
    rows = sqlite3.connect(run_db).execute("SELECT verb, args, done_at FROM commands").fetchall()
    assert [(verb, json.loads(args), done) for verb, args, done in rows] == [("set_concurrency", {"limit": 7}, None)]


async def test_set_concurrency_is_hidden_where_it_does_not_apply(run_db: Path) -> None:
    app = attached(run_db, readonly=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.check_action("set_concurrency", ()) is False
        await pilot.press("c")
        await settle(pilot)
        assert isinstance(app.screen, DashboardScreen)
    done = sqlite3.connect(run_db)
    done.execute("UPDATE runs SET state = 'done'")
    done.commit()
    done.close()
    app = attached(run_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.last_record is not None and app.last_record.state == "done"
        assert app.check_action("set_concurrency", ()) is False  # a finished run has nothing to limit
    app = attached(run_db)
    live = sqlite3.connect(run_db)
    live.execute("UPDATE runs SET state = 'running'")
    live.commit()
    live.close()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.check_action("set_concurrency", ()) is True
        await pilot.press("j")
        await settle(pilot)
        assert app.check_action("set_concurrency", ()) is False  # `c` cancels a job there
    assert sqlite3.connect(run_db).execute("SELECT COUNT(*) FROM commands").fetchone()[0] == 0


def test_the_attached_control_implements_run_control_exactly() -> None:
    import inspect

    from app.engine.control import RunControl
    from app.tui.db_source import AttachedControl

    # job control is not the run's: the TUI sends it to app.jobs.job_control (RunControl.job_command, while the
    # protocol still names it, has no sender)
    wanted = {name for name, _ in inspect.getmembers(RunControl, inspect.iscoroutinefunction)} - {"job_command"}
    assert wanted == {"pause", "resume", "set_concurrency", "retry_failed"}
    for name in wanted:
        mine = getattr(AttachedControl, name)
        assert inspect.iscoroutinefunction(mine), name
        assert inspect.signature(mine) == inspect.signature(getattr(RunControl, name)), name


@pytest.mark.parametrize(
    ("keep_raw", "said"),
    [(False, "raw bodies are not kept: set [run] keep_raw = true"), (True, "no raw body was stored for this attempt")],
)
async def test_sample_screen_says_why_a_raw_body_is_absent(run_db: Path, keep_raw: bool, said: str) -> None:
    conn = sqlite3.connect(run_db)
    conn.execute("UPDATE responses SET raw = NULL WHERE sample_pk = (SELECT pk FROM samples WHERE sample_id = 's0002')")
    config = json.loads(conn.execute("SELECT config FROM runs").fetchone()[0])
    config["run"] = {"keep_raw": keep_raw}
    conn.execute("UPDATE runs SET config = ?", (json.dumps(config),))
    conn.commit()
    conn.close()
    app = attached(run_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.open_sample("s0002")
        await settle(pilot)
        await pilot.press("r")
        await settle(pilot)
        text = str(app.screen.query_one("#sample-text").render())
        assert said in text and "(none)\n\nr shows" not in text
        app.pop_screen()
        await settle(pilot)
        app.open_sample("s0003")  # a sample whose body was kept shows it
        await settle(pilot)
        await pilot.press("r")
        await settle(pilot)
        assert '"gen-3"' in str(app.screen.query_one("#sample-text").render())
