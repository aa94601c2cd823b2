"""The store's ingest operations: samples and reference ids in chunked transactions, and per-file progress.

Each chunk of a file is ONE write operation of the `RunStore` writer (one short transaction beside a
live engine, never the whole file under one lock); the chunk's progress row in `ingest_files`
(schema v5) is written in the same transaction, so a SIGKILL leaves either the chunk and its progress
or neither. A file is marked complete only after its last chunk; `ingest_status(conn, run_id)` tells
anyone (the engine before it leases) whether every recorded file of a run was fully ingested.

Duplicate ids: a line whose id the run already holds with the same dataset, prompt and tools is
"already present"; with different content it is a conflict, reported per line as `file:line` and counted.
The check walks the (run_id, sample_id) unique index once per line of the chunk (json_each outer, a CROSS
JOIN so the planner cannot turn it into a scan of the run's samples per line).
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

from app.errors import InputError
from app.store.ids import pack_ids
from app.store.store_records import IngestReport, ReferenceRecord, SampleInput
from app.store.tallies import add_ingested

INGEST_CHUNK = 5000
# a chunk of long prompts ends at this much text instead: two chunks are in flight (one read, one written), and
# 5,000 prompts of 5 KB (a 1 GB JSON array of long chats) took the ingest to 338 MB peak RSS; capped, 92 MB
INGEST_CHUNK_BYTES = 2_000_000
MAX_CONFLICT_EXAMPLES = 5


class StoreWriter(Protocol):
    """The one thing these operations need of the run store (`RunStore.write`): run one write operation
    in the writer's next transaction and return its result."""

    async def write(self, op: Any) -> Any: ...


__all__ = [
    "INGEST_CHUNK",
    "IngestFile",
    "IngestStatus",
    "attach_references",
    "begin_file",
    "finish_file",
    "ingest",
    "ingest_status",
    "pipelined",
    "require_complete",
]


# ---------------------------------------------------------------------------------------------- progress


@dataclass(frozen=True, slots=True)
class IngestFile:
    """One input file of a run as recorded: role 'dataset' or 'reference', its content fingerprint, progress."""

    role: str
    name: str
    path: str
    fingerprint: str
    options: str
    lines_done: int
    complete: bool
    finished_at: float | None
    bad_lines: int = 0
    conflicts: int = 0


@dataclass(frozen=True, slots=True)
class IngestStatus:
    """Every recorded input file of a run; `complete` when none is half-ingested."""

    files: tuple[IngestFile, ...]

    @property
    def complete(self) -> bool:
        """True when every recorded file was fully ingested (also when none is recorded: nothing to finish)."""
        return all(f.complete for f in self.files)

    @property
    def incomplete(self) -> tuple[IngestFile, ...]:
        """The files whose ingest was interrupted (or is running now)."""
        return tuple(f for f in self.files if not f.complete)

    def describe(self) -> str:
        """One sentence naming the half-ingested files and what to do."""
        if self.complete:
            return "every input file is fully ingested"
        names = ", ".join(f"{f.role} {f.name!r} ({f.path}, {f.lines_done} lines so far)" for f in self.incomplete)
        return (
            f"the ingest of {names} did not finish; run `eaglewatch ingest CONFIG` (or the same `run` again) to "
            "finish it, or allow a partial run explicitly"
        )


def ingest_status(conn: sqlite3.Connection, run_id: int) -> IngestStatus:
    """The ingest progress of every input file of `run_id` (any connection, read-only is fine)."""
    rows = conn.execute(
        "SELECT role, name, path, fingerprint, options, lines_done, complete, finished_at, bad_lines, conflicts "
        "FROM ingest_files WHERE run_id = ? ORDER BY role, name",
        (run_id,),
    ).fetchall()
    return IngestStatus(
        tuple(IngestFile(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], r[8], r[9]) for r in rows)
    )


def require_complete(status: IngestStatus, *, allow_partial: bool = False) -> None:
    """Raise InputError (naming the files and what to do) when the run is half-ingested, unless allowed."""
    if not status.complete and not allow_partial:
        raise InputError(status.describe())


def file_record(conn: sqlite3.Connection, run_id: int, role: str, name: str) -> IngestFile | None:
    """The recorded progress of one input file, or None when it was never ingested into this run."""
    for f in ingest_status(conn, run_id).files:
        if f.role == role and f.name == name:
            return f
    return None


def sample_pks(conn: sqlite3.Connection, run_id: int) -> dict[str, int]:
    """Sample id -> row key of every sample the run holds (what a caller settling results by sample id needs)."""
    return dict(conn.execute("SELECT sample_id, pk FROM samples WHERE run_id = ?", (run_id,)).fetchall())


