"""Every tile's every label and number whole, at 80x24 and 120x40, read off a real dashboard (Pilot): a label is
a whole word or an abbreviation the help screen (`?`) explains; every class a tile counts is shown. The record
carries the numbers that were cut before: 10/10 in flight with 191 waiting, a mixed limit with no capacity yet,
a `timeout 1` among the errors, 16 truncated answers, and long endpoint names."""

from __future__ import annotations

import io
import re
from dataclasses import replace

import pytest

from app.engine.record.snapshot import EndpointLive, FinishedFigures, RunRecord
from app.store.count_records import AnswerCounts, EndpointCounts, Percentiles
from app.tui.app import EaglewatchApp
from app.tui.screens.dashboard import GLOSSARY, DashboardScreen
from app.tui.screens.help import HelpScreen
from tests.tui.fit import cuts
from tests.tui.sources import COUNTS, LIVE, RECORD, MemorySource

SIZES = [(80, 24), (120, 40), (120, 24), (80, 40)]
IDS = ["80x24", "120x40", "120x24", "80x40"]

ANSWERS = AnswerCounts(
    answers=2_030,
    verdicts=(
        ("exact", 1_804),
        ("bpe_equivalent", 75),
        ("text_mismatch", 23),
        ("structure_mismatch", 4),
        ("truncated", 16),
        ("unchecked", 108),
    ),
    verified=312,
    checked=1_610,
    unchecked=108,
    measured=312,
    measured_exact=300,
    measured_benign=8,
    measured_corrupt=(("text_mismatch", 4),),
    suspects=7,
    truncated=16,
)
DEMANDING = replace(
    RECORD,
    counts=replace(
        COUNTS,
        answers=ANSWERS,
        intervened=5,
        interventions=(("context_compression", 2), ("provider_fallback", 1), ("thinking_budget", 2)),
        errors_by_class=(("429", 57), ("5xx", 12), ("stream", 3), ("timeout", 1)),
        retried=70,
        endpoints=(
            EndpointCounts("simulator", completed=1_900, failed=3, cost_usd=1.1),
            EndpointCounts("quirky-upstream", completed=130, failed=2, cost_usd=0.1),
        ),
    ),
    live=replace(
        LIVE,
        in_flight=10,
        waiting=191,
        concurrency_limit=10,
        endpoints=(
            EndpointLive("simulator", in_flight=8, waiting=150, concurrency_limit=8, limit_reason="growing"),
            EndpointLive(
                "quirky-upstream",
                in_flight=2,
                waiting=41,
                concurrency_limit=2,
                limit_reason="cooling down after 429",
                capacity=2,
            ),
        ),
    ),
)
FINISHED = replace(
    DEMANDING,
    state="done",
    live=None,
    engine="stopped",
    engine_text="engine exited 3 min ago",
    finished=FinishedFigures(
        elapsed_s=754.0,
        req_s=2.69,
        tok_s=546.4,
        cost_per_hour=6.13,
        percentiles=Percentiles(2150.0, 6400.0, 310.0, 900.0),
    ),
)

# what each tile must show whole: one of the alternatives (a full word, or its glossary abbreviation) per item
LIVE_ITEMS = {
    "throughput": [
        ("tok/s 1,530",),
        ("p95 6.4s", "p95 6.4 s"),
        ("in flight 10/10", "flight 10/10"),
        ("waiting 191",),
        ("limit mixed",),
    ],
    "cost": [("spent $1.28",), ("$6.13/h",), ("proj. $2.79",), ("budget $5.00 26%",)],
    "reconstruction": [
        ("exact 1,804",),
        ("benign 75",),
        ("corrupt 27",),
        ("trunc 16", "truncated 16"),
        ("no ref 108", "no reference 108"),
        ("suspect 7",),
        ("verified 312",),
        ("match 98.7% n=312",),
    ],
    "errors": [
        ("429 57",),
        ("5xx 12",),
        ("stream 3",),
        ("timeout 1",),
        ("interv 5",),  # samples a server intervened on (by kind where the tile is wide enough)
        ("failed 12",),
        ("retried 70",),
    ],
}
FINISHED_ITEMS = {
    "throughput": [("avg tok/s 546",), ("avg req/s 2.7",), ("p95 6.4s", "p95 6.4 s"), ("leased 8",)],
    "cost": [("spent $1.28",), ("avg $6.13/h",), ("budget $5.00 26%",)],
    "reconstruction": LIVE_ITEMS["reconstruction"],
    "errors": LIVE_ITEMS["errors"],
}
# words a tile may use without explanation; anything else must be in the help's glossary
PLAIN = {
    "spent",
    "budget",
    "none",
    "exact",
    "benign",
    "corrupt",
    "truncated",
    "reference",
    "suspect",
    "verified",
    "unchecked",
    "measured",
    "match",
    "failed",
    "retried",
    "leased",
    "waiting",
    "in",
    "flight",
    "limit",
    "capacity",
    "growing",
    "at",
    "ceiling",
    "mixed",
    "pinned",
    "n",
    "stream",
    "timeout",
    "s",
    "ms",
    "h",
    "of",
}


