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


def _plans(reader: sqlite3.Connection, run) -> list[str]:
    """Every query-plan step of every SELECT that `run()` makes the connection execute."""
    statements: list[str] = []
    reader.set_trace_callback(statements.append)  # the SQL really run, values filled in
    try:
        run()
    finally:
        reader.set_trace_callback(None)
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert selects
    return [row[3] for sql in selects for row in reader.execute("EXPLAIN QUERY PLAN " + sql)]


@pytest.mark.parametrize("text", [None, "marker"])
@pytest.mark.parametrize("order", list(queries.MISMATCH_ORDERS))
@pytest.mark.parametrize("verdicts", [MISMATCH, ("exact",), None])
def test_mismatch_page_never_scans_the_whole_table(reader: sqlite3.Connection, order: str, verdicts, text) -> None:
    pages: list[queries.MismatchPage] = []
    plan = _plans(reader, lambda: pages.append(queries.mismatch_page(reader, 1, verdicts, text, order, offset=50, limit=10)))
    assert len(pages[0].rows) == (10 if text is None else max(0, min(10, pages[0].total - 50)))
    assert not any(step.startswith(("SCAN r", "SCAN s")) for step in plan), plan


@pytest.mark.parametrize("order", ["sample", "recent", "verdict", "longest"])
def test_keyset_pages_read_an_index_range_whatever_the_depth(reader: sqlite3.Connection, order: str) -> None:
    deep = queries.mismatch_page(reader, 1, MISMATCH, None, order, offset=2000, limit=10)
    plan = _plans(reader, lambda: queries.mismatch_page(reader, 1, MISMATCH, None, order, 2010, 10, after=deep.rows[-1]))
    assert not any(step.startswith(("SCAN r", "SCAN s")) for step in plan), plan
    # the page starts at its key inside the index (nothing before it is read), not at an OFFSET
    assert any(step.startswith("SEARCH r") and ("sample_pk>?" in step or "sample_pk<?" in step or "category>?" in step)
               for step in plan), plan


def test_pages_cover_every_mismatch_once_in_order(reader: sqlite3.Connection) -> None:
    total = queries.mismatch_count(reader, 1, MISMATCH)
    assert 0.02 * N < total < 0.05 * N
    seen: list[int] = []
    page = queries.mismatch_page(reader, 1, MISMATCH, None, "sample", 0, 500)
    while page.rows:
        seen += [r.pk for r in page.rows]
        page = queries.mismatch_page(reader, 1, MISMATCH, None, "sample", page.offset + 500, 500, after=page.rows[-1])
    assert len(seen) == total == len(set(seen)) == page.total
    assert seen == sorted(seen)
    recent = queries.mismatch_page(reader, 1, MISMATCH, None, "recent", 0, 1000)
    assert [r.pk for r in recent.rows] == sorted(seen, reverse=True)[:1000]
    assert {r.category for r in queries.mismatch_page(reader, 1, MISMATCH, limit=1000).rows} <= set(MISMATCH)


def test_longest_first_by_key_matches_a_full_sort_ties_included(reader: sqlite3.Connection) -> None:
    want = [pk for (pk,) in reader.execute(
        "SELECT sample_pk FROM reconstructions WHERE category IN ('text_mismatch', 'structure_mismatch') "
        "ORDER BY n_tokens DESC, sample_pk")]
    lengths = [n for (n,) in reader.execute(
        "SELECT n_tokens FROM reconstructions WHERE category IN ('text_mismatch', 'structure_mismatch')")]
    assert len(set(lengths)) < len(lengths)  # ties exist, so the key must include the sample
    got: list[int] = []
    page = queries.mismatch_page(reader, 1, MISMATCH, None, "longest", 0, 97)
    while page.rows:
        got += [r.pk for r in page.rows]
        page = queries.mismatch_page(reader, 1, MISMATCH, None, "longest", page.offset + 97, 97, after=page.rows[-1])
    assert got == want
    back = queries.mismatch_page(reader, 1, MISMATCH, None, "longest", 97, 97,
                                 before=queries.mismatch_page(reader, 1, MISMATCH, None, "longest", 194, 1).rows[0])
    assert [r.pk for r in back.rows] == want[97:194]


