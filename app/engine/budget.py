"""Budget guard: never start a request that could carry spending past `budget_usd`.

Every request in flight reserves its worst-case cost (prompt estimate at the prompt price plus
`max_tokens` at the completion price); a result replaces its reservation with its real cost. A new request
may start only while spent + reserved + its own worst case stays within the budget. Without a price for
the model there is no worst case to reserve, so the engine refuses a budget then (`Run.start`). What a
request costs beyond its reservation (prices below the provider's bill, billed retries) is summed in
`overshoot_usd` so the operator is told the budget was passed, not "reached". Pure arithmetic: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per million tokens; `cached_prompt_per_m` for prompt tokens a provider's cache served (None: the
    prompt price). The worst case is priced without the cache."""

    prompt_per_m: float
    completion_per_m: float
    cached_prompt_per_m: float | None = None


def estimate_prompt_tokens(messages: list[dict], tools: list | None = None) -> int:
    """A deliberately high prompt-token estimate (2 characters per token) for worst-case costing."""
    n = len(json.dumps(messages, ensure_ascii=False))
    if tools:
        n += len(json.dumps(tools, ensure_ascii=False))
    return n // 2 + 16


class BudgetGuard:
    """Tracks spent and reserved dollars against an optional budget."""

    def __init__(self, budget_usd: float | None, prices: Prices | None, max_tokens: int, spent_usd: float = 0.0) -> None:
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
        """Replace a reservation with what the request really cost (0 for a request that failed unbilled)."""
        self.reserved_usd = max(0.0, self.reserved_usd - reserved_usd)
        self.spent_usd += cost_usd


def cost_per_hour(spent_usd: float, elapsed_s: float) -> float:
    """Average spending rate since the run started in this process."""
    return spent_usd * 3600.0 / elapsed_s if elapsed_s > 0 else 0.0


def projected_total(spent_usd: float, done: int, remaining: int) -> float | None:
    """Spent so far plus the average cost per done sample times the samples still to go (None before any)."""
    if done <= 0:
        return None
    return spent_usd + spent_usd / done * remaining
