"""Streaming readers for prompt datasets and SGLang-style reference files: JSON lines (plain, .gz, .zst), JSON arrays,
Parquet, Arrow and `datasets` save_to_disk folders (`container_of` tells which from the name).

Files are read row by row, never whole (JSON arrays with ijson's incremental parser, Parquet by row group, Arrow by
record batch). A row's position is its line, or its row index from 1 for arrays and tables. A bad line is counted and
skipped, and its `file:line:column: reason`
(`file:line: reason` when the problem is not at one place in the text) kept (the first few) in the `ReadStats`
passed in; without one, the first bad line raises InputError. Columns count characters from 1, as editors do.

Formats (with `regenerate = "last"`, the default, the prompt is the conversation without its trailing assistant
turn, which is what we regenerate; with `regenerate = "all"` each line is a whole conversation whose assistant
turns are all regenerated in order: `iter_conversations`, turns split by `app.conversation.split_turns`):
- openai-messages:          {"id", "messages": [{"role", "content", ...}], "tools"?}
- sharegpt:                 {"id", "conversations": [{"from": "human"|"gpt"|"system"|"tool", "value"}], "tools"?}
- specforge-conversations:  {"id", "conversations": [{"role", "content"}], "tools"?}
- prompt-response / alpaca (only through "auto"): {"prompt", "response"?} / {"instruction", "input"?, "output"?}
- auto:                     each row's format told from its columns (`row_format`)
- reference (SGLang-style): {"id", "messages", "output_ids": [int], "meta_info": {"finish_reason": ...}}
A line without an id gets a stable content hash of its prompt ("h-" + 16 hex digits).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from app.conversation import ConversationInput, ConversationShapeError, conversation_content_id, split_turns
from app.errors import InputError
from app.store.store_records import ReferenceRecord, SampleInput

T = TypeVar("T")

FORMATS = ("openai-messages", "sharegpt", "specforge-conversations", "auto")
ROLES = ("system", "developer", "user", "assistant", "tool")
_ROLE_SET = frozenset(ROLES)
_CONTENT_TYPES = (str, list)
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
}
MAX_EXAMPLES = 5


@dataclass
class ReadStats:
    """What a reader saw so far: lines, bytes (for progress), and the bad lines with the first few reasons."""

    lines: int = 0
    bytes_read: int = 0
    good: int = 0
    bad: int = 0
    examples: list[str] = field(default_factory=list)
    formats: dict[str, int] = field(default_factory=dict)  # good rows per row format (what "auto" told apart)

    def reject(self, where: str, reason: str) -> None:
        """Count a bad line and keep its `file:line: reason` if among the first few."""
        self.bad += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{where}: {reason}")


class _BadLine(Exception):
    """A line that cannot be used; `column` (1-based, in characters) where the problem is, when it is at one place."""

    def __init__(self, reason: str, column: int | None = None) -> None:
        super().__init__(reason)
        self.column = column

    def where(self, path: Path | str, number: int) -> str:
        """`file:line:column` (or `file:line`)."""
        return f"{path}:{number}:{self.column}" if self.column is not None else f"{path}:{number}"


def content_id(messages: list[dict[str, Any]], tools: list[Any] | None) -> str:
    """A stable id for a sample that has none: a hash of its prompt messages and tools."""
    blob = json.dumps({"messages": messages, "tools": tools}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "h-" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _open(path: Path) -> Any:
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; check the dataset path in the config") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def container_of(path: str | Path) -> str:
    """How a dataset file holds its rows, guessed from its name (and, for `.json`, its first byte): "jsonl",
    "jsonl.gz", "jsonl.zst", "json-array", "parquet", "arrow" (an IPC file or stream) or "arrow-dir" (a
    `datasets` `save_to_disk` folder)."""
    path = Path(path)
    if path.is_dir():
        return "arrow-dir"
    name = path.name.lower()
    if name.endswith(".gz"):
        return "jsonl.gz"
    if name.endswith((".zst", ".zstd")):
        return "jsonl.zst"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".arrow", ".feather", ".ipc")):
        return "arrow"
    if name.endswith(".json"):
        try:
            with path.open("rb") as fh:
                head = fh.read(4096).lstrip()
        except OSError:
            return "jsonl"
        return "json-array" if head.startswith(b"[") else "jsonl"
    return "jsonl"


def _lines(path: Path, stats: ReadStats) -> Iterator[tuple[int, bytes | dict[str, Any] | _NotAnObject]]:
    """Each row of a dataset file with its position (the line; the row index, from 1, for arrays and tables):
    raw JSON bytes for the text containers, an already decoded dict for Parquet and Arrow."""
    kind = container_of(path)
    if kind in ("parquet", "arrow", "arrow-dir"):
        yield from _table_rows(path, kind, stats)
        return
    if kind == "json-array":
        yield from _array_rows(path, stats)
        return
    fh = _open(path)
    with fh:
        if kind == "jsonl.gz":
            import gzip

            stream: Any = gzip.GzipFile(fileobj=fh)
        elif kind == "jsonl.zst":
            import io

            import zstandard

            stream = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(fh), 1 << 20)
        else:
            stream = fh
        compressed = stream is not fh
        try:
            for number, line in enumerate(stream, 1):
                stats.lines = number
                stats.bytes_read = fh.tell() if compressed else stats.bytes_read + len(line)
                if line.strip():
                    yield number, line
        except (OSError, EOFError) as exc:  # a corrupt or truncated compressed stream
            raise InputError(f"{path}:{stats.lines + 1}: cannot be decompressed ({exc}); is the file whole?") from None
        except Exception as exc:
            if type(exc).__name__ == "ZstdError":
                raise InputError(
                    f"{path}:{stats.lines + 1}: cannot be decompressed ({exc}); is the file whole?"
                ) from None
            raise


def _array_rows(path: Path, stats: ReadStats) -> Iterator[tuple[int, bytes | dict[str, Any] | _NotAnObject]]:
    """The elements of a top-level JSON array, parsed one at a time (ijson's C backend), never the file whole."""
    import ijson

    fh = _open(path)
    with fh:
        number = 0
        try:
            for obj in ijson.items(fh, "item", use_float=True):
                number += 1
                stats.lines = number
                stats.bytes_read = fh.tell()
                yield number, obj if isinstance(obj, dict) else _NotAnObject(obj)
        except ijson.JSONError as exc:
            raise InputError(
                f"{path}:{number + 1}: the JSON array cannot be read past element {number} ({exc}); "
                "fix the file (elements before it were read)"
            ) from None


class _NotAnObject:
    """An array element or table row that is not a JSON object (reported by `_parse`)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _table_files(path: Path, kind: str) -> list[Path]:
    if kind != "arrow-dir":
        return [path]
    state = path / "state.json"
    if state.exists():
        try:
            files = [path / f["filename"] for f in orjson.loads(state.read_bytes()).get("_data_files", [])]
        except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError) as exc:
            raise InputError(f"{state}: not a `datasets` state file ({exc})") from None
        if files:
            return files
    files = sorted(path.glob("*.arrow"))
    if not files:
        raise InputError(
            f"{path}: a folder without .arrow files; give a JSONL, JSON, Parquet or Arrow file, "
            "or a folder written by `datasets` save_to_disk"
        )
    return files


def _record_batches(file: Path, kind: str) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if kind == "parquet":
            yield from pq.ParquetFile(file).iter_batches(batch_size=2048)
            return
        with pa.memory_map(str(file)) as source:
            try:
                reader: Any = pa.ipc.open_file(source)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)
            except pa.ArrowInvalid:
                source.seek(0)
                yield from pa.ipc.open_stream(source)
    except FileNotFoundError:
        raise InputError(f"{file}: no such file; check the dataset path in the config") from None
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{file}: cannot be read as {kind.removesuffix('-dir')} ({exc})") from None


def _null_struct_columns(batch: Any) -> tuple[str, ...]:
    """The list-of-struct columns of a record batch with a null member somewhere (the only ones to clean)."""
    import pyarrow as pa

    out = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        kind = col.type
        if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_struct(kind.value_type):
            values = col.values
            if any(values.field(i).null_count for i in range(kind.value_type.num_fields)):
                out.append(name)
    return tuple(out)


def _without_nulls(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    """A table row with the null members of its lists' objects dropped: Arrow gives every struct all the keys of
    its column's type (a user turn gets `tool_calls: null`), which JSON lines would not have held."""
    for key in columns:
        value = row.get(key)
        if type(value) is list and value and type(value[0]) is dict:
            row[key] = [{k: v for k, v in m.items() if v is not None} if type(m) is dict else m for m in value]
    return row


def _table_rows(path: Path, kind: str, stats: ReadStats) -> Iterator[tuple[int, bytes | dict[str, Any]]]:
    """Rows of Parquet / Arrow files one record batch at a time, numbered from 1 across a folder's files."""
    files = _table_files(path, kind)
    sizes = [f.stat().st_size if f.exists() else 0 for f in files]
    number = 0
    done = 0
    for file, size in zip(files, sizes, strict=True):
        for batch in _record_batches(file, "arrow" if kind == "arrow-dir" else kind):
            clean = _null_struct_columns(batch)
            for row in batch.to_pylist():
                number += 1
                stats.lines = number
                yield number, _without_nulls(row, clean) if clean else row
        done += size
        stats.bytes_read = done


def _parse(line: bytes | dict[str, Any] | _NotAnObject) -> dict[str, Any]:
    if type(line) is dict:
        return line
    if isinstance(line, _NotAnObject):
        raise _BadLine(f"expected a JSON object, got {type(line.value).__name__}")
    assert isinstance(line, bytes)
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as first:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            column = len(line[: exc.start].decode("utf-8", "replace")) + 1
            raise _BadLine(f"not UTF-8 ({exc.reason} at byte {exc.start})", column) from None
        try:  # the stdlib parser words its errors better
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise _BadLine(f"invalid JSON ({exc.msg})", exc.colno) from None
        except ValueError as exc:
            raise _BadLine(f"invalid JSON ({exc})") from None
        # the stdlib accepts what orjson does not: NaN / Infinity, or a number past a double's range
        raise _BadLine(f"invalid JSON ({first.msg}: a number out of range, NaN or Infinity)", first.colno) from None
    if not isinstance(obj, dict):
        raise _BadLine(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _check_messages(messages: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise _BadLine(f"{key!r} must be a non-empty list of messages")
    for m in messages:
        # the fast path: a well-formed message; anything else is explained by _explain
        if type(m) is not dict or m.get("role") not in _ROLE_SET:
            _explain(messages, key)
        content = m.get("content")
        if (
            type(content) is not str
            and (content is None or not isinstance(content, _CONTENT_TYPES))
            and (content is not None or m["role"] != "assistant")
        ):
            _explain(messages, key)
    return messages


def _explain(messages: list[Any], key: str) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _BadLine(f"{key}[{i}] is not an object")
        role = m.get("role")
        if role not in _ROLE_SET:
            raise _BadLine(f"{key}[{i}].role is {role!r}; expected one of {', '.join(ROLES)}")
        content = m.get("content")
        if content is None and role != "assistant":
            raise _BadLine(f"{key}[{i}].content is missing")
        if content is not None and not isinstance(content, _CONTENT_TYPES):
            raise _BadLine(f"{key}[{i}].content must be a string, a list of parts or null")
    raise _BadLine(f"{key!r} is not a valid list of messages")


def _prompt(messages: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The conversation without its trailing assistant turn."""
    if messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages or (messages[-1]["role"] == "system" and all(m["role"] == "system" for m in messages)):
        raise _BadLine(f"{key!r} holds no user turn before the final assistant turn")
    return messages


def row_format(obj: dict[str, Any]) -> str:
    """The format of one row, from its columns (what `format = "auto"` reads each row as): `messages`;
    `conversations` of `from`/`value` (ShareGPT) or of `role`/`content`; `prompt`/`response`;
    `instruction`/`input`/`output` (Alpaca)."""
    if "messages" in obj:
        return "openai-messages"
    conv = obj.get("conversations")
    if isinstance(conv, list):
        first = conv[0] if conv else None
        return "sharegpt" if isinstance(first, dict) and "from" in first else "specforge-conversations"
    if "prompt" in obj:
        return "prompt-response"
    if "instruction" in obj:
        return "alpaca"
    raise _BadLine(
        "has none of the columns messages, conversations, prompt or instruction; set `format` for this dataset"
    )


# each row format by the columns it is told from (what `format = "auto"` says it guessed)
FORMAT_COLUMNS = {
    "openai-messages": "messages",
    "sharegpt": "conversations from/value",
    "specforge-conversations": "conversations role/content",
    "prompt-response": "prompt/response",
    "alpaca": "instruction/input/output",
}
CONTAINER_WORDS = {
    "jsonl": "JSON lines",
    "jsonl.gz": "gzip JSON lines",
    "jsonl.zst": "zstd JSON lines",
    "json-array": "JSON array",
    "parquet": "Parquet",
    "arrow": "Arrow",
    "arrow-dir": "datasets save_to_disk folder",
}


def reading_words(ds: Any, stats: ReadStats) -> str | None:
    """What was guessed about a config `Dataset` whose `format` is "auto" or not set, from the rows `stats` read:
    `prompts.parquet: Parquet, columns messages → openai-messages (2,000 rows checked)`; None when `format` is
    set to a named format (nothing was guessed that the config does not say)."""
    auto = ds.format == "auto"
    if not auto and "format" in ds.model_fields_set:
        return None
    path = Path(ds.path)
    head = f"{path.name}: {CONTAINER_WORDS.get(container_of(path), container_of(path))}"
    if not auto:
        return (
            f'{head}, read as {ds.format} (`format` not set: the default); `format = "auto"` tells it from the columns'
        )
    if not stats.formats:
        return f"{head}, no row read in any format (every checked row refused)"
    mapped = dict(getattr(ds, "columns", None) or {})

    def columns(fmt: str) -> str:
        words = FORMAT_COLUMNS.get(fmt, fmt)
        key = words.split()[0].split("/")[0]
        return f"{words} (the file's {mapped[key]!r})" if key in mapped and mapped[key] != key else words

    def rows(n: int) -> str:
        return f"{n:,} row" + ("" if n == 1 else "s")

    ranked = sorted(stats.formats.items(), key=lambda item: (-item[1], item[0]))
    if len(ranked) == 1:
        fmt, n = ranked[0]
        return f"{head}, columns {columns(fmt)} → {fmt} ({rows(n)} checked); set `format` to override"
    parts = ", ".join(f"columns {columns(fmt)} → {fmt} ({rows(n)})" for fmt, n in ranked)
    return f"{head}, {parts}; set `format` to override"


def _text_column(obj: dict[str, Any], key: str, required: bool = True) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise _BadLine(f"{key!r} must be a non-empty string")
    return value


def _messages_of(obj: dict[str, Any], fmt: str) -> list[dict[str, Any]]:
    if fmt == "auto":
        fmt = row_format(obj)
    if fmt == "prompt-response":
        out = [{"role": "user", "content": _text_column(obj, "prompt")}]
        response = obj.get("response")
        return out + ([{"role": "assistant", "content": response}] if isinstance(response, str) else [])
    if fmt == "alpaca":
        extra = _text_column(obj, "input", required=False)
        prompt = _text_column(obj, "instruction") + (f"\n\n{extra}" if extra else "")
        output = obj.get("output")
        return [{"role": "user", "content": prompt}] + (
            [{"role": "assistant", "content": output}] if isinstance(output, str) else []
        )
    if fmt == "openai-messages":
        return _check_messages(obj.get("messages"), "messages")
    conv = obj.get("conversations")
    if not isinstance(conv, list) or not conv:
        raise _BadLine("'conversations' must be a non-empty list")
    if fmt == "sharegpt":
        out = []
        for i, turn in enumerate(conv):
            if not isinstance(turn, dict):
                raise _BadLine(f"conversations[{i}] is not an object")
            who = turn.get("from")
            role = _SHAREGPT_ROLES.get(who) if isinstance(who, str) else None
            if role is None:
                raise _BadLine(f"conversations[{i}].from is {who!r}; expected human, gpt, system or tool")
            value = turn.get("value")
            if not isinstance(value, str):
                raise _BadLine(f"conversations[{i}].value must be a string")
            out.append({"role": role, "content": value})
        return out
    return _check_messages(conv, "conversations")


def _sample_id(obj: dict[str, Any], id_field: str) -> str | None:
    value = obj.get(id_field)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _BadLine(f"{id_field!r} must be a string or an integer, got {type(value).__name__}")
    return str(value)


@dataclass(frozen=True, slots=True)
class RowChoice:
    """Which rows of a file are read and under what names: `columns` maps a canonical column (messages,
    conversations, id, category, tools) to the file's name for it; `fraction` keeps that share of the rows,
    chosen by a hash of (seed, position), so the same rows every time."""

    columns: tuple[tuple[str, str], ...] = ()
    fraction: float | None = None
    seed: int = 0

    def keeps(self, number: int) -> bool:
        """Whether the row at `number` is among the sampled ones."""
        if self.fraction is None or self.fraction >= 1:
            return True
        digest = hashlib.blake2b(f"{self.seed}:{number}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") < self.fraction * 2**64

    def rename(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The row with its mapped columns under their canonical names."""
        for canonical, source in self.columns:
            if source in obj and canonical != source:
                obj[canonical] = obj.pop(source)
        return obj


def _category_of(obj: dict[str, Any], choice: RowChoice | None) -> str | None:
    if choice is None or not any(c == "category" for c, _ in choice.columns):
        return None
    value = obj.get("category")
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _BadLine(f"'category' must be a string, got {type(value).__name__}")
    return str(value)


_SCRIPTS = (
    ("CJK", re.compile("[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")),
    ("Cyrillic", re.compile("[\u0400-\u04ff]")),
    ("Arabic", re.compile("[\u0600-\u06ff]")),
    ("Latin", re.compile("[A-Za-z\u00c0-\u024f]")),
)
_LATIN = _SCRIPTS[-1][1]
_NON_LATIN = re.compile("[\u0400-\u04ff\u0600-\u06ff\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")


def script_of(messages: list[dict[str, Any]], sample: int = 200) -> str:
    """A cheap guess at the language of a prompt by script: the script of most letters in the first `sample`
    characters of its last user turn (Latin, CJK, Cyrillic, Arabic; "other" for the rest or no letters)."""
    text = ""
    for m in reversed(messages):
        if m.get("role") == "user":
            content = m.get("content")
            text = (
                content
                if isinstance(content, str)
                else " ".join(
                    p.get("text", "") for p in content or () if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
            )
            break
    text = text[:sample]
    if text.isascii() or _NON_LATIN.search(text) is None:  # most prompts: no need to count
        return "Latin" if _LATIN.search(text) else "other"
    counts = {name: len(pattern.findall(text)) for name, pattern in _SCRIPTS}
    best = max(counts, key=counts.__getitem__)
    return best if counts[best] > 0 else "other"  # (letters of other scripts are not counted against these)


def iter_prompts(
    path: str | Path,
    fmt: str,
    *,
    dataset: str | None = None,
    id_field: str = "id",
    limit: int | None = None,
    stats: ReadStats | None = None,
    choice: RowChoice | None = None,
) -> Iterator[SampleInput]:
    """Yield a SampleInput per good row of a prompt file in format `fmt`, at most `limit` of them (of the rows
    `choice` keeps, under its column names)."""
    name = dataset or Path(path).stem

    def sample(obj: dict[str, Any], number: int) -> SampleInput:
        key = _key_of(obj, fmt)
        row_fmt = row_format(obj) if fmt == "auto" else fmt
        messages = _prompt(_messages_of(obj, row_fmt), key)
        tools = _tools_of(obj)
        sid = _sample_id(obj, id_field) or content_id(messages, tools)
        out = SampleInput(
            sid, name, messages, tools, line=number, category=_category_of(obj, choice), language=script_of(messages)
        )
        if stats is not None:
            stats.formats[row_fmt] = stats.formats.get(row_fmt, 0) + 1
        return out

    return _good_lines(path, fmt, limit, stats, sample, choice)


def _key_of(obj: dict[str, Any], fmt: str) -> str:
    """The column a row's messages are named by in its error messages."""
    if fmt == "auto":
        return "conversations" if "conversations" in obj else "messages"
    return "messages" if fmt == "openai-messages" else "conversations"


def _tools_of(obj: dict[str, Any]) -> list[Any] | None:
    tools = obj.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _BadLine("'tools' must be a list")
    return tools


def _good_lines(
    path: str | Path,
    fmt: str,
    limit: int | None,
    stats: ReadStats | None,
    build: Callable[[dict[str, Any], int], T],
    choice: RowChoice | None = None,
) -> Iterator[T]:
    """What `build(parsed line, line number)` makes of each good line, at most `limit` of them. A bad line (a
    `_BadLine` from parsing or from `build`) fails the read with its file:line when `stats` is None, else it is
    counted in `stats` and passed over."""
    if fmt not in FORMATS:
        raise InputError(f"{path}: unknown dataset format {fmt!r}; expected one of {', '.join(FORMATS)}")
    path = Path(path)
    strict = stats is None
    stats = stats if stats is not None else ReadStats()
    for number, line in _lines(path, stats):
        if limit is not None and stats.good >= limit:
            return
        if choice is not None and not choice.keeps(number):
            continue
        try:
            obj = _parse(line)
            item = build(choice.rename(obj) if choice is not None else obj, number)
        except _BadLine as exc:
            if strict:
                raise InputError(f"{exc.where(path, number)}: {exc}; fix or remove the line") from None
            stats.reject(exc.where(path, number), str(exc))
            continue
        stats.good += 1
        yield item


def iter_dataset(ds: Any, stats: ReadStats | None = None) -> Iterator[SampleInput]:
    """Yield the samples of a config `Dataset` (path, format, id_field, limit, name) read with regenerate =
    "last" (one sample per line)."""
    return iter_prompts(
        ds.path,
        ds.format,
        dataset=ds.name,
        id_field=_id_field(ds),
        limit=ds.row_limit,
        stats=stats,
        choice=row_choice(ds),
    )


def row_choice(ds: Any) -> RowChoice | None:
    """The RowChoice a config `Dataset` declares (None when it maps no column and samples every row)."""
    columns = tuple((k, v) for k, v in (getattr(ds, "columns", None) or {}).items() if k != "id")
    fraction = getattr(ds, "sample_fraction", None)
    if not columns and fraction is None:
        return None
    return RowChoice(columns, fraction, getattr(ds, "sample_seed", 0))


def _id_field(ds: Any) -> str:
    return (getattr(ds, "columns", None) or {}).get("id") or ds.id_field


def iter_conversations(
    path: str | Path,
    fmt: str,
    *,
    dataset: str | None = None,
    id_field: str = "id",
    limit: int | None = None,
    stats: ReadStats | None = None,
    on_tool_divergence: str = "stop",
    choice: RowChoice | None = None,
) -> Iterator[ConversationInput]:
    """Yield a ConversationInput per good line of a JSONL file in format `fmt`, at most `limit` of them: the whole
    conversation, split into the turns to regenerate (`app.conversation.split_turns`). A line without an id gets
    a hash of its messages and tools ("c-" + 16 hex digits). Bad lines as in `iter_prompts`, the reason naming the
    message (e.g. `messages[3] is a tool result, but ...`)."""
    name = dataset or Path(path).stem

    def conversation(obj: dict[str, Any], number: int) -> ConversationInput:
        key = _key_of(obj, fmt)
        messages = _messages_of(obj, fmt)
        tools = _tools_of(obj)
        try:
            turns = split_turns(messages, key)
        except ConversationShapeError as exc:
            raise _BadLine(str(exc)) from None
        cid = _sample_id(obj, id_field) or conversation_content_id(messages, tools)
        if "#" in cid:
            raise _BadLine(f"{id_field!r} {cid!r} holds '#', which separates a conversation id from its turn")
        return ConversationInput(
            cid, name, tools, turns, on_tool_divergence, line=number, category=_category_of(obj, choice)
        )

    return _good_lines(path, fmt, limit, stats, conversation, choice)


def iter_dataset_conversations(ds: Any, stats: ReadStats | None = None) -> Iterator[ConversationInput]:
    """Yield the conversations of a config `Dataset` read with regenerate = "all"."""
    return iter_conversations(
        ds.path,
        ds.format,
        dataset=ds.name,
        id_field=_id_field(ds),
        limit=ds.row_limit,
        stats=stats,
        on_tool_divergence=ds.on_tool_divergence,
        choice=row_choice(ds),
    )


def _finish_reason(meta: Any) -> str | None:
    if not isinstance(meta, dict):
        return None
    fr = meta.get("finish_reason")
    if isinstance(fr, dict):  # SGLang: {"type": "stop" | "length", "matched": ...}
        fr = fr.get("type")
    return fr if isinstance(fr, str) else None


def out_of_vocab(output_ids: tuple[int, ...] | list[int], vocab_size: int) -> str | None:
    """Why reference ids cannot come from a tokenizer of `vocab_size` tokens (the first id outside it), or None.

    The one check `validate` and ingest share: a row that fails it is refused with its file:line.
    """
    if not output_ids or max(output_ids) < vocab_size:
        return None
    bad = next(t for t in output_ids if t >= vocab_size)
    return (
        f"output id {bad} is outside the tokenizer's vocabulary (size {vocab_size}); "
        "is the tokenizer the model that produced this file?"
    )


def iter_references(
    path: str | Path, *, id_field: str = "id", stats: ReadStats | None = None, vocab_size: int | None = None
) -> Iterator[ReferenceRecord]:
    """Yield a ReferenceRecord per good line of an SGLang-style reference JSONL file.

    With `vocab_size`, a line holding an id outside the vocabulary is a bad line too (`out_of_vocab`).
    """
    path = Path(path)
    strict = stats is None
    stats = stats if stats is not None else ReadStats()
    for number, line in _lines(path, stats):
        try:
            obj = _parse(line)
            ids = obj.get("output_ids")
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in ids
            ):
                raise _BadLine("'output_ids' must be a list of non-negative integer token ids")
            if vocab_size is not None:
                problem = out_of_vocab(ids, vocab_size)
                if problem is not None:
                    raise _BadLine(problem)
            messages = obj.get("messages")
            sid = _sample_id(obj, id_field)
            if messages is not None:
                messages = _check_messages(messages, "messages")
            if sid is None:
                if messages is None:
                    raise _BadLine(f"has neither {id_field!r} nor 'messages' to join on")
                sid = content_id(_prompt(messages, "messages"), obj.get("tools"))
        except _BadLine as exc:
            if strict:
                raise InputError(f"{exc.where(path, number)}: {exc}; fix or remove the line") from None
            stats.reject(exc.where(path, number), str(exc))
            continue
        stats.good += 1
        yield ReferenceRecord(sid, tuple(ids), _finish_reason(obj.get("meta_info")), messages, number)


def file_fingerprint(path: str | Path) -> str:
    """`sha256:<hex>` of a file's bytes (of a `save_to_disk` folder: of its files' names and bytes, in name order):
    the content fingerprint an ingest is recorded under."""
    path = Path(path)
    try:
        if path.is_dir():
            digest = hashlib.sha256()
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                digest.update(str(file.relative_to(path)).encode() + b"\0")
                with file.open("rb") as fh:
                    digest.update(hashlib.file_digest(fh, "sha256").digest())
            return "sha256:" + digest.hexdigest()
        with path.open("rb") as fh:
            return "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; check the path in the config") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None


@dataclass(frozen=True, slots=True)
class DatasetReading:
    """What was guessed about how to read dataset `index` of the config (`reading_words`)."""

    index: int
    name: str
    text: str

    def __str__(self) -> str:
        return f"data.datasets[{self.index}] ({self.name}): {self.text}"


@dataclass(frozen=True, slots=True)
class InputsCheck:
    """What checking a config's input files found: errors (the run must not start), warnings, the vocab size,
    and how many reference and dataset lines were read."""

    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    vocab_size: int | None = None
    references_checked: int = 0
    dataset_lines_checked: int = 0
    # per dataset whose `format` is "auto" or not set: its container and the row formats its columns told
    readings: tuple[DatasetReading, ...] = ()


REFERENCE_SAMPLE = 2000
DATASET_SAMPLE = 2000  # lines of each dataset `run` and `ingest` read before writing (`config check` reads all)


def _file_problem(path: Path, what: str) -> str | None:
    if not path.exists():
        return f"{path} does not exist; fix the path ({what}; relative paths are relative to the config file)"
    if path.is_dir():
        if what == "prompt file" and ((path / "state.json").exists() or any(path.glob("*.arrow"))):
            return None
        return f"{path} is a directory; give the path of the {what}"
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc}); check its permissions"
    return None


def _database_problem(path: Path) -> str | None:
    """Why a run database cannot be written at `path` (folder missing or not writable, file not writable), in
    words that say what to do; None when it can. The advice differs for a database that does not exist yet."""
    import os

    folder = path.parent
    if not folder.is_dir():
        return (
            f"its folder {folder} does not exist; create it (mkdir -p {folder}) or set run.database (or --db) to a "
            "path in an existing folder"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        if path.exists():
            return (
                f"its folder {folder} is read-only (or not writable by this user), and a run database is written "
                "with a journal beside it (-wal, -shm); copy it to a writable folder and point run.database (or "
                "--db) at the copy. The reading verbs (status, watch --readonly, export) work where it is."
            )
        return (
            f"cannot be created: its folder {folder} is read-only (or not writable by this user); set "
            "run.database (or --db) to a path in a writable folder, or fix the folder's permissions"
        )
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return "exists but is not readable and writable by this user; fix its permissions or use another database path"
    return None


def check_api_keys(config: Any) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the endpoints' keys: an `api_key_env` whose variable is not set or empty is an
    error (the run would fail on its first request); a hosted API (OpenRouter, OpenAI) with no api_key_env is a
    warning. Never reads a key beyond checking that it is there."""
    import os
    from urllib.parse import urlsplit

    label = str(config.source) if getattr(config, "source", None) else "config"
    errors: list[str] = []
    warnings: list[str] = []
    for i, ep in enumerate(config.endpoints):
        if ep.simulator is not None:
            continue
        if ep.api_key_env:
            if not os.environ.get(ep.api_key_env):
                errors.append(
                    f"{label}: endpoints[{i}].api_key_env: the environment variable {ep.api_key_env} "
                    f"(endpoint {ep.name!r}) is not set or empty; export it before starting the run"
                )
        else:
            host = urlsplit(ep.base_url or "").hostname or ""
            if host.endswith(("openrouter.ai", "openai.com")):
                warnings.append(
                    f"endpoints[{i}] ({ep.name!r}) calls {host} without api_key_env; it will refuse the "
                    "requests (401): name the variable holding the key"
                )
    return errors, warnings


def check_inputs(
    config: Any,
    *,
    reference_sample: int | None = REFERENCE_SAMPLE,
    dataset_sample: int | None = DATASET_SAMPLE,
    require_keys: bool = True,
) -> InputsCheck:
    """Check everything a config names without running or writing: each dataset and reference file exists and is
    readable, the first `dataset_sample` lines of each dataset parse in its format (None: every line), the
    tokenizer directory loads (and the profile is known), the first `reference_sample` lines of each reference
    file parse with ids inside the vocabulary (None: every line), the database can be written where the config
    puts it, and each endpoint's API key variable is set (an error with `require_keys`, else a warning: `ingest`
    sends no request).

    Messages read `<key>: <problem>; <what to do>`. A file whose every checked line is refused is an error (the
    wrong format or tokenizer, most likely); some refused lines are a warning with their count and the first few
    as file:line:column (ingest skips them).
    """
    from app.tokens import get_profile, load_tokenizer

    label = str(config.source) if getattr(config, "source", None) else "config"
    errors: list[str] = []
    warnings: list[str] = []
    readings: list[DatasetReading] = []
    lines_checked = 0
    for i, ds in enumerate(config.data.datasets):
        problem = _file_problem(Path(ds.path), "prompt file")
        if problem:
            errors.append(f"{label}: data.datasets[{i}].path: {problem}")
            continue
        stats = ReadStats()
        try:
            for _ in iter_prompts(
                ds.path, ds.format, dataset=ds.name, id_field=_id_field(ds), stats=stats, choice=row_choice(ds)
            ):
                if dataset_sample is not None and stats.good + stats.bad >= dataset_sample:
                    break
        except InputError as exc:
            errors.append(f"{label}: data.datasets[{i}].path: {exc}")
            continue
        seen = stats.good + stats.bad
        lines_checked += seen
        reading = reading_words(ds, stats)
        if reading is not None:
            readings.append(DatasetReading(i, ds.name, reading))
        if stats.bad:
            scope = f"the first {seen}" if dataset_sample is not None and seen >= dataset_sample else f"all {seen}"
            examples = "; ".join(stats.examples[:3])
            if not stats.good:
                errors.append(
                    f"{label}: data.datasets[{i}]: every one of {scope} lines checked is refused as "
                    f"{ds.format}, e.g. {examples}; is `format` right for this file?"
                )
            else:
                warnings.append(
                    f"data.datasets[{i}] ({ds.name}): {stats.bad} of {scope} lines checked are refused "
                    f"(ingest skips them): {examples}"
                )
    references: list[tuple[str, Path]] = []
    if config.data.reference is not None:
        references.append(("data.reference", Path(config.data.reference)))
    for i, ep in enumerate(config.endpoints):
        sim = ep.simulator
        if sim is not None and sim.reference is not None and sim.reference != config.data.reference:
            references.append((f"endpoints[{i}].simulator.reference", Path(sim.reference)))
        for j, extra in enumerate(getattr(sim, "extra_references", None) or ()):
            references.append((f"endpoints[{i}].simulator.extra_references[{j}]", Path(extra)))
    readable_refs = []
    for key, path in references:
        problem = _file_problem(path, "reference JSONL file")
        if problem:
            errors.append(f"{label}: {key}: {problem}")
        else:
            readable_refs.append((key, path))
    vocab_size = None
    pattern = None
    try:
        pattern = get_profile(config.model.profile).pretokenizer_pattern
    except (InputError, KeyError, ValueError) as exc:
        errors.append(f"{label}: model.profile: {exc}")
    try:
        vocab_size = load_tokenizer(config.model.tokenizer, pattern).vocab_size
    except (InputError, OSError, ValueError) as exc:
        errors.append(f"{label}: model.tokenizer: {exc}")
    checked = 0
    if vocab_size is not None:
        for key, path in readable_refs:
            stats = ReadStats()
            try:
                for _ in iter_references(path, stats=stats, vocab_size=vocab_size):
                    if reference_sample is not None and stats.good + stats.bad >= reference_sample:
                        break
            except InputError as exc:
                errors.append(f"{label}: {key}: {exc}")
                continue
            seen = stats.good + stats.bad
            checked += seen
            scope = f"the first {seen}" if reference_sample is not None and seen >= reference_sample else f"all {seen}"
            if stats.bad and not stats.good:
                errors.append(
                    f"{label}: {key}: every one of {scope} lines checked is refused, e.g. {stats.examples[0]}; "
                    "is model.tokenizer the model that produced this file?"
                )
            elif stats.bad:
                warnings.append(
                    f"{key}: {stats.bad} of {scope} lines checked are refused (ingest skips them), "
                    f"e.g. {stats.examples[0]}"
                )
    problem = _database_problem(Path(config.run.database))
    if problem:
        errors.append(f"{label}: run.database: {config.run.database} {problem}")
    key_errors, key_warnings = check_api_keys(config)
    if require_keys:
        errors += key_errors
    else:
        warnings += [e.split(": ", 1)[1] for e in key_errors]
    warnings += key_warnings
    return InputsCheck(tuple(errors), tuple(warnings), vocab_size, checked, lines_checked, tuple(readings))
