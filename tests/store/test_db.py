"""Opening a database: migrations forward, and refusing files that are not ours, untouched."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.errors import InputError
from app.store.db import connect_readonly, migrate
from app.store.ids import pack_ids, unpack_ids
from app.store.schema import MIGRATIONS, SCHEMA_VERSION


def tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
    finally:
        conn.close()


def user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


def test_new_database_gets_the_current_schema_in_wal_mode(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    assert migrate(db) == SCHEMA_VERSION
    assert user_version(db) == SCHEMA_VERSION
    assert {"runs", "samples", "responses", "reconstructions", "jobs", "job_shards", "events", "commands"} <= tables(db)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_old_version_database_is_upgraded_keeping_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    migrate(db, migrations=MIGRATIONS[:1])  # a database from the first release
    assert user_version(db) == 1
    assert "reconstructions_by_run_category" not in tables(db)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('kept', 0, 0)")
    conn.commit()
    conn.close()

    assert migrate(db) == SCHEMA_VERSION
    assert user_version(db) == SCHEMA_VERSION
    assert "reconstructions_by_run_category" in tables(db)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT name FROM runs").fetchall() == [("kept",)]
    conn.close()


def test_migrating_twice_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    migrate(db)
    before = tables(db)
    assert migrate(db) == SCHEMA_VERSION
    assert tables(db) == before


def test_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    db = tmp_path / "future.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE future (x)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    with pytest.raises(InputError, match=rf"future\.db: was written by a newer eaglewatch \(schema version {SCHEMA_VERSION + 5}"):
        migrate(db)
    with pytest.raises(InputError, match="newer eaglewatch"):
        connect_readonly(db)
    assert db.read_bytes() == before


def test_non_sqlite_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    db = tmp_path / "notes.db"
    db.write_text("these are my notes, not a database\n")
    before = db.read_bytes()
    with pytest.raises(InputError, match=r"notes\.db: is not an SQLite database"):
        migrate(db)
    with pytest.raises(InputError, match="is not an SQLite database"):
        connect_readonly(db)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_locked_database_is_refused_clearly(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"
    migrate(db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('held', 0, 0)")
    try:
        with pytest.raises(InputError, match=r"busy\.db: is locked by another process"):
            migrate(db, busy_timeout_s=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert migrate(db, busy_timeout_s=0.1) == SCHEMA_VERSION  # usable once the lock is gone


def test_locked_fresh_rollback_journal_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "plain.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO t VALUES (1)")
    try:
        with pytest.raises(InputError, match="is locked by another process"):
            migrate(db, busy_timeout_s=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert user_version(db) == 0


def test_missing_database_for_a_reader(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such database; run `eaglewatch ingest CONFIG` first"):
        connect_readonly(tmp_path / "none.db")
    assert not (tmp_path / "none.db").exists()


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        migrate(tmp_path / "no" / "such" / "x.db")


def test_readonly_connection_refuses_writes_and_old_schemas(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    migrate(db, migrations=MIGRATIONS[:1])
    with pytest.raises(InputError, match="older than this eaglewatch"):
        connect_readonly(db)
    conn = connect_readonly(db, upgrade=True)
    assert user_version(db) == SCHEMA_VERSION
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('x', 0, 0)")
    conn.close()


@pytest.mark.parametrize("ids", [(), (0,), (1, 2, 3), (2**32 - 1, 163584, 7)])
def test_ids_round_trip_as_little_endian_uint32(ids: tuple[int, ...]) -> None:
    blob = pack_ids(ids)
    assert blob is not None and len(blob) == 4 * len(ids)
    assert unpack_ids(blob) == ids


def test_ids_layout_and_errors() -> None:
    assert pack_ids([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert pack_ids(None) is None and unpack_ids(None) is None
    with pytest.raises(ValueError):
        pack_ids([-1])
    with pytest.raises(ValueError):
        pack_ids([2**32])
    with pytest.raises(ValueError, match="multiple of 4"):
        unpack_ids(b"\x00\x01\x02")
