"""Store writes that outlast a locked or full database: retried with backoff, never dropped.

`StoreGate.commit` runs one store call and, while it fails for a transient reason (another process holds
the write lock past the busy timeout, the disk is full, an I/O error), waits and tries again; a result the
provider already billed is therefore held by its request task (inside the in-flight bound) until it is
stored. While any write is failing `blocked` names why, and the engine leases nothing new. A write that
fails for a lasting reason (a constraint, a bug) is raised to the caller.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from app.store.run_store import StoreWriteError

T = TypeVar("T")


def disk_full_advice(db_path: Path) -> str:
    """What to free when the database's disk is full: the filesystem and how much is left on it."""
    folder = Path(db_path).resolve().parent
    try:
        usage = shutil.disk_usage(folder)
        left = f"{usage.free / 1e6:.1f} MB free of {usage.total / 1e6:.1f} MB"
    except OSError:
        left = "free space unknown"
    return (
        f"the disk holding {db_path} is full ({left}); free space on that filesystem (old exports, "
        f"job outputs, other runs' databases) or move the database, then resume"
    )


class StoreGate:
    """Retries transient write failures; `on_change(error | None)` is called when writing stops or works again."""

    def __init__(
        self, on_change: Callable[[StoreWriteError | None], None], *, base_s: float = 0.05, cap_s: float = 1.0
    ) -> None:
        self.blocked: StoreWriteError | None = None
        self.held = 0  # writes waiting to be retried now
        self._on_change = on_change
        self._base_s = base_s
        self._cap_s = cap_s

    async def commit(self, call: Callable[[], Awaitable[T]]) -> T:
        """Await `call()` until it succeeds; transient StoreWriteErrors are retried with capped backoff."""
        n = 0
        while True:
            try:
                value = await call()
            except StoreWriteError as exc:
                if not exc.transient:
                    raise
                if self.blocked is None or self.blocked.kind != exc.kind:
                    self.blocked = exc
                    self._on_change(exc)
                self.held += 1
                try:
                    await asyncio.sleep(min(self._cap_s, self._base_s * 2 ** min(n, 16)))
                finally:
                    self.held -= 1
                n += 1
                continue
            if self.blocked is not None:
                self.blocked = None
                self._on_change(None)
            return value
