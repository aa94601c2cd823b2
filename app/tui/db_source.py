"""The two DataSources: attached (the run database alone) and in-process (an engine `Run` + the database).

Every read goes through the store's read module (`app.store.queries`: a `RunReader`, one read-only
connection behind a lock, so screens may read from thread workers); this module only turns its records
into what the widgets show and aligns token ids for the diff. Run control is a `RunControl`: the
engine itself in-process, `AttachedControl` (rows in the `commands` table) attached. Job control goes
to the jobs package (`app.jobs.job_control`), which owns job state.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.control import RunControl
from app.engine.record.reads import LatencyCache, read_record
from app.engine.record.snapshot import LiveFigures, RunRecord
from app.errors import EaglewatchError, InputError
from app.store import queries
from app.store.heartbeat import Liveness, liveness, read_heartbeat
from app.store.queries import RunReader
from app.tui.format import clock
from app.tui.source import ConversationRow, MismatchPage, SampleDetail, SampleDiff, TurnRow
from widgets.event_tail import EventLine
from widgets.jobs_table import JobRow

LOG_TAIL_BYTES = 64 * 1024  # how much of a shard log the jobs screen reads (its last lines)


ACK_TIMEOUT_S = 5.0  # how long a viewer waits for the engine to take a command before it warns
ACK_POLL_S = 0.1  # how often it looks (the engine polls the table about once a second)


@dataclass(frozen=True, slots=True)
class CommandAck:
    """What became of one queued command: `taken` by the engine after `waited_s` (seen from this viewer),
    or not within the wait; `engine` is the run's heartbeat as judged when the wait ended untaken."""

    command_id: int
    taken: bool
    waited_s: float
    engine: Liveness | None = None


class AttachedControl:
    """`RunControl` for an attached viewer: each call queues a row in the `commands` table, which the
    headless engine polls (verbs pause {now}, resume, set_concurrency {limit}, retry_failed) and marks done when it
    takes
    it; `last_command` is the id of the row the latest call queued, and `acknowledgement` waits for it."""

    def __init__(self, database: Path, run_id: int) -> None:
        self.database = Path(database)
        self.run_id = run_id
        self._store: Any = None
        self.last_command: int | None = None

    async def _writer(self) -> Any:
        if self._store is None:
            from app.store.run_store import RunStore

            self._store = await RunStore.open(self.database)
        return self._store

    async def _command(self, verb: str, args: dict[str, Any] | None = None) -> None:
        store = await self._writer()
        self.last_command = await store.enqueue_command(self.run_id, verb, args or {})

    async def pause(self, now: bool = False) -> None:
        """Queue a pause (with now=True, one that cancels requests in flight)."""
        await self._command("pause", {"now": True} if now else None)

    async def resume(self) -> None:
        """Queue a resume."""
        await self._command("resume")

    async def set_concurrency(self, limit: int) -> None:
        """Queue a new in-flight limit (the engine clamps it to the configured min/max)."""
        if limit < 1:
            raise InputError(f"a concurrency limit must be at least 1 (got {limit})")
        await self._command("set_concurrency", {"limit": int(limit)})

    async def retry_failed(self) -> None:
        """Queue putting the run's failed samples back to pending (fresh attempts)."""
        await self._command("retry_failed")

    async def acknowledgement(self, command_id: int, timeout_s: float = ACK_TIMEOUT_S) -> CommandAck:
        """Wait up to `timeout_s` for the engine to take command `command_id` (its `done_at` set); when it does
        not, say how the run's heartbeat looks (a gone or stopped engine takes nothing)."""
        store = await self._writer()
        started = time.monotonic()
        while True:
            if await store.command_taken_at(command_id) is not None:
                return CommandAck(command_id, True, time.monotonic() - started)
            waited = time.monotonic() - started
            if waited >= timeout_s:
                beat = await store.read(lambda conn: read_heartbeat(conn, self.run_id))
                return CommandAck(command_id, False, waited, liveness(beat, time.time()))
            await asyncio.sleep(min(ACK_POLL_S, timeout_s - waited))

    async def aclose(self) -> None:
        """Close the command writer, if one was opened."""
        if self._store is not None:
            await self._store.close()
            self._store = None


