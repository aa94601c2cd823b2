"""The quality gate: pause (or route around) an endpoint or upstream provider whose measured corrupt rate
crosses `limits.max_corrupt_rate`, once it has at least `limits.min_verified_samples` verified samples.

Pure: counts in, decisions out (no I/O, no asyncio). A *verified* sample is one with true ids (server ids
or logprobs with bytes) whose text-only reconstruction was compared with them (app.tokens.flags.TEXT_PATH); its
verdict is exact, benign (bpe_equivalent), truncated, or corrupt (text_mismatch / structure_mismatch): the verdict
sets of `app.records`.
The engine feeds `tally(...)` from its results and acts on `judge(...)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from app.records import CORRUPT_VERDICTS, Category

ACTIONS = ("pause", "route_around")


@dataclass(frozen=True, slots=True)
class FidelityTally:
    """Measured text-path verdicts of one endpoint and upstream provider (provider None: not reported)."""

    endpoint: str
    provider: str | None
    verified: int = 0
    exact: int = 0
    benign: int = 0  # bpe_equivalent (app.records.BENIGN_VERDICTS, exact counted apart)
    corrupt: dict[str, int] = field(default_factory=dict)  # verdict -> count
    truncated: int = 0  # cut short: neither benign nor corrupt
    example_pk: int | None = None  # the first corrupt sample seen

    @property
    def corrupt_total(self) -> int:
        """Corrupt samples of every kind."""
        return sum(self.corrupt.values())

    @property
    def corrupt_rate(self) -> float:
        """Corrupt share of the verified samples (0.0 with none)."""
        return self.corrupt_total / self.verified if self.verified else 0.0


@dataclass(frozen=True, slots=True)
class QualityDecision:
    """What to do about one endpoint/provider that crossed the limit, and the sentence for the event."""

    action: str  # one of ACTIONS
    endpoint: str
    provider: str | None
    rate: float
    corrupt: int
    verified: int
    example_pk: int | None
    message: str


def add(t: FidelityTally, category: str, pk: int) -> FidelityTally:
    """`t` with one more verified sample of text-path verdict `category` (sample `pk`)."""
    if category == Category.EXACT:
        return replace(t, verified=t.verified + 1, exact=t.exact + 1)
    if category in CORRUPT_VERDICTS:
        return replace(
            t,
            verified=t.verified + 1,
            corrupt={**t.corrupt, category: t.corrupt.get(category, 0) + 1},
            example_pk=t.example_pk if t.example_pk is not None else pk,
        )
    if category == Category.TRUNCATED:
        return replace(t, verified=t.verified + 1, truncated=t.truncated + 1)
    return replace(t, verified=t.verified + 1, benign=t.benign + 1)


def tally(rows: Iterable[tuple[str, str | None, str, int]]) -> tuple[FidelityTally, ...]:
    """Tallies from (endpoint, provider, text-path verdict, sample pk) rows, one per endpoint/provider, in order
    seen."""
    acc: dict[tuple[str, str | None], FidelityTally] = {}
    for endpoint, provider, category, pk in rows:
        key = (endpoint, provider)
        acc[key] = add(acc.get(key) or FidelityTally(endpoint, provider), category, pk)
    return tuple(acc.values())


def judge(
    tallies: Iterable[FidelityTally], max_corrupt_rate: float | None, min_verified: int, on_corrupt: str = "pause"
) -> tuple[QualityDecision, ...]:
    """One decision per endpoint/provider over the limit with enough verified samples (none when no limit).

    route_around needs an upstream provider name to ignore; without one the decision is a pause.
    """
    if max_corrupt_rate is None:
        return ()
    if on_corrupt not in ACTIONS:
        raise ValueError(f"on_corrupt {on_corrupt!r} is not one of {', '.join(ACTIONS)}")
    out: list[QualityDecision] = []
    for t in tallies:
        if t.verified < max(1, min_verified) or t.corrupt_rate <= max_corrupt_rate:
            continue
        action = on_corrupt if (on_corrupt == "pause" or t.provider) else "pause"
        who = f"endpoint {t.endpoint!r}" + (f", upstream provider {t.provider!r}" if t.provider else "")
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(t.corrupt.items()))
        example = f"; example sample pk {t.example_pk}" if t.example_pk is not None else ""
        then = (
            f"ignoring provider {t.provider!r} from now on (OpenRouter provider.ignore)"
            if action == "route_around"
            else "pausing before spending more"
        )
        out.append(
            QualityDecision(
                action,
                t.endpoint,
                t.provider,
                t.corrupt_rate,
                t.corrupt_total,
                t.verified,
                t.example_pk,
                f"{who}: measured corrupt rate {t.corrupt_rate:.1%} ({t.corrupt_total} of {t.verified} verified "
                f"samples: {kinds}) exceeds limits.max_corrupt_rate {max_corrupt_rate:.1%}{example}; {then}",
            )
        )
    return tuple(out)