async def begin_file(
    store: StoreWriter, run_id: int, role: str, name: str, path: str, fingerprint: str, options: str
) -> None:
    """Record that ingesting a file starts (complete = 0) before its first chunk commits."""

    def op(conn: sqlite3.Connection) -> None:
        now = time.time()
        conn.execute(
            "INSERT INTO ingest_files (run_id, role, name, path, fingerprint, options, lines_done, complete, "
            "started_at, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?, 0, 0, ?, ?) ON CONFLICT (run_id, role, name) DO UPDATE SET "
            "path = excluded.path, fingerprint = excluded.fingerprint, options = excluded.options, lines_done = 0, "
            "complete = 0, started_at = excluded.started_at, finished_at = NULL, updated_at = excluded.updated_at",
            (run_id, role, name, path, fingerprint, options, now, now),
        )

    await store.write(op)


async def finish_file(
    store: StoreWriter, run_id: int, role: str, name: str, lines: int, *, bad_lines: int = 0, conflicts: int = 0
) -> None:
    """Mark a file fully ingested (after its last chunk committed), with what its pass refused."""

    def op(conn: sqlite3.Connection) -> None:
        now = time.time()
        conn.execute(
            "UPDATE ingest_files SET complete = 1, lines_done = ?, bad_lines = ?, conflicts = ?, finished_at = ?, "
            "updated_at = ? WHERE run_id = ? AND role = ? AND name = ?",
            (lines, bad_lines, conflicts, now, now, run_id, role, name),
        )

    await store.write(op)


def _progress(conn: sqlite3.Connection, run_id: int, track: tuple[str, str] | None, line: int) -> None:
    if track is not None and line:
        conn.execute(
            "UPDATE ingest_files SET lines_done = MAX(lines_done, ?), updated_at = ? WHERE run_id = ? AND role = ? "
            "AND name = ?",
            (line, time.time(), run_id, *track),
        )


# ---------------------------------------------------------------------------------------------- samples


async def ingest(
    store: StoreWriter,
    run_id: int,
    samples: Iterable[SampleInput],
    *,
    chunk: int = INGEST_CHUNK,
    source: str = "",
    track: tuple[str, str] | None = None,
) -> IngestReport:
    """Insert samples (pending) that the run does not hold yet; existing sample ids are left untouched.

    The iterable is consumed in chunks on a worker thread while the previous chunk is inserted, so a
    generator over a large file is never materialised and reading overlaps writing. `source` (the file)
    prefixes each conflict's `file:line`; `track` = (role, name) advances that file's `ingest_files` row
    in each chunk's transaction.
    """
    return await pipelined(
        store, samples, chunk, _sample_batch, lambda b: b.n > 0, lambda b: _insert_samples_op(run_id, b, source, track)
    )


B = TypeVar("B")


async def pipelined(
    store: StoreWriter,
    items: Iterable[Any],
    chunk: int,
    batch_of: Callable[[Iterator[Any], int], B],
    has_rows: Callable[[B], bool],
    op_of: Callable[[B], Callable[[sqlite3.Connection], IngestReport]],
) -> IngestReport:
    """Ingest `items` chunk by chunk: the next chunk is read (`batch_of`, on a worker thread) while the one before
    it is written (`op_of(batch)`, one transaction each); the chunks' reports added up."""
    it = iter(items)
    report = IngestReport()
    batch = await asyncio.to_thread(batch_of, it, chunk)
    while has_rows(batch):
        pending = asyncio.ensure_future(store.write(op_of(batch)))
        try:
            nxt = await asyncio.to_thread(batch_of, it, chunk)
        finally:
            part = await pending
        report = report + part
        batch = nxt
    return report


@dataclass(frozen=True, slots=True)
class _SampleBatch:
    """A chunk of samples as one JSON array of [sample_id, dataset, messages, tools, line] (NULL-free ids)."""

    n: int
    rows_json: str
    references: list[tuple[str, bytes]]  # (sample_id, packed ids) for the few samples that carry them
    last_line: int


def _text_size(messages: list[dict[str, Any]]) -> int:
    """About how many characters a prompt's messages hold (string contents; 256 for any other)."""
    return sum(len(c) if isinstance(c := m.get("content"), str) else 256 for m in messages)


def _sample_batch(it: Iterator[SampleInput], chunk: int) -> _SampleBatch:
    """The next `chunk` samples, or fewer whose text reaches INGEST_CHUNK_BYTES, as one JSON array."""
    part: list[SampleInput] = []
    size = 0
    for sample in itertools.islice(it, chunk):
        part.append(sample)
        size += _text_size(sample.messages)
        if size >= INGEST_CHUNK_BYTES:
            break
    refs = [(s.sample_id, pack_ids(s.reference_ids)) for s in part if s.reference_ids is not None]
    rows = [(s.sample_id, s.dataset, s.messages, s.tools, s.line, s.category, s.language) for s in part]
    last = max((s.line for s in part), default=0)
    return _SampleBatch(len(part), orjson.dumps(rows).decode("utf-8"), refs, last)  # type: ignore[arg-type]


