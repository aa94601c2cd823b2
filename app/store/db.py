"""Opening a run database safely: refuse what is not ours, migrate forward, set the connection pragmas.

Every check that can refuse a file runs before anything is written, so a refused file is left exactly as
it was: not SQLite, locked by another process, or written by a newer eaglewatch.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.errors import InputError
from app.store.schema import MIGRATIONS, SCHEMA_VERSION

SQLITE_HEADER = b"SQLite format 3\x00"
DEFAULT_BUSY_TIMEOUT_S = 10.0


def check_file(path: Path) -> bool:
    """Raise InputError if `path` exists and is not an SQLite database; return whether it exists."""
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass the path of a database file with --db")
    if not path.exists():
        if not path.parent.is_dir():
            raise InputError(f"{path}: its directory {path.parent} does not exist; create it or pass another --db")
        return False
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if head and head != SQLITE_HEADER:
        raise InputError(
            f"{path}: is not an SQLite database (it does not start with the SQLite header); "
            "pass another --db path or move this file away"
        )
    return True


def _locked(path: Path, exc: Exception) -> InputError:
    return InputError(
        f"{path}: is locked by another process ({exc}); wait for that process to finish "
        "(another eaglewatch writing to it?) or pass another --db"
    )


def _read_version(conn: sqlite3.Connection, path: Path) -> int:
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise _locked(path, exc) from None
        raise InputError(f"{path}: is not a usable SQLite database ({exc}); pass another --db") from None
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{path}: is not a usable SQLite database ({exc}); pass another --db") from None


def _refuse_newer(path: Path, version: int, known: int = SCHEMA_VERSION) -> None:
    if version > known:
        raise InputError(
            f"{path}: was written by a newer eaglewatch (schema version {version}; this version knows up to "
            f"{known}); upgrade eaglewatch to open it, or pass another --db"
        )


def migrate(
    path: str | Path,
    *,
    create: bool = True,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    migrations: tuple[str, ...] = MIGRATIONS,
) -> int:
    """Bring the database at `path` to the current schema (creating it when `create`); return the version.

    Raises InputError (file untouched) for a non-SQLite file, a locked file or a newer schema.
    """
    path = Path(path)
    target = len(migrations)
    exists = check_file(path)
    if not exists and not create:
        raise InputError(f"{path}: no such database; run `eaglewatch ingest CONFIG` first or pass another --db")
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    try:
        version = _read_version(conn, path)
        _refuse_newer(path, version, target)
        # Take the write lock even when there is nothing to migrate: a writer that cannot get it now
        # would fail later, halfway through its work.
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise _locked(path, exc) from None
        try:
            version = _read_version(conn, path)  # another process may have migrated meanwhile
            _refuse_newer(path, version, target)
            for step in range(version, target):
                for statement in _statements(migrations[step]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {step + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        # WAL persists in the file; set it only once the file is known to be ours.
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as exc:
                raise _locked(path, exc) from None
        return target
    finally:
        conn.close()


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (comments kept; sqlite3 needs one statement per execute)."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip() and not all(ln.strip().startswith("--") or not ln.strip() for ln in buf.splitlines()):
        raise ValueError(f"incomplete SQL statement in migration: {buf[:80]!r}")
    return out


def configure(conn: sqlite3.Connection, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
    """Set the per-connection pragmas every eaglewatch connection uses (WAL, foreign keys, busy timeout)."""
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = NORMAL")


def connect_readonly(
    path: str | Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, upgrade: bool = False
) -> sqlite3.Connection:
    """A read-only connection (usable from any thread) to an existing, current run database.

    An older schema is migrated first when `upgrade`, else refused with the command that upgrades it.
    """
    path = Path(path)
    if not check_file(path):
        raise InputError(f"{path}: no such database; run `eaglewatch ingest CONFIG` first or pass another --db")
    uri = f"{path.resolve().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None)
    try:
        version = _read_version(conn, path)
        _refuse_newer(path, version)
        if version < SCHEMA_VERSION and upgrade:
            conn.close()
            migrate(path, create=False, busy_timeout_s=busy_timeout_s)
            return connect_readonly(path, busy_timeout_s=busy_timeout_s)
        if version < SCHEMA_VERSION:
            raise InputError(
                f"{path}: has schema version {version}, older than this eaglewatch's {SCHEMA_VERSION}; "
                f"upgrade it with `eaglewatch status --db {path}`"
            )
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        conn.execute("PRAGMA query_only = ON")
    except BaseException:
        conn.close()
        raise
    return conn
