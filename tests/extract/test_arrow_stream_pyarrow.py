"""The Arrow stream reader on stream files pyarrow writes in the `datasets` save_to_disk layout (no trainer env)."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pyarrow as pa
import pytest

from app.errors import InputError
from app.extract.arrow_stream import IntListColumn, prepared_files


def _write(path: Path, table: pa.Table, chunk: int = 3) -> Path:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=chunk)
    return path


def _read(path: Path, column: str = "input_ids") -> list[list[int]]:
    col = IntListColumn(path, column)
    try:
        return [array("q", bytes(v)).tolist() for v in col.rows()]
    finally:
        col.close()


ROWS = [[i, i + 1, 2**40 + i][: 1 + i % 3] for i in range(10)]


@pytest.mark.parametrize("large", [False, True])
def test_rows_come_back_in_order_across_record_batches(tmp_path: Path, large: bool) -> None:
    kind = pa.large_list(pa.int64()) if large else pa.list_(pa.int64())
    table = pa.table({"input_ids": pa.array(ROWS, kind), "seq_len": pa.array([len(r) for r in ROWS], pa.int64())})
    assert _read(_write(tmp_path / "a.arrow", table)) == ROWS


def test_a_sliced_table_keeps_its_offsets(tmp_path: Path) -> None:
    table = pa.table({"input_ids": pa.array(ROWS, pa.list_(pa.int64()))}).slice(4)
    assert _read(_write(tmp_path / "s.arrow", table, chunk=100)) == ROWS[4:]


def test_nulls_and_wrong_columns_are_named(tmp_path: Path) -> None:
    table = pa.table({"input_ids": pa.array([[1], None], pa.list_(pa.int64())), "seq_len": pa.array([1, 0])})
    path = _write(tmp_path / "n.arrow", table)
    with pytest.raises(InputError, match="column 'input_ids' has 1 null rows"):
        _read(path)
    with pytest.raises(InputError, match=r"no column 'token_ids' \(columns: input_ids, seq_len\)"):
        _read(path, "token_ids")
    with pytest.raises(InputError, match="column 'seq_len' is Int, not a list of integers"):
        _read(path, "seq_len")


def test_junk_is_not_an_arrow_stream(tmp_path: Path) -> None:
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"\xff\xff\xff\xff\x00\x10\x00\x00hello")
    with pytest.raises(InputError, match="runs past the end"):
        _read(junk)


def test_prepared_files_follow_state_json(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "b.arrow"}, {"filename": "a.arrow"}]})
    )
    assert [p.name for p in prepared_files(tmp_path)] == ["b.arrow", "a.arrow"]
