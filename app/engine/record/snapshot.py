"""The run's record: the one picture of a run that every face shows (the TUI in-process and attached, `serve`,
`status`, `fidelity`, the headless progress line).

A RunRecord has four parts, each with one source:
- `counts` (app.store.count_records.RunCounts): samples by state, cost, errors, verdicts, the verification
  classes, truncated, suspects, per-endpoint and per-provider counts. Always the store's tallies, read by
  `app.store.queries.run_counts`: in-process too, so a face never shows one engine's share as the run's.
- `live` (LiveFigures): what only a running engine knows now: requests in flight and waiting, the limits and
  why, rates and percentiles of its last minutes, ETA and projected cost. The engine fills it
  (`Run.snapshot()`); an attached reader takes it from the engine's heartbeat while the engine beats.
- `finished` (FinishedFigures): once nothing moves the run (it is done, or its engine exited or is gone), the
  figures over the whole run instead of live ones: elapsed frozen at the last stored request, averages over
  that time, percentiles over every answer (`app.store.queries.run_latency`). A finished run never shows a
  live rate or a counting clock.
- the engine's liveness: `here` (this process hosts it) | running | stopped | gone | never (app.store.heartbeat),
  and `engine_text`, that in words.

`app.engine.record.reads.read_record` builds one from a database connection (any thread); `state_words` says the
run's state as every face words it (one rule for DONE, below). This module holds no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.store.count_records import Percentiles, RunCounts, RunLatency
from app.store.verification import VerificationStatus, worst_state

IN_PROCESS = "here"  # the engine runs in this process (the in-process TUI, the headless progress line)
LIVE_STATES = ("running", "paused", "stopping")  # states an engine moves a run through


@dataclass(frozen=True, slots=True)
class Rate:
    """Requests/s and output tokens/s over the trailing 10 s, 1 min and 5 min."""

    req_s_10s: float = 0.0
    req_s_1m: float = 0.0
    req_s_5m: float = 0.0
    tok_s_10s: float = 0.0
    tok_s_1m: float = 0.0
    tok_s_5m: float = 0.0


@dataclass(frozen=True, slots=True)
class EndpointLive:
    """One endpoint as its engine sees it now: requests on the wire, samples waiting (a retry's wait, or a
    response being reconstructed and stored), the adaptive limit with its reason (app.engine.capacity.limiter.REASONS)
    and
    the capacity proven so far (None while growing), and its last minutes' rate and percentiles."""

    name: str
    in_flight: int = 0
    waiting: int = 0
    concurrency_limit: int = 0
    limit_reason: str | None = None
    capacity: int | None = None
    rate: Rate = field(default_factory=Rate)
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None


@dataclass(frozen=True, slots=True)
class LiveFigures:
    """What only a running engine knows, now (the heartbeat carries it to attached readers).

    `state` / `state_reason` are the engine's (a pause it decided shows before the database row says so);
    `started_at` is when this engine process started the run (unix s); `cost_per_hour` is what this engine has
    spent per hour it ran; percentiles and rates cover its last five minutes; `eta_s` and `projected_cost_usd`
    are its projection of the samples left (app.engine.money.eta).
    """

    state: str
    state_reason: str | None = None
    started_at: float = 0.0
    in_flight: int = 0
    waiting: int = 0
    concurrency_limit: int = 0
    rate: Rate = field(default_factory=Rate)
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    cost_per_hour: float = 0.0
    eta_s: float | None = None
    projected_cost_usd: float | None = None
    endpoints: tuple[EndpointLive, ...] = ()

    def endpoint(self, name: str) -> EndpointLive | None:
        return next((e for e in self.endpoints if e.name == name), None)