class _JobControl:
    """Pause / resume / cancel a job through the jobs package (recorded in the database first)."""

    def __init__(self, database: Path) -> None:
        self.database = database

    def command(self, job_id: int, verb: str) -> None:
        """Blocking (cancel waits for local processes to end): call from a worker thread. `app.jobs.job_control`
        picks the job's own executor, local or Slurm."""
        from app.jobs import job_control as control

        actions = {"pause": control.pause_job, "resume": control.resume_job, "cancel": control.cancel_job}
        if verb not in actions:
            raise EaglewatchError(f"unknown job command {verb!r}; use pause, resume or cancel")
        actions[verb](self.database, job_id)


class _DatabaseBackedSource:
    """What both faces read from the run database: mismatch pages, diffs, sample detail, jobs, events."""

    def __init__(self, reader: RunReader, *, tokenizer: Any = None, tokenizer_dir: Path | None = None) -> None:
        self.reader = reader
        self._latency = LatencyCache()  # a finished run's percentiles: read once, not per poll
        self._jobs = _JobControl(reader.database)
        self._tokenizers: dict[str, Any] = {}
        if tokenizer is not None and tokenizer_dir is not None:
            # the engine's Reconstructor already holds the run's tokenizer: diffs reuse it
            self._tokenizers[str(tokenizer_dir)] = tokenizer

    def mismatch_page(self, *args: Any, **kwargs: Any) -> MismatchPage:
        """`DataSource.mismatch_page`: the store's `RunReader.mismatch_page` (same arguments)."""
        return self.reader.mismatch_page(*args, **kwargs)

    def conversation_page(self, after_pk: int, limit: int) -> Sequence[ConversationRow]:
        """`DataSource.conversation_page`: the store's `conversation_page` over this run."""
        return self.reader.call(queries.conversation_page, self.reader.run_id, after_pk=after_pk, limit=limit)

    def conversation_turns(self, conversation_id: str) -> Sequence[TurnRow]:
        """`DataSource.conversation_turns`: the store's `conversation_turns` over this run."""
        return self.reader.call(queries.conversation_turns, self.reader.run_id, conversation_id)

    def dataset_mix(self) -> Sequence[queries.MixRow]:
        """`DataSource.dataset_mix`: the store's `dataset_mix` over this run."""
        return self.reader.call(queries.dataset_mix, self.reader.run_id)

    def tokenizer_dir(self) -> Path:
        """The run's tokenizer directory, from the config stored with the run."""
        value = (self.reader.run.config.get("model") or {}).get("tokenizer")
        if not value:
            raise InputError(
                f"{self.reader.database}: run {self.reader.run_name!r} records no model.tokenizer in its config"
            )
        return Path(value)

    def _tokenizer(self) -> Any:
        from app.tokens import load_tokenizer

        path = str(self.tokenizer_dir())
        if path not in self._tokenizers:
            self._tokenizers[path] = load_tokenizer(path)
        return self._tokenizers[path]

    def sample_diff(self, sample_id: str) -> SampleDiff:
        from app.tokens.align import align

        rec = self.reader.call(queries.reconstruction_of, self.reader.run_id, sample_id)
        if rec is None:
            self._known(sample_id)
            raise InputError(f"sample {sample_id!r} has no reconstruction yet (no response stored for it)")
        if rec.reference_ids is None:
            raise InputError(f"sample {sample_id!r} has no reference ids, so there is nothing to diff against")
        alignment = align(rec.reference_ids, rec.output_ids, self._tokenizer())
        return SampleDiff(sample_id, rec.category, rec.explanation or "", alignment, rec.strategy)

    def _known(self, sample_id: str) -> None:
        if self.reader.call(queries.sample_detail, self.reader.run_id, sample_id) is None:
            raise InputError(f"run {self.reader.run_name!r} has no sample {sample_id!r}")

    def sample_detail(self, sample_id: str) -> SampleDetail:
        detail = self.reader.call(queries.sample_detail, self.reader.run_id, sample_id, keep_raw=self.reader.keep_raw)
        if detail is None:
            raise InputError(f"run {self.reader.run_name!r} has no sample {sample_id!r}")
        return detail

    def jobs(self) -> Sequence[JobRow]:
        return [
            JobRow(
                j.job_id,
                j.name,
                j.state,
                j.executor,
                j.shards_done,
                j.n_shards,
                j.tokens,
                clock(j.updated_at) if j.updated_at else "",
                j.log_path,
            )
            for j in self.reader.call(queries.job_summaries, self.reader.run_id)
        ]

    def job_log(self, job_id: int, lines: int) -> str:
        found = self.reader.call(queries.latest_shard_log, job_id)
        if found is None:
            return f"job {job_id} has no shard log yet"
        shard, path = found
        try:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
                text = fh.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"shard {shard} log {path}: cannot be read ({exc.strerror})"
        return f"shard {shard} · {path}\n" + "\n".join(text.splitlines()[-lines:])

    def events(self, n: int) -> Sequence[EventLine]:
        return [
            EventLine(clock(e.ts), e.level, e.kind, e.message)
            for e in self.reader.call(queries.events_tail, self.reader.run_id, n)
        ]

    async def job_command(self, job_id: int, verb: str) -> None:
        if not self.can_control:
            raise EaglewatchError("this viewer is read-only (--readonly); it sends no commands")
        await asyncio.to_thread(self._jobs.command, job_id, verb)

    @property
    def can_control(self) -> bool:
        return self.control is not None

    @property
    def control(self) -> RunControl | None:
        raise NotImplementedError

    def record(self, live: LiveFigures | None) -> RunRecord:
        """`DataSource.record`: app.engine.record.reads.read_record over this reader's connection."""
        return self.reader.call(read_record, self.reader.run_name, live=live, latency=self._latency)

    def series_since(self, responses_after: int, reconstructions_after: int) -> queries.SeriesChunk:
        return self.reader.call(queries.series_since, self.reader.run_id, responses_after, reconstructions_after)

    def close(self) -> None:
        self.reader.close()


