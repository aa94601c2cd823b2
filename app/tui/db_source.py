"""The two DataSources: attached (the run database alone) and in-process (an engine `Run` + the database).

Reads go through one read-only `sqlite3` connection guarded by a lock (screens call them from
thread workers). Attached control writes rows to the `commands` table through `RunStore`; in-process
control calls the engine. Job control goes to the jobs package (`app.jobs`), which owns job state.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.engine.dbsnapshot import snapshot_from_db
from app.engine.snapshot import MetricsSnapshot
from app.errors import EaglewatchError, InputError
from app.store.db import connect_readonly
from app.store.ids import unpack_ids
from app.tui.format import clock
from app.tui.source import MISMATCH_ORDERS, MismatchPage, MismatchRow, SampleDetail, SampleDiff
from widgets.event_tail import EventLine
from widgets.jobs_table import JobRow

SORT_CACHE_S = 10.0  # how long a computed sort order (first difference, tokens differing) is reused



class DatabaseReader:
    """Sync read queries over one run in a run database (thread-safe: one connection, one lock)."""

    def __init__(self, database: Path, run_name: str | None) -> None:
        self.database = Path(database)
        self._conn = connect_readonly(self.database)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        self._tokenizers: dict[str, Any] = {}
        self._sorted: dict[tuple, tuple[float, list[int]]] = {}
        with self._lock:
            runs = self._conn.execute("SELECT id, name, config FROM runs ORDER BY id").fetchall()
        if not runs:
            raise InputError(f"{self.database}: holds no run yet; start one with 'eaglewatch run CONFIG'")
        if run_name is None:
            if len(runs) > 1:
                names = ", ".join(r["name"] for r in runs)
                raise InputError(f"{self.database}: holds several runs ({names}); choose one with --run NAME")
            row = runs[0]
        else:
            matches = [r for r in runs if r["name"] == run_name]
            if not matches:
                names = ", ".join(r["name"] for r in runs)
                raise InputError(f"{self.database}: no run named {run_name!r} (runs: {names}); check --run")
            row = matches[0]
        self.run_id: int = row["id"]
        self.run_name: str = row["name"]
        try:
            self.run_config: dict[str, Any] = json.loads(row["config"] or "{}")
        except ValueError:
            self.run_config = {}

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def snapshot(self) -> MetricsSnapshot:
        """The run's metrics as the database records them (attached face)."""
        with self._lock:
            # dbsnapshot sorts plain tuples: give it tuple rows for this call.
            self._conn.row_factory = None
            try:
                return snapshot_from_db(self._conn, self.run_name)
            finally:
                self._conn.row_factory = sqlite3.Row

    def mismatch_page(
        self,
        verdicts: Sequence[str],
        text: str,
        order: str,
        offset: int,
        limit: int,
        *,
        after: MismatchRow | None = None,
        before: MismatchRow | None = None,
    ) -> MismatchPage:
        """One page of non-exact samples; `after` / `before` (a row of the neighbouring page) turn pages by key.

        Sample and verdict order read only about `limit` index entries per verdict, whatever the depth
        (keyset paging over the (run, category, sample) index); the other orders sort every match.
        """
        if order not in MISMATCH_ORDERS:
            raise ValueError(f"unknown mismatch order {order!r}; choose one of {', '.join(MISMATCH_ORDERS)}")
        verdicts = tuple(sorted(set(verdicts)))
        if not verdicts:
            return MismatchPage((), 0, 0)
        text_sql, text_args = _text_condition(text)
        with self._lock:
            total = self._count(verdicts, text_sql, text_args)
            if order == "sample":
                rows = self._page_by_sample(verdicts, text_sql, text_args, offset, limit, after, before)
            elif order == "verdict":
                rows = self._page_by_verdict(verdicts, text_sql, text_args, offset, limit, after, before)
            else:
                rows = self._page_sorted(verdicts, text_sql, text_args, order, offset, limit)
            names = self._names([row[0] for row in rows])
        page = tuple(
            MismatchRow(names[pk][0], names[pk][1], category, first, ref_len, n_tokens, _n_diff(n_diff), pk)
            for pk, category, first, ref_len, n_tokens, n_diff in rows
        )
        return MismatchPage(page, total, offset)

    _COLUMNS = "r.sample_pk, r.category, r.first_diff, r.ref_len, r.n_tokens, r.n_diff"
    _FROM = "reconstructions AS r"
    # CROSS JOIN keeps reconstructions outermost: a text filter then reads only the non-exact rows.
    _CROSS = "reconstructions AS r CROSS JOIN samples AS s ON s.pk = r.sample_pk"

    def _count(self, verdicts: tuple[str, ...], text_sql: str, text_args: list[Any]) -> int:
        source = self._CROSS if text_sql else self._FROM
        marks = ", ".join("?" * len(verdicts))
        return self._conn.execute(
            f"SELECT COUNT(*) FROM {source} WHERE r.run_id = ? AND r.category IN ({marks}){text_sql}",
            [self.run_id, *verdicts, *text_args],
        ).fetchone()[0]

    def _page_by_sample(self, verdicts, text_sql, text_args, offset, limit, after, before) -> list[tuple]:
        # One index range per verdict, each cut at `need` rows, merged: no sort over all matches.
        backwards = before is not None
        anchor = (before.pk if before else after.pk if after else -1)
        skip = 0 if (after or before) else offset
        need = skip + limit
        direction, compare = ("DESC", "<") if backwards else ("ASC", ">")
        source = self._CROSS if text_sql else self._FROM
        parts, args = [], []
        for verdict in verdicts:
            parts.append(
                f"SELECT * FROM (SELECT {self._COLUMNS} FROM {source} WHERE r.run_id = ? AND r.category = ? "
                f"AND r.sample_pk {compare} ?{text_sql} ORDER BY r.sample_pk {direction} LIMIT ?)"
            )
            args += [self.run_id, verdict, anchor, *text_args, need]
        sql = " UNION ALL ".join(parts) + f" ORDER BY 1 {direction} LIMIT ? OFFSET ?"
        rows = self._conn.execute(sql, [*args, limit, skip]).fetchall()
        return list(reversed(rows)) if backwards else rows

    def _page_by_verdict(self, verdicts, text_sql, text_args, offset, limit, after, before) -> list[tuple]:
        marks = ", ".join("?" * len(verdicts))
        source = self._CROSS if text_sql else self._FROM
        where = f"r.run_id = ? AND r.category IN ({marks}){text_sql}"
        args: list[Any] = [self.run_id, *verdicts, *text_args]
        direction, skip = "ASC", offset
        if after is not None or before is not None:
            key = after or before
            compare = ">" if after is not None else "<"
            where += f" AND (r.category {compare} ? OR (r.category = ? AND r.sample_pk {compare} ?))"
            args += [key.verdict, key.verdict, key.pk]
            direction, skip = ("ASC" if after is not None else "DESC"), 0
        rows = self._conn.execute(
            f"SELECT {self._COLUMNS} FROM {source} WHERE {where} "
            f"ORDER BY r.category {direction}, r.sample_pk {direction} LIMIT ? OFFSET ?",
            [*args, limit, skip],
        ).fetchall()
        return list(reversed(rows)) if direction == "DESC" else rows

    def _page_sorted(self, verdicts, text_sql, text_args, order, offset, limit) -> list[tuple]:
        # Without a text filter an index serves each order (below). Otherwise sort every match once (in
        # Python, by key) and keep the order of keys for SORT_CACHE_S, so turning pages is a slice plus a
        # lookup of `limit` rows.
        if order == "first_diff" and not text_sql:
            # Samples with a first difference come in order from a partial index: a page reads about
            # offset + limit index entries. Only a page reaching past them (into samples without one) sorts.
            marks = ", ".join("?" * len(verdicts))
            pks = [row[0] for row in self._conn.execute(
                "SELECT r.sample_pk FROM reconstructions AS r INDEXED BY reconstructions_by_run_first_diff "
                f"WHERE r.run_id = ? AND r.category IN ({marks}) AND r.first_diff IS NOT NULL "
                "ORDER BY r.first_diff, r.sample_pk LIMIT ? OFFSET ?",
                [self.run_id, *verdicts, limit, offset],
            )]
            if len(pks) == limit:
                return self._rows_for(pks)
        if order == "n_diff" and not text_sql:
            # The n_diff index holds every reconstruction (NULLs, from rows written outside the store, last):
            # a page reads about offset + limit index entries and is complete even when short.
            marks = ", ".join("?" * len(verdicts))
            return self._rows_for([row[0] for row in self._conn.execute(
                "SELECT r.sample_pk FROM reconstructions AS r INDEXED BY reconstructions_by_run_n_diff "
                f"WHERE r.run_id = ? AND r.category IN ({marks}) "
                "ORDER BY r.n_diff DESC, r.sample_pk LIMIT ? OFFSET ?",
                [self.run_id, *verdicts, limit, offset],
            )])
        key = (verdicts, text_sql, tuple(text_args), order)
        cached = self._sorted.get(key)
        now = time.monotonic()
        if cached is None or now - cached[0] > SORT_CACHE_S:
            marks = ", ".join("?" * len(verdicts))
            source = self._CROSS if text_sql else self._FROM
            rows = self._conn.execute(
                f"SELECT r.sample_pk, r.first_diff, r.n_diff FROM {source} "
                f"WHERE r.run_id = ? AND r.category IN ({marks}){text_sql}",
                [self.run_id, *verdicts, *text_args],
            ).fetchall()
            if order == "first_diff":
                rows.sort(key=lambda row: (row[1] is None, row[1] or 0, row[0]))
            else:
                # as SQL's ORDER BY n_diff DESC, sample_pk (NULL last), so both paths agree
                rows.sort(key=lambda row: (row[2] is None, -(row[2] or 0), row[0]))
            cached = self._sorted[key] = (now, [row[0] for row in rows])
        return self._rows_for(cached[1][offset : offset + limit])

    def _rows_for(self, pks: list[int]) -> list[tuple]:
        """The page's rows, in the order of `pks`."""
        if not pks:
            return []
        marks = ", ".join("?" * len(pks))
        found = {
            row[0]: row
            for row in self._conn.execute(f"SELECT {self._COLUMNS} FROM {self._FROM} WHERE r.sample_pk IN ({marks})", pks)
        }
        return [found[pk] for pk in pks if pk in found]

    def _names(self, pks: list[int]) -> dict[int, tuple[str, str]]:
        if not pks:
            return {}
        marks = ", ".join("?" * len(pks))
        rows = self._conn.execute(f"SELECT pk, sample_id, dataset FROM samples WHERE pk IN ({marks})", pks)
        return {pk: (sample_id, dataset) for pk, sample_id, dataset in rows}

    def _sample_pk(self, sample_id: str) -> int:
        row = self._conn.execute(
            "SELECT pk FROM samples WHERE run_id = ? AND sample_id = ?", (self.run_id, sample_id)
        ).fetchone()
        if row is None:
            raise InputError(f"run {self.run_name!r} has no sample {sample_id!r}")
        return row[0]

    def reconstruction(self, sample_id: str) -> tuple[tuple[int, ...], tuple[int, ...], str, str, str]:
        """(reference ids, reconstructed ids, verdict, explanation, strategy) of one sample."""
        with self._lock:
            pk = self._sample_pk(sample_id)
            row = self._conn.execute(
                "SELECT r.output_ids, COALESCE(r.reference_ids, s.reference_ids), r.category, r.explanation, r.strategy "
                "FROM reconstructions AS r JOIN samples AS s ON s.pk = r.sample_pk WHERE r.sample_pk = ?",
                (pk,),
            ).fetchone()
        if row is None:
            raise InputError(f"sample {sample_id!r} has no reconstruction yet (no response stored for it)")
        if row[1] is None:
            raise InputError(f"sample {sample_id!r} has no reference ids, so there is nothing to diff against")
        return unpack_ids(row[1]) or (), unpack_ids(row[0]) or (), row[2], row[3] or "", row[4]

    def tokenizer_dir(self) -> Path:
        """The run's tokenizer directory, from the config stored with the run."""
        value = (self.run_config.get("model") or {}).get("tokenizer")
        if not value:
            raise InputError(f"{self.database}: run {self.run_name!r} records no model.tokenizer in its config")
        return Path(value)

    def sample_diff(self, sample_id: str, tokenizer: Any) -> SampleDiff:
        """Align one sample's reference and reconstructed ids with `tokenizer`."""
        from app.tokens.align import align

        ref, rec, verdict, explanation, strategy = self.reconstruction(sample_id)
        return SampleDiff(sample_id, verdict, explanation, align(ref, rec, tokenizer), strategy)

    def sample_detail(self, sample_id: str) -> SampleDetail:
        """The sample, its latest response and its reconstruction's verdict."""
        with self._lock:
            pk = self._sample_pk(sample_id)
            sample = self._conn.execute(
                "SELECT sample_id, dataset, state, messages, last_error FROM samples WHERE pk = ?", (pk,)
            ).fetchone()
            response = self._conn.execute(
                "SELECT endpoint, finish_reason, reasoning, content, tool_calls, usage, cost_usd, latency_ms, ttft_ms, "
                "error, raw FROM responses WHERE sample_pk = ? ORDER BY attempt DESC, id DESC LIMIT 1",
                (pk,),
            ).fetchone()
            rec = self._conn.execute(
                "SELECT category, strategy FROM reconstructions WHERE sample_pk = ?", (pk,)
            ).fetchone()
        prompt = _json(sample["messages"], [])
        if response is None:
            return SampleDetail(
                sample["sample_id"], sample["dataset"], sample["state"], prompt=prompt, error=sample["last_error"]
            )
        raw = response["raw"]
        if raw:
            try:
                raw = json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
            except ValueError:
                pass
        return SampleDetail(
            sample_id=sample["sample_id"],
            dataset=sample["dataset"],
            state=sample["state"],
            prompt=prompt,
            reasoning=response["reasoning"],
            content=response["content"],
            tool_calls=_json(response["tool_calls"], []),
            usage=_json(response["usage"], {}),
            cost_usd=response["cost_usd"] or 0.0,
            latency_ms=response["latency_ms"],
            ttft_ms=response["ttft_ms"],
            endpoint=response["endpoint"],
            finish_reason=response["finish_reason"],
            verdict=rec["category"] if rec else None,
            strategy=rec["strategy"] if rec else None,
            error=response["error"] or sample["last_error"],
            raw=raw,
        )

    def jobs(self) -> list[JobRow]:
        """Jobs of this run (and jobs recorded without a run), newest first, with shard progress."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT j.id, j.name, j.state, j.executor, j.n_shards, j.error, j.updated_at, "
                "COALESCE(SUM(sh.state = 'done'), 0), COALESCE(SUM(sh.tokens), 0), MAX(sh.log_path) "
                "FROM jobs AS j LEFT JOIN job_shards AS sh ON sh.job_id = j.id "
                "WHERE j.run_id = ? OR j.run_id IS NULL GROUP BY j.id ORDER BY j.id DESC LIMIT 200",
                (self.run_id,),
            ).fetchall()
        out = []
        for job_id, name, state, executor, n_shards, error, updated, done, tokens, log in rows:
            if state not in ("done", "failed", "cancelled") and (error or "").lower().startswith("paused"):
                state = "paused"
            out.append(JobRow(job_id, name, state, executor, done, n_shards, tokens, clock(updated), log))
        return out

    def job_log(self, job_id: int, lines: int) -> str:
        """The last `lines` lines of the job's most recently updated shard log."""
        with self._lock:
            row = self._conn.execute(
                "SELECT shard, log_path FROM job_shards WHERE job_id = ? AND log_path IS NOT NULL "
                "ORDER BY updated_at DESC, shard DESC LIMIT 1",
                (job_id,),
            ).fetchone()
        if row is None:
            return f"job {job_id} has no shard log yet"
        path = Path(row[1])
        try:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - 64 * 1024))
                text = fh.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"shard {row[0]} log {path}: cannot be read ({exc.strerror})"
        tail = text.splitlines()[-lines:]
        return f"shard {row[0]} · {path}\n" + "\n".join(tail)

    def events(self, n: int) -> list[EventLine]:
        """The run's last `n` events, oldest first (times in UTC)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT ts, level, kind, message FROM events WHERE run_id = ? ORDER BY id DESC LIMIT ?",
                (self.run_id, n),
            ).fetchall()
        return [EventLine(clock(ts), level, kind, message) for ts, level, kind, message in reversed(rows)]


def _text_condition(text: str) -> tuple[str, list[Any]]:
    """The SQL (joined with samples as `s`) matching `text` in a sample id, dataset or explanation."""
    if not text:
        return "", []
    pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    sql = (
        " AND (s.sample_id LIKE ? ESCAPE '\\' OR s.dataset LIKE ? ESCAPE '\\'"
        " OR r.explanation LIKE ? ESCAPE '\\')"
    )
    return sql, [pattern, pattern, pattern]


def _n_diff(n_diff: int | None) -> int:
    """Tokens differing, from the reconstruction's n_diff column (`app.store.schema.N_DIFF_SQL` over its
    spans; NULL, for a row written outside the store, reads as 0)."""
    return n_diff or 0


def _json(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


class _JobControl:
    """Pause / resume / cancel a job through the jobs package (recorded in the database first)."""

    def __init__(self, database: Path) -> None:
        self.database = database

    def command(self, job_id: int, verb: str) -> None:
        """Blocking (cancel waits for local processes to end): call from a worker thread. `app.jobs.control`
        picks the job's own executor, local or Slurm."""
        from app.jobs import control

        actions = {"pause": control.pause_job, "resume": control.resume_job, "cancel": control.cancel_job}
        if verb not in actions:
            raise EaglewatchError(f"unknown job command {verb!r}; use pause, resume or cancel")
        actions[verb](self.database, job_id)


