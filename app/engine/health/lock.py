"""The run's lock file: one engine per (database, run) on a host."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from app.errors import EaglewatchError


class EngineLock:
    """An exclusive lock file per (database, run): a second engine on the same run (same host) is refused."""

    def __init__(self, db_path: Path, run_name: str) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_name)
        self.path = Path(f"{db_path}.{safe}.lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise EaglewatchError naming the holder's pid."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise EaglewatchError(
                f"another engine (pid {holder}) is already running this run ({self.path} is locked); "
                "attach to it with 'eaglewatch watch' or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        """Free the lock (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
