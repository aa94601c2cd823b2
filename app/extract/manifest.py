"""Read the `eagle3-shards` export: `manifest.json` plus one file of samples per shard.

The extractor needs only this small interface: a manifest lists shards (index, file, sample and token
counts) and a shard reads as a list of `ShardSample(sample_id, input_ids, loss_mask)`. Every defect is an
`InputError` naming the file, line and field.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import InputError


@dataclass(frozen=True, slots=True)
class ShardSample:
    """One training sample: its id, the full token ids (prompt + completion) and the loss mask."""

    sample_id: str
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One shard as the manifest lists it; `samples`/`tokens` are None when the manifest omits them."""

    index: int
    path: Path
    samples: int | None
    tokens: int | None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A parsed `manifest.json`: its path, its shards by index, and the tokenizer fingerprint if given."""

    path: Path
    shards: tuple[ShardEntry, ...]
    tokenizer_fingerprint: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def shard(self, index: int) -> ShardEntry:
        """The entry for shard `index`, or an InputError listing the shards that exist."""
        for entry in self.shards:
            if entry.index == index:
                return entry
        have = [e.index for e in self.shards]
        raise InputError(f"{self.path}: no shard {index}; the manifest lists shards {_ranges(have)}")

    @property
    def total_tokens(self) -> int | None:
        """Sum of the shards' token counts, or None when any shard lacks one."""
        counts = [e.tokens for e in self.shards if e.tokens is not None]
        return sum(counts) if len(counts) == len(self.shards) else None


def _ranges(indices: list[int]) -> str:
    if not indices:
        return "(none)"
    if indices == list(range(indices[0], indices[0] + len(indices))):
        return f"{indices[0]}..{indices[-1]}"
    return ", ".join(map(str, indices))


def _opt_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{where}: expected a count (integer >= 0), got {value!r}")
    return value


def read_manifest(path: str | Path) -> Manifest:
    """Parse an `eagle3-shards` manifest (a file, or the folder holding `manifest.json`)."""
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: manifest not found; run 'eaglewatch export --format eagle3-shards' first") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        raise InputError(f"{path}: expected an object with a 'shards' list (an eagle3-shards manifest)")
    entries = []
    seen: set[int] = set()
    for n, raw in enumerate(data["shards"]):
        where = f"{path}: shards[{n}]"
        if not isinstance(raw, dict):
            raise InputError(f"{where}: expected an object with 'index' and 'path'")
        index = raw.get("index", n)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise InputError(f"{where}.index: expected an integer >= 0, got {index!r}")
        if index in seen:
            raise InputError(f"{where}.index: shard {index} is listed twice")
        seen.add(index)
        file = raw.get("path") or raw.get("file")
        if not isinstance(file, str) or not file:
            raise InputError(f"{where}.path: expected the shard's file name")
        entries.append(
            ShardEntry(
                index=index,
                path=(path.parent / file).resolve(),
                samples=_opt_int(raw.get("samples", raw.get("count")), f"{where}.samples"),
                tokens=_opt_int(raw.get("tokens"), f"{where}.tokens"),
            )
        )
    fingerprint = data.get("tokenizer_fingerprint")
    if isinstance(data.get("tokenizer"), dict):
        fingerprint = fingerprint or data["tokenizer"].get("fingerprint")
    return Manifest(
        path=path.resolve(),
        shards=tuple(sorted(entries, key=lambda e: e.index)),
        tokenizer_fingerprint=fingerprint if isinstance(fingerprint, str) else None,
        meta={k: v for k, v in data.items() if k != "shards"},
    )


def _int_list(value: Any, where: str) -> tuple[int, ...]:
    # array("q") checks every item is an integer at C speed (shards hold millions of ids)
    try:
        if not isinstance(value, list):
            raise TypeError
        array("q", value)
    except (TypeError, OverflowError):
        raise InputError(f"{where}: expected a list of integers") from None
    return tuple(value)


def read_shard(entry: ShardEntry) -> list[ShardSample]:
    """All samples of one shard file (JSON lines: id, input_ids, loss_mask), checked against the manifest."""
    try:
        handle = entry.path.open(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{entry.path}: shard {entry.index} file is missing (listed in the manifest)") from None
    samples: list[ShardSample] = []
    with handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{entry.path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise InputError(f"{where}: expected an object with id, input_ids and loss_mask")
            sample_id = row.get("id", row.get("sample_id"))
            if sample_id is None:
                raise InputError(f"{where}: the sample has no 'id'")
            ids = _int_list(row.get("input_ids"), f"{where}: input_ids")
            mask = _int_list(row.get("loss_mask"), f"{where}: loss_mask")
            if not ids:
                raise InputError(f"{where}: sample {sample_id!r} has no input_ids")
            if len(mask) != len(ids):
                raise InputError(
                    f"{where}: sample {sample_id!r} has {len(ids)} input_ids but {len(mask)} loss_mask values"
                )
            samples.append(ShardSample(str(sample_id), ids, mask))
    if entry.samples is not None and entry.samples != len(samples):
        raise InputError(
            f"{entry.path}: shard {entry.index} holds {len(samples)} samples but the manifest says {entry.samples}; "
            "export the shards again"
        )
    tokens = sum(len(s.input_ids) for s in samples)
    if entry.tokens is not None and entry.tokens != tokens:
        raise InputError(
            f"{entry.path}: shard {entry.index} holds {tokens} tokens but the manifest says {entry.tokens}; "
            "export the shards again"
        )
    return samples
