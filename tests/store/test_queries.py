"""Read-side queries for the faces: paging through verdicts at 100k rows, filters, events, jobs."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from app.errors import InputError
from app.store import queries
from app.store.db import migrate
from app.store.run_store import RunStore, index_pending_text
from app.store.store_records import ResultRecord

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
    conn.execute("BEGIN")
    while index_pending_text(conn):  # as the run store does (written outside it, they wait in the queue)
        pass
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
    plan = _plans(
        reader,
        lambda: pages.append(
            queries.mismatch_page(reader, 1, queries.MismatchQuery(verdicts, text, order, offset=50, limit=10))
        ),
    )
    assert len(pages[0].rows) == (10 if text is None else max(0, min(10, pages[0].total - 50)))
    assert not any(step.startswith(("SCAN r", "SCAN s")) for step in plan), plan


@pytest.mark.parametrize("order", ["sample", "recent", "verdict", "longest"])
def test_keyset_pages_read_an_index_range_whatever_the_depth(reader: sqlite3.Connection, order: str) -> None:
    deep = queries.mismatch_page(reader, 1, queries.MismatchQuery(MISMATCH, None, order, offset=2000, limit=10))
    plan = _plans(
        reader,
        lambda: queries.mismatch_page(
            reader, 1, queries.MismatchQuery(MISMATCH, None, order, 2010, 10, after=deep.rows[-1])
        ),
    )
    assert not any(step.startswith(("SCAN r", "SCAN s")) for step in plan), plan
    # the page starts at its key inside the index (nothing before it is read), not at an OFFSET
    assert any(
        step.startswith("SEARCH r") and ("sample_pk>?" in step or "sample_pk<?" in step or "category>?" in step)
        for step in plan
    ), plan


def test_pages_cover_every_mismatch_once_in_order(reader: sqlite3.Connection) -> None:
    total = queries.mismatch_count(reader, 1, MISMATCH)
    assert 0.02 * N < total < 0.05 * N
    seen: list[int] = []
    page = queries.mismatch_page(reader, 1, queries.MismatchQuery(MISMATCH, None, "sample", 0, 500))
    while page.rows:
        seen += [r.pk for r in page.rows]
        page = queries.mismatch_page(
            reader, 1, queries.MismatchQuery(MISMATCH, None, "sample", page.offset + 500, 500, after=page.rows[-1])
        )
    assert len(seen) == total == len(set(seen)) == page.total
    assert seen == sorted(seen)
    recent = queries.mismatch_page(reader, 1, queries.MismatchQuery(MISMATCH, None, "recent", 0, 1000))
    assert [r.pk for r in recent.rows] == sorted(seen, reverse=True)[:1000]
    assert {
        r.category for r in queries.mismatch_page(reader, 1, queries.MismatchQuery(MISMATCH, limit=1000)).rows
    } <= set(MISMATCH)


def test_longest_first_by_key_matches_a_full_sort_ties_included(reader: sqlite3.Connection) -> None:
    want = [
        pk
        for (pk,) in reader.execute(
            "SELECT sample_pk FROM reconstructions WHERE category IN ('text_mismatch', 'structure_mismatch') "
            "ORDER BY n_tokens DESC, sample_pk"
        )
    ]
    lengths = [
        n
        for (n,) in reader.execute(
            "SELECT n_tokens FROM reconstructions WHERE category IN ('text_mismatch', 'structure_mismatch')"
        )
    ]
    assert len(set(lengths)) < len(lengths)  # ties exist, so the key must include the sample
    got: list[int] = []
    page = queries.mismatch_page(reader, 1, queries.MismatchQuery(MISMATCH, None, "longest", 0, 97))
    while page.rows:
        got += [r.pk for r in page.rows]
        page = queries.mismatch_page(
            reader, 1, queries.MismatchQuery(MISMATCH, None, "longest", page.offset + 97, 97, after=page.rows[-1])
        )
    assert got == want
    back = queries.mismatch_page(
        reader,
        1,
        queries.MismatchQuery(
            MISMATCH,
            None,
            "longest",
            97,
            97,
            before=queries.mismatch_page(reader, 1, queries.MismatchQuery(MISMATCH, None, "longest", 194, 1)).rows[0],
        ),
    )
    assert [r.pk for r in back.rows] == want[97:194]


def test_sorted_orders_and_the_text_filter(reader: sqlite3.Connection) -> None:
    diffs = [
        r.first_diff
        for r in queries.mismatch_page(reader, 1, queries.MismatchQuery(MISMATCH, None, "first_diff", 0, 200)).rows
    ]
    assert diffs == sorted(diffs)
    longest = [
        r.rec_len
        for r in queries.mismatch_page(reader, 1, queries.MismatchQuery(MISMATCH, None, "longest", 0, 200)).rows
    ]
    assert longest == sorted(longest, reverse=True) and longest[0] > longest[-1]
    found = queries.mismatch_page(reader, 1, queries.MismatchQuery(None, "marker as", "sample", 0, 1000))
    assert [r.pk for r in found.rows] == list(range(1000, N + 1, 1000))  # in explanations
    assert queries.mismatch_count(reader, 1, None, "marker as") == 100 == found.total
    assert (
        queries.mismatch_page(reader, 1, queries.MismatchQuery(None, "s000042", "sample", 0, 10)).rows[0].sample_id
        == "s000042"
    )
    assert queries.mismatch_count(reader, 1, None, "d") == N  # the dataset ('d') is searched too
    assert (
        queries.mismatch_page(reader, 1, queries.MismatchQuery(None, "%", "sample", 0, 10)).rows == ()
    )  # LIKE wildcards are literal


def test_counts(reader: sqlite3.Connection) -> None:
    verdicts = queries.verdict_counts(reader, 1)
    assert sum(verdicts.values()) == N and verdicts["unchecked"] == 0
    assert queries.state_counts(reader, 1)["done"] == N
    assert queries.strategy_counts(reader, 1) == {"canonical": N}


def test_unknown_order_or_verdict_is_refused(reader: sqlite3.Connection) -> None:
    with pytest.raises(ValueError, match="unknown order"):
        queries.mismatch_page(reader, 1, queries.MismatchQuery(MISMATCH, order="random"))
    with pytest.raises(ValueError, match="unknown verdicts"):
        queries.mismatch_page(reader, 1, queries.MismatchQuery(["wrong"]))


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
    conn.execute(
        "INSERT INTO runs (id, name, config, created_at, updated_at) "
        "VALUES (1, 'only', '{\"run\": {\"keep_raw\": true}}', 0, 0)"
    )
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
    expected = [
        pk
        for (pk,) in reader.execute(
            "SELECT r.sample_pk FROM reconstructions r JOIN samples s ON s.pk = r.sample_pk WHERE r.run_id = 1 AND "
            "(s.sample_id LIKE ?1 ESCAPE '\\' OR s.dataset LIKE ?1 ESCAPE '\\' OR r.explanation LIKE ?1 ESCAPE '\\') "
            "ORDER BY r.sample_pk",
            (pattern,),
        )
    ]
    page = queries.mismatch_page(reader, 1, queries.MismatchQuery(None, text, "sample", 0, 100_000))
    assert [r.pk for r in page.rows] == expected and page.total == len(expected)
    plan = _plans(reader, lambda: queries.mismatch_page(reader, 1, queries.MismatchQuery(None, text, "sample", 0, 10)))
    assert any("mismatch_text" in step for step in plan), plan  # the trigram index, not a LIKE scan


def test_the_text_index_follows_a_reprocessed_explanation(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'r', 0, 0)")
    conn.execute("INSERT INTO samples (pk, run_id, sample_id, dataset, messages) VALUES (7, 1, 'abc-7', 'chat', '[]')")
    conn.execute(
        "INSERT INTO reconstructions (run_id, sample_pk, strategy, output_ids, category, n_tokens, explanation, "
        "created_at) VALUES (1, 7, 'canonical', x'01000000', 'text_mismatch', 1, 'old words', 0)"
    )
    assert queries.mismatch_count(conn, 1, None, "old words") == 1
    conn.execute("UPDATE reconstructions SET explanation = 'new words' WHERE sample_pk = 7")
    assert queries.mismatch_count(conn, 1, None, "old words") == 0
    assert queries.mismatch_count(conn, 1, None, "new words") == 1
    conn.execute("DELETE FROM reconstructions WHERE sample_pk = 7")
    assert conn.execute("SELECT COUNT(*) FROM mismatch_text").fetchone()[0] == 0


def _like_pks(conn: sqlite3.Connection, text: str) -> list[int]:
    pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    return [
        pk
        for (pk,) in conn.execute(
            "SELECT r.sample_pk FROM reconstructions r JOIN samples s ON s.pk = r.sample_pk WHERE "
            "s.sample_id LIKE ?1 ESCAPE '\\' OR s.dataset LIKE ?1 ESCAPE '\\' OR r.explanation LIKE ?1 ESCAPE '\\' "
            "ORDER BY r.sample_pk",
            (pattern,),
        )
    ]


def test_rows_queued_for_the_text_index_are_found_as_indexed_ones(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'r', 0, 0)")
    conn.executemany(
        "INSERT INTO samples (pk, run_id, sample_id, dataset, messages) VALUES (?, 1, ?, ?, '[]')",
        [(i, f"id-{i:03d}", "chat" if i % 2 else "Code") for i in range(1, 41)],
    )
    texts = ["id-01", "CHAT", "code", "drift at", "at token 1", "100%_", "nothing like it"]

    def write(first: int, last: int, words: str) -> None:
        conn.executemany(
            "INSERT INTO reconstructions (run_id, sample_pk, strategy, output_ids, category, n_tokens, explanation, "
            "created_at) VALUES (1, ?, 'canonical', x'01000000', 'text_mismatch', 1, ?, 0)",
            [(i, f"{words} token {i}" + (" 100%_" if i % 7 == 0 else "")) for i in range(first, last + 1)],
        )

    def found() -> dict[str, list[int]]:
        return {
            t: [r.pk for r in queries.mismatch_page(conn, 1, queries.MismatchQuery(None, t, "sample", 0, 1000)).rows]
            for t in texts
        }

    write(1, 20, "drift at")
    queued = conn.execute("SELECT COUNT(*) FROM mismatch_text_pending").fetchone()[0]
    assert queued == 20 and conn.execute("SELECT COUNT(*) FROM mismatch_text").fetchone()[0] == 0
    before = found()  # every row still queued: matched by LIKE
    assert before == {t: _like_pks(conn, t) for t in texts} and before["drift at"] == list(range(1, 21))
    assert index_pending_text(conn, limit=15) == 15 and index_pending_text(conn) == 5 and index_pending_text(conn) == 0
    assert conn.execute("SELECT COUNT(*) FROM mismatch_text").fetchone()[0] == 20
    assert found() == before  # the same rows from the index
    write(21, 40, "split at")  # half indexed, half queued: one answer over both
    texts.append("split at")
    assert found() == {t: _like_pks(conn, t) for t in texts}
    conn.execute("UPDATE reconstructions SET explanation = 'rewritten' WHERE sample_pk IN (3, 33)")
    queued = conn.execute("SELECT sample_pk FROM mismatch_text_pending WHERE sample_pk IN (3, 33)").fetchall()
    assert queued == [(3,), (33,)]
    texts.append("rewritten")
    assert found() == {t: _like_pks(conn, t) for t in texts} and found()["rewritten"] == [3, 33]
    while index_pending_text(conn):
        pass
    assert found() == {t: _like_pks(conn, t) for t in texts}
    conn.close()


async def test_the_run_store_indexes_reconstruction_text_in_bulk(tmp_path: Path, monkeypatch) -> None:
    from app.records import Completion, Reconstruction, Usage, Verdict
    from app.store import run_store
    from app.store.store_records import SampleInput

    monkeypatch.setattr(run_store, "INDEX_TEXT_EVERY", 8)
    store = await RunStore.open(tmp_path / "r.db")
    run_id = await store.ensure_run("r")
    await store.ingest(run_id, [SampleInput(f"s{i}", "d", [{"role": "user", "content": "q"}]) for i in range(20)])
    leased = await store.lease(run_id, 20, 60)
    rec = Reconstruction(output_ids=(1, 2), strategy="canonical")
    c = Completion(content="a", usage=Usage(prompt_tokens=1, completion_tokens=2))

    def counts() -> tuple[int, int]:
        raw = sqlite3.connect(tmp_path / "r.db")
        try:
            return tuple(
                raw.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("mismatch_text", "mismatch_text_pending")
            )
        finally:
            raw.close()

    def verdict(s) -> Verdict:
        return Verdict("text_mismatch", explanation=f"x {s.sample_id}")

    for s in leased[:12]:
        await store.record_result(ResultRecord(run_id, s.pk, 1, "sim", c, 0.0, rec, verdict(s)))
    await store.add_event(run_id, "info", "t", "a write after the move")  # the move runs between batches
    indexed, queued = counts()
    assert indexed >= 8 and indexed + queued == 12
    for s in leased[12:]:
        await store.record_result(ResultRecord(run_id, s.pk, 1, "sim", c, 0.0, rec, verdict(s)))
    await store.close()
    assert counts() == (20, 0)  # the rest at close
    conn = queries.connect_readonly(tmp_path / "r.db")
    assert queries.mismatch_count(conn, run_id, None, "x s1") == 11  # s1 and s10..s19
    conn.close()


def test_a_v5_database_keeps_its_text_index_and_queues_new_rows(tmp_path: Path) -> None:
    from app.store.schema import MIGRATIONS

    db = tmp_path / "v5.db"
    migrate(db, migrations=MIGRATIONS[:5])
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'r', 0, 0)")
    conn.executemany(
        "INSERT INTO samples (pk, run_id, sample_id, dataset, messages) VALUES (?, 1, ?, 'd', '[]')",
        [(i, f"s{i}") for i in (1, 2)],
    )
    conn.execute(
        "INSERT INTO reconstructions (run_id, sample_pk, strategy, output_ids, category, n_tokens, "
        "explanation, created_at) VALUES (1, 1, 'canonical', x'01000000', 'text_mismatch', 1, 'old row', 0)"
    )
    conn.close()
    assert migrate(db) == len(MIGRATIONS)
    conn = sqlite3.connect(db, isolation_level=None)
    assert conn.execute("SELECT COUNT(*) FROM mismatch_text").fetchone()[0] == 1  # indexed by v5's trigger
    conn.execute(
        "INSERT INTO reconstructions (run_id, sample_pk, strategy, output_ids, category, n_tokens, "
        "explanation, created_at) VALUES (1, 2, 'canonical', x'01000000', 'text_mismatch', 1, 'new row', 0)"
    )
    assert conn.execute("SELECT sample_pk FROM mismatch_text_pending").fetchall() == [(2,)]
    assert [queries.mismatch_count(conn, 1, None, t) for t in ("old row", "new row", " row")] == [1, 1, 2]
    conn.close()
