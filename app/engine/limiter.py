"""Adaptive in-flight limit per endpoint: AIMD with ceiling stabilisation and cascade dampening.

The rule follows NeMo Data Designer's throttle: after a window of consecutive successes while the limit was
the bottleneck (as many as the limit itself, at most `success_window`), the limit grows by one; an overload signal (429, 503, 529) multiplies it by
`reduce_factor` and starts a cooldown (Retry-After, else `default_cooldown_s`) during which nothing new
starts. Only the first overload of a burst cuts (the burst ends at the next success), and growth after a
cut stops `ceiling_overshoot` above the limit at which the first overload happened, so the limit settles
instead of oscillating. Pure and synchronous: the caller passes the clock reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LimitChange:
    """A change of the limit worth an operator event ("concurrency reduced from 20 to 15 ...")."""

    old: int
    new: int
    cooldown_s: float
    reason: str


class AdaptiveLimit:
    """In-flight limit for one endpoint; `take`/`release` count slots, `on_*` adapt the limit."""

    def __init__(
        self,
        initial: int,
        minimum: int,
        maximum: int,
        *,
        success_window: int = 25,
        reduce_factor: float = 0.75,
        ceiling_overshoot: float = 0.10,
        default_cooldown_s: float = 2.0,
        max_cooldown_s: float = 60.0,
    ) -> None:
        if minimum < 1 or maximum < minimum:
            raise ValueError(f"concurrency bounds must satisfy 1 <= min <= max, got min={minimum} max={maximum}")
        self.minimum = minimum
        self.maximum = maximum
        self.limit = min(max(initial, minimum), maximum)
        self.in_flight = 0
        self.success_window = success_window
        self.reduce_factor = reduce_factor
        self.ceiling_overshoot = ceiling_overshoot
        self.default_cooldown_s = default_cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.cooldown_until = 0.0
        self.ceiling: int | None = None  # limit when the first overload happened
        self._streak = 0
        self._in_burst = False
        self.cuts = 0
        self.operator_cap: int | None = None  # set_limit pins the limit: growth never passes it

    def can_start(self, now: float) -> bool:
        """True when a request may start now (a free slot and no cooldown)."""
        return self.in_flight < self.limit and now >= self.cooldown_until

    def take(self) -> None:
        """Count one request as started (call only after `can_start`)."""
        self.in_flight += 1

    def release(self) -> None:
        """Count one request as ended (success, failure or cancellation)."""
        self.in_flight = max(0, self.in_flight - 1)

    def on_success(self, saturated: bool = True) -> LimitChange | None:
        """Record a success; grow by one after `success_window` successes while the limit was the bottleneck."""
        self._in_burst = False
        if not saturated:
            return None
        self._streak += 1
        # Congestion-avoidance growth: one step per window of successes as long as the limit itself (capped at
        # success_window), so a limit cut to 1 by a burst recovers in a few requests, not success_window of them.
        if self._streak < max(1, min(self.success_window, self.limit)):
            return None
        self._streak = 0
        cap = self.maximum if self.operator_cap is None else self.operator_cap
        if self.ceiling is not None:
            cap = min(cap, max(self.ceiling, math.floor(self.ceiling * (1 + self.ceiling_overshoot))))
        if self.limit >= cap:
            return None
        old = self.limit
        self.limit += 1
        return LimitChange(old, self.limit, 0.0, "sustained success")

    def on_overload(self, now: float, retry_after_s: float | None = None) -> LimitChange | None:
        """Record a 429/503/529: the first of a burst cuts the limit and starts a cooldown; later ones do nothing."""
        self._streak = 0
        cooldown = self.default_cooldown_s if retry_after_s is None else max(0.0, retry_after_s)
        cooldown = min(cooldown, self.max_cooldown_s)
        # every signal is honoured for starting requests (the server asked for the wait), but the
        # cooldown never blocks growth, so a long Retry-After cannot freeze the limit itself
        self.cooldown_until = max(self.cooldown_until, now + cooldown)
        if self._in_burst:
            return None
        self._in_burst = True
        self.cuts += 1
        if self.ceiling is None:
            self.ceiling = self.limit
        old = self.limit
        self.limit = max(self.minimum, math.floor(self.limit * self.reduce_factor))
        return LimitChange(old, self.limit, cooldown, "overloaded")

    def set_limit(self, limit: int) -> int:
        """Operator override, clamped to min/max: the new limit is also the most that growth reaches (overloads
        still cut below it). Resets the remembered ceiling. Returns the new limit."""
        self.limit = min(max(int(limit), self.minimum), self.maximum)
        self.operator_cap = self.limit
        self.ceiling = None
        self._streak = 0
        return self.limit
