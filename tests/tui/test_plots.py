"""The plots: a real time axis, one meaning per number (the plots end at what the tiles say), the same curves
in both faces, frozen at DONE."""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path

import pytest
from rich.cells import cell_len

from app.engine.record.snapshot import FinishedFigures, LiveFigures, RunRecord
from app.store import queries
from app.tui.app import EaglewatchApp, make_app
from app.tui.db_source import AttachedSource, InProcessSource
from app.tui.series import RunSeries, read_chunk
from tests.tui.test_fit import settle, start_engine, with_probes
from widgets.time_plot import PlotSeries, TimePlot, columns_of, fmt_value, time_axis

T0 = 1_700_000_000.0  # 22:13:20 UTC


def test_rate_columns_divide_amounts_by_the_seconds_they_cover() -> None:
    # 100, 200 and 300 tokens over 10, 10 and a partial 5 s: one column is 600 tokens / 25 s
    series = PlotSeries("tok/s", T0, 10, (100.0, 200.0, 300.0), (10.0, 10.0, 5.0))
    assert columns_of(series, 1) == ([24.0], 3)
    assert columns_of(series, 3) == ([10.0, 20.0, 60.0], 1)
    level = PlotSeries("spent", T0, 10, (0.1, 0.3, None, 0.6), mode="level", unit="money")
    assert columns_of(level, 2) == ([0.3, 0.6], 2)  # a level column shows its last known value


