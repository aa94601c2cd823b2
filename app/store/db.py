"""Opening a run database safely: refuse what is not ours, migrate forward, set the connection pragmas.

Every check that can refuse a file runs before anything is written, so a refused file is left exactly as
it was: not SQLite, another program's SQLite file (tables but no eaglewatch schema), damaged (`PRAGMA
quick_check`), in a read-only folder (for a writer), locked by another process, or written by a newer
eaglewatch.

Two ways in:
- `migrate(path)` before a writer (RunStore, JobStore) opens: creates or upgrades, after the checks above.
- `connect_readonly(path)` for the reading verbs (status, watch, export, reprocess's reads): `mode=ro`,
  never creates, never migrates unless `upgrade` and the file is an older eaglewatch database; in a folder
  it cannot write (no -shm can be made) it falls back to `immutable=1`. It runs `quick_check` too, so a
  damaged file fails with a sentence instead of a traceback halfway through a report.
"""

from __future__ import annotations

import os
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
            raise InputError(
                f"{path}: its directory {path.parent} does not exist; create it or pass another database path"
            )
        return False
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: cannot be read (permission denied); check its owner and mode")
    # Ask SQLite, never open() the file here: closing any descriptor of a file drops every POSIX lock this
    # process holds on it, so a header read beside a live connection (the engine's, a viewer's) would let
    # another process take the database for unused and delete its -wal and -shm under us.
    try:
        probe = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            probe.execute("PRAGMA schema_version").fetchone()
        finally:
            probe.close()
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc) or "encrypted" in str(exc):
            raise InputError(
                f"{path}: is not an SQLite database (it does not start with the SQLite header); "
                "pass another database path or move this file away"
            ) from None
        # locked, busy or damaged further in: the caller's open says which
    return True


def _locked(path: Path, exc: Exception) -> InputError:
    return InputError(
        f"{path}: is locked by another process ({exc}); wait for that process to finish "
        "(another eaglewatch writing to it?) or pass another database path"
    )


def _read_version(conn: sqlite3.Connection, path: Path) -> int:
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise _locked(path, exc) from None
        if "unable to open" in str(exc) and _readonly_folder(path):
            raise InputError(f"{path}: cannot be opened in its read-only folder {path.parent} ({exc})") from None
        raise InputError(f"{path}: is not a usable SQLite database ({exc}); pass another database path") from None
    except sqlite3.DatabaseError as exc:
        if "malformed" in str(exc):
            raise _damaged(path, str(exc)) from None
        raise InputError(f"{path}: is not a usable SQLite database ({exc}); pass another database path") from None


def _damaged(path: Path, detail: str) -> InputError:
    return InputError(
        f"{path}: the database is damaged ({detail}); restore it from a backup, or recover what is readable with "
        f"`sqlite3 {path} .recover | sqlite3 recovered.db`, and pass that with --db"
    )


def _quick_check(conn: sqlite3.Connection, path: Path) -> None:
    """Raise InputError naming the damage when `PRAGMA quick_check` finds any (O(database size), no writes)."""
    try:
        rows = conn.execute("PRAGMA quick_check(3)").fetchall()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise _locked(path, exc) from None
        raise _damaged(path, str(exc)) from None
    except sqlite3.DatabaseError as exc:
        raise _damaged(path, str(exc)) from None
    problems = [r[0] for r in rows if r[0] != "ok"]
    if problems:
        raise _damaged(path, "; ".join(problems))


def _tables(conn: sqlite3.Connection, path: Path) -> set[str]:
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise _locked(path, exc) from None
        raise _damaged(path, str(exc)) from None


def _refuse_foreign(conn: sqlite3.Connection, path: Path, version: int) -> None:
    """Refuse an SQLite file that is not an eaglewatch database (another program's tables, no runs table)."""
    tables = _tables(conn, path)
    if (version == 0 and tables) or (version > 0 and "runs" not in tables):
        shown = ", ".join(sorted(tables)[:5]) + (" ..." if len(tables) > 5 else "")
        raise InputError(
            f"{path}: is an SQLite database but not an eaglewatch run database (it holds tables {shown}); "
            "eaglewatch leaves it untouched: pass the path of a run database (or a new file) with --db"
        )


