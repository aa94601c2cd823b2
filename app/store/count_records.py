"""The counts part of a run's record: what the store's tallies say about a run, as frozen records.

`app.store.queries.run_counts(conn, run_id)` is the one function that reads them (from the maintained tallies,
so it costs the same at a million samples as at ten); every face takes its counts from it: the TUI in-process
and attached, `status`, `fidelity`, the headless progress line. This module only defines the records and folds
tally rows into them (pure). Each count has one definition, written on its field.

Units: `samples` counts samples by state; everything about answers (verdicts, verification classes, measured
fidelity, suspects, truncation, prompt checks) counts stored answers, one per sample that got one (its current
reconstruction); requests (`errors_by_class`, `retried`, an endpoint's `completed`) count attempts. A run of
whole conversations adds its conversation and turn counts as a part of its own beside `samples`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from app.records import CORRUPT_VERDICTS, VERDICTS, Category, Verification, verification_of
from app.store.rows import ConversationCounts
from app.store.schema import SAMPLE_STATES
from app.store.tallies import QualityTally


@dataclass(frozen=True, slots=True)
class SampleStates:
    """Samples of the run per state (schema SAMPLE_STATES)."""

    pending: int = 0
    waiting: int = 0  # a conversation's turns whose parent turn is not stored yet
    leased: int = 0
    done: int = 0
    failed: int = 0  # ended without usable ids, after every attempt (or at once, for a fatal error)
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.pending + self.waiting + self.leased + self.done + self.failed + self.skipped

    @property
    def ended(self) -> int:
        """Samples that will not be sent again: done, failed or skipped."""
        return self.done + self.failed + self.skipped

    @property
    def remaining(self) -> int:
        """Samples still to end: pending, leased, or a conversation's turn waiting on its parent."""
        return self.pending + self.waiting + self.leased

    def as_dict(self) -> dict[str, int]:
        return {state: getattr(self, state) for state in SAMPLE_STATES}


@dataclass(frozen=True, slots=True)
class AnswerCounts:
    """Stored answers (one per sample that got a response reconstructed into ids) by what they are.

    verdicts: every category of app.records.VERDICTS (0 when none), against the sample's reference.
    verified / checked / unchecked: the verification classes (app.records.Verification); they add up to `answers`.
    measured: verified answers whose text-only reconstruction was also compared with their true ids (the probes: the
      endpoint's text-path fidelity); by that comparison's verdict: measured_exact, measured_benign
      (bpe_equivalent), measured_truncated, measured_corrupt (per corrupt verdict).
    suspects: answers carrying a suspect flag (app.tokens.flags; the export leaves them out unless asked).
    truncated: answers that stopped at max_tokens (finish_reason `length`, or the verdict `truncated`).
    prompt_checks: answers whose server prompt ids were compared with the rendered prompt, per outcome
      (agree | differ | no_server_ids).
    """

    answers: int = 0
    verdicts: tuple[tuple[str, int], ...] = tuple((str(v), 0) for v in VERDICTS)
    verified: int = 0
    checked: int = 0
    unchecked: int = 0
    measured: int = 0
    measured_exact: int = 0
    measured_benign: int = 0
    measured_truncated: int = 0
    measured_corrupt: tuple[tuple[str, int], ...] = ()
    suspects: int = 0
    truncated: int = 0
    prompt_checks: tuple[tuple[str, int], ...] = ()

    def verdict(self, category: str) -> int:
        """Answers with verdict `category`."""
        return dict(self.verdicts).get(str(category), 0)

    @property
    def corrupt(self) -> int:
        """Answers whose verdict is corrupt (app.records.CORRUPT_VERDICTS)."""
        return sum(self.verdict(v) for v in CORRUPT_VERDICTS)

    @property
    def measured_matched(self) -> int:
        """Measured answers whose text-only reconstruction gave the same text (exact or benign): the match rate's
        numerator."""
        return self.measured_exact + self.measured_benign

    @property
    def measured_corrupt_total(self) -> int:
        return sum(n for _, n in self.measured_corrupt)

    def verification(self) -> dict[str, int]:
        """Answers per verification class, keyed by its JSON name (app.records.Verification)."""
        return {
            Verification.VERIFIED.value: self.verified,
            Verification.CHECKED.value: self.checked,
            Verification.UNCHECKED.value: self.unchecked,
        }


@dataclass(frozen=True, slots=True)
class EndpointCounts:
    """One endpoint over the whole run (every engine that ran it).

    completed: answers received from it (successful requests); failed: samples whose last request failed at it
    and that failed for good; retried: its failed requests that were tried again (failed requests that were not
    their sample's last); errors_by_class: its failed requests per error class; cost_usd: what every request to it
    cost; completion_tokens: output tokens of its answers.
    """

    name: str
    completed: int = 0
    failed: int = 0
    retried: int = 0
    errors_by_class: tuple[tuple[str, int], ...] = ()
    cost_usd: float = 0.0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ProviderCounts:
    """The answers of one endpoint and upstream provider (None: the endpoint reported none): `fidelity`'s rows."""

    endpoint: str
    provider: str | None
    answers: AnswerCounts