@pytest.mark.parametrize("width", [20, 38, 78, 120])
def test_a_plot_fits_its_width_and_labels_both_axes(width: int) -> None:
    values = tuple(float(v) for v in range(60))
    series = PlotSeries("tok/s", T0, 10, values, (10.0,) * 60, now_label="10 s: 59")
    lines = TimePlot(series).lines(width, 6)
    assert len(lines) == 6 and all(cell_len(line.plain) <= width for line in lines)
    assert lines[0].plain.startswith("tok/s")
    per = -(-60 // (width - 7))  # buckets per column at this width
    if width >= 38:
        assert f"({per * 10}s avg)" in lines[0].plain or f"({per * 10 // 60}m avg)" in lines[0].plain
    assert lines[1].plain.strip().startswith(fmt_value(max(columns_of(series, width - 7)[0]), "count") + "│")
    assert lines[-1].plain.strip().startswith("└22:13")  # wall-clock start


def test_the_time_axis_names_both_ends_and_the_span() -> None:
    axis = time_axis(T0, T0 + 17 * 60, 60, 80)
    assert "22:13" in axis and "22:30 UTC" in axis and "17m" in axis
    assert cell_len(time_axis(T0, T0 + 17 * 60, 5, 14)) <= 14  # parts are left out, never cut


def read_all(source) -> RunSeries:
    series = RunSeries()
    while True:
        series.add(read_chunk(source, series.cursor))
        if series.caught_up:
            return series


async def test_the_plots_end_at_what_the_tiles_show(run_db: Path) -> None:
    app = EaglewatchApp(AttachedSource(with_probes(run_db)))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        screen = app.screen
        rec = screen._last
        cost = screen.query_one("#plot-cost", TimePlot).series
        match = screen.query_one("#plot-match", TimePlot).series
        rate = screen.query_one("#plot-throughput", TimePlot).series
        assert cost.values[-1] == pytest.approx(rec.cost_usd)  # the plot's end is the tile's spent
        tile = screen.query_one("#tile-reconstruction")._shown[-1]
        measured, matched = screen.series.measured()
        conn = sqlite3.connect(run_db)
        truth = conn.execute(
            "SELECT COUNT(*), SUM(flags NOT LIKE '%text_mismatch%') FROM reconstructions "
            "WHERE flags LIKE '%text_path:%'"
        ).fetchone()
        conn.close()
        assert (measured, matched) == truth == (rec.counts.answers.measured, rec.counts.answers.measured_matched)
        assert measured > 0
        assert tile == f"match {100 * matched / measured:.1f}% n={measured:,}"
        assert match.now_label == f"{100 * matched / measured:.1f}% n={measured:,}"
        assert match.values[-1] == pytest.approx(matched / measured)
        # no engine beats for the fixture run: the tile and the plot show its average over the run, named so
        assert rate.now_label == f"avg {rec.finished.tok_s:,.0f}"
        assert f"avg tok/s {rec.finished.tok_s:,.0f}" in screen.query_one("#tile-throughput")._shown
        total_tokens = sum(v for v in rate.values if v)
        assert total_tokens == sum(
            b.tokens for b in queries.series_since(sqlite3.connect(f"file:{run_db}?mode=ro", uri=True), 1).buckets
        )


def test_the_series_freeze_at_done_and_grow_while_running(run_db: Path) -> None:
    source = AttachedSource(run_db)
    try:
        series = read_all(source)
        # as if its engine beat: live figures, nothing finished
        running = dataclasses.replace(source.record(None), engine="running", live=LiveFigures("running"), finished=None)
        assert running.state == "running"
        now = time.time()
        assert len(series.plots(running, now + 600)["throughput"].values) > len(
            series.plots(running, now)["throughput"].values
        )
        done = dataclasses.replace(running, state="done", finished=FinishedFigures())
        assert series.plots(done, now) == series.plots(done, now + 3600)  # nothing moves after DONE
        gone = dataclasses.replace(running, engine="gone", live=None, finished=FinishedFigures())
        assert series.plots(gone, now) == series.plots(gone, now + 3600)  # nor when its engine is gone
        end = series.plots(done)["throughput"]
        assert end.start + sum(end.spans) == pytest.approx(series.last_at)  # frozen at the last stored attempt
    finally:
        source.close()


async def test_both_faces_draw_the_same_plots(tmp_path: Path, sample_data_dir: Path) -> None:
    config, store, engine = await start_engine(tmp_path, sample_data_dir, samples=8)
    try:
        in_process = InProcessSource(run=engine, config=config)
        app = make_app(in_process)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(300):  # 8 samples on the simulator: a few seconds (its slow tail up to ~20 s)
                if engine.state == "done":
                    break
                await pilot.pause(0.1)
            assert engine.state == "done"
            for _ in range(2):  # two polls after DONE (a poll right after a slow one waits: let it start now)
                app.screen._not_before = 0.0
                app.screen.poll()
                await settle(pilot)
            assert app.screen._last.state == "done" and not app.screen.series.empty
            shown = {
                name: app.screen.query_one(f"#plot-{name}", TimePlot).series for name in ("throughput", "match", "cost")
            }
            attached = AttachedSource(Path(config.run.database))
            try:
                theirs = read_all(attached).plots(attached.record(None))
            finally:
                attached.close()
            for name in shown:
                mine, other = shown[name], theirs[name]
                # the same buckets; a value summed over chunks read as they came (in-process) or in one read
                # (attached) may differ in the last bit of its float, never in what is drawn
                assert (mine.start, len(mine.values), mine.spans) == (other.start, len(other.values), other.spans), name
                assert mine.values == pytest.approx(other.values, rel=1e-9, abs=1e-12), name
            app.exit()
    finally:
        await engine.close()
        await store.close()


def test_kept_buckets_give_the_same_plots_as_a_fresh_read(run_db: Path) -> None:
    """The series keeps every bucket but the newest between polls: rows arriving later (also into an older
    bucket, as a catch-up does) must give exactly what reading everything at once gives."""
    snap = RunRecord("demo", "running", engine="running", live=LiveFigures("running"))
    b0 = int(T0 // 10)

    def chunk(*buckets: queries.SeriesBucket) -> queries.SeriesChunk:
        return queries.SeriesChunk(tuple(buckets), 0, 0, True)

    rows = [
        queries.SeriesBucket(b0 + k, 10 * k, k, 0.5 * k, k % 3, k % 2, T0 + 10 * k, T0 + 10 * k + 5)
        for k in range(0, 40, 3)
    ]
    late = [
        queries.SeriesBucket(b0 + 4, 7, 1, 0.25, 2, 1, T0 + 41, T0 + 42),
        queries.SeriesBucket(b0 + 60, 9, 1, 0.1, 1, 1, T0 + 601, T0 + 602),
    ]
    kept = RunSeries()
    kept.add(chunk(*rows[:7]))
    kept.plots(snap, T0 + 300)
    kept.add(chunk(*rows[7:]))
    kept.plots(snap, T0 + 450)
    kept.add(chunk(*late))
    fresh = RunSeries()
    merged = sorted(rows + late, key=lambda b: b.bucket)
    fresh.add(chunk(*merged))
    assert kept.plots(snap, T0 + 700) == fresh.plots(snap, T0 + 700)
    assert kept.plots(snap, T0 + 700)["match"].now_label == fresh.plots(snap, T0 + 700)["match"].now_label
