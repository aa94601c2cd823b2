"""Row codecs: what the store writes for a Completion / Reconstruction is what the reads give back."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from app.records import Category, Completion, DiffSpan, Reconstruction, TokenLogprob, Usage, Verdict
from app.store import queries, rows
from app.store.store_records import ReconstructionLabels, ResultRecord
from tests.store.test_run_store import completion, open_with


async def test_a_completion_comes_back_from_its_responses_row(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 1)
    (leased,) = await store.lease(run_id, 1, 60)
    sent = replace(completion(), reasoning_logprobs=(TokenLogprob("th", (116, 104), -0.5),), generation_id="gen-7")
    response_id = await store.record_result(
        ResultRecord(run_id, leased.pk, 1, "sim", sent, 0.25, Reconstruction((1, 2), "logprobs"), None, (1, 2))
    )
    await store.close()

    conn = queries.connect_readonly(tmp_path / "runs.db")
    try:
        (stored,) = queries.latest_completions(conn, run_id)
    finally:
        conn.close()
    # reference ids are the sample's (it was ingested without any), not the old reconstruction's
    assert (stored.sample_pk, stored.sample_id, stored.response_id, stored.reference_ids) == (
        leased.pk,
        "s0",
        response_id,
        None,
    )
    got = stored.completion
    for name in (
        "content",
        "reasoning",
        "tool_calls",
        "finish_reason",
        "content_logprobs",
        "reasoning_logprobs",
        "token_ids",
        "provider",
        "model",
        "generation_id",
    ):
        assert getattr(got, name) == getattr(sent, name), name
    assert (got.ttft_s, got.total_s) == pytest.approx((sent.ttft_s, sent.total_s))


async def test_a_reconstruction_row_is_built_once_and_read_back_whole(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 2)
    a, b = await store.lease(run_id, 2, 60)
    verdict = Verdict(
        Category.TEXT_MISMATCH,
        first_diff=1,
        ref_len=3,
        rec_len=3,
        spans=(DiffSpan(1, 2, 1, 3),),
        explanation="text differs at token 1",
    )
    rec = Reconstruction((7, 8, 9), "canonical", repair="think_spaces", roundtrip=False, notes=("normaliser",))
    await store.record_result(
        ResultRecord(run_id, a.pk, 1, "sim", completion(), 0.0, rec, verdict, (7, 1, 9), profile="p", tokenizer="fp")
    )
    # a reprocess-style upsert of the second sample, with the v5 columns filled
    row = rows.reconstruction_row(
        run_id, b.pk, rec, None, None, ReconstructionLabels(ids_source="server", flags=("suspect_space",))
    )
    assert row.category == "unchecked" and row.n_tokens == 3
    assert await store.upsert_reconstructions([row]) == 1
    await store.close()

    conn = queries.connect_readonly(tmp_path / "runs.db")
    try:
        first = queries.reconstruction_of(conn, run_id, "s0")
        second = queries.reconstruction_of(conn, run_id, "s1")
        n_diff = dict(conn.execute("SELECT sample_pk, n_diff FROM reconstructions"))
    finally:
        conn.close()
    assert first is not None and second is not None
    assert (first.output_ids, first.reference_ids, first.category, first.first_diff, first.ref_len) == (
        (7, 8, 9),
        (7, 1, 9),
        "text_mismatch",
        1,
        3,
    )
    assert (first.repair, first.roundtrip, first.notes, first.spans) == (
        "think_spaces",
        False,
        ("normaliser",),
        ((1, 2, 1, 3),),
    )
    assert (first.profile, first.tokenizer, first.explanation) == ("p", "fp", "text differs at token 1")
    # record_result stores the Reconstruction's own provenance (none given here: no source, no flags)
    assert (first.ids_source, first.flags, first.prompt_check, first.prompt_first_diff) == (None, (), None, None)
    assert (second.ids_source, second.flags, second.reference_ids) == ("server", ("suspect_space",), None)
    assert n_diff == {a.pk: 2, b.pk: 0}  # computed from the spans by the upsert


async def test_a_result_record_is_stored_as_the_rows_built_from_it(tmp_path: Path) -> None:
    store, run_id = await open_with(tmp_path, 1)
    (leased,) = await store.lease(run_id, 1, 60)
    verdict = Verdict(
        Category.TEXT_MISMATCH,
        first_diff=0,
        ref_len=2,
        rec_len=2,
        spans=(DiffSpan(0, 1, 0, 1),),
        explanation="text differs at token 0",
    )
    rec = Reconstruction((4, 5), "canonical", ids_source="logprobs", flags=("suspect_space",))
    result = ResultRecord(
        run_id,
        leased.pk,
        3,
        "sim",
        completion(),
        0.125,
        rec,
        verdict,
        (6, 5),
        "failed",
        profile="p",
        tokenizer="fp",
        error_class="reconstruction",
        error="why",
        prompt_check="mismatch",
        prompt_first_diff=7,
    )
    response_id = await store.record_result(result)
    await store.close()

    conn = queries.connect_readonly(tmp_path / "runs.db")
    try:
        stored = queries.reconstruction_of(conn, run_id, "s0")
        response = conn.execute(
            "SELECT attempt, endpoint, cost_usd FROM responses WHERE id = ?", (response_id,)
        ).fetchone()
        sample = conn.execute(
            "SELECT state, tries, error_class, last_error FROM samples WHERE pk = ?", (leased.pk,)
        ).fetchone()
    finally:
        conn.close()
    built = rows.reconstruction_row(run_id, leased.pk, rec, verdict, (6, 5), result.labels(), response_id=response_id)
    assert stored is not None
    assert replace(stored, created_at=0.0) == replace(built, created_at=0.0)
    assert (stored.ids_source, stored.flags, stored.prompt_check, stored.prompt_first_diff) == (
        "logprobs",
        ("suspect_space",),
        "mismatch",
        7,
    )
    assert tuple(response) == (3, "sim", 0.125)
    assert tuple(sample) == ("failed", 3, "reconstruction", "why")


def test_raw_bodies_are_kept_only_when_asked_and_under_the_cap() -> None:
    c = replace(completion(), raw=[{"id": "chunk-1", "choices": []}])
    assert rows.encode_response(1, 1, 1, "e", c, 0.0)[rows.RESPONSE_COLUMNS.index("raw")] is None
    kept = rows.encode_response(1, 1, 1, "e", c, 0.0, keep_raw=True)[rows.RESPONSE_COLUMNS.index("raw")]
    assert kept == '[{"id":"chunk-1","choices":[]}]'
    assert rows.encode_raw(c.raw, max_bytes=len(kept) - 1) is None
    assert rows.encode_raw(object()) is None  # not JSON: dropped, never an error mid-run


def test_encode_reconstruction_refuses_an_unknown_column() -> None:
    row = rows.reconstruction_row(1, 1, Reconstruction((1,), "none"), None, None)
    assert rows.encode_reconstruction(row, response_id=5)["response_id"] == 5
    with pytest.raises(KeyError, match="respons_id"):
        rows.encode_reconstruction(row, respons_id=5)


def test_every_column_the_codec_writes_exists(tmp_path: Path) -> None:
    from app.store.db import migrate

    db = tmp_path / "x.db"
    migrate(db)
    conn = sqlite3.connect(db)
    columns = {r[1] for r in conn.execute("PRAGMA table_info(reconstructions)")}
    assert set(rows.RECONSTRUCTION_COLUMNS) <= columns
    assert set(rows.RESPONSE_COLUMNS) <= {r[1] for r in conn.execute("PRAGMA table_info(responses)")}
    conn.close()


# ---- what the codecs refuse to write ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "cost", "column"),
    [
        (Completion("ok"), float("nan"), "responses.cost_usd"),
        (Completion("ok"), float("inf"), "responses.cost_usd"),
        (Completion("ok"), -1.0, "responses.cost_usd"),
        (Completion("ok", usage=Usage(prompt_tokens=2**64)), 0.0, "responses.prompt_tokens"),
        (Completion("ok", usage=Usage(completion_tokens=-1)), 0.0, "responses.completion_tokens"),
        (Completion("a\ud83db"), 0.0, "responses.content"),
        (Completion("ok", reasoning="\udc00"), 0.0, "responses.reasoning"),
        (Completion("ok", token_ids=(1, -5)), 0.0, "responses.token_ids"),
        (Completion("ok", prompt_token_ids=(2**33,)), 0.0, "responses.prompt_ids"),
        (Completion("ok", content_logprobs=(TokenLogprob("o", None, math.nan),)), 0.0, "responses.logprobs"),
    ],
)
def test_a_value_the_table_cannot_hold_is_refused_naming_its_column(completion, cost, column):
    with pytest.raises(rows.RowError) as caught:
        rows.encode_response(1, 1, 1, "e", completion, cost)
    assert caught.value.column == column and str(caught.value).startswith(column)


def test_any_message_can_be_stored_once_cleaned():
    assert rows.clean_text("plain") == "plain" and rows.clean_text("a\ud83db") == "a\ufffdb"
    rows.clean_text("a\ud83db").encode("utf-8")