@dataclass(frozen=True, slots=True)
class RunCounts:
    """Everything the store's tallies say about one run (see the module docstring for the units).

    cost_usd: the cost ledger (every stored request). requests: stored requests, answered or failed.
    completion_tokens: output tokens of the answers received. errors_by_class: failed requests per error class;
    failed_by_class: failed samples per error class; retried: failed requests that were tried again (the sum of
    the endpoints'). first_at / last_at: when the run's first and latest requests were stored (unix s).
    """

    samples: SampleStates = field(default_factory=SampleStates)
    cost_usd: float = 0.0
    requests: int = 0
    completion_tokens: int = 0
    errors_by_class: tuple[tuple[str, int], ...] = ()
    failed_by_class: tuple[tuple[str, int], ...] = ()
    retried: int = 0
    answers: AnswerCounts = field(default_factory=AnswerCounts)
    strategies: tuple[tuple[str, int], ...] = ()
    endpoints: tuple[EndpointCounts, ...] = ()
    providers: tuple[ProviderCounts, ...] = ()
    first_at: float | None = None
    last_at: float | None = None
    conversations: ConversationCounts | None = None  # a run of whole conversations: each counted by how it stands
    # samples with a server intervention (app.engine.interventions), in all and per kind (a sample may have several)
    intervened: int = 0
    interventions: tuple[tuple[str, int], ...] = ()

    @property
    def answered(self) -> int:
        """Successful requests (answers received), over every endpoint."""
        return sum(e.completed for e in self.endpoints)


# a measured text-path verdict that is not corrupt -> the AnswerCounts field it counts in
_MEASURED: dict[str, str] = {
    Category.EXACT: "exact",
    Category.BPE_EQUIVALENT: "benign",
    Category.TRUNCATED: "truncated",
}


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50 / p95 of the latency (request to last byte) and of the time to first token, in ms (None: none timed)."""

    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None


@dataclass(frozen=True, slots=True)
class RunLatency:
    """Percentiles over every answer of the run (`answers` of them), overall and per endpoint, from the rows:
    what a finished run shows instead of the engine's last five minutes."""

    answers: int = 0
    overall: Percentiles = field(default_factory=Percentiles)
    endpoints: tuple[tuple[str, Percentiles], ...] = ()

    def of(self, endpoint: str) -> Percentiles:
        return dict(self.endpoints).get(endpoint, Percentiles())


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of already-sorted values by nearest rank; None when empty (the engine's live
    windows use it too, so a live p95 and a finished run's p95 mean the same)."""
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[k]


def percentiles_of(latency_ms: list[float], ttft_ms: list[float]) -> Percentiles:
    """Percentiles of unsorted latency and TTFT values."""
    latency, ttft = sorted(latency_ms), sorted(ttft_ms)
    return Percentiles(
        percentile(latency, 0.5), percentile(latency, 0.95), percentile(ttft, 0.5), percentile(ttft, 0.95)
    )


def fold_answers(rows: Iterable[QualityTally]) -> AnswerCounts:
    """AnswerCounts of quality tally rows (any subset: a run, an endpoint, an endpoint and provider)."""
    verdicts = {str(v): 0 for v in VERDICTS}
    classes = {v: 0 for v in Verification}
    measured = {"exact": 0, "benign": 0, "truncated": 0}
    corrupt: dict[str, int] = {}
    prompt: dict[str, int] = {}
    answers = suspects = truncated = n_measured = 0
    for r in rows:
        answers += r.n
        verdicts[r.category] = verdicts.get(r.category, 0) + r.n
        classes[verification_of(r.ids_source, r.category)] += r.n
        suspects += r.n if r.suspect else 0
        truncated += r.n if (r.truncated or r.category == Category.TRUNCATED) else 0
        if r.prompt_check:
            prompt[r.prompt_check] = prompt.get(r.prompt_check, 0) + r.n
        if r.text_path in CORRUPT_VERDICTS:
            corrupt[r.text_path] = corrupt.get(r.text_path, 0) + r.n
        elif r.text_path in _MEASURED:
            measured[_MEASURED[r.text_path]] += r.n
        else:  # not measured ('')
            continue
        n_measured += r.n
    return AnswerCounts(
        answers=answers,
        verdicts=tuple(verdicts.items()),
        verified=classes[Verification.VERIFIED],
        checked=classes[Verification.CHECKED],
        unchecked=classes[Verification.UNCHECKED],
        measured=n_measured,
        measured_exact=measured["exact"],
        measured_benign=measured["benign"],
        measured_truncated=measured["truncated"],
        measured_corrupt=tuple(sorted(corrupt.items())),
        suspects=suspects,
        truncated=truncated,
        prompt_checks=tuple(sorted(prompt.items())),
    )


def merge_answers(*parts: AnswerCounts) -> AnswerCounts:
    """The sum of AnswerCounts (e.g. one endpoint and provider over several runs)."""

    def pairs(name: str) -> tuple[tuple[str, int], ...]:
        out: dict[str, int] = {}
        for part in parts:
            for key, n in getattr(part, name):
                out[key] = out.get(key, 0) + n
        return tuple(sorted(out.items()))

    ints = {
        f: sum(getattr(p, f) for p in parts)
        for f in (
            "answers",
            "verified",
            "checked",
            "unchecked",
            "measured",
            "measured_exact",
            "measured_benign",
            "measured_truncated",
            "suspects",
            "truncated",
        )
    }
    verdicts = dict(pairs("verdicts"))
    return AnswerCounts(
        **ints,
        verdicts=tuple((str(v), verdicts.get(str(v), 0)) for v in VERDICTS),
        measured_corrupt=pairs("measured_corrupt"),
        prompt_checks=pairs("prompt_checks"),
    )


__all__ = [
    "SampleStates",
    "AnswerCounts",
    "EndpointCounts",
    "ProviderCounts",
    "RunCounts",
    "Percentiles",
    "RunLatency",
    "percentile",
    "percentiles_of",
    "fold_answers",
    "merge_answers",
]