@dataclass(frozen=True, slots=True)
class FinishedFigures:
    """A run no engine moves, over its whole span (first to latest stored request): `elapsed_s` frozen there,
    answers and output tokens per second and dollars per hour averaged over it, percentiles over every answer;
    per endpoint, its answers per second and percentiles."""

    elapsed_s: float = 0.0
    req_s: float = 0.0
    tok_s: float = 0.0
    cost_per_hour: float = 0.0
    percentiles: Percentiles = field(default_factory=Percentiles)
    endpoints: tuple[tuple[str, float, Percentiles], ...] = ()

    def endpoint(self, name: str) -> tuple[float, Percentiles]:
        """(answers/s, percentiles) of one endpoint over the run."""
        for n, req_s, p in self.endpoints:
            if n == name:
                return req_s, p
        return 0.0, Percentiles()


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One moment of a run, for every face (see the module docstring for its parts).

    `state` is the run's state (runs.state: idle | running | paused | stopping | done | failed; the engine's own
    when it runs here or beats), `state_reason` why (e.g. "402: out of credits", "budget reached", "operator").
    `read_at` is when the record was read (unix s); `budget_usd` the run's budget (None: none).
    """

    run_name: str
    state: str
    counts: RunCounts = field(default_factory=RunCounts)
    state_reason: str | None = None
    engine: str = "never"
    engine_text: str = ""
    live: LiveFigures | None = None
    finished: FinishedFigures | None = None
    budget_usd: float | None = None
    read_at: float = 0.0
    # each endpoint × provider's text path: verified / prior only / unverified (app.store.verification); read from
    # the database with the record (the engine's own snapshot leaves it empty)
    trust: tuple[VerificationStatus, ...] = ()

    def endpoint_trust(self, endpoint: str) -> str | None:
        """The least proven verification state among `endpoint`'s upstream providers (None: no answer yet)."""
        return worst_state(t.state for t in self.trust if t.endpoint == endpoint)

    # the samples' states, read often enough to be named here (they are counts.samples')
    @property
    def total(self) -> int:
        return self.counts.samples.total

    @property
    def done(self) -> int:
        return self.counts.samples.done

    @property
    def failed(self) -> int:
        return self.counts.samples.failed

    @property
    def skipped(self) -> int:
        return self.counts.samples.skipped

    @property
    def cost_usd(self) -> float:
        """Dollars spent by the run: every stored request (the cost ledger)."""
        return self.counts.cost_usd

    @property
    def elapsed_s(self) -> float:
        """The run's wall time: from its first stored request to its latest one once finished, else to now
        (before its first request: since this engine started it)."""
        if self.finished is not None:
            return self.finished.elapsed_s
        start = self.counts.first_at
        if start is None:
            start = self.live.started_at if self.live is not None and self.live.started_at else self.read_at
        return max(0.0, self.read_at - start)

    @property
    def eta_s(self) -> float | None:
        """The engine's projection of the time left, while the run runs (None otherwise)."""
        if self.finished is None and self.live is not None and self.state == "running":
            return self.live.eta_s
        return None

    @property
    def engine_gone(self) -> bool:
        """The database says an engine moves the run, but none beats: it crashed or its machine is lost."""
        return self.engine == "gone" and self.state in LIVE_STATES


# ---------------------------------------------------------------------------------------------- words

ENGINE_STOPPED = "engine stopped"  # the reason an engine that closes cleanly leaves on a run it did not finish
DONE = "✓ DONE"
WITH_FAILURES = "⚠ FINISHED WITH FAILURES"
STATE_LABELS = {
    "running": "● RUNNING",
    "paused": "‖ PAUSED",
    "stopping": "■ STOPPING",
    "failed": "✗ FAILED",
    "idle": "○ IDLE",
}


@dataclass(frozen=True, slots=True)
class StateWords:
    """The run's state as every face words it: `label` ("✓ DONE"), `detail` (why, or what the engine did;
    None) and `tone` (good | warn | bad | live | plain) for a face that colours it."""

    label: str
    detail: str | None
    tone: str

    @property
    def text(self) -> str:
        return self.label + (f" ({self.detail})" if self.detail else "")


def state_words(record: RunRecord) -> StateWords:
    """The run's state in words. The rule for the end: every sample ended and none failed is "✓ DONE"; every
    sample ended with any failed is "⚠ FINISHED WITH FAILURES (n/N failed)", never DONE. A live state whose
    engine exited cleanly says so ("engine exited 3 min ago"); one whose engine stopped beating is
    "✗ ENGINE GONE (last seen 12 s ago)"."""
    s = record.counts.samples
    if record.engine_gone:
        return StateWords("✗ ENGINE GONE", record.engine_text.removeprefix("ENGINE GONE").strip(" ()") or None, "bad")
    if record.state == "done":
        if s.failed:
            return StateWords(WITH_FAILURES, f"{s.failed:,}/{s.total:,} failed", "warn")
        return StateWords(DONE, None, "good")
    label = STATE_LABELS.get(record.state, record.state.upper())
    reasons = [record.state_reason] if record.state_reason else []
    if record.engine == "stopped" and record.state in LIVE_STATES:
        # "engine exited 3 min ago": nothing moves the run now (the reason a clean close records says less)
        reasons = [r for r in reasons if r != ENGINE_STOPPED] + [record.engine_text]
    tone = {"running": "live", "paused": "warn", "failed": "bad"}.get(record.state, "plain")
    return StateWords(label, "; ".join(reasons) or None, tone)


# ---------------------------------------------------------------------------------------------- building


def finished_figures(counts: RunCounts, latency: RunLatency) -> FinishedFigures:
    """The figures of a run no engine moves, over its span (counts.first_at .. counts.last_at)."""
    span = 0.0
    if counts.first_at is not None and counts.last_at is not None:
        span = max(0.0, counts.last_at - counts.first_at)
    per_s = 1.0 / span if span > 0 else 0.0
    return FinishedFigures(
        elapsed_s=span,
        req_s=counts.answered * per_s,
        tok_s=counts.completion_tokens * per_s,
        cost_per_hour=counts.cost_usd * 3600.0 * per_s,
        percentiles=latency.overall,
        endpoints=tuple((e.name, e.completed * per_s, latency.of(e.name)) for e in counts.endpoints),
    )


__all__ = [
    "IN_PROCESS",
    "LIVE_STATES",
    "Rate",
    "EndpointLive",
    "LiveFigures",
    "FinishedFigures",
    "RunRecord",
    "StateWords",
    "state_words",
    "finished_figures",
]
