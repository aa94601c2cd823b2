"""The progress protocol: JSON lines on a shard's stdout, read back from its log file.

`{"event": "progress", "shard": i, "done": n, "total": m, "tokens": t}` per batch, then
`{"event": "shard_done", "shard": i, "path": "..."}`. The wrapper adds `start` and `exit` events.
Lines that are not JSON objects with an "event" key (library noise) are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ShardProgress:
    """What a shard reported last: items done of total, tokens processed, and whether it said it finished."""

    done: int = 0
    total: int = 0
    tokens: int = 0
    finished: bool = False
    output_path: str | None = None


def apply_line(progress: ShardProgress, line: str) -> ShardProgress:
    """Fold one stdout line into the progress so far (unchanged for a non-protocol line)."""
    line = line.strip()
    if not line.startswith("{"):
        return progress
    try:
        obj = json.loads(line)
    except ValueError:
        return progress
    if not isinstance(obj, dict):
        return progress
    event = obj.get("event")
    if event == "progress":
        return ShardProgress(
            done=_int(obj.get("done"), progress.done),
            total=_int(obj.get("total"), progress.total),
            tokens=_int(obj.get("tokens"), progress.tokens),
            finished=progress.finished,
            output_path=progress.output_path,
        )
    if event == "shard_done":
        path = obj.get("path")
        return ShardProgress(
            done=max(progress.done, _int(obj.get("done"), progress.done)),
            total=_int(obj.get("total"), progress.total),
            tokens=_int(obj.get("tokens"), progress.tokens),
            finished=True,
            output_path=str(path) if path is not None else progress.output_path,
        )
    return progress


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


class LogTail:
    """Reads a growing stdout log incrementally and keeps the shard's latest progress."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.progress = ShardProgress()
        self._offset = 0
        self._partial = b""

    def read(self) -> ShardProgress:
        """Consume the lines appended since the last call; return the progress so far."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return self.progress
        if not chunk:
            return self.progress
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            self.progress = apply_line(self.progress, raw.decode("utf-8", "replace"))
        return self.progress


def last_lines(path: Path, n: int = 3, max_bytes: int = 4096) -> str:
    """The last `n` non-empty lines of a log file (for error messages); '' when it is missing."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])