# The whole chunk is inserted by ONE statement over json_each: sqlite3 then runs it without holding the
# GIL, so the next chunk is parsed in parallel (executemany re-takes the GIL for every row).
_INSERT_SAMPLES = (
    "INSERT OR IGNORE INTO samples (run_id, sample_id, dataset, messages, tools, category, language, updated_at) "
    "SELECT ?1, json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), "
    "CASE json_type(value, '$[3]') WHEN 'null' THEN NULL ELSE json_extract(value, '$[3]') END, "
    "json_extract(value, '$[5]'), json_extract(value, '$[6]'), ?2 "
    "FROM json_each(?3)"
)
# Lines of the chunk whose id the run holds with different content (dataset, prompt or tools). json_each is
# the outer loop (CROSS JOIN fixes the order), each line one lookup in the (run_id, sample_id) unique index.
_CONFLICTS = (
    "SELECT json_extract(j.value, '$[0]'), json_extract(j.value, '$[4]'), s.dataset, "
    "s.dataset != json_extract(j.value, '$[1]') "
    "FROM json_each(?2) AS j CROSS JOIN samples AS s "
    "ON s.run_id = ?1 AND s.sample_id = json_extract(j.value, '$[0]') "
    "WHERE s.dataset != json_extract(j.value, '$[1]') OR s.messages != json_extract(j.value, '$[2]') "
    "OR s.tools IS NOT (CASE json_type(j.value, '$[3]') WHEN 'null' THEN NULL ELSE json_extract(j.value, '$[3]') END)"
)


def _insert_samples_op(run_id: int, batch: _SampleBatch, source: str, track: tuple[str, str] | None):
    def op(conn: sqlite3.Connection) -> IngestReport:
        max_pk_before = conn.execute("SELECT COALESCE(MAX(pk), 0) FROM samples").fetchone()[0]
        before = conn.total_changes
        conn.execute(_INSERT_SAMPLES, (run_id, time.time(), batch.rows_json))
        added = conn.total_changes - before
        add_ingested(conn, run_id, added, max_pk_before)  # no per-row INSERT trigger: ingest counts its own
        ignored = batch.n - added
        conflicts: list[str] = []
        if ignored:  # only a chunk with duplicates pays for the check
            for sid, line, held_by, other_dataset in conn.execute(_CONFLICTS, (run_id, batch.rows_json)):
                where = (f"{source}:{line}: " if source else f"line {line}: ") if line else ""
                why = (
                    f"held by dataset {held_by!r}" if other_dataset else "already held with a different prompt or tools"
                )
                conflicts.append(f"{where}id {sid!r} {why}; skipped (give the line a distinct id)")
        if batch.references:
            conn.executemany(
                "UPDATE samples SET reference_ids = ? WHERE run_id = ? AND sample_id = ? AND reference_ids IS NULL",
                [(blob, run_id, sid) for sid, blob in batch.references],
            )
        _progress(conn, run_id, track, batch.last_line)
        return IngestReport(
            added=added,
            already_present=ignored - len(conflicts),
            conflicts=len(conflicts),
            conflict_examples=tuple(conflicts[:MAX_CONFLICT_EXAMPLES]),
        )

    return op


# ---------------------------------------------------------------------------------------------- references


async def attach_references(
    store: StoreWriter,
    run_id: int,
    references: Iterable[ReferenceRecord],
    *,
    chunk: int = INGEST_CHUNK,
    track: tuple[str, str] | None = None,
) -> tuple[int, int]:
    """Set reference ids on samples that have none yet; return (attached, unmatched sample ids)."""
    it = iter(references)
    attached = unmatched = 0

    def take() -> tuple[list[tuple[Any, ...]], int]:
        part = list(itertools.islice(it, chunk))
        rows = [(pack_ids(r.output_ids), r.finish_reason, time.time(), run_id, r.sample_id) for r in part]
        return rows, max((r.line for r in part), default=0)

    def op_for(rows: list[tuple[Any, ...]], last_line: int):
        def op(conn: sqlite3.Connection) -> tuple[int, int]:
            changed = missing = 0
            for row in rows:
                cur = conn.execute(
                    "UPDATE samples SET reference_ids = ?, reference_finish = ?, updated_at = ? "
                    "WHERE run_id = ? AND sample_id = ? AND reference_ids IS NULL",
                    row,
                )
                if cur.rowcount:
                    changed += 1
                elif (
                    conn.execute(
                        "SELECT 1 FROM samples WHERE run_id = ? AND sample_id = ?", (run_id, row[4])
                    ).fetchone()
                    is None
                ):
                    missing += 1
            _progress(conn, run_id, track, last_line)
            return changed, missing

        return op

    rows, last = await asyncio.to_thread(take)
    while rows:
        a, m = await store.write(op_for(rows, last))
        attached += a
        unmatched += m
        rows, last = await asyncio.to_thread(take)
    return attached, unmatched
