"""What the monitor reads and steers: the `DataSource` protocol and the plain records it returns.

Screens talk only to a DataSource. Its read methods are synchronous and may touch SQLite, so the
screens call them from thread workers (never on the UI loop); its control methods are coroutines.
Two implementations live in `app.tui.db_source`: in-process (an engine `Run` plus read queries)
and attached (read queries plus the `commands` table).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.engine.snapshot import MetricsSnapshot
from app.records import Alignment
from widgets.event_tail import EventLine
from widgets.jobs_table import JobRow

# Verdicts listed on the mismatches screen (everything but exact), in filter-cycling order.
MISMATCH_VERDICTS = ("bpe_equivalent", "text_mismatch", "structure_mismatch", "truncated", "unchecked")
# Sort orders the mismatches screen offers: key -> caption.
MISMATCH_ORDERS = {
    "sample": "sample id",
    "verdict": "verdict",
    "first_diff": "first difference",
    "n_diff": "tokens differing (most first)",
}

VERDICT_WORDS = {
    "exact": "exact: the reconstructed ids equal the reference ids",
    "bpe_equivalent": "benign: same text, different BPE split",
    "text_mismatch": "corrupt: the decoded text differs from the reference",
    "structure_mismatch": "corrupt: the special-token layout differs (a reconstruction logic bug)",
    "truncated": "truncated: the response stopped at max_tokens, so there is no end-of-turn",
    "unchecked": "unchecked: there is no reference to compare against",
}
VERDICT_CLASS = {
    "exact": "exact",
    "bpe_equivalent": "benign",
    "text_mismatch": "corrupt",
    "structure_mismatch": "corrupt",
    "truncated": "truncated",
    "unchecked": "unchecked",
}


@dataclass(frozen=True, slots=True)
class MismatchRow:
    """One non-exact sample as listed on the mismatches screen."""

    sample_id: str
    dataset: str
    verdict: str
    first_diff: int | None
    ref_len: int | None
    rec_len: int
    n_diff: int
    pk: int = 0  # the store's row key: pages turn by it (keyset paging)


@dataclass(frozen=True, slots=True)
class MismatchPage:
    """A window of the mismatch list: `rows` start at `offset` of `total` matching rows."""

    rows: tuple[MismatchRow, ...]
    total: int
    offset: int


@dataclass(frozen=True, slots=True)
class SampleDiff:
    """What the token-diff screen shows for one sample."""

    sample_id: str
    verdict: str
    explanation: str
    alignment: Alignment
    strategy: str | None = None

    @property
    def headline(self) -> str:
        """The verdict in words, with the aligner's or validator's own explanation when present."""
        if not self.explanation:
            return VERDICT_WORDS.get(self.verdict, self.verdict)
        label = VERDICT_CLASS.get(self.verdict, self.verdict)
        if self.explanation.lower().startswith(label):
            return self.explanation
        return f"{label}: {self.explanation}"


@dataclass(frozen=True, slots=True)
class SampleDetail:
    """Everything stored about one sample's latest response, as text ready to show."""

    sample_id: str
    dataset: str
    state: str
    prompt: Sequence[dict[str, Any]] = ()
    reasoning: str | None = None
    content: str | None = None
    tool_calls: Sequence[dict[str, Any]] = ()
    usage: dict[str, Any] = field(default_factory=dict)
    cost_usd: float = 0.0
    latency_ms: float | None = None
    ttft_ms: float | None = None
    endpoint: str | None = None
    finish_reason: str | None = None
    verdict: str | None = None
    strategy: str | None = None
    error: str | None = None
    raw: str | None = None


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
        """False for a read-only viewer: pause/resume and job commands are hidden."""

    @property
    def snapshot_on_loop(self) -> bool:
        """True when snapshot() is in-memory and must be taken on the event loop (in-process engine)."""

    def snapshot(self) -> MetricsSnapshot:
        """The run's metrics now."""

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

    def sample_diff(self, sample_id: str) -> SampleDiff:
        """Reference vs reconstructed tokens for one sample, aligned (raises EaglewatchError if none)."""

    def sample_detail(self, sample_id: str) -> SampleDetail:
        """Prompt, response, usage, timings and raw body of one sample."""

    def jobs(self) -> Sequence[JobRow]:
        """Extraction jobs, newest first."""

    def job_log(self, job_id: int, lines: int) -> str:
        """The tail of a job's log (its newest shard's log file), or a sentence saying why none."""

    def events(self, n: int) -> Sequence[EventLine]:
        """The last `n` events, oldest first."""

    async def pause(self, now: bool = False) -> None:
        """Ask the run to lease nothing new; with now=True also to cancel requests in flight."""

    async def resume(self) -> None:
        """Ask the run to continue."""

    async def job_command(self, job_id: int, verb: str) -> None:
        """Pause, resume or cancel a job (verb: pause | resume | cancel)."""

    def close(self) -> None:
        """Release connections (the engine, if any, is stopped by its owner)."""
