"""Read-side queries for the faces: paging through verdicts at 100k rows, filters, events, jobs."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from app.errors import InputError
from app.store import queries
from app.store.db import migrate
from app.store.run_store import RunStore

N = 100_000
CATEGORIES = ["exact"] * 90 + ["bpe_equivalent"] * 6 + ["text_mismatch"] * 2 + ["structure_mismatch", "truncated"]


@pytest.fixture(scope="module")
def big_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with 100k reconstructed samples, a few percent of them mismatches."""
    db = tmp_path_factory.mktemp("q") / "runs.db"
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'big', 0, 0)")
    rng = random.Random(7)
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO samples (pk, run_id, sample_id, dataset, messages, state) VALUES (?, 1, ?, 'd', '[]', 'done')",
        ((i, f"s{i:06d}") for i in range(1, N + 1)),
    )
    conn.executemany(
        "INSERT INTO reconstructions (run_id, sample_pk, strategy, output_ids, category, first_diff, n_tokens, "
        "explanation, created_at) VALUES (1, ?, 'canonical', x'01000000', ?, ?, ?, ?, 0)",
        (
            (i, cat, rng.randint(0, 999), rng.randint(1, 5000), "marker as text" if i % 1000 == 0 else "")
            for i in range(1, N + 1)
            for cat in [rng.choice(CATEGORIES)]
        ),
    )
    conn.execute("COMMIT")
    conn.close()
    return db


@pytest.fixture
def reader(big_db: Path):
    conn = queries.connect_readonly(big_db)
    yield conn
    conn.close()


MISMATCH = ("text_mismatch", "structure_mismatch")


@pytest.mark.parametrize("order", list(queries.MISMATCH_ORDERS))
@pytest.mark.parametrize("verdicts", [MISMATCH, ("exact",), None])
def test_mismatch_page_never_scans_the_whole_table(reader: sqlite3.Connection, order: str, verdicts) -> None:
    statements: list[str] = []
    reader.set_trace_callback(statements.append)  # the SQL mismatch_page really runs, values filled in
    rows = queries.mismatch_page(reader, 1, verdicts, None, order, offset=50, limit=10)
    reader.set_trace_callback(None)
    assert len(rows) == 10
    (sql,) = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    plan = [row[3] for row in reader.execute("EXPLAIN QUERY PLAN " + sql)]
    assert not any(step.startswith("SCAN r") for step in plan), plan


def test_pages_cover_every_mismatch_once_in_order(reader: sqlite3.Connection) -> None:
    total = queries.mismatch_count(reader, 1, MISMATCH)
    assert 0.02 * N < total < 0.05 * N
    seen: list[int] = []
    offset = 0
    while page := queries.mismatch_page(reader, 1, MISMATCH, None, "sample", offset, 500):
        seen += [r.sample_pk for r in page]
        offset += len(page)
    assert len(seen) == total == len(set(seen))
    assert seen == sorted(seen)
    assert {r.category for r in queries.mismatch_page(reader, 1, MISMATCH, limit=1000)} <= set(MISMATCH)


def test_first_diff_order_and_text_filter(reader: sqlite3.Connection) -> None:
    page = queries.mismatch_page(reader, 1, MISMATCH, None, "first_diff", 0, 200)
    diffs = [r.first_diff for r in page]
    assert diffs == sorted(diffs)
    found = queries.mismatch_page(reader, 1, None, "marker as", "sample", 0, 1000)
    assert [r.sample_pk for r in found] == list(range(1000, N + 1, 1000))
    assert queries.mismatch_count(reader, 1, None, "marker as") == 100
    assert queries.mismatch_page(reader, 1, None, "s000042", "sample", 0, 10)[0].sample_id == "s000042"
    assert queries.mismatch_page(reader, 1, None, "%", "sample", 0, 10) == []  # LIKE wildcards are literal


def test_counts(reader: sqlite3.Connection) -> None:
    verdicts = queries.verdict_counts(reader, 1)
    assert sum(verdicts.values()) == N and verdicts["unchecked"] == 0
    assert queries.state_counts(reader, 1)["done"] == N
    assert queries.strategy_counts(reader, 1) == {"canonical": N}


def test_unknown_order_or_verdict_is_refused(reader: sqlite3.Connection) -> None:
    with pytest.raises(ValueError, match="unknown order"):
        queries.mismatch_page(reader, 1, MISMATCH, order="random")
    with pytest.raises(ValueError, match="unknown verdicts"):
        queries.mismatch_page(reader, 1, ["wrong"])


async def test_events_jobs_and_run_resolution(tmp_path: Path) -> None:
    store = await RunStore.open(tmp_path / "runs.db")
    a = await store.ensure_run("a")
    await store.ensure_run("b")
    for i in range(5):
        await store.add_event(a, "info", "test", f"event {i}")

    def add_job(conn: sqlite3.Connection) -> int:
        job = conn.execute(
            "INSERT INTO jobs (run_id, name, executor, spec, state, n_shards, created_at, updated_at) "
            "VALUES (?, 'extract', 'local', '{\"shards\": 2}', 'running', 2, 0, 0)",
            (a,),
        ).lastrowid
        conn.executemany(
            "INSERT INTO job_shards (job_id, shard, state, done, total) VALUES (?, ?, ?, ?, 10)",
            [(job, 0, "done", 10), (job, 1, "running", 4)],
        )
        return job

    job_id = await store.write(add_job)
    await store.close()

    conn = queries.connect_readonly(tmp_path / "runs.db")
    tail = queries.events_tail(conn, a, 3)
    assert [e.message for e in tail] == ["event 2", "event 3", "event 4"]
    assert [e.message for e in queries.events_tail(conn, a, 10, after_id=tail[-1].id)] == []
    (job,) = queries.jobs(conn)
    assert (job.id, job.state, job.spec) == (job_id, "running", {"shards": 2})
    assert [(s.shard, s.state, s.done) for s in queries.job_shards(conn, job_id)] == [(0, "done", 10), (1, "running", 4)]
    assert queries.resolve_run(conn, "b").name == "b"
    with pytest.raises(InputError, match=r"holds several runs \(a, b\); choose one with --run NAME"):
        queries.resolve_run(conn, None)
    with pytest.raises(InputError, match="has no run named 'c'"):
        queries.resolve_run(conn, "c")
    assert queries.sample_detail(conn, a, "nope") is None
    assert queries.reconstruction_ids(conn, a, "nope") is None
    conn.close()
