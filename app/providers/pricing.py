"""Cost of one completion: the larger of the provider's own figure and the list price of its tokens.

`pricing` is anything with `prompt_per_m`, `completion_per_m` and `cached_prompt_per_m` (USD per
million tokens): the config's `Pricing`, or `ModelPricing` below (built from `/v1/models`).
Reasoning tokens are part of `completion_tokens` (OpenRouter bills them as output), so they are not
added again. Cached prompt tokens are part of `prompt_tokens` and are billed at the cached rate. The larger of
the two is charged so money never goes backwards: a provider that reports less than its tokens' list price (a
negative cost, zero) cannot lower the ledger below what the tokens cost; a reported cost the body boundary
refused (`Usage.cost_problem`: NaN, infinite, negative, absurd) is not used at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.records import Usage


class PricingLike(Protocol):
    # read-only members, so frozen dataclasses (ModelPricing, the config's prices) satisfy it
    @property
    def prompt_per_m(self) -> float: ...
    @property
    def completion_per_m(self) -> float: ...
    @property
    def cached_prompt_per_m(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class ModelPricing:
    """List prices in USD per million tokens."""

    prompt_per_m: float = 0.0
    completion_per_m: float = 0.0
    cached_prompt_per_m: float | None = None


def cost_of(usage: Usage, pricing: PricingLike | None) -> float:
    """USD charged for `usage`: the larger of the reported cost (when usable) and the list price of its tokens
    (0 without prices). Always finite and non-negative."""
    priced = list_price(usage, pricing) or 0.0
    reported = usage.cost_usd
    if reported is None or not math.isfinite(reported) or reported < 0:
        return priced
    return max(float(reported), priced)


def list_price(usage: Usage, pricing: PricingLike | None) -> float | None:
    """USD of `usage`'s tokens at `pricing`, or None without prices."""
    if pricing is None:
        return None
    cached = min(max(usage.cached_tokens, 0), max(usage.prompt_tokens, 0))
    uncached = max(usage.prompt_tokens, 0) - cached
    cached_rate = pricing.cached_prompt_per_m
    if cached_rate is None:
        cached_rate = pricing.prompt_per_m
    total = (
        uncached * pricing.prompt_per_m
        + cached * cached_rate
        + max(usage.completion_tokens, 0) * pricing.completion_per_m
    )
    return total / 1_000_000


def pricing_from_models_entry(entry: dict[str, Any]) -> ModelPricing:
    """Read one `/v1/models` `data[]` item's `pricing` (decimal strings, USD per token) into $/M."""
    raw = entry.get("pricing") or {}

    def per_m(key: str) -> float | None:
        value = raw.get(key)
        if value in (None, ""):
            return None
        try:
            price = float(value) * 1_000_000
        except (TypeError, ValueError):
            return None
        return price if math.isfinite(price) and price >= 0 else None  # a hostile listing cannot set NaN prices

    return ModelPricing(
        prompt_per_m=per_m("prompt") or 0.0,
        completion_per_m=per_m("completion") or 0.0,
        cached_prompt_per_m=per_m("input_cache_read"),
    )


def base_model(model: str) -> str:
    """`vendor/model:variant` -> `vendor/model` (OpenRouter variants such as :floor, :nitro, :free, :thinking,
    :online, :exacto, :extended); a name without a variant suffix is returned unchanged."""
    head, sep, tail = model.rpartition(":")
    if not sep or not head or "/" in tail or not tail:
        return model
    return head


def resolve_pricing(model: str, table: Mapping[str, Any]) -> tuple[Any, str | None]:
    """(prices, the key they came from) for `model` in a `[pricing."<model>"]` table: the exact name first,
    else the base model's (a variant shares its base's price unless priced itself); (None, None) if neither."""
    if model in table:
        return table[model], model
    base = base_model(model)
    if base != model and base in table:
        return table[base], base
    return None, None


@dataclass(frozen=True, slots=True)
class PriceQuote:
    """The list prices a run uses for its model and where they came from.

    source: 'config' ([pricing."<key>"]), 'models' (an endpoint's GET /models), or 'none' (no price anywhere:
    costs count only what the API reports, and the budget guard has no estimate before the first result).
    """

    model: str
    pricing: Any
    source: str
    key: str | None = None  # the config key or the endpoint name the prices came from

    def describe(self) -> str:
        """One line for `config check` and the run's start-up event."""
        if self.pricing is None:
            return (
                f"{self.model}: no price in the config or from any endpoint's /models; cost counts only what "
                "the API reports and the budget guard has no estimate before the first result"
            )
        p = self.pricing
        where = f'[pricing."{self.key}"]' if self.source == "config" else f"GET /models of {self.key}"
        cached = p.cached_prompt_per_m if p.cached_prompt_per_m is not None else p.prompt_per_m
        return (
            f"{self.model}: ${p.prompt_per_m:g}/M prompt, ${p.completion_per_m:g}/M completion, "
            f"${cached:g}/M cached prompt (from {where})"
        )


async def prices_at_start(model: str, table: Mapping[str, Any], clients: Mapping[str, Any]) -> PriceQuote:
    """The run's prices: the config's (variant rules of `resolve_pricing`), else the first endpoint whose
    `GET /models` lists the model or its base (`ChatClient.fetch_pricing`), else a 'none' quote.

    `clients`: endpoint name -> ChatClient. Never raises for an endpoint without /models.
    """
    pricing, key = resolve_pricing(model, table)
    if pricing is not None:
        return PriceQuote(model, pricing, "config", key)
    for name, client in clients.items():
        fetched = await client.fetch_pricing(model)
        if fetched is not None and (fetched.prompt_per_m or fetched.completion_per_m):
            return PriceQuote(model, fetched, "models", name)
    return PriceQuote(model, None, "none")
