"""The intervention ledger in the store: schema v10's table, an old database that opens with it, the rows a result
writes, the counts by kind every face reads and the sample detail that lists them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.records import Completion, Intervention, Reconstruction, Usage
from app.store import queries
from app.store.db import migrate
from app.store.run_store import RunStore
from app.store.schema import MIGRATIONS, SCHEMA_VERSION
from app.store.store_records import ResultRecord, SampleInput


def test_a_version_9_database_opens_with_an_empty_ledger_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "v9.db"
    migrate(db, migrations=MIGRATIONS[:9])
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('old', 0, 0)")
    conn.commit()
    conn.close()

    assert migrate(db) == SCHEMA_VERSION
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT COUNT(*) FROM interventions").fetchone() == (0,)
        (run_id,) = conn.execute("SELECT id FROM runs WHERE name = 'old'").fetchone()
        counts = queries.run_counts(conn, run_id)
        assert (counts.intervened, counts.interventions) == (0, ())
    finally:
        conn.close()


def _result(run_id: int, pk: int, interventions: tuple[Intervention, ...]) -> ResultRecord:
    completion = Completion(
        content="hi",
        finish_reason="stop",
        usage=Usage(prompt_tokens=3, completion_tokens=4),
        interventions=interventions,
    )
    flags = tuple(f"intervened:{i.kind}" for i in interventions)
    return ResultRecord(
        run_id, pk, 1, "ep", completion, 0.0, Reconstruction((1, 2), "canonical", ids_source="text", flags=flags)
    )


async def test_stored_interventions_are_counted_by_kind_and_listed_on_the_sample(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    store = await RunStore.open(db)
    try:
        run = await store.ensure_run("r", {})
        await store.ingest(
            run, [SampleInput(f"s{i}", "d", [{"role": "user", "content": str(i)}], None, None) for i in range(4)]
        )
        leased = {s.sample_id: s for s in await store.lease(run, 4, 60.0)}
        fallback = Intervention("provider_fallback", "OpenRouter answered on attempt 2: tried A (503), B (200)")
        compressed = Intervention("context_compression", "OpenRouter ran the context_compression stage")
        budget = Intervention("thinking_budget", "the reasoning holds 60 tokens, the thinking_token_budget of 60")
        await store.record_result(_result(run, leased["s0"].pk, (fallback, compressed)))
        await store.record_result(_result(run, leased["s1"].pk, (compressed,)))
        await store.record_result(_result(run, leased["s2"].pk, (budget,)))
        await store.record_result(_result(run, leased["s3"].pk, ()))
    finally:
        await store.close()

    conn = sqlite3.connect(db)
    try:
        counts = queries.run_counts(conn, run)
        assert counts.intervened == 3
        assert dict(counts.interventions) == {"context_compression": 2, "provider_fallback": 1, "thinking_budget": 1}
        detail = queries.sample_detail(conn, run, "s0")
        assert detail is not None
        assert detail.interventions == (
            ("provider_fallback", fallback.detail),
            ("context_compression", compressed.detail),
        )
        clean = queries.sample_detail(conn, run, "s3")
        assert clean is not None and clean.interventions == ()
    finally:
        conn.close()
