"""The Arrow stream reader behind the speculators layout, on files Hugging Face `datasets` and pyarrow wrote."""

from __future__ import annotations

from array import array

import pytest

from app.errors import InputError
from app.extract.arrow_stream import IntListColumn, prepared_files
from tests.export.trainers.env import run_consumer


def _read(path, column="input_ids"):
    col = IntListColumn(path, column)
    try:
        return [array("q", bytes(v)).tolist() for v in col.rows()]
    finally:
        col.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    torch = pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("arrow")
    run_consumer("arrow-datasets", base, result=base / "r.pt")
    return base, torch.load(base / "r.pt")


def test_it_reads_what_datasets_save_to_disk_wrote_in_row_order(written):
    base, want = written
    files = prepared_files(base / "ds")
    assert len(files) == 2 and min(want["batches"]) > 1  # two shards, each of several record batches
    assert [row for f in files for row in _read(f)] == want["ds"]


def test_it_reads_a_large_list_column_batch_by_batch(written):
    base, want = written
    assert _read(base / "large.arrow") == want["large"]


def test_a_missing_or_wrong_column_is_named(written):
    base, _ = written
    path = prepared_files(base / "ds")[0]
    with pytest.raises(InputError, match=r"no column 'token_ids' \(columns: input_ids, loss_mask, seq_len\)"):
        _read(path, "token_ids")
    with pytest.raises(InputError, match="column 'seq_len' is Int, not a list of integers"):
        _read(path, "seq_len")


def test_a_folder_or_file_that_is_no_dataset_is_refused(tmp_path):
    with pytest.raises(InputError, match="holds no state.json"):
        prepared_files(tmp_path)
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"\xff\xff\xff\xff\x00\x10\x00\x00hello")
    with pytest.raises(InputError, match="runs past the end"):
        _read(junk)
