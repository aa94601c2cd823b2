"""What the eval monitor reads and steers: `EvalSource`, over an eval run's database (attached or in-process).

One poll (`EvalSource.poll`, off the UI thread) reads only the requests stored since the last one
(`app.store.eval_reads.tally_rows_after`, by id after a cursor) into running aggregates (`app.eval.live.EvalTally`),
plus the run's state, its engine's heartbeat and the newest events: its cost does not grow with the run. The stored
report with its bootstrap intervals (`report`) needs every row; the dashboard asks for it on a throttle, in a worker
of its own, over a connection of its own, so a poll never waits for it.

Run control is the generation monitor's: the eval engine itself in-process (`app.eval.run.EvalRun` is a
`RunControl`), `AttachedControl` (the `commands` table) attached.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.control import RunControl
from app.errors import InputError
from app.eval.live import EvalFigures, EvalTally, eval_setup, step_spans
from app.store import eval_reads, queries
from app.store.eval_reads import EvalRequestLine
from app.store.heartbeat import liveness, read_heartbeat
from app.store.queries import RunReader
from app.tui.db_source import AttachedControl
from app.tui.format import clock
from widgets.event_tail import EventLine

__all__ = ["EvalPoll", "EvalRequestLine", "EvalSource", "EvalStatus", "RequestOutput", "is_eval_run"]

EVENTS_FETCHED = 8
PROMPTS_EVERY_S = 5.0  # the prompt count (the progress bar's total) is re-read this often at most
IN_PROCESS = "in-process"


@dataclass(frozen=True, slots=True)
class EvalStatus:
    """The run's state as the status line shows it."""

    run_name: str
    state: str
    reason: str | None
    engine: str  # in-process | running | stopped | gone | never (app.store.heartbeat.Liveness.state)
    engine_text: str
    in_flight: int | None
    total: int  # requests to store: prompts × endpoints
    started_at: float | None

    @property
    def engine_gone(self) -> bool:
        """A run live in the database whose engine stopped beating: keys would queue what nothing reads."""
        return self.engine in ("gone", "never", "stopped") and self.state in ("running", "paused")


@dataclass(frozen=True, slots=True)
class EvalPoll:
    """One poll of the eval dashboard."""

    status: EvalStatus
    figures: EvalFigures
    events: tuple[EventLine, ...]
    caught_up: bool  # False while a viewer still reads a big run's history (the next poll goes on at once)


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One request's output as the request screen shows it: `pieces` are (text, kind) with kind one of
    app.eval.live's ACCEPTED, REJECTED, BONUS, OWN, or "plain" when the server gave no per-step detail."""

    request_id: int
    sample_id: str
    endpoint: str
    category: str | None
    error: str | None
    n_tokens: int
    accepted: int | None
    steps: int | None
    tokens_per_s: float | None
    loop: bool
    decoded: bool  # False: the pieces are token ids (no tokenizer configured, or it could not be loaded)
    detailed: bool  # the server gave per-step detail (spans coloured)
    pieces: tuple[tuple[str, str], ...]
    note: str = ""


def is_eval_run(database: Path, run_name: str | None) -> bool:
    """Whether the run `run_name` of `database` (the only run when None) is an eval run (False for a file that is no
    run database, or one older than eval runs: the generation monitor then says what is wrong)."""
    try:
        conn = queries.connect_readonly(database, check=False)
    except (sqlite3.Error, OSError):
        return False
    try:
        run = queries.resolve_run(conn, run_name, db_label=str(database))
        return queries.run_kind(conn, run.id) == "eval"
    except sqlite3.Error:
        return False
    finally:
        conn.close()