class _DatabaseBackedSource:
    """What both faces read from the run database: mismatch pages, diffs, sample detail, jobs, events."""

    reader: DatabaseReader
    _jobs: _JobControl

    def mismatch_page(
        self,
        verdicts: Sequence[str],
        text: str,
        order: str,
        offset: int,
        limit: int,
        *,
        after: MismatchRow | None = None,
        before: MismatchRow | None = None,
    ) -> MismatchPage:
        return self.reader.mismatch_page(verdicts, text, order, offset, limit, after=after, before=before)

    def sample_diff(self, sample_id: str) -> SampleDiff:
        return self.reader.sample_diff(sample_id, self._tokenizer())

    def _tokenizer(self) -> Any:
        from app.tokens import load_tokenizer

        path = self.reader.tokenizer_dir()
        if str(path) not in self.reader._tokenizers:
            self.reader._tokenizers[str(path)] = load_tokenizer(path)
        return self.reader._tokenizers[str(path)]

    def sample_detail(self, sample_id: str) -> SampleDetail:
        return self.reader.sample_detail(sample_id)

    def jobs(self) -> Sequence[JobRow]:
        return self.reader.jobs()

    def job_log(self, job_id: int, lines: int) -> str:
        return self.reader.job_log(job_id, lines)

    def events(self, n: int) -> Sequence[EventLine]:
        return self.reader.events(n)

    def close(self) -> None:
        self.reader.close()