def test_sorted_orders_and_the_text_filter(reader: sqlite3.Connection) -> None:
    diffs = [r.first_diff for r in queries.mismatch_page(reader, 1, MISMATCH, None, "first_diff", 0, 200).rows]
    assert diffs == sorted(diffs)
    longest = [r.rec_len for r in queries.mismatch_page(reader, 1, MISMATCH, None, "longest", 0, 200).rows]
    assert longest == sorted(longest, reverse=True) and longest[0] > longest[-1]
    found = queries.mismatch_page(reader, 1, None, "marker as", "sample", 0, 1000)
    assert [r.pk for r in found.rows] == list(range(1000, N + 1, 1000))  # in explanations
    assert queries.mismatch_count(reader, 1, None, "marker as") == 100 == found.total
    assert queries.mismatch_page(reader, 1, None, "s000042", "sample", 0, 10).rows[0].sample_id == "s000042"
    assert queries.mismatch_count(reader, 1, None, "d") == N  # the dataset ('d') is searched too
    assert queries.mismatch_page(reader, 1, None, "%", "sample", 0, 10).rows == ()  # LIKE wildcards are literal


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
    (job,) = queries.job_summaries(conn, a)
    assert (job.job_id, job.state, job.n_shards, job.shards_done) == (job_id, "running", 2, 1)
    assert queries.latest_shard_log(conn, job_id) is None  # no shard has a log yet
    assert queries.resolve_run(conn, "b").name == "b"
    with pytest.raises(InputError, match=r"holds several runs \(a, b\); choose one with --run NAME"):
        queries.resolve_run(conn, None)
    with pytest.raises(InputError, match="has no run named 'c'"):
        queries.resolve_run(conn, "c")
    assert queries.sample_detail(conn, a, "nope") is None
    assert queries.reconstruction_of(conn, a, "nope") is None
    conn.close()


def test_run_reader_chooses_the_run_once_and_reads_keep_raw(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    migrate(db)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (id, name, config, created_at, updated_at) "
                 "VALUES (1, 'only', '{\"run\": {\"keep_raw\": true}}', 0, 0)")
    conn.commit()
    conn.close()
    reader = queries.RunReader(db)
    try:
        assert (reader.run_id, reader.run_name, reader.keep_raw) == (1, "only", True)
        assert reader.mismatch_page(queries.MISMATCH_VERDICTS, "", "longest", 0, 10).total == 0
    finally:
        reader.close()
    with pytest.raises(InputError, match="has no run named 'x'"):
        queries.RunReader(db, "x")


@pytest.mark.parametrize("text", ["marker as", "MARKER", "s00004", "r a", 'say "hi"', "100%_"])
def test_the_indexed_text_filter_finds_what_a_like_scan_finds(reader: sqlite3.Connection, text: str) -> None:
    pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    expected = [pk for (pk,) in reader.execute(
        "SELECT r.sample_pk FROM reconstructions r JOIN samples s ON s.pk = r.sample_pk WHERE r.run_id = 1 AND "
        "(s.sample_id LIKE ?1 ESCAPE '\\' OR s.dataset LIKE ?1 ESCAPE '\\' OR r.explanation LIKE ?1 ESCAPE '\\') "
        "ORDER BY r.sample_pk", (pattern,))]
    page = queries.mismatch_page(reader, 1, None, text, "sample", 0, 100_000)
    assert [r.pk for r in page.rows] == expected and page.total == len(expected)
    plan = _plans(reader, lambda: queries.mismatch_page(reader, 1, None, text, "sample", 0, 10))
    assert any("mismatch_text" in step for step in plan), plan  # the trigram index, not a LIKE scan


def test_the_text_index_follows_a_reprocessed_explanation(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'r', 0, 0)")
    conn.execute("INSERT INTO samples (pk, run_id, sample_id, dataset, messages) VALUES (7, 1, 'abc-7', 'chat', '[]')")
    conn.execute("INSERT INTO reconstructions (run_id, sample_pk, strategy, output_ids, category, n_tokens, explanation, "
                 "created_at) VALUES (1, 7, 'canonical', x'01000000', 'text_mismatch', 1, 'old words', 0)")
    assert queries.mismatch_count(conn, 1, None, "old words") == 1
    conn.execute("UPDATE reconstructions SET explanation = 'new words' WHERE sample_pk = 7")
    assert queries.mismatch_count(conn, 1, None, "old words") == 0
    assert queries.mismatch_count(conn, 1, None, "new words") == 1
    conn.execute("DELETE FROM reconstructions WHERE sample_pk = 7")
    assert conn.execute("SELECT COUNT(*) FROM mismatch_text").fetchone()[0] == 0
