"""The writer side: batching, leases that survive crashes, one-transaction results, readers during writes."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from app.errors import EaglewatchError
from app.records import Completion, DiffSpan, Reconstruction, TokenLogprob, ToolCall, Usage, Verdict
from app.store import queries
from app.store.run_store import RunStore
from app.store.store_records import ReferenceRecord, ResultRecord, SampleInput


def samples(n: int, dataset: str = "d", start: int = 0) -> list[SampleInput]:
    return [
        SampleInput(f"s{i}", dataset, [{"role": "user", "content": f"question {i}"}], None, None)
        for i in range(start, start + n)
    ]


async def open_with(tmp_path: Path, n: int = 0, **kw: object) -> tuple[RunStore, int]:
    store = await RunStore.open(tmp_path / "runs.db", **kw)  # type: ignore[arg-type]
    run_id = await store.ensure_run("r", {"run": {"name": "r"}})
    if n:
        await store.ingest(run_id, samples(n))
    return store, run_id


def completion(text: str = "hello", cost: float | None = 0.001) -> Completion:
    return Completion(
        content=text,
        reasoning="thinking",
        tool_calls=(ToolCall(id="c1", name="f", arguments='{"a":1}'),),
        finish_reason="stop",
        usage=Usage(prompt_tokens=10, completion_tokens=5, cost_usd=cost),
        content_logprobs=(TokenLogprob("he", (104, 101), -0.1), TokenLogprob("llo", None, -0.2)),
        token_ids=(5, 6),
        ttft_s=0.05,
        total_s=0.4,
        provider="sim",
        model="m",
    )


async def test_ensure_run_is_idempotent(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path)
    assert await store.ensure_run("r", {}) == run_id
    assert await store.ensure_run("other", {}) != run_id
    await store.close()


async def test_ingest_adds_each_sample_once(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path)
    first = await store.ingest(run_id, samples(10))
    again = await store.ingest(run_id, samples(12))
    assert (first.added, first.already_present) == (10, 0)
    assert (again.added, again.already_present) == (2, 10)
    assert (await store.counts(run_id))["pending"] == 12
    await store.close()


async def test_ingest_reports_ids_held_by_another_dataset(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path)
    await store.ingest(run_id, samples(3, dataset="a"))
    report = await store.ingest(run_id, samples(3, dataset="b", start=1))
    assert (report.added, report.already_present, report.conflicts) == (1, 0, 2)
    assert report.conflict_examples == (
        "id 's1' held by dataset 'a'; skipped (give the line a distinct id)",
        "id 's2' held by dataset 'a'; skipped (give the line a distinct id)",
    )
    await store.close()


async def test_ingest_consumes_a_generator_in_chunks(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path)
    pulled = []

    def gen():
        for s in samples(25):
            pulled.append(s.sample_id)
            yield s

    report = await store.ingest(run_id, gen(), chunk=10)
    assert report.added == 25 and len(pulled) == 25
    assert store.commits >= 3
    await store.close()


async def test_lease_hands_out_oldest_pending_and_counts_attempts(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 5)
    first = await store.lease(run_id, 2, 60)
    second = await store.lease(run_id, 10, 60)
    assert [s.sample_id for s in first] == ["s0", "s1"]
    assert [s.sample_id for s in second] == ["s2", "s3", "s4"]
    assert all(s.attempts == 1 for s in first + second)
    assert first[0].messages == [{"role": "user", "content": "question 0"}]
    assert await store.lease(run_id, 3, 60) == []
    assert (await store.counts(run_id))["leased"] == 5
    await store.close()


async def test_expired_leases_return_to_pending_after_a_crash(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 3)
    await store.lease(run_id, 3, 0.05)
    await store.close()  # the process "crashes" with three samples leased

    store = await RunStore.open(tmp_path / "runs.db")
    assert (await store.counts(run_id))["leased"] == 3
    await asyncio.sleep(0.1)
    assert await store.expire_leases(run_id) == 3
    again = await store.lease(run_id, 3, 60)
    assert [s.attempts for s in again] == [2, 2, 2]  # the crashed attempt counts
    assert await store.expire_leases(run_id) == 0  # live leases are left alone
    await store.close()


async def test_release_gives_the_attempt_back(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 2)
    leased = await store.lease(run_id, 2, 60)
    assert await store.release(run_id, [s.pk for s in leased]) == 2
    again = await store.lease(run_id, 2, 60)
    assert [s.attempts for s in again] == [1, 1]
    await store.close()


async def test_record_result_stores_response_reconstruction_cost_and_state_together(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 1)
    (leased,) = await store.lease(run_id, 1, 60)
    rec = Reconstruction(output_ids=(1, 2, 3), strategy="logprobs", repair="strip_whitespace", roundtrip=True)
    verdict = Verdict(
        "text_mismatch", first_diff=1, ref_len=3, rec_len=3, spans=(DiffSpan(1, 2, 1, 2),), explanation="x"
    )
    response_id = await store.record_result(
        ResultRecord(
            run_id,
            leased.pk,
            1,
            "sim",
            completion(),
            0.25,
            rec,
            verdict,
            (1, 9, 3),
            profile="kimi-k2.5",
            tokenizer="fp1",
        )
    )
    assert await store.spent_usd(run_id) == pytest.approx(0.25)
    assert (await store.counts(run_id))["done"] == 1
    await store.close()

    conn = queries.connect_readonly(tmp_path / "runs.db")
    detail = queries.sample_detail(conn, run_id, "s0")
    assert detail is not None and detail.state == "done" and detail.category == "text_mismatch"
    assert detail.content == "hello" and detail.tool_calls[0]["name"] == "f"
    rec_row = queries.reconstruction_of(conn, run_id, "s0")
    assert rec_row is not None and rec_row.response_id == response_id
    assert rec_row.output_ids == (1, 2, 3)
    assert rec_row.reference_ids == (1, 9, 3)
    assert rec_row.spans == ((1, 2, 1, 2),)
    assert (rec_row.profile, rec_row.tokenizer) == ("kimi-k2.5", "fp1")
    # the Reconstruction gave no ids_source and no flags: stored as such (engine tests cover filled ones)
    assert (rec_row.repair, rec_row.roundtrip, rec_row.ids_source, rec_row.flags) == (
        "strip_whitespace",
        True,
        None,
        (),
    )
    assert queries.verdict_counts(conn, run_id)["text_mismatch"] == 1
    assert queries.strategy_counts(conn, run_id) == {"logprobs": 1}
    raw = sqlite3.connect(tmp_path / "runs.db")
    assert (
        raw.execute("SELECT token_ids, logprobs FROM responses").fetchone()[1].startswith('{"content":[["he",[104,101]')
    )
    conn.close()
    raw.close()


async def test_a_failing_result_leaves_no_partial_rows(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 1)
    (leased,) = await store.lease(run_id, 1, 60)
    bad = Reconstruction(output_ids=(1, -5), strategy="canonical")  # -5 cannot be packed: fails before writing
    with pytest.raises(ValueError):
        await store.record_result(ResultRecord(run_id, leased.pk, 1, "sim", completion(), 0.1, bad, None, None))

    def boom(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO responses (run_id, sample_pk, attempt, endpoint, cost_usd, created_at) VALUES (?, ?, 1, "
            "'x', 9, 0)",
            (run_id, leased.pk),
        )
        conn.execute("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(EaglewatchError, match="a database write failed"):
        await store.write(boom)
    assert await store.spent_usd(run_id) == 0  # the half-done operation was rolled back
    assert (await store.counts(run_id))["leased"] == 1
    await store.close()


async def test_record_result_is_all_or_nothing(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 1)
    (leased,) = await store.lease(run_id, 1, 60)
    rec = Reconstruction(output_ids=(1, 2), strategy="canonical")
    # the response row goes in first; the reconstruction row then violates the verdict CHECK
    with pytest.raises(EaglewatchError, match="a database write failed"):
        await store.record_result(
            ResultRecord(run_id, leased.pk, 1, "sim", completion(), 0.5, rec, Verdict("bogus"), None)
        )
    assert await store.spent_usd(run_id) == 0
    assert (await store.counts(run_id))["leased"] == 1
    with pytest.raises(EaglewatchError, match="FOREIGN KEY"):
        await store.record_result(ResultRecord(run_id, 999_999, 1, "sim", completion(), 0.5, rec, None, None))
    assert await store.spent_usd(run_id) == 0
    await store.close()


async def test_one_failing_operation_does_not_fail_its_batch(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 2, batch_linger_s=0.05)

    def boom(conn: sqlite3.Connection) -> None:
        raise RuntimeError("op failed")

    results = await asyncio.gather(
        store.add_event(run_id, "info", "t", "one"),
        store.write(boom),
        store.add_event(run_id, "info", "t", "two"),
        return_exceptions=True,
    )
    assert isinstance(results[1], RuntimeError)
    assert results[0] is None and results[2] is None
    await store.close()
    conn = queries.connect_readonly(tmp_path / "runs.db")
    assert [e.message for e in queries.events_tail(conn, run_id, 10) if e.kind == "t"] == ["one", "two"]
    conn.close()


async def test_concurrent_writes_are_batched_into_few_commits(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, batch_max=64, batch_linger_s=0.05)
    before = store.commits
    await asyncio.gather(*(store.add_event(run_id, "info", "k", f"e{i}") for i in range(200)))
    commits = store.commits - before
    assert 4 <= commits <= 20  # bounded by batch size (64), not one commit per write
    await store.close()


async def test_record_failure_retry_then_final(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 1)
    (leased,) = await store.lease(run_id, 1, 60)
    await store.record_failure(run_id, leased.pk, "RetryableError", "HTTP 429 from sim", final=False, endpoint="sim")
    assert (await store.counts(run_id))["pending"] == 1
    (leased,) = await store.lease(run_id, 1, 60)
    await store.record_failure(
        run_id, leased.pk, "SampleFatalError", "prompt too long", final=True, cost_usd=0.02, endpoint="sim"
    )
    assert (await store.counts(run_id))["failed"] == 1
    assert await store.spent_usd(run_id) == pytest.approx(0.02)
    await store.close()
    conn = queries.connect_readonly(tmp_path / "runs.db")
    detail = queries.sample_detail(conn, run_id, "s0")
    assert detail is not None and detail.state == "failed"
    attempts = conn.execute("SELECT attempt, error_class FROM responses ORDER BY id").fetchall()
    assert attempts == [(1, "RetryableError"), (2, "SampleFatalError")]
    assert detail.error == "prompt too long" and detail.content is None
    conn.close()


async def test_commands_are_taken_once_in_order(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path)
    await store.enqueue_command(run_id, "pause", {})
    await store.enqueue_command(run_id, "set_concurrency", {"n": 4})
    taken = await store.take_commands(run_id)
    assert [(c.verb, c.args) for c in taken] == [("pause", {}), ("set_concurrency", {"n": 4})]
    assert await store.take_commands(run_id) == []
    await store.close()


async def test_run_state_and_unknown_states(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path)
    await store.set_run_state(run_id, "paused", "budget reached")
    with pytest.raises(ValueError):
        await store.set_run_state(run_id, "sleeping")
    await store.close()
    conn = queries.connect_readonly(tmp_path / "runs.db")
    run = queries.run_by_name(conn, "r")
    assert run is not None and (run.state, run.reason) == ("paused", "budget reached")
    conn.close()


async def test_attach_references_joins_by_sample_id(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 3)
    refs = [ReferenceRecord("s0", (1, 2), "stop"), ReferenceRecord("s2", (3,), "length"), ReferenceRecord("zz", (4,))]
    assert await store.attach_references(run_id, refs) == (2, 1)
    assert await store.attach_references(run_id, refs) == (0, 1)  # nothing new the second time
    (leased, *_) = await store.lease(run_id, 3, 60)
    assert leased.reference_ids == (1, 2)
    await store.close()


async def test_closed_store_refuses_writes(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path)
    await store.close()
    with pytest.raises(EaglewatchError, match="closed"):
        await store.add_event(run_id, "info", "k", "late")


async def test_readers_keep_working_while_the_writer_commits(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 1)
    reader = queries.connect_readonly(tmp_path / "runs.db")
    seen: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def read_loop() -> None:
        try:
            while not stop.is_set():
                seen.append(sum(queries.state_counts(reader, run_id).values()))
                time.sleep(0.001)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=read_loop)
    thread.start()
    for batch in range(10):
        await store.ingest(run_id, samples(500, start=1 + batch * 500))
        reads = len(seen)
        for _ in range(5000):  # let the reader read between commits (bounded wait, no timing asserted)
            if len(seen) > reads or errors:
                break
            await asyncio.sleep(0.001)
    stop.set()
    thread.join()
    await store.close()
    reader.close()
    assert not errors
    assert len(seen) >= 10
    assert seen == sorted(seen)  # each read saw a committed state, never a half batch going backwards
    assert seen[-1] <= 5001 and all(n % 500 == 1 for n in seen)  # whole batches only
