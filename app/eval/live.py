"""The eval monitor's read model: running aggregates over an eval run's stored requests, grown row by row.

`EvalTally.add` takes the light rows read after a cursor (`app.store.eval_reads.tally_rows_after`), so a poll costs
what was stored since the last one, never the whole run. `EvalTally.figures` gives what the dashboard shows, with
the same definitions as the report (`app.eval.figures`): the request-weighted mean acceptance length (loops left out,
requests without figures counted apart), the token-weighted one, per-position acceptance, by category, tokens/s
and the speedup over the baseline, the mean acceptance length per 10 s bucket, and the verdicts of
`app.eval.figures.verdicts` over the running figures. What needs every row at once (bootstrap intervals) is the
stored report's (`app.eval.report.stored_report`), read on a throttle off the poll path.

A failed request later answered (a resumed run replaces it) stops counting as failed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.config import EvalSection
from app.eval.figures import verdicts
from app.store.eval_reads import EvalTallyRow

BUCKET_S = 10  # one point of the acceptance plot (the generation plots' bucket)


@dataclass
class _Sums:
    """Acceptance sums of a set of requests (one endpoint, or one endpoint's category)."""

    measured: int = 0  # requests with figures and at least one step
    length_sum: float = 0.0  # Σ (1 + accepted / steps) over them
    accepted: int = 0
    steps: int = 0
    per_position: list[int] = field(default_factory=list)

    def add(self, row: EvalTallyRow) -> None:
        if not row.steps or row.accepted is None:
            return
        self.measured += 1
        self.length_sum += 1.0 + row.accepted / row.steps
        self.accepted += row.accepted
        self.steps += row.steps
        for k, n in enumerate(row.per_position or ()):
            if k == len(self.per_position):
                self.per_position.append(0)
            self.per_position[k] += n

    @property
    def mean(self) -> float | None:
        return round(self.length_sum / self.measured, 4) if self.measured else None

    @property
    def token_weighted(self) -> float | None:
        return round(1.0 + self.accepted / self.steps, 4) if self.steps else None

    def positions(self) -> tuple[float, ...]:
        return tuple(round(c / self.steps, 4) if self.steps else 0.0 for c in self.per_position)


@dataclass
class _Endpoint:
    answered: int = 0
    failed: int = 0
    no_acceptance: int = 0
    loops: int = 0
    kept: _Sums = field(default_factory=_Sums)  # loops left out (the figures)
    with_loops: _Sums = field(default_factory=_Sums)
    categories: dict[str, _Sums] = field(default_factory=lambda: defaultdict(_Sums))
    tps_sum: float = 0.0
    tps_n: int = 0
    ttft_sum: float = 0.0
    ttft_n: int = 0
    output_tokens: int = 0
    buckets: dict[int, list[float]] = field(default_factory=dict)  # bucket -> [Σ length, n] (loops left out)

    @property
    def tokens_per_s(self) -> float | None:
        return self.tps_sum / self.tps_n if self.tps_n else None


@dataclass(frozen=True, slots=True)
class CategoryFigures:
    category: str
    requests: int
    mean_acceptance_length: float | None
    token_weighted: float | None


@dataclass(frozen=True, slots=True)
class EndpointFigures:
    """One endpoint's running figures (a drafter endpoint, or the baseline with `baseline` set)."""

    name: str
    baseline: bool
    answered: int
    failed: int
    no_acceptance: int
    loops: int
    requests: int  # with figures, loops left out
    mean_acceptance_length: float | None
    token_weighted: float | None
    mean_with_loops: float | None
    per_position: tuple[float, ...]
    tokens_per_s: float | None
    ttft_ms: float | None
    output_tokens: int
    speedup: float | None
    categories: tuple[CategoryFigures, ...]
    series: tuple[tuple[int, float], ...]  # (bucket start, mean acceptance length) in time order


@dataclass(frozen=True, slots=True)
class EvalFigures:
    """What the eval dashboard shows of the run's stored requests."""

    stored: int
    answered: int
    failed: int
    endpoints: tuple[EndpointFigures, ...]
    verdicts: tuple[dict[str, str], ...]
    first_at: float | None
    last_at: float | None


def eval_setup(config: Mapping[str, Any]) -> tuple[EvalSection, list[str], str | None]:
    """(the [eval] section, the drafter endpoints, the baseline) of a run's stored config, as the report reads
    them (the drafter endpoints: [eval] endpoints, else every endpoint but the baseline)."""
    section = config.get("eval")
    ev = EvalSection.model_validate(section if isinstance(section, dict) else {})
    names = [ep["name"] for ep in config.get("endpoints", []) if isinstance(ep, dict) and "name" in ep]
    drafters = list(ev.endpoints) or [n for n in names if n != ev.baseline]
    return ev, drafters, ev.baseline


class EvalTally:
    """Running aggregates of one eval run (one reader thread at a time: the caller serialises `add`)."""

    def __init__(self, ev: EvalSection, drafters: Sequence[str], baseline: str | None) -> None:
        self.ev = ev
        self.drafters = list(drafters)
        self.baseline = baseline
        self.cursor = 0  # the id of the last row added
        self.stored = 0
        self._endpoints: dict[str, _Endpoint] = defaultdict(_Endpoint)
        self._failed_keys: set[tuple[int, str]] = set()
        self.first_at: float | None = None
        self.last_at: float | None = None

    def add(self, rows: Iterable[EvalTallyRow]) -> None:
        """Count rows read after `cursor` (in id order)."""
        for row in rows:
            self.cursor = max(self.cursor, row.id)
            self.stored += 1
            self.first_at = row.created_at if self.first_at is None else min(self.first_at, row.created_at)
            self.last_at = row.created_at if self.last_at is None else max(self.last_at, row.created_at)
            e = self._endpoints[row.endpoint]
            key = (row.sample_pk, row.endpoint)
            if key in self._failed_keys:  # an earlier failed try of this pair, replaced by this one
                self._failed_keys.discard(key)
                e.failed -= 1
                self.stored -= 1
            if row.failed:
                e.failed += 1
                self._failed_keys.add(key)
                continue
            e.answered += 1
            e.output_tokens += row.completion_tokens
            if row.tokens_per_s is not None:
                e.tps_sum += row.tokens_per_s
                e.tps_n += 1
            if row.ttft_ms is not None:
                e.ttft_sum += row.ttft_ms
                e.ttft_n += 1
            if not row.measured:
                e.no_acceptance += 1
            e.with_loops.add(row)
            category = e.categories[row.category or "(none)"]  # listed even when all its answers are loops
            if row.loop:
                e.loops += 1
                continue
            e.kept.add(row)
            category.add(row)
            if row.steps and row.accepted is not None:
                b = int(row.created_at // BUCKET_S) * BUCKET_S
                point = e.buckets.setdefault(b, [0.0, 0])
                point[0] += 1.0 + row.accepted / row.steps
                point[1] += 1

    def figures(self) -> EvalFigures:
        """The running figures and verdicts (cheap: sums over endpoints, categories and buckets)."""
        base = self._endpoints.get(self.baseline) if self.baseline else None
        base_tps = base.tokens_per_s if base is not None else None
        names = [*self.drafters, *([self.baseline] if self.baseline else [])]
        names += sorted(n for n in self._endpoints if n not in names)
        out: list[EndpointFigures] = []
        found: list[dict[str, str]] = []
        for name in names:
            e = self._endpoints.get(name) or _Endpoint()
            is_base = name == self.baseline
            tps = e.tokens_per_s
            out.append(
                EndpointFigures(
                    name=name,
                    baseline=is_base,
                    answered=e.answered,
                    failed=e.failed,
                    no_acceptance=e.no_acceptance,
                    loops=e.loops,
                    requests=e.kept.measured,
                    mean_acceptance_length=e.kept.mean,
                    token_weighted=e.kept.token_weighted,
                    mean_with_loops=e.with_loops.mean,
                    per_position=e.kept.positions(),
                    tokens_per_s=tps,
                    ttft_ms=e.ttft_sum / e.ttft_n if e.ttft_n else None,
                    output_tokens=e.output_tokens,
                    speedup=round(tps / base_tps, 3) if tps and base_tps and not is_base else None,
                    categories=tuple(
                        CategoryFigures(c, s.measured, s.mean, s.token_weighted)
                        for c, s in sorted(e.categories.items())
                    ),
                    series=tuple((b, v[0] / v[1]) for b, v in sorted(e.buckets.items())),
                )
            )
            if name in self.drafters:
                found += verdicts(name, _part(e), e.answered, self.ev)
        answered = sum(e.answered for e in self._endpoints.values())
        failed = sum(e.failed for e in self._endpoints.values())
        return EvalFigures(self.stored, answered, failed, tuple(out), tuple(found), self.first_at, self.last_at)


def _part(e: _Endpoint) -> dict[str, Any]:
    """An endpoint's running figures in the shape `app.eval.figures.verdicts` reads (no intervals)."""

    def fig(s: _Sums) -> dict[str, Any]:
        return {
            "requests": s.measured,
            "mean_acceptance_length": s.mean,
            "mean_acceptance_length_ci95": None,
            "token_weighted_acceptance_length": s.token_weighted,
            "accepted_tokens": s.accepted,
            "steps": s.steps,
            "per_position_acceptance": list(s.positions()),
        }

    return {"figures": fig(e.kept), "figures_with_loops": fig(e.with_loops), "loops": e.loops}


ACCEPTED, REJECTED, BONUS, OWN = "accepted", "rejected", "bonus", "own"


def step_spans(
    n_tokens: int, per_step_accepted: Sequence[int] | None, per_step_drafted: Sequence[int] | None
) -> list[tuple[int, int, str]] | None:
    """The output's tokens as (start, end, kind) spans from the server's per-step detail (vLLM `detailed`): each
    step emits its accepted drafts (`accepted`) plus one token of the target's own, which stands where a draft was
    rejected (`rejected`) or follows a step whose drafts were all accepted (`bonus`). The steps cover the output's
    end; tokens before them (the prefill's first token) are `own`. None when the server gave no per-step detail or
    it does not fit the output."""
    if not isinstance(per_step_accepted, list) or not all(isinstance(n, int) and n >= 0 for n in per_step_accepted):
        return None
    drafted = per_step_drafted if isinstance(per_step_drafted, list) else None
    covered = sum(n + 1 for n in per_step_accepted)
    if covered > n_tokens + 1 or not per_step_accepted:
        return None
    spans: list[tuple[int, int, str]] = []
    at = max(0, n_tokens - covered)
    if at:
        spans.append((0, at, OWN))
    for i, n in enumerate(per_step_accepted):
        if n:
            spans.append((at, min(at + n, n_tokens), ACCEPTED))
            at += n
        if at >= n_tokens:
            break  # the last step's own token was cut by max_tokens
        k = drafted[i] if drafted is not None and i < len(drafted) and isinstance(drafted[i], int) else None
        spans.append((at, at + 1, BONUS if k is not None and n >= k else REJECTED))
        at += 1
    return spans
