"""What a run has spent, may spend and has counted: the budget, the prices, the sample counts and the tallies.

The `Ledger` is read by the snapshot and moved by settling (`app.engine.settle.Settler`), the scheduler (leases,
reservations) and control (released leases). `load` takes the stored truth at start (counts per state, the cost
ledger, verdicts and strategies), so a resumed run counts on from what it had; `quote_prices` settles the prices
the budget guard and each result's cost use: the config's, else an endpoint's GET /models.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

from app.config import RunConfig
from app.engine.capacity.endpoints import Endpoint
from app.engine.money.budget import BudgetGuard, Prices
from app.engine.record.metrics import EndpointMetrics
from app.engine.work.counts import SampleCounts
from app.errors import InputError
from app.providers.pricing import ModelPricing, prices_at_start, resolve_pricing
from app.store.run_store import RunStore

# (level, kind, message) -> an operator event
OnEvent = Callable[[str, str, str], Awaitable[None]]


@runtime_checkable
class PriceSource(Protocol):
    """A client that can read its endpoint's list prices (`app.providers.client.ChatClient`; a client a test or
    benchmark passes may not)."""

    async def fetch_pricing(self, model: str) -> ModelPricing | None: ...


class Ledger:
    """The run's money and tallies as this engine knows them between reads of the store."""

    def __init__(self, *, config: RunConfig, started_m: float) -> None:
        # a variant (":floor", ":nitro", ...) takes its base model's price unless priced itself
        self.pricing: ModelPricing | None = resolve_pricing(config.model.name, config.pricing)[0]
        p = self.pricing
        self.budget = BudgetGuard(
            config.limits.budget_usd,
            Prices(p.prompt_per_m, p.completion_per_m, p.cached_prompt_per_m) if p else None,
            config.generation.max_tokens,
        )
        self.counts = SampleCounts()
        self.total_metrics = EndpointMetrics("all", started_m)  # every endpoint together
        self.verdicts: Counter[str] = Counter()
        self.strategies: Counter[str] = Counter()
        self.spent_at_start = 0.0  # what earlier engines of the run spent ($/h counts from here)

    async def load(self, store: RunStore, run_id: int) -> None:
        """Take the store's counts, cost ledger, verdicts and strategies (a resumed run counts on from them)."""
        self.counts.reset(await store.counts(run_id))
        self.spent_at_start = self.budget.spent_usd = await store.spent_usd(run_id)
        verdicts, strategies = await store.outcome_counts(run_id)
        self.verdicts, self.strategies = Counter(verdicts), Counter(strategies)

    async def quote_prices(self, config: RunConfig, endpoints: Sequence[Endpoint], on_event: OnEvent) -> None:
        """Prices for the budget guard and the cost of each result: the config's, else those of the first
        endpoint whose GET /models lists the model. A budget with no price anywhere is refused with an
        InputError (the guard could not know what a request may cost)."""
        quoting = {e.name: e.client for e in endpoints if isinstance(e.client, PriceSource)}
        quote = await prices_at_start(config.model.name, config.pricing, quoting)
        if quote.pricing is not None and self.pricing is None:
            self.pricing = quote.pricing
            self.budget.prices = Prices(
                quote.pricing.prompt_per_m, quote.pricing.completion_per_m, quote.pricing.cached_prompt_per_m
            )
        if quote.source != "config":
            await on_event("info" if quote.pricing is not None else "warning", "budget", quote.describe())
        if config.limits.budget_usd is not None and self.budget.prices is None:
            raise InputError(
                f"limits.budget_usd is {config.limits.budget_usd:g} but no price is known for {config.model.name!r} "
                "(no [pricing] entry for it or its base model, and no endpoint's GET /models lists it): the budget "
                "guard cannot know what a request may cost before it is billed; add "
                f'[pricing."{config.model.name}"] prompt_per_m and completion_per_m (the worst case you accept), '
                "or drop the budget"
            )

    def stop_message(self, worst: float, model: str) -> str:
        """Why the budget stops the run before a request whose worst case is `worst`: reached, or passed by
        responses that cost more than their reservations (then: correct the prices)."""
        budget, spent = self.budget.budget_usd or 0.0, self.budget.spent_usd
        if spent > budget + 1e-12:
            return (
                f"budget ${budget:.4f} passed: spent ${spent:.4f}, ${self.budget.overshoot_usd:.4f} beyond what "
                f"was reserved (responses cost more than [pricing] predicts for {model!r}, or failed requests "
                "were billed); correct the prices, raise limits.budget_usd and resume"
            )
        return (
            f"budget ${budget:.4f} reached: spent ${spent:.4f}, the next request could cost up to ${worst:.4f}; "
            "raise limits.budget_usd and resume to continue"
        )
