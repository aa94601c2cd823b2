"""The plots' read (`queries.series_since`): per-bucket sums, read once by rowid range, never a table scan."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.store import queries
from app.store.db import migrate

T0 = 1_700_000_000.0  # a bucket boundary (divisible by 10)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Two runs; run 1 has 30 responses over 3 buckets (every 5th failed), run 2 one response in between."""
    path = tmp_path / "series.db"
    migrate(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO runs (id, name, created_at, updated_at) VALUES (1, 'a', 0, 0), (2, 'b', 0, 0)")
    conn.executemany(
        "INSERT INTO samples (pk, run_id, sample_id, dataset, messages, state) VALUES (?, ?, ?, 'd', '[]', 'done')",
        [(i, 1 if i <= 30 else 2, f"s{i}") for i in range(1, 32)],
    )
    rows = []
    for i in range(1, 31):
        failed = i % 5 == 0
        rows.append((i, 1, i, 100 * i, 0.01, "Timeout" if failed else None, T0 + (i - 1)))  # 1 s apart: 3 buckets
        if i == 15:
            rows.append((100, 2, 31, 999_999, 5.0, None, T0 + 14.5))  # the other run's, amid run 1's rows
    conn.executemany(
        "INSERT INTO responses (id, run_id, sample_pk, attempt, endpoint, completion_tokens, cost_usd, "
        "error_class, created_at) VALUES (?, ?, ?, 1, 'e', ?, ?, ?, ?)",
        rows,
    )
    recs = []
    for i in range(1, 31):
        flags = (
            ('["text_path:text_mismatch"]' if i % 6 == 0 else '["marker_in_text", "text_path:exact"]')
            if i % 2 == 0
            else None
        )
        recs.append((1, i, i, flags, T0 + (i - 1)))
    conn.executemany(
        "INSERT INTO reconstructions (run_id, sample_pk, response_id, strategy, output_ids, category, n_tokens, "
        "flags, created_at) VALUES (?, ?, ?, 'canonical', x'01000000', 'exact', 1, ?, ?)",
        recs,
    )
    conn.close()
    return path


def totals(chunks: list[queries.SeriesChunk]) -> dict[int, tuple]:
    sums: dict[int, list] = {}
    for chunk in chunks:
        for b in chunk.buckets:
            row = sums.setdefault(b.bucket, [0, 0, 0.0, 0, 0])
            for k, v in enumerate((b.tokens, b.responses, b.cost_usd, b.measured, b.matched)):
                row[k] += v
    return {b: (r[0], r[1], round(r[2], 6), r[3], r[4]) for b, r in sums.items()}


def test_buckets_sum_tokens_of_successes_cost_of_every_attempt_and_measured_samples(db: Path) -> None:
    conn = queries.connect_readonly(db)
    chunk = queries.series_since(conn, 1)
    conn.close()
    assert chunk.caught_up and chunk.response_cursor == 100 and chunk.reconstruction_cursor == 30
    b0 = int(T0 // 10)
    expected = {}
    for k in range(3):
        ids = range(10 * k + 1, 10 * k + 11)
        ok = [i for i in ids if i % 5]
        measured = [i for i in ids if i % 2 == 0]
        expected[b0 + k] = (
            sum(100 * i for i in ok),
            len(ok),
            round(0.01 * 10, 6),
            len(measured),
            sum(1 for i in measured if i % 6),
        )
    assert totals([chunk]) == expected  # run 2's 999,999 tokens and $5 are not run 1's


def test_reading_in_chunks_reads_each_row_once(db: Path) -> None:
    conn = queries.connect_readonly(db)
    whole = queries.series_since(conn, 1)
    chunks, cursor = [], (0, 0)
    while True:
        chunk = queries.series_since(conn, 1, *cursor, chunk=7)
        chunks.append(chunk)
        cursor = (chunk.response_cursor, chunk.reconstruction_cursor)
        if chunk.caught_up:
            break
    assert len(chunks) > 3
    assert totals(chunks) == totals([whole])
    again = queries.series_since(conn, 1, *cursor)
    assert again.buckets == () and again.caught_up  # nothing new: nothing read twice
    conn.close()


def test_series_since_reads_rowid_ranges_never_a_scan(db: Path) -> None:
    conn = queries.connect_readonly(db)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    queries.series_since(conn, 1, 3, 2)
    conn.set_trace_callback(None)
    plan = [
        row[3]
        for sql in statements
        if sql.lstrip().upper().startswith("SELECT")
        for row in conn.execute("EXPLAIN QUERY PLAN " + sql)
    ]
    conn.close()
    assert any("INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in step for step in plan), plan
    assert not any(step.startswith(("SCAN responses", "SCAN reconstructions")) for step in plan), plan