class AttachedSource(_DatabaseBackedSource):
    """A viewer over a run database; steers a headless engine through the `commands` table."""

    def __init__(self, database: Path, run_name: str | None = None, *, readonly: bool = False) -> None:
        super().__init__(RunReader(database, run_name))
        self.readonly = readonly
        self._control = None if readonly else AttachedControl(self.reader.database, self.reader.run_id)

    @property
    def title(self) -> str:
        mode = "read-only" if self.readonly else "attached"
        return f"{self.reader.run_name} · {self.reader.database.name} ({mode})"

    @property
    def live(self) -> bool:
        return False

    @property
    def control(self) -> AttachedControl | None:
        return self._control

    def live_figures(self) -> None:
        return None  # the engine's heartbeat carries them (read_record)

    async def aclose(self) -> None:
        """Close the command writer, if one was opened."""
        if self._control is not None:
            await self._control.aclose()


class InProcessSource(_DatabaseBackedSource):
    """The monitor over an engine `Run` hosted in this process (its live figures are taken on the event loop)."""

    def __init__(self, *, run: Any, config: Any) -> None:
        engine_tokenizer = getattr(getattr(run, "reconstructor", None), "tokenizer", None)
        super().__init__(
            RunReader(Path(run.db_path), config.run.name),
            tokenizer=engine_tokenizer,
            tokenizer_dir=Path(config.model.tokenizer),
        )
        self.run = run
        self.config = config

    @property
    def title(self) -> str:
        return f"{self.config.run.name} · {self.reader.database.name}"

    @property
    def live(self) -> bool:
        return self.run.state in ("running", "paused", "stopping")

    @property
    def control(self) -> RunControl:
        return self.run

    def live_figures(self) -> LiveFigures | None:
        return self.run.snapshot().live


def open_attached(database: Path, run_name: str | None, *, readonly: bool) -> AttachedSource:
    """The attached source, or InputError naming the database when it cannot be read."""
    try:
        return AttachedSource(database, run_name, readonly=readonly)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{database}: cannot be read as a run database ({exc}); pass the run's eaglewatch.db") from exc
