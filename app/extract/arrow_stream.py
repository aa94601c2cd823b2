"""Read integer-list columns from an Arrow IPC stream file, the format Hugging Face `datasets.save_to_disk`
writes (`data-XXXXX-of-YYYYY.arrow`), without pyarrow.

Enough of the format to find one `list<int>` / `large_list<int>` column in every record batch: the
encapsulated messages (continuation marker, length, flatbuffer `Message`, body), the `Schema` (fields, types,
children) and each `RecordBatch`'s field nodes and buffers, per the Arrow columnar format specification
(format/Message.fbs, format/Schema.fbs). Compressed bodies, dictionary batches on the wanted column and nulls in
it are refused with a sentence naming the file. The body is read through a memory map, so a row's ids are a
zero-copy view.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.errors import InputError

# Schema.fbs `Type` union members and how many buffers each takes in a record batch (validity first)
_TYPE_NAMES = {1: "Null", 2: "Int", 3: "FloatingPoint", 4: "Binary", 5: "Utf8", 6: "Bool", 7: "Decimal", 8: "Date",
               9: "Time", 10: "Timestamp", 11: "Interval", 12: "List", 13: "Struct", 14: "Union",
               15: "FixedSizeBinary", 16: "FixedSizeList", 17: "Map", 18: "Duration", 19: "LargeBinary",
               20: "LargeUtf8", 21: "LargeList"}
_BUFFERS = {1: 0, 2: 2, 3: 2, 4: 3, 5: 3, 6: 2, 7: 2, 8: 2, 9: 2, 10: 2, 11: 2, 12: 2, 13: 1, 15: 2, 16: 1, 17: 2,
            18: 2, 19: 3, 20: 3, 21: 2}
_SCHEMA, _RECORD_BATCH, _DICTIONARY_BATCH = 1, 3, 2


class _Table:
    """A flatbuffer table at `pos` in `buf`: fields by their vtable slot."""

    __slots__ = ("buf", "pos", "vtable", "vsize")

    def __init__(self, buf: memoryview | bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vsize = struct.unpack_from("<H", buf, self.vtable)[0]

    def _offset(self, slot: int) -> int:
        at = 4 + 2 * slot
        return struct.unpack_from("<H", self.buf, self.vtable + at)[0] if at < self.vsize else 0

    def scalar(self, slot: int, fmt: str, default: int = 0) -> int:
        off = self._offset(slot)
        return struct.unpack_from("<" + fmt, self.buf, self.pos + off)[0] if off else default

    def _indirect(self, slot: int) -> int | None:
        off = self._offset(slot)
        if not off:
            return None
        at = self.pos + off
        return at + struct.unpack_from("<I", self.buf, at)[0]

    def table(self, slot: int) -> _Table | None:
        at = self._indirect(slot)
        return None if at is None else _Table(self.buf, at)

    def string(self, slot: int) -> str:
        at = self._indirect(slot)
        if at is None:
            return ""
        n = struct.unpack_from("<I", self.buf, at)[0]
        return bytes(self.buf[at + 4: at + 4 + n]).decode("utf-8")

    def tables(self, slot: int) -> list[_Table]:
        at = self._indirect(slot)
        if at is None:
            return []
        n = struct.unpack_from("<I", self.buf, at)[0]
        out = []
        for i in range(n):
            elem = at + 4 + 4 * i
            out.append(_Table(self.buf, elem + struct.unpack_from("<I", self.buf, elem)[0]))
        return out

    def structs(self, slot: int) -> tuple[int, int]:
        """(position of the first struct, count) of a vector of fixed-size structs."""
        at = self._indirect(slot)
        if at is None:
            return 0, 0
        return at + 4, struct.unpack_from("<I", self.buf, at)[0]


@dataclass
class _Field:
    name: str
    type_id: int
    bit_width: int = 0  # Int
    children: list[_Field] = field(default_factory=list)


def _field(table: _Table) -> _Field:
    type_id = table.scalar(2, "B")
    bit_width = 0
    if type_id == 2:
        int_type = table.table(3)
        bit_width = int_type.scalar(0, "i") if int_type is not None else 0
    return _Field(table.string(0), type_id, bit_width, [_field(c) for c in table.tables(5)])


def _walk(fields: list[_Field]) -> Iterator[_Field]:
    for f in fields:
        yield f
        yield from _walk(f.children)


class IntListColumn:
    """The rows of one `list<int>` column of an Arrow stream file, batch by batch, as memoryviews of their values
    (little-endian, `item_size` bytes each)."""

    def __init__(self, path: Path, column: str) -> None:
        self.path = Path(path)
        self.column = column
        try:
            with self.path.open("rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise InputError(f"{self.path}: not found") from None
        except ValueError:  # an empty file cannot be mapped
            raise InputError(f"{self.path}: empty, not an Arrow stream") from None
        self._view = memoryview(self._map)
        self.item_size = 0

    def close(self) -> None:
        """Release the memory map; while a row view handed out is still alive, the map stays for the garbage
        collector to close."""
        try:
            self._view.release()
            self._map.close()
        except BufferError:
            pass

    def _messages(self) -> Iterator[tuple[int, _Table, int]]:
        """(header type, header table, body position) of each message, in order."""
        buf, at, end = self._view, 0, len(self._view)
        while at + 4 <= end:
            (size,) = struct.unpack_from("<i", buf, at)
            at += 4
            if size == -1:  # continuation marker, then the length
                if at + 4 > end:
                    break
                (size,) = struct.unpack_from("<i", buf, at)
                at += 4
            if size == 0:  # end of stream
                return
            if size < 0 or at + size > end:
                raise InputError(f"{self.path}: a message at byte {at} runs past the end; not an Arrow stream file")
            meta = memoryview(buf[at: at + size])
            message = _Table(meta, struct.unpack_from("<I", meta, 0)[0])
            header_type = message.scalar(1, "B")
            header = message.table(2)
            body_length = message.scalar(3, "q")
            if header is None:
                raise InputError(f"{self.path}: a message at byte {at} has no header")
            at += size
            yield header_type, header, at
            at += body_length

    def rows(self) -> Iterator[memoryview]:
        """Each row's values, in file order."""
        fields: list[_Field] | None = None
        target = -1
        for kind, header, body in self._messages():
            if kind == _SCHEMA:
                fields = [_field(t) for t in header.tables(1)]
                flat = list(_walk(fields))
                names = [f.name for f in fields]
                if self.column not in names:
                    raise InputError(f"{self.path}: no column {self.column!r} (columns: {', '.join(names)})")
                col = fields[names.index(self.column)]
                if col.type_id not in (12, 21) or len(col.children) != 1 or col.children[0].type_id != 2:
                    kind_name = _TYPE_NAMES.get(col.type_id, str(col.type_id))
                    raise InputError(f"{self.path}: column {self.column!r} is {kind_name}, not a list of integers")
                unknown = [f for f in flat if f.type_id not in _BUFFERS]
                if unknown:
                    raise InputError(f"{self.path}: column type {_TYPE_NAMES.get(unknown[0].type_id, unknown[0].type_id)}"
                                     f" ({unknown[0].name!r}) is not readable here")
                target = flat.index(col)
                self._flat = flat
                self.item_size = col.children[0].bit_width // 8
                self._offset_size = 8 if col.type_id == 21 else 4
            elif kind == _DICTIONARY_BATCH:
                continue
            elif kind == _RECORD_BATCH:
                if fields is None:
                    raise InputError(f"{self.path}: a record batch comes before the schema")
                yield from self._batch_rows(header, body, target)

    def _batch_rows(self, batch: _Table, body: int, target: int) -> Iterator[memoryview]:
        if batch.table(3) is not None:
            raise InputError(f"{self.path}: compressed record batches are not readable here; save the dataset "
                             "uncompressed")
        length = batch.scalar(0, "q")
        nodes_at, _ = batch.structs(1)
        buffers_at, n_buffers = batch.structs(2)
        buf = batch.buf
        buffer_index = sum(_BUFFERS[f.type_id] for f in self._flat[:target])
        node = struct.unpack_from("<qq", buf, nodes_at + 16 * target)
        if node[1]:
            raise InputError(f"{self.path}: column {self.column!r} has {node[1]} null rows")
        if buffer_index + 4 > n_buffers:
            raise InputError(f"{self.path}: a record batch has too few buffers for column {self.column!r}")
        offsets_at, _ = struct.unpack_from("<qq", buf, buffers_at + 16 * (buffer_index + 1))
        values_at, values_len = struct.unpack_from("<qq", buf, buffers_at + 16 * (buffer_index + 3))
        fmt = f"<{length + 1}{'q' if self._offset_size == 8 else 'i'}"
        offsets = struct.unpack_from(fmt, self._view, body + offsets_at)
        item = self.item_size
        values = self._view[body + values_at: body + values_at + values_len]
        for i in range(length):
            yield values[offsets[i] * item: offsets[i + 1] * item]


def prepared_files(prepared: Path) -> list[Path]:
    """The Arrow files of a dataset `save_to_disk` wrote to `prepared`, in row order (state.json `_data_files`)."""
    import json

    state = prepared / "state.json"
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{prepared}: holds no state.json; not a dataset written by `speculators prepare-data` "
                         "(datasets.save_to_disk)") from None
    except ValueError as exc:
        raise InputError(f"{state}: not valid JSON ({exc})") from None
    files = [prepared / entry["filename"] for entry in data.get("_data_files") or [] if isinstance(entry, dict)]
    if not files:
        raise InputError(f"{state}: lists no data files")
    return files
