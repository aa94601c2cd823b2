"""Read integer-list columns from an Arrow IPC stream file, the format Hugging Face `datasets.save_to_disk`
writes (`data-XXXXX-of-YYYYY.arrow`), with pyarrow.

One `list<int>` / `large_list<int>` column of every record batch, read through a memory map so a row's ids are a
zero-copy view of the values buffer. Nulls in the column and a column of another type are refused with a
sentence naming the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from app.errors import InputError


class IntListColumn:
    """The rows of one `list<int>` column of an Arrow stream file, batch by batch, as memoryviews of their values
    (little-endian, `item_size` bytes each)."""

    def __init__(self, path: Path, column: str) -> None:
        import pyarrow as pa

        self.path = Path(path)
        self.column = column
        self.item_size = 0
        if not self.path.exists():
            raise InputError(f"{self.path}: not found")
        if self.path.stat().st_size == 0:
            raise InputError(f"{self.path}: empty, not an Arrow stream")
        self._map = pa.memory_map(str(self.path))

    def close(self) -> None:
        """Release the memory map (a row view handed out keeps its buffer alive)."""
        self._map.close()

    def rows(self) -> Iterator[memoryview]:
        """Each row's values, in file order."""
        import pyarrow as pa

        try:
            reader = pa.ipc.open_stream(self._map)
            schema = reader.schema
            if self.column not in schema.names:
                raise InputError(f"{self.path}: no column {self.column!r} (columns: {', '.join(schema.names)})")
            kind = schema.field(self.column).type
            if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type):
                name = "Int" if pa.types.is_integer(kind) else str(kind)
                raise InputError(f"{self.path}: column {self.column!r} is {name}, not a list of integers")
            self.item_size = kind.value_type.bit_width // 8
            index = schema.get_field_index(self.column)
            for batch in reader:
                yield from self._batch_rows(batch.column(index))
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(
                f"{self.path}: a message runs past the end or is malformed ({exc}); not an Arrow stream file"
            ) from None

    def _batch_rows(self, col) -> Iterator[memoryview]:  # noqa: ANN001 (a pyarrow ListArray)
        if col.null_count:
            raise InputError(f"{self.path}: column {self.column!r} has {col.null_count} null rows")
        offsets = col.offsets.to_numpy()
        values = col.values
        item = self.item_size
        start = values.offset
        view = memoryview(values.buffers()[1]).cast("B")
        base = start * item
        for i in range(len(col)):
            yield view[base + int(offsets[i]) * item : base + int(offsets[i + 1]) * item]


def prepared_files(prepared: Path) -> list[Path]:
    """The Arrow files of a dataset `save_to_disk` wrote to `prepared`, in row order (state.json `_data_files`)."""
    import json

    state = prepared / "state.json"
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{prepared}: holds no state.json; not a dataset written by `speculators prepare-data` "
            "(datasets.save_to_disk)"
        ) from None
    except ValueError as exc:
        raise InputError(f"{state}: not valid JSON ({exc})") from None
    files = [prepared / entry["filename"] for entry in data.get("_data_files") or [] if isinstance(entry, dict)]
    if not files:
        raise InputError(f"{state}: lists no data files")
    return files
