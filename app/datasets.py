"""Streaming readers for prompt datasets and SGLang-style reference files (JSONL, one object a line).

Files are read line by line, never whole. A bad line is counted and skipped, and its `file:line:column: reason`
(`file:line: reason` when the problem is not at one place in the text) kept (the first few) in the `ReadStats`
passed in; without one, the first bad line raises InputError. Columns count characters from 1, as editors do.

Formats (with `regenerate = "last"`, the default, the prompt is the conversation without its trailing assistant
turn, which is what we regenerate; with `regenerate = "all"` each line is a whole conversation whose assistant
turns are all regenerated in order: `iter_conversations`, turns split by `app.conversation.split_turns`):
- openai-messages:          {"id", "messages": [{"role", "content", ...}], "tools"?}
- sharegpt:                 {"id", "conversations": [{"from": "human"|"gpt"|"system"|"tool", "value"}], "tools"?}
- specforge-conversations:  {"id", "conversations": [{"role", "content"}], "tools"?}
- reference (SGLang-style): {"id", "messages", "output_ids": [int], "meta_info": {"finish_reason": ...}}
A line without an id gets a stable content hash of its prompt ("h-" + 16 hex digits).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from app.conversation import ConversationInput, ConversationShapeError, conversation_content_id, split_turns
from app.errors import InputError
from app.store.store_records import ReferenceRecord, SampleInput

T = TypeVar("T")

FORMATS = ("openai-messages", "sharegpt", "specforge-conversations")
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


def _lines(path: Path, stats: ReadStats) -> Iterator[tuple[int, bytes]]:
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; check the dataset path in the config") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with fh:
        for number, line in enumerate(fh, 1):
            stats.lines = number
            stats.bytes_read += len(line)
            if line.strip():
                yield number, line


def _parse(line: bytes) -> dict[str, Any]:
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
        if (type(content) is not str and (content is None or not isinstance(content, _CONTENT_TYPES))
                and (content is not None or m["role"] != "assistant")):
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


def _messages_of(obj: dict[str, Any], fmt: str) -> list[dict[str, Any]]:
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


def iter_prompts(
    path: str | Path,
    fmt: str,
    *,
    dataset: str | None = None,
    id_field: str = "id",
    limit: int | None = None,
    stats: ReadStats | None = None,
) -> Iterator[SampleInput]:
    """Yield a SampleInput per good line of a prompt JSONL file in format `fmt`, at most `limit` of them."""
    name = dataset or Path(path).stem
    key = "messages" if fmt == "openai-messages" else "conversations"

    def sample(obj: dict[str, Any], number: int) -> SampleInput:
        messages = _prompt(_messages_of(obj, fmt), key)
        tools = _tools_of(obj)
        sid = _sample_id(obj, id_field) or content_id(messages, tools)
        return SampleInput(sid, name, messages, tools, line=number)

    return _good_lines(path, fmt, limit, stats, sample)


def _tools_of(obj: dict[str, Any]) -> list[Any] | None:
    tools = obj.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _BadLine("'tools' must be a list")
    return tools


def _good_lines(path: str | Path, fmt: str, limit: int | None, stats: ReadStats | None,
                build: Callable[[dict[str, Any], int], T]) -> Iterator[T]:
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
        try:
            item = build(_parse(line), number)
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
    return iter_prompts(ds.path, ds.format, dataset=ds.name, id_field=ds.id_field, limit=ds.limit, stats=stats)


def iter_conversations(
    path: str | Path,
    fmt: str,
    *,
    dataset: str | None = None,
    id_field: str = "id",
    limit: int | None = None,
    stats: ReadStats | None = None,
    on_tool_divergence: str = "stop",
) -> Iterator[ConversationInput]:
    """Yield a ConversationInput per good line of a JSONL file in format `fmt`, at most `limit` of them: the whole
    conversation, split into the turns to regenerate (`app.conversation.split_turns`). A line without an id gets
    a hash of its messages and tools ("c-" + 16 hex digits). Bad lines as in `iter_prompts`, the reason naming the
    message (e.g. `messages[3] is a tool result, but ...`)."""
    name = dataset or Path(path).stem
    key = "messages" if fmt == "openai-messages" else "conversations"

    def conversation(obj: dict[str, Any], number: int) -> ConversationInput:
        messages = _messages_of(obj, fmt)
        tools = _tools_of(obj)
        try:
            turns = split_turns(messages, key)
        except ConversationShapeError as exc:
            raise _BadLine(str(exc)) from None
        cid = _sample_id(obj, id_field) or conversation_content_id(messages, tools)
        if "#" in cid:
            raise _BadLine(f"{id_field!r} {cid!r} holds '#', which separates a conversation id from its turn")
        return ConversationInput(cid, name, tools, turns, on_tool_divergence, line=number)

    return _good_lines(path, fmt, limit, stats, conversation)


def iter_dataset_conversations(ds: Any, stats: ReadStats | None = None) -> Iterator[ConversationInput]:
    """Yield the conversations of a config `Dataset` read with regenerate = "all"."""
    return iter_conversations(ds.path, ds.format, dataset=ds.name, id_field=ds.id_field, limit=ds.limit, stats=stats,
                              on_tool_divergence=ds.on_tool_divergence)


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
    """`sha256:<hex>` of a file's bytes: the content fingerprint an ingest is recorded under."""
    try:
        with Path(path).open("rb") as fh:
            return "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; check the path in the config") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None