class AttachedSource(_DatabaseBackedSource):
    """A viewer over a run database; steers a headless engine through the `commands` table."""

    snapshot_on_loop = False

    def __init__(self, database: Path, run_name: str | None = None, *, readonly: bool = False) -> None:
        self.reader = DatabaseReader(database, run_name)
        self.readonly = readonly
        self._store: Any = None
        self._jobs = _JobControl(self.reader.database)

    @property
    def title(self) -> str:
        mode = "read-only" if self.readonly else "attached"
        return f"{self.reader.run_name} · {self.reader.database.name} ({mode})"

    @property
    def live(self) -> bool:
        return False

    @property
    def can_control(self) -> bool:
        return not self.readonly

    def snapshot(self) -> MetricsSnapshot:
        return self.reader.snapshot()

    async def _command(self, verb: str, args: dict[str, Any] | None = None) -> None:
        if self.readonly:
            raise EaglewatchError("this viewer is read-only (--readonly); it sends no commands")
        if self._store is None:
            from app.store.run_store import RunStore

            self._store = await RunStore.open(self.reader.database)
        await self._store.enqueue_command(self.reader.run_id, verb, args or {})

    async def pause(self, now: bool = False) -> None:
        await self._command("pause", {"now": True} if now else None)

    async def resume(self) -> None:
        await self._command("resume")

    async def job_command(self, job_id: int, verb: str) -> None:
        if self.readonly:
            raise EaglewatchError("this viewer is read-only (--readonly); it sends no commands")
        await asyncio.to_thread(self._jobs.command, job_id, verb)

    async def aclose(self) -> None:
        """Close the command writer, if one was opened."""
        if self._store is not None:
            await self._store.close()
            self._store = None


