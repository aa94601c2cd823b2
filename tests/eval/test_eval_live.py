"""The eval monitor's read model: running aggregates grown from rows read after a cursor give the report's figures
(the same definitions), a poll reads only what is new, a failed pair later answered stops counting as failed, and
the per-step spans cover the output as the server's steps emitted it. Real SQLite files written through the store's
writer (`RunStore`, `eval_ops.record_eval_request`)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from app.config import EvalSection
from app.eval.figures import eval_report
from app.eval.live import ACCEPTED, BONUS, OWN, REJECTED, EvalTally, step_spans
from app.store import eval_ops, eval_reads, queries
from app.store.rows import EvalRequestRow
from app.store.run_store import RunStore
from app.store.store_records import SampleInput
from app.tui.eval_source import EvalSource
from app.tui.eval_source import is_eval_run as eval_run_check

CONFIG = {
    "model": {"name": "m"},
    "endpoints": [{"name": "spec"}, {"name": "spec2"}, {"name": "base"}],
    "eval": {"drafter": "d", "baseline": "base", "dead_after": 5, "bootstrap": 100},
}


def request(run_id: int, pk: int, endpoint: str, rng: random.Random, *, created: float) -> EvalRequestRow:
    """A stored answer with figures drawn from `rng`: some loops, some without figures, the baseline plain."""
    if endpoint == "base":
        return EvalRequestRow(run_id, pk, endpoint, None, "chat", None, (1, 2, 3), 30, tokens_per_s=50.0,
                              created_at=created)  # fmt: skip
    steps = rng.randint(5, 40)
    per_step = [rng.choice((0, 1, 2, 3)) if endpoint == "spec" else 0 for _ in range(steps)]
    measured = pk % 11 != 0
    return EvalRequestRow(
        run_id, pk, endpoint, "d", ("chat", "code", None)[pk % 3], None, tuple(range(sum(per_step) + steps)),
        sum(per_step) + steps, ttft_ms=20.0, tokens_per_s=80.0 + pk % 7,
        spec_source="vllm" if measured else None,
        spec={"per_step_accepted": per_step} if measured else None,
        accepted=sum(per_step) if measured else None, drafted=3 * steps if measured else None,
        steps=steps if measured else None,
        per_position=tuple(sum(1 for n in per_step if n > k) for k in range(3)) if measured else None,
        loop=pk % 13 == 0, created_at=created,
    )  # fmt: skip


async def seed(path: Path, n: int, *, start: int = 0, failed: tuple[int, ...] = ()) -> int:
    store = await RunStore.open(path)
    try:
        run_id = await store.ensure_run("ev", CONFIG)
        await store.write(lambda conn: eval_ops.mark_eval_run(conn, run_id))
        if start == 0:
            await store.ingest(
                run_id, [SampleInput(f"p{i:03d}", "d", [{"role": "user", "content": "q"}], None) for i in range(n)]
            )
        rng = random.Random(start)
        for pk in range(start + 1, n + 1):
            for ep in ("spec", "spec2", "base"):
                if pk in failed and ep == "spec":
                    row = EvalRequestRow(run_id, pk, ep, "d", "chat", "ServerError: 500", created_at=1000.0 + pk)
                else:
                    row = request(run_id, pk, ep, rng, created=1000.0 + pk)
                await store.write(lambda conn, row=row: eval_ops.record_eval_request(conn, row))
        return run_id
    finally:
        await store.close()


def stored_rows(path: Path, run_id: int) -> list[EvalRequestRow]:
    conn = sqlite3.connect(path)
    try:
        return queries.eval_requests(conn, run_id)
    finally:
        conn.close()


async def test_running_figures_equal_the_reports(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    run_id = await seed(db, 60, failed=(7, 9))
    ev = EvalSection.model_validate(CONFIG["eval"])
    tally = EvalTally(ev, ["spec", "spec2"], "base")
    conn = sqlite3.connect(db)
    try:
        while rows := eval_reads.tally_rows_after(conn, run_id, tally.cursor, limit=17):  # several chunks
            tally.add(rows)
    finally:
        conn.close()
    live = tally.figures()
    report = eval_report(stored_rows(db, run_id), ev, drafter_endpoints=["spec", "spec2"], baseline="base")
    by_name = {e.name: e for e in live.endpoints}
    for name in ("spec", "spec2"):
        want, got = report["endpoints"][name], by_name[name]
        assert got.mean_acceptance_length == want["figures"]["mean_acceptance_length"]
        assert got.token_weighted == want["figures"]["token_weighted_acceptance_length"]
        assert list(got.per_position) == want["figures"]["per_position_acceptance"]
        assert got.mean_with_loops == want["figures_with_loops"]["mean_acceptance_length"]
        assert (got.answered, got.failed, got.loops) == (want["answered"], want["failed"], want["loops"])
        assert got.no_acceptance == want["no_acceptance"]
        assert got.speedup == want["speedup_vs_baseline"]
        assert {c.category: c.mean_acceptance_length for c in got.categories} == {
            c: f["mean_acceptance_length"] for c, f in want["by_category"].items()
        }
    assert by_name["spec"].failed == 2 and by_name["spec2"].speedup is not None
    assert list(live.verdicts) == report["verdicts"]  # spec2 accepts nothing: dead drafter, and the loops
    assert {v["verdict"] for v in live.verdicts} >= {"dead drafter", "repetition loops"}


async def test_a_poll_reads_only_new_rows_and_a_retried_pair_stops_failing(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    run_id = await seed(db, 20, failed=(3,))
    source = EvalSource(queries.RunReader(db, None), control=None)
    try:
        first = source.poll()
        spec = next(e for e in first.figures.endpoints if e.name == "spec")
        assert spec.failed == 1 and first.figures.stored == 60 and first.caught_up
        cursor = source.tally.cursor
        again = source.poll()
        assert source.tally.cursor == cursor and again.figures == first.figures  # nothing new: nothing read
        # the resumed run answers the failed pair (INSERT OR REPLACE: a new id) and one more prompt
        store = await RunStore.open(db)
        try:
            row = request(run_id, 3, "spec", random.Random(1), created=2000.0)
            await store.write(lambda conn: eval_ops.record_eval_request(conn, row))
        finally:
            await store.close()
        after = source.poll()
        spec = next(e for e in after.figures.endpoints if e.name == "spec")
        assert spec.failed == 0 and spec.answered == 20 and after.figures.stored == 60
        assert after.status.total == 60 and after.status.state == "idle"
    finally:
        source.close()
    assert eval_run_check(db, None)


def test_the_tally_query_walks_the_rowid(tmp_path: Path) -> None:
    """The incremental read must not scan the run's rows through the (run_id, endpoint, id) index and sort them."""
    from app.store.db import migrate

    db = tmp_path / "e.db"
    migrate(db)
    conn = sqlite3.connect(db)
    try:
        plan = " ".join(
            str(r[-1])
            for r in conn.execute(
                "EXPLAIN QUERY PLAN SELECT id FROM eval_requests WHERE id > ? AND +run_id = ? ORDER BY id LIMIT ?",
                (0, 1, 10),
            )
        )
    finally:
        conn.close()
    assert "INTEGER PRIMARY KEY" in plan and "TEMP B-TREE" not in plan, plan


@pytest.mark.parametrize(
    ("n", "steps", "drafted", "want"),
    [
        # prefill's token, then 2 accepted + the target's own after a rejection, then 3 of 3 + a bonus
        (8, [2, 3], [3, 3], [(0, 1, OWN), (1, 3, ACCEPTED), (3, 4, REJECTED), (4, 7, ACCEPTED), (7, 8, BONUS)]),
        (2, [0, 0], [3, 3], [(0, 1, REJECTED), (1, 2, REJECTED)]),
        (3, [3], [3], [(0, 3, ACCEPTED)]),  # max_tokens cut the step's own token
    ],
)
def test_step_spans_cover_the_output(n, steps, drafted, want) -> None:
    assert step_spans(n, steps, drafted) == want


def test_step_spans_refuse_what_does_not_fit() -> None:
    assert step_spans(3, [3, 3], [3, 3]) is None
    assert step_spans(3, None, None) is None
    assert step_spans(3, [], []) is None
