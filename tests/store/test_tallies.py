"""The maintained tallies (schema v3) stay equal to a recount through every RunStore write, and readers trust them."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from app.engine.record.reads import read_record
from app.records import Completion, Reconstruction, Usage, Verdict
from app.store import queries, tallies
from app.store.db import migrate
from app.store.rows import ReconstructionRow
from app.store.run_store import RunStore
from app.store.schema import MIGRATIONS
from app.store.store_records import ResultRecord, SampleInput

TALLY_TABLES = ("sample_tallies", "response_tallies", "reconstruction_tallies", "quality_tallies", "tally_marks")


def samples(n: int, start: int = 0) -> list[SampleInput]:
    return [
        SampleInput(f"s{i}", "d", [{"role": "user", "content": f"q {i}"}], None, None) for i in range(start, start + n)
    ]


def completion(finish: str = "stop", tokens: int = 5, cost: float = 0.25) -> Completion:
    return Completion(
        content="hello",
        finish_reason=finish,
        usage=Usage(prompt_tokens=10, completion_tokens=tokens, cost_usd=cost),
        total_s=0.4,
        ttft_s=0.05,
        provider="sim",
        model="m",
    )


def table_rows(db: Path) -> dict[str, list[tuple]]:
    """The tally tables' non-zero rows, sorted, so two states of the database compare."""
    conn = sqlite3.connect(db)
    try:
        out = {}
        for table in TALLY_TABLES:
            rows = conn.execute(f"SELECT * FROM {table}").fetchall()
            if table != "tally_marks":
                rows = [r for r in rows if r[-1 if table != "response_tallies" else 4] != 0]
            out[table] = sorted(rows)
        return out
    finally:
        conn.close()


def recounted(db: Path) -> dict[str, list[tuple]]:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        tallies.recount(conn)
    finally:
        conn.close()
    return table_rows(db)