@dataclass(frozen=True, slots=True)
class InputsCheck:
    """What checking a config's input files found: errors (the run must not start), warnings, the vocab size,
    and how many reference and dataset lines were read."""

    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    vocab_size: int | None = None
    references_checked: int = 0
    dataset_lines_checked: int = 0


REFERENCE_SAMPLE = 2000
DATASET_SAMPLE = 2000  # lines of each dataset `run` and `ingest` read before writing (`config check` reads all)


def _file_problem(path: Path, what: str) -> str | None:
    if not path.exists():
        return f"{path} does not exist; fix the path ({what}; relative paths are relative to the config file)"
    if path.is_dir():
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
        return (f"its folder {folder} does not exist; create it (mkdir -p {folder}) or set run.database (or --db) to a "
                "path in an existing folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        if path.exists():
            return (f"its folder {folder} is read-only (or not writable by this user), and a run database is written "
                    "with a journal beside it (-wal, -shm); copy it to a writable folder and point run.database (or "
                    "--db) at the copy. The reading verbs (status, watch --readonly, export) work where it is.")
        return (f"cannot be created: its folder {folder} is read-only (or not writable by this user); set "
                "run.database (or --db) to a path in a writable folder, or fix the folder's permissions")
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
                errors.append(f"{label}: endpoints[{i}].api_key_env: the environment variable {ep.api_key_env} "
                              f"(endpoint {ep.name!r}) is not set or empty; export it before starting the run")
        else:
            host = urlsplit(ep.base_url or "").hostname or ""
            if host.endswith(("openrouter.ai", "openai.com")):
                warnings.append(f"endpoints[{i}] ({ep.name!r}) calls {host} without api_key_env; it will refuse the "
                                "requests (401): name the variable holding the key")
    return errors, warnings


def check_inputs(config: Any, *, reference_sample: int | None = REFERENCE_SAMPLE,
                 dataset_sample: int | None = DATASET_SAMPLE, require_keys: bool = True) -> InputsCheck:
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
    lines_checked = 0
    for i, ds in enumerate(config.data.datasets):
        problem = _file_problem(Path(ds.path), "prompt JSONL file")
        if problem:
            errors.append(f"{label}: data.datasets[{i}].path: {problem}")
            continue
        stats = ReadStats()
        try:
            for _ in iter_prompts(ds.path, ds.format, dataset=ds.name, id_field=ds.id_field, stats=stats):
                if dataset_sample is not None and stats.good + stats.bad >= dataset_sample:
                    break
        except InputError as exc:
            errors.append(f"{label}: data.datasets[{i}].path: {exc}")
            continue
        seen = stats.good + stats.bad
        lines_checked += seen
        if stats.bad:
            scope = f"the first {seen}" if dataset_sample is not None and seen >= dataset_sample else f"all {seen}"
            examples = "; ".join(stats.examples[:3])
            if not stats.good:
                errors.append(f"{label}: data.datasets[{i}]: every one of {scope} lines checked is refused as "
                              f"{ds.format}, e.g. {examples}; is `format` right for this file?")
            else:
                warnings.append(f"data.datasets[{i}] ({ds.name}): {stats.bad} of {scope} lines checked are refused "
                                f"(ingest skips them): {examples}")
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
    return InputsCheck(tuple(errors), tuple(warnings), vocab_size, checked, lines_checked)
