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
    with pytest.raises(
        InputError, match=rf"future\.db: was written by a newer eaglewatch \(schema version {SCHEMA_VERSION + 5}"
    ):
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


# ------------------------------------------------------------------ refusals, damaged files, read-only opens

import hashlib  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def eaglewatch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def foreign_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('mine')")
    conn.commit()
    conn.close()
    return path


def test_another_programs_sqlite_file_is_left_untouched_by_every_verb(tmp_path: Path) -> None:
    db = foreign_db(tmp_path / "other.sqlite")
    before = digest(db)
    for args in (
        ["status", "--db", str(db)],
        ["export", "--db", str(db), "--format", "specforge", "--out", str(tmp_path / "out")],
    ):
        out = eaglewatch(*args, cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        assert "is an SQLite database but not an eaglewatch run database (it holds tables notes)" in out.stderr
        assert "Traceback" not in out.stderr
    with pytest.raises(InputError, match="not an eaglewatch run database"):
        migrate(db)  # the writers' way in refuses it too
    assert digest(db) == before and tables(db) == {"notes"}
    assert not Path(f"{db}-wal").exists()


def _run_config(tmp_path: Path, db: Path, n: int = 3000) -> Path:
    with (tmp_path / "prompts.jsonl").open("w") as fh:
        for i in range(n):
            fh.write('{"id": "s%d", "messages": [{"role": "user", "content": "question %d %s"}]}\n' % (i, i, "x" * 200))
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        f'[run]\nname = "t"\ndatabase = "{db}"\n\n[data]\n\n[[data.datasets]]\npath = "prompts.jsonl"\n\n'
        f'[model]\nname = "m"\ntokenizer = "{ROOT / "sample_data" / "tokenizer"}"\n\n'
        '[[endpoints]]\nbase_url = "http://127.0.0.1:1/v1"\n'
    )
    return cfg


def test_a_database_corrupted_mid_file_fails_status_run_and_export_with_a_sentence(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    cfg = _run_config(tmp_path, db)
    assert eaglewatch("ingest", str(cfg), cwd=tmp_path).returncode == 0
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0  # checkpointed on close
    size = db.stat().st_size
    with db.open("r+b") as fh:  # garbage over a few pages in the middle of the file
        fh.seek(size // 2)
        fh.write(os.urandom(4096 * 3))
    for args in (
        ["status", "--db", str(db)],
        ["run", "--headless", str(cfg)],
        ["ingest", str(cfg)],
        ["export", "--db", str(db), "--format", "specforge", "--out", str(tmp_path / "out")],
    ):
        out = eaglewatch(*args, cwd=tmp_path)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        assert f"{db}: the database is damaged" in out.stderr and ".recover" in out.stderr, out.stderr


@pytest.fixture
def readonly_folder(tmp_path: Path):
    """A folder the process cannot write, even as root: a read-only bind mount of a writable one."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here (needs CAP_SYS_ADMIN); the read-only folder case is untested")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield src, ro
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_a_read_only_folder_has_its_own_message_and_read_verbs_work_there(tmp_path: Path, readonly_folder) -> None:
    src, ro = readonly_folder
    cfg = _run_config(tmp_path, src / "runs.db", n=20)
    assert eaglewatch("ingest", str(cfg), cwd=tmp_path).returncode == 0
    assert not (src / "runs.db-wal").exists()
    db = ro / "runs.db"
    with pytest.raises(OSError):
        (ro / "probe").write_text("x")  # really read-only

    status = eaglewatch("status", "--db", str(db), "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert __import__("json").loads(status.stdout)["runs"][0]["states"]["pending"] == 20
    conn = connect_readonly(db)
    assert conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 20
    conn.close()

    write = eaglewatch("ingest", str(cfg), "--db", str(db), cwd=tmp_path)
    assert write.returncode == 2 and "Traceback" not in write.stderr
    assert f"its folder {ro} is read-only" in write.stderr and "status, watch" in write.stderr


def test_a_new_database_in_a_read_only_folder_is_refused_before_anything_with_advice_that_fits(
    tmp_path: Path, readonly_folder
) -> None:
    _, ro = readonly_folder
    cfg = _run_config(tmp_path, ro / "new.db", n=5)
    for verb in (["config", "check"], ["ingest"], ["run", "--headless"]):
        p = eaglewatch(*verb, str(cfg), cwd=tmp_path)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (verb, p.stderr)
        assert f"new.db cannot be created: its folder {ro} is read-only" in p.stderr, (verb, p.stderr)
        assert "set run.database (or --db)" in p.stderr and "copy" not in p.stderr
    assert not (ro / "new.db").exists()


def test_an_empty_file_is_not_a_run_for_the_read_verbs(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    db.write_bytes(b"")
    with pytest.raises(InputError, match="is an empty database, not a run yet"):
        connect_readonly(db)
    assert db.read_bytes() == b""


def test_checking_a_file_beside_a_live_connection_keeps_its_wal_for_everyone(tmp_path: Path) -> None:
    """Regression: check_file used to open() the database to read its header; closing that descriptor dropped
    this process's POSIX locks, so another process's closing connection took the database for unused and
    deleted the -wal/-shm the live connection still used (an attached viewer then froze; a headless engine's
    later writes vanished)."""
    import subprocess
    import sys

    from app.store.db import check_file, connect_readonly

    db = tmp_path / "live.db"
    migrate(db)
    live = sqlite3.connect(db, isolation_level=None)  # the engine's connection, kept open
    live.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('r', 0, 0)")
    assert (tmp_path / "live.db-wal").exists()
    check_file(db)  # what every read verb and viewer open does, in this same process
    connect_readonly(db, check=False).close()
    other = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT COUNT(*) FROM runs').fetchone(); "
        "c.close()"
    )
    subprocess.run([sys.executable, "-c", other, str(db)], check=True)  # another process opens and closes
    assert (tmp_path / "live.db-wal").exists(), "another process deleted the WAL of a live connection"
    live.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('s', 0, 0)")
    reader = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert reader.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2  # the live writes stay visible
    reader.close()
    live.close()