async def test_tallies_equal_a_recount_after_every_kind_of_write(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = await RunStore.open(db)
    run = await store.ensure_run("r", {})
    other = await store.ensure_run("other", {})
    await store.ingest(run, samples(40))
    await store.ingest(run, samples(45))  # 40 already present, 5 new
    await store.ingest(other, samples(7))

    leased = await store.lease(run, 30, 60.0)
    a, b, c, d, e, f = leased[:6]
    await store.record_result(
        ResultRecord(
            run, a.pk, 1, "ep-a", completion(), 0.25, Reconstruction((1, 2), "canonical"), Verdict("exact", rec_len=2)
        )
    )
    await store.record_result(
        ResultRecord(
            run,
            b.pk,
            1,
            "ep-b",
            completion("length", 9, 0.5),
            0.5,
            Reconstruction((1, 3), "logprobs"),
            Verdict("text_mismatch", first_diff=1, ref_len=2, rec_len=2),
        )
    )
    await store.record_failure(
        run, c.pk, "RetryableError", "503", final=False, cost_usd=0.01, endpoint="ep-a", attempt=1
    )
    await store.record_failure(run, d.pk, "AuthError", "401", final=True, endpoint="ep-b", attempt=1)
    await store.record_failure(run, e.pk, "ContentError", "bad", final=True)  # no endpoint: no response row
    await store.skip(run, [f.pk], "prompt too long")
    assert await store.release(run, [s.pk for s in leased[6:12]]) == 6

    short = await store.lease(run, 5, -1.0)  # already expired
    assert await store.expire_leases(run) == len(short)

    # reprocess: the same samples get new verdicts and strategies, plus one reconstruction that is new
    now = time.time()
    rows = [
        ReconstructionRow(
            run_id=run,
            sample_pk=pk,
            profile="p",
            tokenizer="t",
            strategy=strategy,
            output_ids=(1,),
            category=category,
            created_at=now,
        )
        for pk, category, strategy in (
            (a.pk, "bpe_equivalent", "server_ids"),
            (b.pk, "exact", "logprobs"),
            (c.pk, "unchecked", "canonical"),
        )
    ]
    assert await store.upsert_reconstructions(rows) == 3
    await store.close()

    maintained = table_rows(db)
    assert maintained == recounted(db)

    conn = queries.connect_readonly(db)
    try:
        assert tallies.samples_current(conn)
        counts = queries.state_counts(conn, run)
        assert sum(counts.values()) == 45
        direct = dict(
            conn.execute("SELECT state, COUNT(*) FROM samples WHERE run_id = ? GROUP BY state", (run,)).fetchall()
        )
        assert {k: v for k, v in counts.items() if v} == direct
        assert queries.verdict_counts(conn, run)["bpe_equivalent"] == 1
        assert queries.verdict_counts(conn, run)["text_mismatch"] == 0
        assert queries.strategy_counts(conn, run) == {"canonical": 1, "logprobs": 1, "server_ids": 1}
        assert queries.cost_total(conn, run) == 0.25 + 0.5 + 0.01
        assert tallies.failed_by_class(conn, run) == {"AuthError": 1, "ContentError": 1}
        at = time.time()
        rec = read_record(conn, "r", now=at)
        c = rec.counts
        # retried: failed requests tried again (c's 503); d's 401 ended its sample, so it is failed, not retried.
        # truncated: b's answer stopped at max_tokens, but its reprocessed reconstruction names no response (and
        # its verdict is exact now), so no answer of the run is truncated any more
        assert (rec.total, rec.done, rec.failed, rec.skipped, c.answers.truncated, c.retried) == (45, 2, 2, 1, 0, 1)
        assert dict(c.errors_by_class) == {"AuthError": 1, "RetryableError": 1}  # failed requests, by class
        assert dict(c.failed_by_class) == {"AuthError": 1, "ContentError": 1}  # failed samples, by class
        assert [(e.name, e.completed, e.failed, e.retried, e.cost_usd) for e in c.endpoints] == [
            ("ep-a", 1, 0, 1, 0.25 + 0.01),
            ("ep-b", 1, 1, 0, 0.5),
        ]
        assert read_record(conn, "other").counts.samples.pending == 7
        conn.row_factory = sqlite3.Row  # a viewer's connection may hand out Rows: the same record
        assert read_record(conn, "r", now=at) == rec
        assert queries.state_counts(conn, run) == counts
    finally:
        conn.close()


async def test_deleting_a_run_cascades_through_the_tallies(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = await RunStore.open(db)
    run = await store.ensure_run("r", {})
    await store.ingest(run, samples(5))
    (s,) = await store.lease(run, 1, 60.0)
    await store.record_result(ResultRecord(run, s.pk, 1, "ep", completion(), 0.25, Reconstruction((1,), "canonical")))
    await store.write(lambda conn: conn.execute("DELETE FROM samples WHERE pk = ?", (s.pk,)))
    assert table_rows(db) == recounted(db)
    await store.write(lambda conn: conn.execute("DELETE FROM runs WHERE id = ?", (run,)))
    await store.close()
    assert table_rows(db) == recounted(db)
    assert table_rows(db)["sample_tallies"] == []


def test_plain_sql_inserts_are_noticed_until_recount(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'r', 0, 0)")
    conn.executemany(
        "INSERT INTO samples (pk, run_id, sample_id, dataset, messages, state) VALUES (?, 1, ?, 'd', '[]', 'done')",
        [(i, f"s{i}") for i in range(1, 11)],
    )
    assert not tallies.samples_current(conn)
    assert queries.state_counts(conn, 1)["done"] == 10  # counted from the table, not the stale tally
    assert conn.execute("SELECT COUNT(*) FROM sample_tallies").fetchone()[0] == 0
    tallies.recount(conn, 1)
    assert tallies.samples_current(conn)
    assert conn.execute("SELECT state, n FROM sample_tallies").fetchall() == [("done", 10)]
    assert queries.state_counts(conn, 1)["done"] == 10
    conn.close()


def test_migration_fills_the_tallies_from_a_version_2_database(tmp_path: Path) -> None:
    db = tmp_path / "v2.db"
    migrate(db, migrations=MIGRATIONS[:2])
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'r', 0, 0)")
    conn.executemany(
        "INSERT INTO samples (pk, run_id, sample_id, dataset, messages, state, error_class) VALUES (?, 1, ?, "
        "'d', '[]', ?, ?)",
        [(1, "a", "done", None), (2, "b", "failed", "AuthError"), (3, "c", "failed", None), (4, "d", "pending", None)],
    )
    conn.executemany(
        "INSERT INTO responses (run_id, sample_pk, attempt, endpoint, finish_reason, content, completion_tokens, "
        "cost_usd, error_class, created_at) VALUES (1, ?, 1, 'ep', ?, ?, 7, ?, ?, 0)",
        [(1, "length", "x", 0.5, None), (2, None, None, 0.25, "AuthError")],
    )
    conn.execute(
        "INSERT INTO reconstructions (run_id, sample_pk, strategy, output_ids, category, n_tokens, created_at) "
        "VALUES (1, 1, 'canonical', x'01000000', 'exact', 1, 0)"
    )
    conn.close()
    migrate(db)
    migrated = table_rows(db)
    assert migrated["response_tallies"] == [(1, "ep", 0, "AuthError", 1, 0, 0.25, 7), (1, "ep", 1, "", 1, 1, 0.5, 7)]
    assert migrated["sample_tallies"] == [
        (1, "done", "", 1),
        (1, "failed", "", 1),
        (1, "failed", "AuthError", 1),
        (1, "pending", "", 1),
    ]
    assert migrated == recounted(db)
    conn = queries.connect_readonly(db)
    assert tallies.failed_by_class(conn, 1) == {"AuthError": 1}
    assert queries.state_counts(conn, 1) == {
        "pending": 1,
        "waiting": 0,
        "leased": 0,
        "done": 1,
        "failed": 2,
        "skipped": 0,
    }
    conn.close()


def test_the_first_difference_order_walks_an_index(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'r', 0, 0)")
    conn.executemany(
        "INSERT INTO samples (pk, run_id, sample_id, dataset, messages) VALUES (?, 1, ?, 'd', '[]')",
        [(i, f"s{i:03d}") for i in range(1, 201)],
    )
    cats = ("exact", "text_mismatch", "structure_mismatch", "bpe_equivalent")
    conn.executemany(
        "INSERT INTO reconstructions (run_id, sample_pk, strategy, output_ids, category, first_diff, n_tokens, "
        "created_at) "
        "VALUES (1, ?, 'canonical', x'01000000', ?, ?, 1, 0)",
        [(i, cats[i % 4], None if i % 4 == 0 or i % 7 == 0 else (i * 37) % 50) for i in range(1, 201)],
    )
    tallies.recount(conn)
    conn.execute("ANALYZE")
    conn.close()
    reader = queries.connect_readonly(db)
    want = reader.execute(
        "SELECT sample_pk FROM reconstructions WHERE category IN ('text_mismatch', 'structure_mismatch') "
        "ORDER BY first_diff IS NULL, first_diff, sample_pk"
    ).fetchall()
    got: list[int] = []
    offset = 0
    mismatch = ("text_mismatch", "structure_mismatch")
    while rows := queries.mismatch_page(
        reader, 1, queries.MismatchQuery(mismatch, order="first_diff", offset=offset, limit=7)
    ).rows:
        got += [r.pk for r in rows]
        offset += len(rows)
    assert got == [r[0] for r in want]
    statements: list[str] = []
    reader.set_trace_callback(statements.append)
    queries.mismatch_page(reader, 1, queries.MismatchQuery(mismatch, order="first_diff", limit=5))
    reader.set_trace_callback(None)
    (paging,) = [s for s in statements if "first_diff IS NOT NULL" in s]
    plan = [row[3] for row in reader.execute("EXPLAIN QUERY PLAN " + paging)]
    assert any("reconstructions_by_run_first_diff" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan
    reader.close()
