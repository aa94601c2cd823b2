"""The counts part of a run's record (`queries.run_counts`): what each answer is, from the quality tallies that
the writers' triggers keep, in the vocabulary of app.records, equal to a recount after every kind of write."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from app.records import Completion, Reconstruction, Usage, Verdict, Verification, verification_of
from app.store import queries, tallies
from app.store.count_records import AnswerCounts, fold_answers, merge_answers
from app.store.rows import ReconstructionRow
from app.store.run_store import RunStore
from app.store.store_records import ResultRecord, SampleInput
from app.tokens.flags import SUSPECT_FLAGS, TEXT_PATH, is_suspect, text_path_flag


def _completion(provider: str, finish: str = "stop") -> Completion:
    return Completion(
        content="hi",
        finish_reason=finish,
        usage=Usage(prompt_tokens=3, completion_tokens=4),
        total_s=0.5,
        ttft_s=0.1,
        provider=provider,
    )


async def _run_db(path: Path) -> tuple[int, dict[str, int]]:
    """One run: seven answers, one of each kind, over two endpoints and providers; one failed sample."""
    store = await RunStore.open(path)
    run = await store.ensure_run("r", {})
    await store.ingest(
        run, [SampleInput(f"s{i}", "d", [{"role": "user", "content": str(i)}], None, None) for i in range(8)]
    )
    leased = {s.sample_id: s for s in await store.lease(run, 8, 60.0)}
    kinds = [  # sample, endpoint, provider, finish, reconstruction, verdict, prompt check
        (
            "s0",
            "ep-a",
            "P1",
            "stop",
            Reconstruction((1,), "server_ids", ids_source="server", flags=(text_path_flag("text_mismatch"),)),
            "unchecked",
            "agree",
        ),
        ("s1", "ep-a", "P1", "stop", Reconstruction((1,), "canonical", ids_source="text"), "exact", None),
        ("s2", "ep-a", "P2", "stop", Reconstruction((1,), "canonical", ids_source="text"), "text_mismatch", None),
        (
            "s3",
            "ep-b",
            "",
            "stop",
            Reconstruction((1,), "canonical", ids_source="text", flags=("replacement_char",)),
            "unchecked",
            None,
        ),
        ("s4", "ep-b", "", "length", Reconstruction((1,), "canonical", ids_source="text"), "truncated", None),
        (
            "s5",
            "ep-b",
            "",
            "stop",
            Reconstruction((1,), "logprobs", ids_source="logprobs", flags=(text_path_flag("exact"),)),
            "bpe_equivalent",
            "differ",
        ),
        ("s6", "ep-b", "", "length", Reconstruction((1,), "canonical", ids_source="text"), "unchecked", None),
    ]
    for sid, endpoint, provider, finish, rec, category, check in kinds:
        await store.record_result(
            ResultRecord(
                run,
                leased[sid].pk,
                1,
                endpoint,
                _completion(provider or None, finish),
                0.1,
                rec,
                Verdict(category, rec_len=1),
                prompt_check=check,
            )
        )
    await store.record_failure(run, leased["s7"].pk, "5xx", "503", final=True, endpoint="ep-a", attempt=1)
    await store.close()
    return run, {sid: leased[sid].pk for sid in leased}


def _recounted_equals_kept(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        kept = sorted(r for r in conn.execute("SELECT * FROM quality_tallies") if r[-1])
        tallies.recount(conn)
        assert sorted(r for r in conn.execute("SELECT * FROM quality_tallies") if r[-1]) == kept
    finally:
        conn.close()


async def test_every_answer_is_counted_as_what_it_is(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    run, _ = await _run_db(db)
    conn = queries.connect_readonly(db)
    try:
        c = queries.run_counts(conn, run)
    finally:
        conn.close()
    a = c.answers
    assert (c.samples.done, c.samples.failed, c.samples.pending, c.samples.total) == (7, 1, 0, 8)
    assert a.answers == 7 and dict(a.verdicts) == {
        "exact": 1,
        "bpe_equivalent": 1,
        "text_mismatch": 1,
        "structure_mismatch": 0,
        "truncated": 1,
        "unchecked": 3,
    }
    # verified: s0 (server ids), s5 (logprobs); checked against a reference: s1 (exact), s2 (corrupt), s4
    # (truncated); unchecked: s3, s6 (text, no reference)
    assert a.verification() == {"verified": 2, "checked_against_reference": 3, "unchecked": 2}
    assert (a.measured, a.measured_exact, a.measured_corrupt, a.measured_matched) == (2, 1, (("text_mismatch", 1),), 1)
    assert (a.suspects, a.truncated, a.corrupt) == (1, 2, 1)  # truncated: s4's verdict, s6's finish_reason
    assert dict(a.prompt_checks) == {"agree": 1, "differ": 1}
    assert c.requests == 8 and dict(c.errors_by_class) == {"5xx": 1} and c.retried == 0
    assert [(e.name, e.completed, e.failed) for e in c.endpoints] == [("ep-a", 3, 1), ("ep-b", 4, 0)]
    per = {(p.endpoint, p.provider): p.answers for p in c.providers}
    assert set(per) == {("ep-a", "P1"), ("ep-a", "P2"), ("ep-b", None)}
    assert (per[("ep-a", "P1")].verified, per[("ep-a", "P1")].checked, per[("ep-a", "P2")].checked) == (1, 1, 1)
    assert merge_answers(*per.values()) == a  # the providers' rows add up to the run's
    _recounted_equals_kept(db)


async def test_a_reprocess_moves_an_answer_to_its_new_class_and_a_recount_agrees(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    run, pks = await _run_db(db)
    conn = sqlite3.connect(db)
    response = conn.execute("SELECT id FROM responses WHERE sample_pk = ?", (pks["s2"],)).fetchone()[0]
    conn.close()
    store = await RunStore.open(db)
    # s2 reconstructed again (e.g. with a fixed profile): now exact, still a text reconstruction a reference checked;
    # its
    # response (and endpoint) kept
    await store.upsert_reconstructions(
        [
            ReconstructionRow(
                run_id=run,
                sample_pk=pks["s2"],
                strategy="canonical",
                output_ids=(1,),
                category="exact",
                response_id=response,
                ids_source="text",
                created_at=time.time(),
            )
        ]
    )
    await store.close()
    conn = queries.connect_readonly(db)
    try:
        c = queries.run_counts(conn, run)
    finally:
        conn.close()
    assert c.answers.verification() == {"verified": 2, "checked_against_reference": 3, "unchecked": 2}
    assert dict(c.answers.verdicts)["text_mismatch"] == 0 and dict(c.answers.verdicts)["exact"] == 2
    assert {(p.endpoint, p.provider): p.answers.checked for p in c.providers}[("ep-a", "P2")] == 1
    _recounted_equals_kept(db)


def test_the_tally_calls_suspect_what_the_export_calls_suspect() -> None:
    # the trigger counts a flag as suspect unless it is the informational text_path one: the rule of
    # app.tokens.flags.is_suspect for every flag the project writes
    assert not any(f.startswith(TEXT_PATH) for f in SUSPECT_FLAGS)
    assert all(is_suspect([f]) for f in SUSPECT_FLAGS) and not is_suspect([text_path_flag("exact")])


@pytest.mark.parametrize(
    ("source", "category", "expected"),
    [
        ("server", "text_mismatch", Verification.VERIFIED),  # true ids, whatever the reference says
        ("logprobs", "unchecked", Verification.VERIFIED),
        ("text", "bpe_equivalent", Verification.CHECKED),  # a reference judged it: the same text
        ("text", "truncated", Verification.CHECKED),
        ("text", "structure_mismatch", Verification.CHECKED),
        ("text", "unchecked", Verification.UNCHECKED),
        (None, "unchecked", Verification.UNCHECKED),
    ],
)
def test_verification_classes(source, category, expected) -> None:
    assert verification_of(source, category) == expected


def test_an_empty_run_has_every_verdict_at_zero() -> None:
    assert fold_answers([]) == AnswerCounts()
    assert dict(AnswerCounts().verdicts)["unchecked"] == 0