class EvalSource:
    """The eval monitor's data source. `progress` (in-process only) returns the engine's own EvalProgress."""

    kind = "eval"

    def __init__(
        self,
        reader: RunReader,
        *,
        control: RunControl | None,
        progress: Callable[[], Any] | None = None,
        readonly: bool = False,
        tokenizer: Any = None,
    ) -> None:
        self.reader = reader
        self._control = control
        self._progress = progress
        self.readonly = readonly
        ev, drafters, baseline = eval_setup(reader.run.config)
        self.drafters, self.baseline = drafters, baseline
        self.tally = EvalTally(ev, drafters, baseline)
        self._lock = threading.Lock()
        self._prompts: tuple[float, int] | None = None
        self._tokenizer = tokenizer
        self._tokenizer_error: str | None = None

    # --- what the App asks -------------------------------------------------------------------
    @property
    def title(self) -> str:
        mode = "in-process" if self._progress is not None else ("read-only" if self.readonly else "attached")
        return f"{self.reader.run_name} · {self.reader.database.name} (eval, {mode})"

    @property
    def live(self) -> bool:
        """True while this process hosts the eval (quitting stops it)."""
        if self._progress is None:
            return False
        return getattr(self._control, "state", "") in ("idle", "running", "paused")

    @property
    def can_control(self) -> bool:
        return self._control is not None

    @property
    def control(self) -> RunControl | None:
        return self._control

    # --- the poll ----------------------------------------------------------------------------
    def poll(self) -> EvalPoll:
        """New rows into the tally, the running figures, the run's state and the newest events (off the UI thread)."""
        with self._lock:
            rows = self.reader.call(eval_reads.tally_rows_after, self.reader.run_id, self.tally.cursor)
            self.tally.add(rows)
            figures = self.tally.figures()
            caught_up = len(rows) < eval_reads.TALLY_CHUNK
            status = self._status()
            events = self.events(EVENTS_FETCHED)
        return EvalPoll(status, figures, tuple(events), caught_up)

    def _status(self) -> EvalStatus:
        run_id = self.reader.run_id
        state, reason, _ = self.reader.call(eval_reads.run_state, run_id)
        now = time.monotonic()
        if self._prompts is None or now - self._prompts[0] > PROMPTS_EVERY_S:
            self._prompts = (now, self.reader.call(eval_reads.prompts_to_send, run_id))
        targets = len(self.drafters) + (1 if self.baseline else 0)
        total = self._prompts[1] * targets
        in_flight: int | None = None
        if self._progress is not None:
            progress = self._progress()
            engine, engine_text, in_flight = IN_PROCESS, "eval in this process", progress.in_flight
        else:
            beat = self.reader.call(read_heartbeat, run_id)
            seen = liveness(beat, time.time())
            engine, engine_text = seen.state, seen.short
            if seen.alive and beat is not None and beat.snapshot_json:
                in_flight = _eval_snapshot(beat.snapshot_json).get("in_flight")
        started = self.reader.run.created_at or None
        return EvalStatus(self.reader.run_name, state, reason, engine, engine_text, in_flight, total, started)

    def events(self, n: int) -> Sequence[EventLine]:
        return [
            EventLine(clock(e.ts), e.level, e.kind, e.message)
            for e in self.reader.call(queries.events_tail, self.reader.run_id, n)
        ]

    # --- the requests and one request --------------------------------------------------------
    def request_lines(self, before_id: int | None = None, limit: int = 200) -> Sequence[EvalRequestLine]:
        """A page of the run's requests, newest first, below `before_id`."""
        return self.reader.call(eval_reads.request_lines, self.reader.run_id, before_id=before_id, limit=limit)

    def request_output(self, request_id: int) -> RequestOutput:
        """One request's output: decoded with the run's tokenizer when one is configured (else its ids), its
        accepted and rejected drafts marked where the server gave per-step detail."""
        found = self.reader.call(eval_reads.request_whole, self.reader.run_id, request_id)
        if found is None:
            raise InputError(f"run {self.reader.run_name!r} has no eval request {request_id}")
        sample_id, row = found
        ids = list(row.output_ids)
        spec = row.spec or {}
        drafted = spec.get("per_step_drafted")
        if drafted is None and isinstance(spec.get("num_spec_tokens"), int) and row.steps:
            drafted = [spec["num_spec_tokens"]] * row.steps
        spans = step_spans(len(ids), spec.get("per_step_accepted"), drafted)
        tokenizer = self.tokenizer()
        note = "" if tokenizer is not None else (self._tokenizer_error or "no tokenizer configured: token ids")

        def text(part: list[int]) -> str:
            return tokenizer.decode(part) if tokenizer is not None else " ".join(map(str, part)) + " "

        if spans is None:
            pieces: tuple[tuple[str, str], ...] = ((text(ids), "plain"),) if ids else ()
            if not note and row.spec_source is not None:
                note = "the server gave no per-step detail (vLLM --per-request-spec-decode-metrics detailed)"
        else:
            pieces = tuple((text(ids[a:b]), kind) for a, b, kind in spans)
        return RequestOutput(
            request_id, sample_id, row.endpoint, row.category, row.error, len(ids), row.accepted, row.steps,
            row.tokens_per_s, row.loop, tokenizer is not None, spans is not None, pieces, note,
        )  # fmt: skip

    def tokenizer(self) -> Any:
        """The run's tokenizer (its config's model.tokenizer), loaded once; None without one."""
        if self._tokenizer is None and self._tokenizer_error is None:
            path = (self.reader.run.config.get("model") or {}).get("tokenizer")
            if not path:
                self._tokenizer_error = "no model.tokenizer in the run's config: token ids"
            else:
                try:
                    from app.tokens import load_tokenizer

                    self._tokenizer = load_tokenizer(path)
                except Exception as exc:  # a moved tokenizer: show the ids, say why
                    self._tokenizer_error = f"tokenizer {path} could not be loaded ({exc}): token ids"
        return self._tokenizer

    # --- the heavy figures -------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """The stored report (bootstrap intervals, every verdict), over a connection of its own (slow on a big run:
        the dashboard asks for it on a throttle, never in a poll)."""
        from app.eval.report import stored_report

        conn = queries.connect_readonly(self.reader.database)
        try:
            return stored_report(conn, queries.resolve_run(conn, self.reader.run_name))
        finally:
            conn.close()

    async def aclose(self) -> None:
        if isinstance(self._control, AttachedControl):
            await self._control.aclose()

    def close(self) -> None:
        self.reader.close()


def _eval_snapshot(text: str) -> dict[str, Any]:
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return {}
    got = data.get("eval") if isinstance(data, dict) else None
    return got if isinstance(got, dict) else {}


def open_eval_attached(database: Path, run_name: str | None, *, readonly: bool) -> EvalSource:
    """The attached eval source over `database` (steers through the `commands` table unless read-only)."""
    reader = RunReader(database, run_name)
    control = None if readonly else AttachedControl(reader.database, reader.run_id)
    return EvalSource(reader, control=control, readonly=readonly)


def in_process_eval_source(database: Path, run_name: str, engine: Any) -> EvalSource:
    """The eval source over an `EvalRun` hosted in this process (its progress read in memory)."""
    return EvalSource(RunReader(database, run_name), control=engine, progress=lambda: engine.progress)
