"""The attached data source over a real run database: paging, details, diffs, jobs and events."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import InputError
from app.tui.db_source import AttachedSource
from app.tui.source import MISMATCH_ORDERS, MISMATCH_VERDICTS

KEYSET_ORDERS = ("sample", "recent", "verdict", "longest")  # the orders whose pages turn by key


@pytest.mark.parametrize("order", list(MISMATCH_ORDERS))
def test_pages_turned_by_key_match_pages_by_offset(run_db: Path, order: str) -> None:
    reader = AttachedSource(run_db).reader
    by_offset = [reader.mismatch_page(MISMATCH_VERDICTS, "", order, offset, 30).rows for offset in range(0, 160, 30)]
    page = reader.mismatch_page(MISMATCH_VERDICTS, "", order, 0, 30)
    forward = [page.rows]
    while len(page.rows) == 30:
        page = reader.mismatch_page(MISMATCH_VERDICTS, "", order, page.offset + 30, 30, after=page.rows[-1])
        if page.rows:
            forward.append(page.rows)
    if order in KEYSET_ORDERS:
        assert forward == by_offset
    back = reader.mismatch_page(MISMATCH_VERDICTS, "", order, 30, 30, before=by_offset[2][0])
    if order in KEYSET_ORDERS:
        assert back.rows == by_offset[1]
    assert sum(len(rows) for rows in by_offset) == 160


def test_tokens_differing_order_by_index_matches_the_sorted_path(run_db: Path) -> None:
    reader = AttachedSource(run_db).reader

    # no text filter: the n_diff index; a filter every sample id matches ("s"): the Python sort
    def rows(text: str) -> list:
        pages = (reader.mismatch_page(MISMATCH_VERDICTS, text, "n_diff", offset, 30) for offset in range(0, 160, 30))
        return [row for page in pages for row in page.rows]

    indexed, sorted_ = rows(""), rows("s")
    assert len(indexed) == 160 and indexed == sorted_
    keys = [(-row.n_diff, row.pk) for row in indexed]
    assert keys == sorted(keys) and indexed[0].n_diff > indexed[-1].n_diff


def test_mismatch_rows_carry_lengths_and_tokens_differing(run_db: Path) -> None:
    reader = AttachedSource(run_db).reader
    page = reader.mismatch_page(("truncated",), "", "sample", 0, 5)
    assert page.total == 40
    row = page.rows[0]
    assert row.category == "truncated" and row.rec_len < row.ref_len
    assert row.n_diff == row.ref_len - row.rec_len
    assert row.first_diff == row.rec_len


def test_text_filter_matches_sample_ids_datasets_and_explanations(run_db: Path) -> None:
    reader = AttachedSource(run_db).reader
    assert reader.mismatch_page(MISMATCH_VERDICTS, "s001", "sample", 0, 50).total == len(
        [i for i in range(10, 20) if i % 6 not in (0, 4)]
    )
    code = reader.mismatch_page(MISMATCH_VERDICTS, "code", "sample", 0, 200)
    assert code.rows and all(row.dataset == "code" for row in code.rows)
    assert reader.mismatch_page(MISMATCH_VERDICTS, "100%_", "sample", 0, 50).total == 0  # wildcards are literal


def test_diff_aligns_reference_and_reconstruction_with_the_run_tokenizer(run_db: Path) -> None:
    source = AttachedSource(run_db)
    diff = source.sample_diff("s0002")  # a text mismatch: one token changed
    assert diff.category == "text_mismatch"
    assert diff.alignment.ref_len == diff.alignment.rec_len
    assert len(diff.alignment.diff_blocks) == 1
    assert "corrupt" in diff.headline


def test_diff_of_an_unknown_sample_names_it(run_db: Path) -> None:
    with pytest.raises(InputError, match="no sample 'nope'"):
        AttachedSource(run_db).sample_diff("nope")


def test_sample_detail_reads_the_latest_response(run_db: Path) -> None:
    detail = AttachedSource(run_db).sample_detail("s0003")
    assert detail.category == "truncated" and detail.endpoint == "sim-a"
    assert detail.reasoning == "thinking about gates"
    assert detail.prompt[0]["content"] == "question 3"
    assert '"gen-3"' in detail.raw


def test_jobs_show_shard_progress_and_the_log_tail(run_db: Path) -> None:
    source = AttachedSource(run_db)
    (job,) = source.jobs()
    assert (job.job_id, job.state, job.shards_done, job.shards_total, job.tokens) == (1, "running", 2, 4, 20000)
    assert '"event": "progress"' in source.job_log(1, 5)


def test_events_come_oldest_first(run_db: Path) -> None:
    events = AttachedSource(run_db).events(5)
    assert [e.kind for e in events] == ["run", "endpoint"]


def test_a_file_that_is_not_a_database_is_refused_with_its_name(tmp_path: Path) -> None:
    from app.tui.db_source import open_attached

    bogus = tmp_path / "notes.db"
    bogus.write_text("not sqlite")
    with pytest.raises(InputError, match="notes.db"):
        open_attached(bogus, None, readonly=True)