def _help_text(screen: HelpScreen) -> str:
    """Everything the help screen holds (also what is scrolled out of view), as plain text."""
    from rich.console import Console
    from textual.widgets import Static

    console = Console(width=400, record=True, file=io.StringIO())
    console.print(screen.query_one(Static).content)
    return " ".join(console.export_text().split())


def _tiles(screen: DashboardScreen) -> dict[str, str]:
    return {name: "\n".join(screen.query_one(f"#tile-{name}")._shown) for name in LIVE_ITEMS}


def _words(text: str) -> set[str]:
    return {
        w.rstrip(".,") if w != "proj." else w for w in re.findall(r"(?<![0-9A-Za-z$])[A-Za-z][A-Za-z0-9/.\-]*", text)
    }


async def _dashboard(pilot) -> DashboardScreen:
    for _ in range(4):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    screen = pilot.app.screen
    assert isinstance(screen, DashboardScreen)
    return screen


@pytest.mark.parametrize("size", SIZES, ids=IDS)
@pytest.mark.parametrize(
    ("record", "items"), [(DEMANDING, LIVE_ITEMS), (FINISHED, FINISHED_ITEMS)], ids=["live", "finished"]
)
async def test_every_tile_shows_every_label_and_number_whole(size, record: RunRecord, items) -> None:
    source = MemorySource()
    source._record = record
    app = EaglewatchApp(source)
    async with app.run_test(size=size) as pilot:
        screen = await _dashboard(pilot)
        assert cuts(screen) == []
        tiles = _tiles(screen)
        for name, wanted in items.items():
            for alternatives in wanted:
                assert any(a in tiles[name] for a in alternatives), (name, alternatives, tiles[name])
        if record.finished is not None:  # a finished run shows no live figure
            assert "rate" not in tiles["cost"] and "proj." not in tiles["cost"] and "flight" not in tiles["throughput"]
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        help_text = _help_text(app.screen)
        glossary = _words(" ".join(word for word, _ in GLOSSARY)) | {"1m"}
        explained = _words(help_text)
        for name, text in tiles.items():
            for word in _words(text) - PLAIN:
                assert word in glossary, f"{name}: {word!r} is neither a whole word nor in the glossary"
                assert word in explained, f"{name}: {word!r} is not explained on the help screen"


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
async def test_endpoint_names_are_whole_or_an_alias_the_help_explains(size) -> None:
    long_name = "openrouter-moonshot-kimi-k2.5-floor-us-east"
    record = replace(
        DEMANDING,
        counts=replace(
            DEMANDING.counts, endpoints=(*DEMANDING.counts.endpoints, EndpointCounts(long_name, completed=5))
        ),
    )
    source = MemorySource()
    source._record = record
    app = EaglewatchApp(source)
    async with app.run_test(size=size) as pilot:
        screen = await _dashboard(pilot)
        table = screen.query_one("#endpoints")
        width = table.columns[next(iter(table.columns))].width
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]  # scrolled-out rows too
        assert all(len(name) <= width for name in names), (names, width)
        assert "quirky-upstream" in names and "simulator" in names  # whole, never `quirky-upstr`
        alias = next((a for a, n in screen.endpoint_aliases.items() if n == long_name), None)
        if alias is None:
            assert long_name in names
        else:
            assert alias in names and long_name not in names
            await pilot.press("question_mark")
            await pilot.pause()
            assert f"{alias} endpoint {long_name}" in _help_text(app.screen)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
async def test_each_endpoint_says_how_far_its_text_path_is_proven(size) -> None:
    """A mark after each endpoint's name: verified by probes (✓), a known server's steps only (~), unverified (?),
    the least proven of its upstream providers; the help explains the marks; names stay whole beside them."""
    from app.store.verification import PRIOR_ONLY, UNVERIFIED, VERIFIED, VerificationStatus

    def status(endpoint: str, provider: str | None, state: str) -> VerificationStatus:
        return VerificationStatus(endpoint, provider, state, 5 if state == VERIFIED else 0, 5, 0, 0, 9, 9, 0, None)

    record = replace(
        DEMANDING,
        trust=(
            status("simulator", None, VERIFIED),
            status("quirky-upstream", "a", VERIFIED),
            status("quirky-upstream", "b", PRIOR_ONLY),
        ),
    )
    source = MemorySource()
    source._record = record
    app = EaglewatchApp(source)
    async with app.run_test(size=size) as pilot:
        screen = await _dashboard(pilot)
        assert cuts(screen) == []
        table = screen.query_one("#endpoints")
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert names == ["simulator✓", "quirky-upstream~"]
        width = table.columns[next(iter(table.columns))].width
        assert all(len(name) <= width for name in names), (names, width)
        source._record = replace(record, trust=(*record.trust, status("quirky-upstream", "c", UNVERIFIED)))
        for _ in range(100):  # the next poll
            if str(table.get_row_at(1)[0]) == "quirky-upstream?":
                break
            await pilot.pause(0.05)
        assert str(table.get_row_at(1)[0]) == "quirky-upstream?"
        await pilot.press("question_mark")
        await pilot.pause()
        assert "✓ ~ ? after an endpoint" in _help_text(app.screen)
