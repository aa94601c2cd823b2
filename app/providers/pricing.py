"""Cost of one completion: the provider's own figure when it reported one, else from list prices.

`pricing` is anything with `prompt_per_m`, `completion_per_m` and `cached_prompt_per_m` (USD per
million tokens): the config's `Pricing`, or `ModelPricing` below (built from `/v1/models`).
Reasoning tokens are part of `completion_tokens` (OpenRouter bills them as output), so they are not
added again. Cached prompt tokens are part of `prompt_tokens` and are billed at the cached rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from app.records import Usage


class PricingLike(Protocol):
    prompt_per_m: float
    completion_per_m: float
    cached_prompt_per_m: float | None


@dataclass(frozen=True, slots=True)
class ModelPricing:
    """List prices in USD per million tokens."""

    prompt_per_m: float = 0.0
    completion_per_m: float = 0.0
    cached_prompt_per_m: float | None = None


def cost_of(usage: Usage, pricing: PricingLike | None) -> float:
    """USD for `usage`: `usage.cost_usd` when the API reported it, else computed from `pricing` (0 if none)."""
    if usage.cost_usd is not None:
        return float(usage.cost_usd)
    if pricing is None:
        return 0.0
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
        return float(value) * 1_000_000

    return ModelPricing(
        prompt_per_m=per_m("prompt") or 0.0,
        completion_per_m=per_m("completion") or 0.0,
        cached_prompt_per_m=per_m("input_cache_read"),
    )
