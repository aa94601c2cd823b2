"""Budget guard: never start a request that could carry spending past `budget_usd`.

Every request in flight reserves its worst-case cost (prompt estimate at the prompt price plus
`max_tokens` at the completion price); a result replaces its reservation with its real cost. A new request
may start only while spent + reserved + its own worst case stays within the budget. Without a price for
the model there is no worst case to reserve, so the engine refuses a budget then (`Run.start`). What a
request costs beyond its reservation (prices below the provider's bill, billed retries) is summed in
`overshoot_usd` so the operator is told the budget was passed, not "reached". Pure arithmetic: no I/O.

What a response is charged (`charge`): the larger of its reported cost and the list price of its tokens, so
money never goes backwards; a reported cost that is NaN, infinite, negative or past
`limits.max_response_cost_usd` is not used (the boundary said why: `Usage.cost_problem`) and the tokens' list
price is charged instead, or nothing when no price is known (the tokens are still counted). `CostNotes` turns
those problems into operator events without flooding the log. Every figure here is finite and non-negative.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from app.providers.pricing import PricingLike, list_price
from app.records import Usage


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per million tokens; `cached_prompt_per_m` for prompt tokens a provider's cache served (None: the
    prompt price). The worst case is priced without the cache."""

    prompt_per_m: float
    completion_per_m: float
    cached_prompt_per_m: float | None = None


@dataclass(frozen=True, slots=True)
class Charge:
    """What one attempt is charged (`usd`, finite, >= 0) and why: the usable reported cost, the list price
    (None: no price known), and the problem with the reported cost when it was not used."""

    usd: float
    reported: float | None
    priced: float | None
    problem: str | None = None


def charge(usage: Usage | None, pricing: PricingLike | None, reported_usd: float | None = None) -> Charge:
    """The charge for an attempt with `usage` (None: no sound usage came back) at `pricing`: max(reported, priced).
    `reported_usd` overrides the usage's reported cost (a failed attempt's `ProviderError.cost_usd`)."""
    priced = list_price(usage, pricing) if usage is not None else None
    problem = usage.cost_problem if usage is not None else None
    reported = reported_usd if reported_usd is not None else (usage.cost_usd if usage is not None else None)
    if reported is not None and (not math.isfinite(reported) or reported < 0):
        problem, reported = problem or f"the reported cost is {reported!r}", None
    usd = max(reported or 0.0, priced or 0.0)
    return Charge(usd, reported, priced, problem)


class CostNotes:
    """Operator sentences for reported costs that were not believed: the first few in full, then one line per
    hundred more (a provider that reports -1 on every answer must not bury the log)."""

    FULL = 3

    def __init__(self) -> None:
        self.count = 0

    def note(self, c: Charge, sample_id: str, endpoint: str) -> str | None:
        """The event text for charge `c` (which has a problem), or None when this one is only counted."""
        self.count += 1
        if self.count <= self.FULL:
            what = (
                f"charged its tokens' list price ${c.usd:.6f}"
                if c.priced is not None
                else "charged $0 for it: no list price is known for the model ([pricing]); its tokens are counted"
            )
            return f"{endpoint}: sample {sample_id!r}: {c.problem}, so the reported cost is not used; {what}" + (
                " (further such costs are summed, one line per 100)" if self.count == self.FULL else ""
            )
        if self.count % 100 == 0:
            return (
                f"{endpoint}: {self.count} responses so far reported a cost that was not used (charged at list price)"
            )
        return None


def estimate_prompt_tokens(messages: list[dict], tools: list | None = None) -> int:
    """A deliberately high prompt-token estimate (2 characters per token) for worst-case costing."""
    n = len(json.dumps(messages, ensure_ascii=False))
    if tools:
        n += len(json.dumps(tools, ensure_ascii=False))
    return n // 2 + 16


class BudgetGuard:
    """Tracks spent and reserved dollars against an optional budget."""

    def __init__(
        self, budget_usd: float | None, prices: Prices | None, max_tokens: int, spent_usd: float = 0.0
    ) -> None:
        self.budget_usd = budget_usd
        self.prices = prices
        self.max_tokens = max_tokens
        self.spent_usd = spent_usd
        self.reserved_usd = 0.0
        self.overshoot_usd = 0.0  # spent beyond the reservations (the engine adds to it)

    def worst_case(self, prompt_tokens: int) -> float:
        """The most one request with this prompt could cost (0 without prices: no budget is allowed then)."""
        if self.prices is not None:
            return (prompt_tokens * self.prices.prompt_per_m + self.max_tokens * self.prices.completion_per_m) / 1e6
        return 0.0

    def allows(self, worst_case_usd: float) -> bool:
        """True when a request with this worst case may start without any risk of crossing the budget."""
        if self.budget_usd is None:
            return True
        return self.spent_usd + self.reserved_usd + worst_case_usd <= self.budget_usd + 1e-12

    def reserve(self, worst_case_usd: float) -> None:
        """Hold a starting request's worst case until `settle`."""
        self.reserved_usd += worst_case_usd

    def settle(self, reserved_usd: float, cost_usd: float) -> None:
        """Replace a reservation with what the request really cost (0 for a request that failed unbilled).
        A cost that is not finite or is negative is a bug of the caller (`charge` never gives one): ValueError."""
        if not math.isfinite(cost_usd) or cost_usd < 0:
            raise ValueError(f"a charge must be a finite, non-negative amount, got {cost_usd!r}")
        self.reserved_usd = max(0.0, self.reserved_usd - reserved_usd)
        self.spent_usd += cost_usd


def usd(amount: float | None) -> str:
    """Dollars as every face prints them: cents from a dollar up, four decimals under it, "-" when unknown, and a
    word, never `nan` or `inf`, for a figure that is not a finite number (a database written before costs were
    checked)."""
    if amount is None:
        return "-"
    if not math.isfinite(amount):
        return "$(not a number)"
    return f"${amount:,.2f}" if abs(amount) >= 1 else f"${amount:.4f}"


def finite_or_none(amount: float | None) -> float | None:
    """`amount` when it is a finite number, else None (what JSON output carries instead of NaN or inf)."""
    return amount if amount is not None and math.isfinite(amount) else None


def cost_per_hour(spent_usd: float, elapsed_s: float) -> float:
    """Average spending rate since the run started in this process."""
    return spent_usd * 3600.0 / elapsed_s if elapsed_s > 0 else 0.0


def projected_total(spent_usd: float, done: int, remaining: int) -> float | None:
    """Spent so far plus the average cost per done sample times the samples still to go (None before any)."""
    if done <= 0:
        return None
    return spent_usd + spent_usd / done * remaining