def _readonly_folder(path: Path) -> bool:
    import os

    return not os.access(path.parent, os.W_OK) or _mounted_readonly(path.parent)


def _mounted_readonly(folder: Path) -> bool:
    import os

    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _refuse_newer(path: Path, version: int, known: int = SCHEMA_VERSION) -> None:
    if version > known:
        raise InputError(
            f"{path}: was written by a newer eaglewatch (schema version {version}; this version knows up to "
            f"{known}); upgrade eaglewatch to open it, or pass another database path"
        )


def migrate(
    path: str | Path,
    *,
    create: bool = True,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    migrations: tuple[str, ...] = MIGRATIONS,
    check: bool = True,
) -> int:
    """Bring the database at `path` to the current schema (creating it when `create`); return the version.

    Raises InputError (file untouched) for a non-SQLite file, another program's SQLite file, a damaged file
    (`PRAGMA quick_check` when `check`), a read-only folder, a locked file or a newer schema.
    """
    path = Path(path)
    target = len(migrations)
    exists = check_file(path)
    if not exists and not create:
        raise InputError(
            f"{path}: no such database; run `eaglewatch ingest CONFIG` first or pass another database path"
        )
    if _readonly_folder(path):
        if not exists:  # nothing to copy yet: the database must be made elsewhere
            raise InputError(
                f"{path}: cannot be created: its folder {path.parent} is read-only (or not writable by this user); "
                "set run.database (or --db) to a path in a writable folder"
            )
        raise InputError(
            f"{path}: its folder {path.parent} is read-only, and a run database is written with a journal beside "
            "it (-wal, -shm); copy it to a writable folder for this command. The reading verbs (status, watch "
            "--readonly, export) work where it is."
        )
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    try:
        version = _read_version(conn, path)
        _refuse_newer(path, version, target)
        if exists:
            _refuse_foreign(conn, path, version)
            if check:
                _quick_check(conn, path)
        # Take the write lock even when there is nothing to migrate: a writer that cannot get it now
        # would fail later, halfway through its work.
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise _locked(path, exc) from None
        try:
            version = _read_version(conn, path)  # another process may have migrated meanwhile
            _refuse_newer(path, version, target)
            _refuse_foreign(conn, path, version)
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
    path: str | Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, upgrade: bool = False, check: bool = True
) -> sqlite3.Connection:
    """A read-only connection (usable from any thread) to an existing, current eaglewatch run database.

    Never writes to a file that is not an eaglewatch database (refused, untouched) and never creates one.
    An older eaglewatch schema is migrated first when `upgrade`, else refused with the command that upgrades
    it. `check` runs `PRAGMA quick_check` (a damaged file is an InputError). In a read-only folder the file
    is opened `immutable=1` (changes still in a -wal file there are not seen; a writer cannot exist there).
    """
    path = Path(path)
    if not check_file(path):
        raise InputError(
            f"{path}: no such database; run `eaglewatch ingest CONFIG` first or pass another database path"
        )
    immutable = _readonly_folder(path)
    uri = f"{path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None)
    try:
        version = _read_version(conn, path)
        _refuse_newer(path, version)
        if version == 0 and not _tables(conn, path):
            raise InputError(f"{path}: is an empty database, not a run yet; run `eaglewatch ingest CONFIG` first")
        _refuse_foreign(conn, path, version)
        if version < SCHEMA_VERSION and upgrade and not immutable:
            conn.close()
            migrate(path, create=False, busy_timeout_s=busy_timeout_s)
            return connect_readonly(path, busy_timeout_s=busy_timeout_s, check=False)
        if version < SCHEMA_VERSION:
            how = (
                "copy it to a writable folder and run `eaglewatch status --db COPY` to upgrade it"
                if immutable
                else f"upgrade it with `eaglewatch status --db {path}`"
            )
            raise InputError(
                f"{path}: has schema version {version}, older than this eaglewatch's {SCHEMA_VERSION}; {how}"
            )
        if check:
            _quick_check(conn, path)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        conn.execute("PRAGMA query_only = ON")
    except BaseException:
        conn.close()
        raise
    return conn
