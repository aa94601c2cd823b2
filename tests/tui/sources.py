"""Deterministic in-memory data for screen tests: a fixed snapshot, mismatches, diffs, jobs, events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from app.engine.record.snapshot import EndpointLive, LiveFigures, Rate, RunRecord
from app.records import AlignBlock, AlignedToken, Alignment
from app.store.count_records import AnswerCounts, EndpointCounts, RunCounts, SampleStates
from app.tui.source import (
    ConversationCounts,
    ConversationRow,
    MismatchPage,
    MismatchRow,
    MixRow,
    SampleDetail,
    SampleDiff,
    TurnRow,
)
from widgets.event_tail import EventLine
from widgets.jobs_table import JobRow

# the run's mix: two datasets, one with a category column; 1,000 prompts like COUNTS
MIX = (
    MixRow("magpie-pro-300k-filtered", "magpie-pro-300k-filtered", 500, 230, 120_000, 40, 0, (("Latin", 500),)),
    MixRow("openthoughts", "code", 300, 140, 210_000, 140, 0, (("Latin", 290), ("CJK", 10))),
    MixRow("toolace", "toolace", 200, 90, 82_000, 0, 81, (("Latin", 150), ("CJK", 40), ("Cyrillic", 10))),
)

COUNTS = RunCounts(
    samples=SampleStates(pending=520, leased=8, done=460, failed=12),
    cost_usd=1.284,
    requests=503,
    completion_tokens=412_000,
    errors_by_class=(("429", 22), ("timeout", 9)),
    failed_by_class=(("attempts_exhausted", 12),),
    retried=31,
    answers=AnswerCounts(
        answers=460,
        verdicts=(
            ("exact", 431),
            ("bpe_equivalent", 17),
            ("text_mismatch", 3),
            ("structure_mismatch", 0),
            ("truncated", 9),
            ("unchecked", 0),
        ),
        verified=448,
        checked=12,
        unchecked=0,
        measured=80,
        measured_exact=76,
        measured_benign=2,
        measured_corrupt=(("text_mismatch", 2),),
        suspects=1,
        truncated=9,
    ),
    strategies=(("canonical", 380), ("logprobs", 80)),
    endpoints=(
        EndpointCounts("sim-a", completed=300, failed=8, retried=20, cost_usd=0.84),
        EndpointCounts("sim-b", completed=160, failed=4, retried=11, cost_usd=0.44),
    ),
    first_at=1_700_000_000.0,
    last_at=1_700_000_754.0,
)
LIVE = LiveFigures(
    state="running",
    started_at=1_700_000_000.0,
    in_flight=8,
    waiting=2,
    concurrency_limit=16,
    rate=Rate(req_s_10s=3.4, req_s_1m=3.1, req_s_5m=2.9, tok_s_10s=1530.0, tok_s_1m=1402.0, tok_s_5m=1390.0),
    latency_p50_ms=2150.0,
    latency_p95_ms=6400.0,
    ttft_p50_ms=310.0,
    cost_per_hour=6.13,
    eta_s=1210.0,
    projected_cost_usd=2.79,
    endpoints=(
        EndpointLive(
            name="sim-a",
            in_flight=5,
            concurrency_limit=10,
            latency_p50_ms=2000.0,
            latency_p95_ms=6000.0,
            waiting=1,
            limit_reason="at ceiling",
            capacity=10,
        ),
        EndpointLive(
            name="sim-b",
            in_flight=3,
            concurrency_limit=6,
            latency_p50_ms=2400.0,
            latency_p95_ms=7100.0,
            waiting=1,
            limit_reason="at ceiling",
            capacity=6,
        ),
    ),
)
# a fixed record: 754 s into the run (read_at), as an in-process engine would show it
RECORD = RunRecord(
    run_name="demo",
    state="running",
    counts=COUNTS,
    engine="here",
    engine_text="engine in this process",
    live=LIVE,
    budget_usd=5.0,
    read_at=1_700_000_754.0,
)


def tok(i: int, text: str, special: bool = False) -> AlignedToken:
    return AlignedToken(id=i, text=text, special=special)


def sample_alignment(repeat: int = 1) -> Alignment:
    """ref: '<think>' 'The' '·NOR' ... rec splits '·NOR' as '·N' + 'OR' (a benign BPE split)."""
    blocks = []
    ref_pos = rec_pos = 0
    for _r in range(repeat):
        equal = tuple(tok(1000 + k, t) for k, t in enumerate(["The", "·answer", "·is", "·clear", ".", "⏎"] * 3))
        blocks.append(AlignBlock(True, ref_pos, rec_pos, equal, equal))
        ref_pos += len(equal)
        rec_pos += len(equal)
        ref = (tok(4512, "·NOR"),)
        rec = (tok(451, "·N"), tok(1690, "OR"))
        blocks.append(AlignBlock(False, ref_pos, rec_pos, ref, rec))
        ref_pos += 1
        rec_pos += 2
    tail = (tok(7, "·gate", False), tok(163586, "<|im_end|>", True))
    blocks.append(AlignBlock(True, ref_pos, rec_pos, tail, tail))
    return Alignment(tuple(blocks), ref_pos + 2, rec_pos + 2)


def make_rows(n: int) -> list[MismatchRow]:
    verdicts = ("bpe_equivalent", "text_mismatch", "truncated", "structure_mismatch")
    return [
        MismatchRow(f"s{i:05d}", "chat" if i % 3 else "code", verdicts[i % 4], 10 + i % 50, 500 + i, 501 + i, 1 + i % 7)
        for i in range(n)
    ]


class MemorySource:
    """A DataSource over fixed in-memory data, and its own RunControl; records control calls in `commands`."""

    def __init__(
        self, *, rows: int = 250, live: bool = False, can_control: bool = True, state: str = "running"
    ) -> None:
        self._record = replace(RECORD, state=state, live=replace(LIVE, state=state))
        self.rows = make_rows(rows)
        self._live = live
        self._can_control = can_control
        self.commands: list[tuple[str, ...]] = []
        self.job_rows = [
            JobRow(2, "extract-demo-b", "running", "local", 3, 8, 120_000),
            JobRow(1, "extract-demo-a", "done", "slurm", 8, 8, 410_000),
        ]

    title = "demo (test data)"

    @property
    def live(self) -> bool:
        return self._live

    @property
    def can_control(self) -> bool:
        return self._can_control

    @property
    def control(self) -> MemorySource | None:
        return self if self._can_control else None

    def live_figures(self) -> None:
        return None  # the fixed record carries its own

    def record(self, live: LiveFigures | None) -> RunRecord:
        return self._record

    def mismatch_page(
        self, verdicts: Sequence[str], text: str, order: str, offset: int, limit: int, **anchor
    ) -> MismatchPage:
        # Pages by offset only (the anchors are an optimisation of the database source).
        rows = [
            r for r in self.rows if r.category in verdicts and (not text or text in r.sample_id or text in r.dataset)
        ]
        key = {
            "sample": lambda r: r.sample_id,
            "recent": lambda r: [-ord(c) for c in r.sample_id],
            "verdict": lambda r: (r.category, r.sample_id),
            "first_diff": lambda r: (r.first_diff, r.sample_id),
            "n_diff": lambda r: (-r.n_diff, r.sample_id),
            "longest": lambda r: (-r.rec_len, r.sample_id),
        }[order]
        rows.sort(key=key)
        return MismatchPage(tuple(rows[offset : offset + limit]), len(rows), offset)

    def conversation_page(self, after_pk: int, limit: int) -> list[ConversationRow]:
        return []  # a single-turn run

    def conversation_turns(self, conversation_id: str) -> list[TurnRow]:
        return []

    def dataset_mix(self) -> Sequence[MixRow]:
        return MIX

    def sample_diff(self, sample_id: str) -> SampleDiff:
        return SampleDiff(
            sample_id,
            "bpe_equivalent",
            "same text, different BPE split — '·NOR' vs '·N' + 'OR'",
            sample_alignment(3),
            "canonical",
        )

    def sample_detail(self, sample_id: str) -> SampleDetail:
        return SampleDetail(
            sample_id,
            "chat",
            "done",
            prompt=({"role": "user", "content": "Is NOR [functionally] complete?"},),
            reasoning="NOR alone can build NOT, AND, OR.",
            content="Yes: NOR is functionally complete.",
            tool_calls=({"id": "call_0", "name": "lookup", "arguments": '{"q": "NOR"}'},),
            usage={"prompt_tokens": 12, "completion_tokens": 40},
            cost_usd=0.00031,
            latency_ms=2150.0,
            ttft_ms=310.0,
            endpoint="sim-a",
            finish_reason="stop",
            category="bpe_equivalent",
            strategy="canonical",
            raw='{"id": "gen-1"}',
            keep_raw=True,
        )

    def series_since(self, responses_after: int, reconstructions_after: int) -> None:
        return None  # no database: the plots say so

    def jobs(self) -> Sequence[JobRow]:
        return list(self.job_rows)

    def job_log(self, job_id: int, lines: int) -> str:
        return f'{{"event": "progress", "shard": 3, "done": 40, "total": 100}}  (job {job_id})'

    def events(self, n: int) -> Sequence[EventLine]:
        return [
            EventLine("10:00:01", "info", "run", "started with 2 endpoints"),
            EventLine("10:02:13", "warning", "endpoint", "sim-b: 429 rate limited, backing off 2 s"),
            EventLine("10:05:40", "info", "concurrency", "limit 12 -> 16"),
        ][-n:]

    async def pause(self, now: bool = False) -> None:
        self.commands.append(("pause_now",) if now else ("pause",))
        self._set(state="paused", state_reason="operator")

    async def resume(self) -> None:
        self.commands.append(("resume",))
        self._set(state="running", state_reason=None)

    async def set_concurrency(self, limit: int) -> None:
        self.commands.append(("set_concurrency", str(limit)))
        self._set(concurrency_limit=limit)

    def _set(self, **live) -> None:
        state = {k: v for k, v in live.items() if k in ("state", "state_reason")}
        self._record = replace(self._record, live=replace(self._record.live, **live), **state)

    async def retry_failed(self) -> None:
        self.commands.append(("retry_failed",))
        counts = self._record.counts
        samples = replace(counts.samples, pending=counts.samples.pending + counts.samples.failed, failed=0)
        self._record = replace(self._record, counts=replace(counts, samples=samples))

    async def job_command(self, job_id: int, verb: str) -> None:
        self.commands.append(("job", str(job_id), verb))

    def close(self) -> None:
        pass


# a run of whole conversations in every status: 12 conversations, 40 turns (in flight, waiting on its parent,
# diverged, failed, truncated, off-policy after a replayed divergent call)
CONVERSATIONS = (
    ConversationRow("conv-oa-01", "agent-tools", 4, 4, "done", 4, False, 1),
    ConversationRow("conv-oa-02", "agent-tools", 5, 2, "running", 3, False, 5),
    ConversationRow("conv-oa-03", "agent-tools", 5, 1, "diverged", 2, False, 10),
    ConversationRow("conv-oa-04", "agent-tools", 3, 1, "ready", 2, False, 15),
    ConversationRow("conv-oa-05", "agent-tools", 4, 4, "done", 4, True, 18),
    ConversationRow("conv-oa-06", "agent-tools", 2, 0, "not_started", 1, False, 22),
    ConversationRow("conv-sg-01", "chats", 3, 1, "failed", 2, False, 24),
    ConversationRow("conv-sg-02", "chats", 4, 1, "truncated", 1, False, 27),
    ConversationRow("conv-sg-03", "chats", 3, 3, "done", 3, False, 31),
    ConversationRow("conv-sg-04", "chats", 3, 3, "done", 3, False, 34),
    ConversationRow("conv-sg-05", "chats", 2, 0, "running", 1, False, 37),
    ConversationRow("conv-sg-06", "chats", 2, 2, "done", 2, False, 39),
)
DIVERGED_WHY = (
    'turn 1: tool call 0 (search) has arguments {"limit":9,"note":"a different call"} where the dataset had {"limit":9}'
)
TURNS = {
    "conv-oa-02": (
        TurnRow(5, "conv-oa-02#1", 1, 5, "done", None, None, False, "exact", 88, None),
        TurnRow(6, "conv-oa-02#2", 2, 5, "done", None, None, False, "bpe_equivalent", 140, 37),
        TurnRow(7, "conv-oa-02#3", 3, 5, "leased", None, None, False, None, None, None),
        TurnRow(8, "conv-oa-02#4", 4, 5, "waiting", None, None, False, None, None, None),
        TurnRow(9, "conv-oa-02#5", 5, 5, "waiting", None, None, False, None, None, None),
    ),
    "conv-oa-03": (
        TurnRow(10, "conv-oa-03#1", 1, 5, "done", None, None, False, "exact", 101, None),
        TurnRow(11, "conv-oa-03#2", 2, 5, "skipped", "diverged", DIVERGED_WHY, False, None, None, None),
        *(
            TurnRow(10 + k, f"conv-oa-03#{k}", k, 5, "skipped", "parent_skipped", DIVERGED_WHY, False, None, None, None)
            for k in (3, 4, 5)
        ),
    ),
}
CONVERSATION_COUNTS = ConversationCounts(
    total=12,
    done=4,
    diverged=1,
    failed=1,
    truncated=1,
    ended_skipped=0,
    open=5,
    not_started=1,
    in_flight=2,
    waiting_on_parent=2,
    turns={"pending": 2, "waiting": 11, "leased": 2, "done": 21, "failed": 1, "skipped": 3},
    off_policy_turns=2,
)


class ConversationSource(MemorySource):
    """MemorySource of a run of whole conversations: the record counts them, the conversation view lists them."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._record = replace(self._record, counts=replace(self._record.counts, conversations=CONVERSATION_COUNTS))

    def conversation_page(self, after_pk: int, limit: int) -> list[ConversationRow]:
        return [c for c in CONVERSATIONS if c.pk > after_pk][:limit]

    def conversation_turns(self, conversation_id: str) -> list[TurnRow]:
        return list(TURNS.get(conversation_id, ()))
