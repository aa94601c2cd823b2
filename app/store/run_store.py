"""The writer side of the run store: one task batches every state change into few transactions.

Each public write builds a small synchronous operation on the connection and submits it; the writer
task collects what is queued (at most `batch_max` operations, lingering at most `batch_linger_s` for more;
by default none: a group commit, whatever queued while the previous batch ran goes in the next one),
runs the whole batch on aiosqlite's connection thread in ONE transaction (each operation inside its own
savepoint, so one failing operation fails alone), commits, and only then resolves each caller's future.
Readers use their own connections (`app.store.queries`), which WAL lets run while this writes.

The mismatch list's text index is filled in bulk (schema v6): a reconstruction written here is queued in
`mismatch_text_pending` by a trigger, and the writer moves the queue into `mismatch_text` with
`index_pending_text` in a transaction of its own after every INDEX_TEXT_EVERY reconstructions, after its first
batch (what an earlier writer left) and at close (the text filter finds queued rows too, with LIKE).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import orjson

from app.conversation import ConversationInput
from app.errors import EaglewatchError, InputError
from app.store import conversation_ops, ingest_ops, queries, rows, tallies
from app.store.conversation_ops import OpenTurnWork, TurnEnd, after_turn, restore_children_of
from app.store.db import DEFAULT_BUSY_TIMEOUT_S, configure, migrate
from app.store.ids import unpack_ids
from app.store.ingest_ops import INGEST_CHUNK
from app.store.schema import RUN_STATES, SAMPLE_STATES
from app.store.store_records import (
    Command,
    IngestReport,
    LeasedSample,
    ReferenceRecord,
    ResultRecord,
    SampleInput,
)

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection], Any]

_STOP = object()

# reconstructions written between two bulk moves of the text-index queue: ~8 ms of the store thread per move
# (0.008 ms a row), and at most this many rows the text filter matches with LIKE instead of the index
INDEX_TEXT_EVERY = 1000
INDEX_TEXT_CHUNK = 5000  # rows per transaction when indexing a longer queue (a reprocess, a crashed writer's)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode("utf-8")


class RunStore:
    """Async access to one run database: batched writes through a single writer task."""

    def __init__(self, path: Path, db: aiosqlite.Connection, *, batch_max: int, batch_linger_s: float) -> None:
        self.path = path
        self._db = db
        self._batch_max = batch_max
        self._linger = batch_linger_s
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._writer = asyncio.create_task(self._write_loop(), name="eaglewatch-store-writer")
        self._closed = False
        self.commits = 0  # transactions committed so far (for tests and metrics)
        self._unindexed = INDEX_TEXT_EVERY  # reconstructions queued for the text index (unknown at open: a move)

    # ------------------------------------------------------------------------------------ lifecycle

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        batch_max: int = 256,
        # no linger by default: the engine holds a request's slot until its result commits, so a 10 ms
        # linger capped a zero-latency endpoint at 0.47x bare aiohttp (0.73x without; bench/engine.py)
        batch_linger_s: float = 0.0,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> RunStore:
        """Open (creating and migrating as needed) the database; InputError if it is not usable."""
        path = Path(path)
        await asyncio.to_thread(migrate, path, busy_timeout_s=busy_timeout_s)
        db = await aiosqlite.connect(path, isolation_level=None)
        if not hasattr(db, "_execute") or not hasattr(db, "_conn"):  # pragma: no cover - aiosqlite API guard
            await db.close()
            raise EaglewatchError("this aiosqlite version lacks Connection._execute; install aiosqlite>=0.21,<0.23")
        await db._execute(configure, db._conn, busy_timeout_s)
        return cls(path, db, batch_max=batch_max, batch_linger_s=batch_linger_s)

    async def close(self) -> None:
        """Commit everything queued, stop the writer and close the connection."""
        if self._closed:
            return
        self._closed = True
        await self._queue.put(_STOP)
        await self._writer
        await self._db.close()

    async def __aenter__(self) -> RunStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------------------------ machinery

    async def write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run `op(conn)` inside the writer's next batch transaction; return its result after the commit.

        `op` runs on the database thread, must only touch `conn`, and must not commit or roll back.
        """
        if self._closed:
            raise EaglewatchError(f"{self.path}: the run store is closed")
        if self._writer.done():
            raise EaglewatchError(f"{self.path}: the run store's writer has stopped")
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        await self._queue.put((op, fut))
        return await fut

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` on the writer's connection between batches (sees every committed write)."""
        return await self._db._execute(fn, self._db._conn)

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        while not stopping:
            first = await self._queue.get()
            if first is _STOP:
                break
            batch = [first]
            deadline = loop.time() + self._linger
            while len(batch) < self._batch_max:
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self._queue.get(), remaining)
                    except TimeoutError:
                        break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            live = [(op, fut) for op, fut in batch if not fut.cancelled()]
            try:
                results = await self._db._execute(_run_batch, self._db._conn, [op for op, _ in live], self.path)
            except BaseException as exc:  # the connection itself failed: fail the batch, keep serving
                results = [(False, exc)] * len(live)
            else:
                self.commits += 1
            for (_, fut), (ok, value) in zip(live, results, strict=True):
                if fut.done():
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
            if self._unindexed >= INDEX_TEXT_EVERY:
                await self._index_text()
        await self._index_text()
        # drain anything queued after the stop marker
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not _STOP and not item[1].done():
                item[1].set_exception(EaglewatchError(f"{self.path}: the run store closed before this write"))

    async def _index_text(self) -> None:
        """Move the text-index queue into `mismatch_text` (`index_pending_text`), a chunk per transaction,
        between write batches. A failure (a locked or full database) leaves the rows queued, where the text
        filter still finds them, for the next move."""
        self._unindexed = 0
        while True:
            try:
                if not await self._db._execute(_text_queued, self._db._conn):
                    return  # (a read: no write lock taken for nothing, at close either)
                [(ok, moved)] = await self._db._execute(_run_batch, self._db._conn, [index_pending_text], self.path)
            except BaseException:  # the connection itself failed: the next batch will say so
                return
            if not ok:
                return
            self.commits += 1
            if moved < INDEX_TEXT_CHUNK:
                return

    # ------------------------------------------------------------------------------------ runs

    async def ensure_run(self, name: str, config: dict[str, Any] | None = None) -> int:
        """The id of the run called `name`, created (state idle) if missing; its stored config is updated."""
        cfg = _dumps(config or {})

        def op(conn: sqlite3.Connection) -> int:
            now = time.time()
            conn.execute(
                "INSERT INTO runs (name, config, created_at, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET config = excluded.config, updated_at = excluded.updated_at",
                (name, cfg, now, now),
            )
            return conn.execute("SELECT id FROM runs WHERE name = ?", (name,)).fetchone()[0]

        return await self.write(op)

    async def set_run_state(self, run_id: int, state: str, reason: str | None = None) -> None:
        """Set a run's state (one of RUN_STATES) and why."""
        if state not in RUN_STATES:
            raise ValueError(f"unknown run state {state!r}; expected one of {', '.join(RUN_STATES)}")

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE runs SET state = ?, reason = ?, updated_at = ? WHERE id = ?",
                (state, reason, time.time(), run_id),
            )

        await self.write(op)

    # ------------------------------------------------------------------------------------ ingest

    async def ingest(
        self,
        run_id: int,
        samples: Iterable[SampleInput],
        *,
        chunk: int = INGEST_CHUNK,
        source: str = "",
        track: tuple[str, str] | None = None,
    ) -> IngestReport:
        """Insert samples the run does not hold yet, in chunked transactions (see `app.store.ingest_ops.ingest`)."""
        return await ingest_ops.ingest(self, run_id, samples, chunk=chunk, source=source, track=track)

    async def ingest_conversations(
        self,
        run_id: int,
        conversations: Iterable[ConversationInput],
        *,
        chunk: int = INGEST_CHUNK,
        source: str = "",
        track: tuple[str, str] | None = None,
    ) -> IngestReport:
        """Insert the conversations the run does not hold yet as turn rows (turn 1 pending, later turns waiting;
        `app.store.conversation_ops.ingest_conversations`); the report counts conversations."""
        return await conversation_ops.ingest_conversations(
            self, run_id, conversations, chunk=chunk, source=source, track=track
        )

    async def attach_references(
        self,
        run_id: int,
        references: Iterable[ReferenceRecord],
        *,
        chunk: int = INGEST_CHUNK,
        track: tuple[str, str] | None = None,
    ) -> tuple[int, int]:
        """Set reference ids on samples that have none yet; return (attached, unmatched sample ids)."""
        return await ingest_ops.attach_references(self, run_id, references, chunk=chunk, track=track)

    # ------------------------------------------------------------------------------------ leases

    async def lease(self, run_id: int, n: int, lease_s: float, owner: str | None = None) -> list[LeasedSample]:
        """Hand out up to n pending samples until now + lease_s, held by `owner` (host:pid); each lease counts one
        in `attempts`, and `tries` says how many requests the sample has already cost. Order: the conversation
        turns with the most turns after them first (the longest remaining chain: keeps the most conversations in
        progress, so the endpoints stay full to the end), then oldest first; single-turn samples have none after
        them. A conversation's later turns are never pending before their parent is stored."""
        if n <= 0:
            return []

        def op(conn: sqlite3.Connection) -> list[LeasedSample]:
            now = time.time()
            expires = now + lease_s
            rows = conn.execute(
                "UPDATE samples SET state = 'leased', lease_expires = ?, lease_owner = ?, attempts = attempts + 1, "
                "updated_at = ? "
                "WHERE pk IN (SELECT pk FROM samples WHERE run_id = ? AND state = 'pending' "
                "ORDER BY COALESCE(turns - turn, 0) DESC, pk LIMIT ?) "
                "RETURNING pk, sample_id, dataset, messages, tools, attempts, reference_ids, tries, tries_forgiven, "
                "conversation_id, turn, turns",
                (expires, owner, now, run_id, n),
            ).fetchall()
            rows.sort(key=lambda r: (-((r[11] or 0) - (r[10] or 0)), r[0]))
            return [
                LeasedSample(
                    pk=r[0],
                    sample_id=r[1],
                    dataset=r[2],
                    messages=json.loads(r[3]),
                    tools=json.loads(r[4]) if r[4] is not None else None,
                    attempts=r[5],
                    reference_ids=unpack_ids(r[6]),
                    lease_expires=expires,
                    tries=r[7],
                    tries_forgiven=r[8],
                    conversation_id=r[9],
                    turn=r[10],
                    turns=r[11],
                )
                for r in rows
            ]

        return await self.write(op)

    async def expire_leases(self, run_id: int) -> int:
        """Return leased samples whose lease has expired to pending (a crashed or stuck worker); return how many."""

        def op(conn: sqlite3.Connection) -> int:
            now = time.time()
            return conn.execute(
                "UPDATE samples SET state = 'pending', lease_expires = NULL, updated_at = ? "
                "WHERE run_id = ? AND state = 'leased' AND lease_expires <= ?",
                (now, run_id, now),
            ).rowcount

        return await self.write(op)

    async def keep_leases(self, run_id: int, pks: Iterable[int], lease_s: float, owner: str | None = None) -> int:
        """The lease heartbeat, in one transaction: extend the leases this engine holds (`pks`) to now + lease_s,
        then return every other lease of the run that has expired to pending. Returns how many expired."""
        keep = list(pks)

        def op(conn: sqlite3.Connection) -> int:
            now = time.time()
            conn.executemany(
                "UPDATE samples SET lease_expires = ?, lease_owner = ? WHERE run_id = ? AND pk = ? AND state = "
                "'leased'",
                [(now + lease_s, owner, run_id, pk) for pk in keep],
            )
            return conn.execute(
                "UPDATE samples SET state = 'pending', lease_expires = NULL, lease_owner = NULL, updated_at = ? "
                "WHERE run_id = ? AND state = 'leased' AND lease_expires <= ?",
                (now, run_id, now),
            ).rowcount

        return await self.write(op)

    async def recover_leases(self, run_id: int, host: str) -> int:
        """At engine start (holding the run's lock file): return to pending the leases of engines on `host`
        (they are dead: the lock says no live one runs this run here), leases with no owner, and expired
        leases of any owner. Another host's live leases are left to expire. Returns how many came back."""

        def op(conn: sqlite3.Connection) -> int:
            now = time.time()
            return conn.execute(
                "UPDATE samples SET state = 'pending', lease_expires = NULL, lease_owner = NULL, updated_at = ? "
                "WHERE run_id = ? AND state = 'leased' AND (lease_owner IS NULL OR lease_owner = ? "
                "OR substr(lease_owner, 1, ?) = ? OR lease_expires <= ?)",
                (now, run_id, host, len(host) + 1, host + ":", now),
            ).rowcount

        return await self.write(op)

    async def release(self, run_id: int, pks: Iterable[int]) -> int:
        """Give leased samples back unused (pause-now): pending again, the lease's attempt not counted."""
        keys = [(time.time(), run_id, pk) for pk in pks]
        if not keys:
            return 0

        def op(conn: sqlite3.Connection) -> int:
            cur = conn.executemany(
                "UPDATE samples SET state = 'pending', lease_expires = NULL, attempts = MAX(attempts - 1, 0), "
                "updated_at = ? WHERE run_id = ? AND pk = ? AND state = 'leased'",
                keys,
            )
            return cur.rowcount

        return await self.write(op)

    async def retry_failed(self, run_id: int) -> int:
        """Put every failed sample of the run back to pending, in one transaction, each with a fresh allowance of
        attempts (`tries_forgiven` = its tries; its responses and their attempt numbers stay). Returns how many."""

        def op(conn: sqlite3.Connection) -> int:
            pks = [
                r[0]
                for r in conn.execute(
                    "UPDATE samples SET state = 'pending', tries_forgiven = tries, error_class = NULL, "
                    "last_error = NULL, "
                    "lease_expires = NULL, lease_owner = NULL, updated_at = ? WHERE run_id = ? AND state = 'failed' "
                    "RETURNING pk",
                    (time.time(), run_id),
                ).fetchall()
            ]
            # a conversation's turn tried again: the turns its failure skipped wait on it again
            restore_children_of(conn, run_id, pks)
            return len(pks)

        return await self.write(op)

    # ------------------------------------------------------------------------------------ results

    async def record_result(self, result: ResultRecord) -> int:
        """Store a response (+ its reconstruction and verdict) and set the sample's state, in one transaction.

        Returns the response row id once committed. The reconstruction is labelled by `result.labels()`; a paid
        response whose sample still failed (state `failed`, e.g. reconstruction raised) names why in
        `error_class` / `error` on the sample (see ResultRecord).
        """
        r = result
        if r.state not in SAMPLE_STATES:
            raise ValueError(f"unknown sample state {r.state!r}")
        run_id, pk, state, completion = r.run_id, r.sample_pk, r.state, r.completion
        response_row = rows.encode_response(
            run_id, pk, r.attempt, r.endpoint, completion, r.cost_usd, keep_raw=r.keep_raw
        )
        rec_row = None
        if r.reconstruction is not None:
            rec_row = rows.reconstruction_row(run_id, pk, r.reconstruction, r.verdict, r.reference_ids, r.labels())
            self._unindexed += 1

        def op(conn: sqlite3.Connection) -> int:
            response_id = conn.execute(rows.INSERT_RESPONSE, response_row).lastrowid
            assert response_id is not None  # an INSERT sets it
            if rec_row is not None:
                conn.execute(rows.UPSERT_RECONSTRUCTION, rows.encode_reconstruction(rec_row, response_id=response_id))
            if completion.interventions:
                now = time.time()
                conn.executemany(
                    "INSERT INTO interventions (run_id, sample_pk, response_id, kind, detail, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [(run_id, pk, response_id, i.kind, i.detail, now) for i in completion.interventions],
                )
            turn = conn.execute(
                "UPDATE samples SET state = ?, lease_expires = NULL, lease_owner = NULL, error_class = ?, "
                "last_error = ?, tries = MAX(tries, ?), updated_at = ? WHERE pk = ? AND run_id = ? "
                "RETURNING conversation_id",
                (state, r.error_class, r.error, r.attempt, time.time(), pk, run_id),
            ).fetchone()
            if turn is not None and turn[0] is not None:  # a conversation's turn: the next one, same transaction
                after_turn(
                    conn,
                    run_id,
                    pk,
                    TurnEnd(
                        state,
                        completion.content,
                        completion.reasoning,
                        completion.tool_calls,
                        completion.truncated,
                        _history_reasoning(r.profile),
                        r.error or "",
                    ),
                )
            return response_id

        return await self.write(op)

    async def record_failure(
        self,
        run_id: int,
        pk: int,
        error_class: str,
        message: str,
        final: bool,
        cost_usd: float = 0.0,
        *,
        endpoint: str | None = None,
        attempt: int | None = None,
    ) -> None:
        """Note a failed attempt: the sample goes back to pending, or to failed when `final`.

        With `endpoint` (the request reached one) the attempt is also logged in `responses` with its cost,
        so the cost ledger stays complete.
        """

        def op(conn: sqlite3.Connection) -> None:
            now = time.time()
            turn = conn.execute(
                "UPDATE samples SET state = ?, lease_expires = NULL, lease_owner = NULL, error_class = ?, "
                "last_error = ?, updated_at = ? WHERE pk = ? AND run_id = ? RETURNING conversation_id",
                ("failed" if final else "pending", error_class, rows.clean_text(message), now, pk, run_id),
            ).fetchone()
            if final and turn is not None and turn[0] is not None:
                after_turn(conn, run_id, pk, TurnEnd("failed", why=f"{error_class}: {message}"[:500]))
            if endpoint is not None or cost_usd:
                n = attempt
                if n is None:
                    row = conn.execute("SELECT tries FROM samples WHERE pk = ?", (pk,)).fetchone()
                    n = (row[0] if row else 0) + 1
                _insert_attempt(conn, run_id, pk, n, endpoint or "", cost_usd, error_class, message, now)

        await self.write(op)

    async def log_attempt(
        self, run_id: int, pk: int, attempt: int, endpoint: str, cost_usd: float, error_class: str, message: str
    ) -> None:
        """Log a failed request (number `attempt` of this sample, with what it was billed) without changing the
        sample's state; the sample's `tries` counts it."""

        def op(conn: sqlite3.Connection) -> None:
            _insert_attempt(conn, run_id, pk, attempt, endpoint, cost_usd, error_class, message, time.time())

        await self.write(op)

    async def skip(self, run_id: int, pks: Iterable[int], reason: str) -> int:
        """Mark samples skipped (e.g. a prompt too long for the model) with the reason; return how many."""
        rows = [(reason, time.time(), run_id, pk) for pk in pks]

        def op(conn: sqlite3.Connection) -> int:
            n = conn.executemany(
                "UPDATE samples SET state = 'skipped', lease_expires = NULL, last_error = ?, updated_at = ? "
                "WHERE run_id = ? AND pk = ?",
                rows,
            ).rowcount
            for _, _, _, pk in rows:  # a skipped turn ends its conversation (no-op for single-turn samples)
                after_turn(conn, run_id, pk, TurnEnd("skipped", why=reason))
            return n

        return await self.write(op)

    # ------------------------------------------------------------------------------------ events, commands

    async def upsert_reconstructions(self, records: Iterable[rows.ReconstructionRow]) -> int:
        """Replace reconstruction rows (one per sample), e.g. after a reprocess with a fixed tokenizer or
        profile. Returns the number of rows written."""
        params = [rows.encode_reconstruction(r) for r in records]
        self._unindexed += len(params)

        def op(conn: sqlite3.Connection) -> int:
            return conn.executemany(rows.UPSERT_RECONSTRUCTION, params).rowcount

        return await self.write(op)

    async def add_event(self, run_id: int | None, level: str, kind: str, message: str) -> None:
        """Append to the operator's log (a lone surrogate in `message` is stored as U+FFFD)."""
        row = (run_id, time.time(), level, kind, rows.clean_text(message))

        def op(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO events (run_id, ts, level, kind, message) VALUES (?, ?, ?, ?, ?)", row)

        await self.write(op)

    async def enqueue_command(self, run_id: int, verb: str, args: dict[str, Any] | None = None) -> int:
        """Queue a control request for the engine that runs `run_id`; return its id."""
        row = (run_id, verb, _dumps(args or {}), time.time())

        def op(conn: sqlite3.Connection) -> int:
            command_id = conn.execute(
                "INSERT INTO commands (run_id, verb, args, created_at) VALUES (?, ?, ?, ?)", row
            ).lastrowid
            assert command_id is not None  # an INSERT sets it
            return command_id

        return await self.write(op)

    async def command_taken_at(self, command_id: int) -> float | None:
        """When the engine took command `command_id` (its `done_at`), None while it waits or is unknown."""
        row = await self.read(
            lambda conn: conn.execute("SELECT done_at FROM commands WHERE id = ?", (command_id,)).fetchone()
        )
        return row[0] if row else None

    async def take_commands(self, run_id: int) -> list[Command]:
        """The run's open commands in order, marked done in the same transaction."""

        def op(conn: sqlite3.Connection) -> list[Command]:
            rows = conn.execute(
                "UPDATE commands SET done_at = ? WHERE run_id = ? AND done_at IS NULL "
                "RETURNING id, verb, args, created_at",
                (time.time(), run_id),
            ).fetchall()
            return sorted((Command(r[0], r[1], json.loads(r[2]), r[3]) for r in rows), key=lambda c: c.id)

        return await self.write(op)

    # ------------------------------------------------------------------------------------ reads

    async def spent_usd(self, run_id: int) -> float:
        """The run's cost ledger: the sum of every stored attempt's cost (`queries.cost_total`, on this
        writer's connection)."""
        return await self.read(lambda conn: queries.cost_total(conn, run_id))

    async def run_state(self, run_id: int) -> tuple[str | None, str | None]:
        """The run's stored (state, reason), (None, None) for an unknown id."""
        row = await self.read(
            lambda conn: conn.execute("SELECT state, reason FROM runs WHERE id = ?", (run_id,)).fetchone()
        )
        return (row[0], row[1]) if row else (None, None)

    async def open_prompt_sizes(self, run_id: int, *, leased: bool = True) -> dict[str, tuple[int, int]]:
        """Per dataset, the samples still to run (pending, and leased unless `leased` is False) and their prompts'
        JSON characters (messages + tools): what the ETA's prompt-token projection starts from. One scan at engine
        start (and after an operator's retry of failed samples, pending only)."""
        states = "('pending', 'leased')" if leased else "('pending')"
        rows = await self.read(
            lambda conn: conn.execute(
                "SELECT dataset, COUNT(*), TOTAL(LENGTH(messages) + COALESCE(LENGTH(tools), 0)) FROM samples "
                f"WHERE run_id = ? AND state IN {states} GROUP BY dataset",
                (run_id,),
            ).fetchall()
        )
        return {str(d): (int(n), int(c)) for d, n, c in rows}

    async def open_turn_work(self, run_id: int) -> OpenTurnWork:
        """What the open conversations still hold for the ETA (`app.store.conversation_ops.open_turn_work`): per
        dataset the turns waiting on their parents (count, prompt JSON characters known, answers of the model still
        to come in their prompts) and the open conversations by turns left. One scan of the open turns at start."""
        return await self.read(lambda conn: conversation_ops.open_turn_work(conn, run_id))

    async def finished_output_stats(
        self,
        run_id: int,
        newest: int = 20_000,
    ) -> dict[str, tuple[int, int, float, float, int, int, float]]:
        """Per dataset, what the newest `newest` answered requests of this run tell the ETA (`Projector.seed`):
        (answered, output tokens, generation seconds, time-to-first-token seconds, prompt tokens, longest output,
        their cost),
        so a resumed run projects from what it already learned instead of from nothing. Reads by the run's
        time index (responses_by_run), never the whole table."""
        rows = await self.read(
            lambda conn: conn.execute(
                "SELECT s.dataset, COUNT(*), TOTAL(r.completion_tokens), "
                "TOTAL(MAX(0.0, COALESCE(r.latency_ms, 0) - COALESCE(r.ttft_ms, 0))) / 1000.0, "
                "TOTAL(COALESCE(r.ttft_ms, 0)) / 1000.0, TOTAL(r.prompt_tokens), MAX(r.completion_tokens), "
                "TOTAL(r.cost_usd) "
                f"FROM {_NEWEST_ANSWERS} GROUP BY s.dataset",
                (run_id, newest),
            ).fetchall()
        )
        return {
            str(d): (int(n), int(tok), float(gen), float(ttft), int(prompt), int(longest or 0), float(cost))
            for d, n, tok, gen, ttft, prompt, longest, cost in rows
        }

    async def finished_output_lengths(self, run_id: int, newest: int = 20_000) -> dict[str, list[tuple[int, int]]]:
        """Per dataset, the output lengths of the same newest answers as `finished_output_stats`, as (completion
        tokens, count) pairs: the ETA's length curve on resume (`Projector.seed(lengths=)`)."""
        rows = await self.read(
            lambda conn: conn.execute(
                "SELECT s.dataset, r.completion_tokens, COUNT(*) "
                f"FROM {_NEWEST_ANSWERS} GROUP BY s.dataset, r.completion_tokens",
                (run_id, newest),
            ).fetchall()
        )
        out: dict[str, list[tuple[int, int]]] = {}
        for d, tokens, n in rows:
            out.setdefault(str(d), []).append((int(tokens or 0), int(n)))
        return out

    async def outcome_counts(self, run_id: int) -> tuple[dict[str, int], dict[str, int]]:
        """The run's (verdict counts, reconstruction strategy counts) as stored."""
        return await self.read(
            lambda conn: (tallies.verdict_counts(conn, run_id), tallies.strategy_counts(conn, run_id))
        )

    async def counts(self, run_id: int) -> dict[str, int]:
        """Samples per state, every state present (0 when none): `queries.state_counts`, on this writer's
        connection."""
        return await self.read(lambda conn: queries.state_counts(conn, run_id))


# ---------------------------------------------------------------------------------------------- helpers

# a run's newest answers (run id, how many) joined to their samples: what the ETA learns from on resume
_NEWEST_ANSWERS = (
    "(SELECT sample_pk, completion_tokens, latency_ms, ttft_ms, prompt_tokens, cost_usd FROM responses "
    " WHERE run_id = ? AND error_class IS NULL ORDER BY created_at DESC LIMIT ?) AS r "
    "JOIN samples s ON s.pk = r.sample_pk"
)


def _history_reasoning(profile: str) -> str:
    """The profile's `history_reasoning` ("keep" for an unnamed or unknown profile: the template decides)."""
    if not profile:
        return "keep"
    from app.tokens.profile import get_profile

    try:
        return get_profile(profile).history_reasoning
    except InputError:
        return "keep"


def _run_batch(conn: sqlite3.Connection, ops: list[Operation], path: Path) -> list[tuple[bool, Any]]:
    """Run ops in one transaction, each in a savepoint; on a failed commit every op fails."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        err = _store_error(path, exc)
        return [(False, err)] * len(ops)
    results: list[tuple[bool, Any]] = []
    for op in ops:
        conn.execute("SAVEPOINT op")
        try:
            value = op(conn)
        except Exception as exc:
            conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")
            results.append((False, _store_error(path, exc) if isinstance(exc, sqlite3.Error) else exc))
        else:
            conn.execute("RELEASE op")
            results.append((True, value))
    try:
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        err = _store_error(path, exc)
        return [(False, err)] * len(ops)
    return results


def _text_queued(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM mismatch_text_pending LIMIT 1").fetchone() is not None


def index_pending_text(conn: sqlite3.Connection, limit: int | None = None) -> int:
    """Move up to `limit` (default INDEX_TEXT_CHUNK) queued reconstructions (`mismatch_text_pending`, schema v6)
    into the text index `mismatch_text`; returns how many were queued. Runs inside the caller's transaction.
    RunStore calls it; a program that writes reconstructions with its own SQL calls it after its writes, or
    the text filter matches them by LIKE scan."""
    n = INDEX_TEXT_CHUNK if limit is None else limit
    pks = [pk for (pk,) in conn.execute("SELECT sample_pk FROM mismatch_text_pending ORDER BY sample_pk LIMIT ?", (n,))]
    if not pks:
        return 0
    lo, hi = pks[0], pks[-1]
    # a row is never queued and indexed at once (the triggers see to it); the delete keeps a row written
    # around them (INSERT OR REPLACE without recursive triggers) from failing the move for every other row
    conn.execute(
        "DELETE FROM mismatch_text WHERE rowid IN (SELECT sample_pk FROM mismatch_text_pending "
        "WHERE sample_pk BETWEEN ? AND ?)",
        (lo, hi),
    )
    conn.execute(
        "INSERT INTO mismatch_text (rowid, sample_id, dataset, explanation) "
        "SELECT r.sample_pk, s.sample_id, s.dataset, COALESCE(r.explanation, '') FROM mismatch_text_pending p "
        "JOIN reconstructions r ON r.sample_pk = p.sample_pk JOIN samples s ON s.pk = r.sample_pk "
        "WHERE p.sample_pk BETWEEN ? AND ?",
        (lo, hi),
    )
    conn.execute("DELETE FROM mismatch_text_pending WHERE sample_pk BETWEEN ? AND ?", (lo, hi))
    return len(pks)


class StoreWriteError(InputError):
    """A write the database refused. `kind`: "locked" (another process holds the write lock past the busy
    timeout), "full" (the disk or the filesystem quota is full), "io" (another I/O or operational error) or
    "other" (a constraint or a bug: retrying will not help). `transient` says whether a retry may succeed."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def transient(self) -> bool:
        return self.kind in ("locked", "full", "io")


def _store_error(path: Path, exc: BaseException) -> StoreWriteError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        err = StoreWriteError(
            f"{path}: is locked by another process ({text}); wait for it or pass another database path", "locked"
        )
    elif "full" in text or getattr(exc, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
        err = StoreWriteError(f"{path}: the disk is full ({text}); free space on the filesystem that holds it", "full")
    else:
        kind = "io" if isinstance(exc, sqlite3.OperationalError) else "other"
        err = StoreWriteError(f"{path}: a database write failed ({type(exc).__name__}: {text})", kind)
    err.__cause__ = exc
    return err


def _insert_attempt(
    conn: sqlite3.Connection,
    run_id: int,
    pk: int,
    attempt: int,
    endpoint: str,
    cost_usd: float,
    error_class: str,
    message: str,
    now: float,
) -> None:
    """One failed request in the cost ledger (`responses` without content) and in the sample's `tries`."""
    conn.execute(
        "INSERT INTO responses (run_id, sample_pk, attempt, endpoint, cost_usd, error_class, error, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (run_id, pk, attempt, endpoint, float(cost_usd or 0.0), error_class, rows.clean_text(message[:2000]), now),
    )
    conn.execute("UPDATE samples SET tries = MAX(tries, ?) WHERE pk = ?", (attempt, pk))
