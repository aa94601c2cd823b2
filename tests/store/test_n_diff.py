"""Tokens differing per reconstruction (schema v4's n_diff): the migration and every store writer agree."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from app.records import DiffSpan, Reconstruction, Verdict
from app.store.db import migrate
from app.store.rows import ReconstructionRow
from app.store.run_store import RunStore
from app.store.schema import MIGRATIONS, SCHEMA_VERSION
from app.store.store_records import ResultRecord, SampleInput
from tests.store.test_run_store import completion

# (detail as stored, tokens differing: the longer side of each span, 0 without spans or JSON)
DETAILS = [
    ('{"spans": [[0, 3, 0, 1], [5, 6, 4, 9]]}', 3 + 5),
    ('{"spans": [[2, 2, 2, 4]]}', 2),
    ('{"spans": []}', 0),
    ("{}", 0),
    ('{"spans": null}', 0),
    ("not json", 0),
    (None, 0),
]


def expected(detail: str | None) -> int:
    try:
        spans = json.loads(detail or "{}").get("spans") or []
    except ValueError:
        return 0
    return sum(max(b - a, d - c) for a, b, c, d in spans)


def test_reference_function_matches_the_table() -> None:
    assert [expected(d) for d, _ in DETAILS] == [n for _, n in DETAILS]


def test_v3_database_gets_n_diff_filled_from_detail(tmp_path: Path) -> None:
    db = tmp_path / "v3.db"
    migrate(db, migrations=MIGRATIONS[:3])
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'r', 0, 0)")
    for pk, (detail, _) in enumerate(DETAILS, start=1):
        conn.execute(
            "INSERT INTO samples (pk, run_id, sample_id, dataset, messages, state, updated_at) "
            "VALUES (?, 1, ?, 'd', '[]', 'done', 0)",
            (pk, f"s{pk}"),
        )
        conn.execute(
            "INSERT INTO reconstructions (run_id, sample_pk, strategy, output_ids, category, n_tokens, detail, "
            "created_at) VALUES (1, ?, 'canonical', x'01000000', 'text_mismatch', 1, ?, 0)",
            (pk, detail),
        )
    conn.commit()
    conn.close()

    assert migrate(db) == SCHEMA_VERSION
    conn = sqlite3.connect(db)
    got = conn.execute("SELECT detail, n_diff FROM reconstructions ORDER BY sample_pk").fetchall()
    assert [(d, n) for d, n in got] == [(d, expected(d)) for d, _ in DETAILS]
    plan = conn.execute(
        "EXPLAIN QUERY PLAN SELECT sample_pk FROM reconstructions WHERE run_id = 1 AND category IN ('a', 'b') "
        "ORDER BY n_diff DESC, sample_pk LIMIT 10"
    ).fetchall()
    assert "reconstructions_by_run_n_diff" in str(plan) and "TEMP B-TREE" not in str(plan)
    conn.close()


async def test_writers_set_n_diff(tmp_path: Path) -> None:
    store = await RunStore.open(tmp_path / "runs.db")
    run_id = await store.ensure_run("r", {"run": {"name": "r"}})
    inputs = [SampleInput(f"s{i}", "d", [{"role": "user", "content": "q"}], None, None) for i in range(3)]
    await store.ingest(run_id, inputs)
    leased = await store.lease(run_id, 3, 60)
    rec = Reconstruction(output_ids=(1, 2, 3, 4), strategy="canonical")
    spans = (DiffSpan(0, 1, 0, 3), DiffSpan(3, 7, 3, 4))  # 3 + 4 tokens differing
    verdict = Verdict("text_mismatch", first_diff=0, ref_len=7, rec_len=4, spans=spans)
    await store.record_result(
        ResultRecord(
            run_id, leased[0].pk, 1, "sim", completion(), 0.0, rec, verdict, (9,) * 7, profile="p", tokenizer="t"
        )
    )
    await store.record_result(
        ResultRecord(run_id, leased[1].pk, 1, "sim", completion(), 0.0, rec, None, None, profile="p", tokenizer="t")
    )

    # a reprocess rewrites the first one with one span and adds the third
    rows = [
        ReconstructionRow(
            run_id=run_id,
            sample_pk=pk,
            profile="p",
            tokenizer="t",
            strategy="canonical",
            output_ids=(1,),
            category="text_mismatch",
            spans=spans,
        )
        for pk, spans in ((leased[0].pk, ((1, 2, 1, 6),)), (leased[2].pk, ()))
    ]
    before = _n_diffs(tmp_path / "runs.db")
    assert await store.upsert_reconstructions(rows) == 2
    await store.close()

    assert before == {leased[0].pk: 7, leased[1].pk: 0}
    assert _n_diffs(tmp_path / "runs.db") == {leased[0].pk: 5, leased[1].pk: 0, leased[2].pk: 0}


def _n_diffs(db: Path) -> dict[int, int]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT sample_pk, n_diff FROM reconstructions").fetchall())
    finally:
        conn.close()
