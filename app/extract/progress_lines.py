"""The JSON lines the extractor prints on stdout for the job executors (docs/contracts.md, "Jobs")."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, TextIO


class ProgressLog:
    """Writes one JSON object per line and flushes, so a parent process sees each batch at once."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._lock = threading.Lock()  # the shard's writer thread reports batches, the main thread shards

    def emit(self, event: str, shard: int, **fields: Any) -> None:
        """Print `{"event": event, "shard": shard, **fields}` as one line."""
        line = json.dumps({"event": event, "shard": shard, **fields}, separators=(", ", ": ")) + "\n"
        with self._lock:
            self._stream.write(line)
            self._stream.flush()

    def progress(self, shard: int, done: int, total: int, tokens: int, **extra: Any) -> None:
        """Samples `done` of `total` in `shard`, `tokens` processed so far in that shard."""
        self.emit("progress", shard, done=done, total=total, tokens=tokens, **extra)
