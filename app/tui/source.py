"""What the monitor reads and steers: the `DataSource` protocol and the plain records it returns.

Screens talk only to a DataSource. Its read methods are synchronous and may touch SQLite, so the
screens call them through `app.tui.fetch.fetch_in_thread` (never on the UI loop); run control goes
through its `control` (the `app.engine.control.RunControl` protocol), job control through `job_command`.
Two implementations live in `app.tui.db_source`: in-process (an engine `Run` plus the store's reads)
and attached (the store's reads plus the `commands` table). Both faces show the same record of the run
(`app.engine.record.snapshot.RunRecord`): the store's counts, the engine's live figures (taken on the UI loop
in-process, from its heartbeat attached), finished figures once nothing moves the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from app.engine.control import RunControl
from app.engine.record.snapshot import LiveFigures, RunRecord
from app.records import VERDICT_CLASSES, Alignment, Category
from app.store.queries import MISMATCH_ORDERS, MISMATCH_VERDICTS, SERIES_BUCKET_S, MixRow, SeriesChunk, mix_total
from app.store.rows import (
    CONVERSATION_STATUSES,
    ConversationCounts,
    ConversationRow,
    MismatchPage,
    MismatchRow,
    SampleDetail,
    TurnRow,
    conversation_status,
)
from widgets.event_tail import EventLine
from widgets.jobs_table import JobRow

# The read records and the mismatch list's orders and verdicts are the store's (app.store.queries): one
# definition for every face. Re-exported here for the screens.
__all__ = [
    "MISMATCH_ORDERS",
    "MISMATCH_VERDICTS",
    "MismatchPage",
    "MismatchRow",
    "SampleDetail",
    "SampleDiff",
    "DataSource",
    "VERDICT_WORDS",
    "VERDICT_CLASS",
    "SERIES_BUCKET_S",
    "SeriesChunk",
    "ConversationCounts",
    "ConversationRow",
    "TurnRow",
    "CONVERSATION_STATUSES",
    "conversation_status",
    "MixRow",
    "mix_total",
]

VERDICT_WORDS: dict[str, str] = {
    Category.EXACT: "exact: the reconstructed ids equal the reference ids",
    Category.BPE_EQUIVALENT: "benign: same text, different BPE split",
    Category.TEXT_MISMATCH: "corrupt: the decoded text differs from the reference",
    Category.STRUCTURE_MISMATCH: "corrupt: the special-token layout differs (a reconstruction logic bug)",
    Category.TRUNCATED: "truncated: the response stopped at max_tokens, so there is no end-of-turn",
    Category.UNCHECKED: "no reference: there is no reference to compare against",
}
# the class a verdict belongs to, in words (app.records.VERDICT_CLASSES: one vocabulary for every face)
VERDICT_CLASS = VERDICT_CLASSES


@dataclass(frozen=True, slots=True)
class SampleDiff:
    """What the token-diff screen shows for one sample."""

    sample_id: str
    category: str
    explanation: str
    alignment: Alignment
    strategy: str | None = None

    @property
    def headline(self) -> str:
        """The verdict in words, with the aligner's or validator's own explanation when present."""
        if not self.explanation:
            return VERDICT_WORDS.get(self.category, self.category)
        label = VERDICT_CLASS.get(self.category, self.category)
        if self.explanation.lower().startswith(label):
            return self.explanation
        return f"{label}: {self.explanation}"


class DataSource(Protocol):
    """The monitor's only view of a run. Read methods are sync (call them off the UI thread)."""

    @property
    def title(self) -> str:
        """What the header shows: the run name and where it comes from."""

    @property
    def live(self) -> bool:
        """True while an in-process engine is running (quitting would stop it: ask first)."""

    @property
    def can_control(self) -> bool:
        """False for a read-only viewer: run and job control keys are hidden."""

    @property
    def control(self) -> RunControl | None:
        """The run's control (pause, resume, set_concurrency): the engine in-process, the `commands` table
        attached; None for a read-only viewer."""

    def live_figures(self) -> LiveFigures | None:
        """The engine's live figures when this process hosts it (call on the UI loop: they are the engine's
        memory, cheap to take); None for a source that reads them from the database (attached)."""

    def record(self, live: LiveFigures | None) -> RunRecord:
        """The run's record now (call off the UI thread): the store's counts, with `live` when given (from
        `live_figures()`), else the engine's heartbeat, and finished figures once nothing moves the run."""

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
        """Non-exact samples matching the filters, one page, in `order` (a MISMATCH_ORDERS key).

        With `after` (`before`), the page is the one right after (before) that row, and `offset` is only
        reported back; without them the page starts at `offset`.
        """

    def conversation_page(self, after_pk: int, limit: int) -> Sequence[ConversationRow]:
        """Up to `limit` of the run's whole conversations in ingest order, after the one whose turn 1 has row key
        `after_pk` (0: from the first), each with how it stands; empty for a run without conversations."""

    def conversation_turns(self, conversation_id: str) -> Sequence[TurnRow]:
        """Every turn of one conversation in order, each with its state and verdict (empty when unknown)."""

    def dataset_mix(self) -> Sequence[MixRow]:
        """The run's mix per (dataset, category): prompts, answers, loss tokens, reasoning and tool-call answers,
        its prompts' scripts (app.store.queries.dataset_mix, what `status` and the export manifest show)."""

    def sample_diff(self, sample_id: str) -> SampleDiff:
        """Reference vs reconstructed tokens for one sample, aligned (raises EaglewatchError if none)."""

    def sample_detail(self, sample_id: str) -> SampleDetail:
        """Prompt, latest response, usage, timings and raw body of one sample (EaglewatchError if unknown)."""

    def series_since(self, responses_after: int, reconstructions_after: int) -> SeriesChunk | None:
        """The plots' rows stored after those row ids, summed per 10 s bucket; None for a source with no database."""

    def jobs(self) -> Sequence[JobRow]:
        """Extraction jobs, newest first."""

    def job_log(self, job_id: int, lines: int) -> str:
        """The tail of a job's log (its newest shard's log file), or a sentence saying why none."""

    def events(self, n: int) -> Sequence[EventLine]:
        """The last `n` events, oldest first."""

    async def job_command(self, job_id: int, verb: str) -> None:
        """Pause, resume or cancel a job (verb: pause | resume | cancel)."""

    def close(self) -> None:
        """Release connections (the engine, if any, is stopped by its owner)."""