class InProcessSource(_DatabaseBackedSource):
    """The monitor over an engine `Run` hosted in this process (its snapshot is read on the event loop)."""

    snapshot_on_loop = True

    def __init__(self, *, run: Any, config: Any) -> None:
        self.run = run
        self.config = config
        self.reader = DatabaseReader(Path(run.db_path), config.run.name)
        self._jobs = _JobControl(self.reader.database)
        # the engine's Reconstructor already holds the run's tokenizer: reuse it for diffs
        engine_tokenizer = getattr(getattr(run, "reconstructor", None), "tokenizer", None)
        if engine_tokenizer is not None:
            self.reader._tokenizers[str(Path(config.model.tokenizer))] = engine_tokenizer

    @property
    def title(self) -> str:
        return f"{self.config.run.name} · {self.reader.database.name}"

    @property
    def live(self) -> bool:
        return self.run.state in ("running", "paused", "stopping")

    @property
    def can_control(self) -> bool:
        return True

    def snapshot(self) -> MetricsSnapshot:
        return self.run.snapshot()

    async def pause(self, now: bool = False) -> None:
        await self.run.pause(now=now)

    async def resume(self) -> None:
        await self.run.resume()

    async def job_command(self, job_id: int, verb: str) -> None:
        await asyncio.to_thread(self._jobs.command, job_id, verb)


def open_attached(database: Path, run_name: str | None, *, readonly: bool) -> AttachedSource:
    """The attached source, or InputError naming the database when it cannot be read."""
    try:
        return AttachedSource(database, run_name, readonly=readonly)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{database}: cannot be read as a run database ({exc}); pass the run's eaglewatch.db") from exc
