"""Token buckets for the optional requests/min and tokens/min limits.

A bucket refills continuously at `per_min / 60` per second up to `capacity` (default: ten seconds'
worth, so a fresh run does not fire a whole minute's quota at once). Taking is allowed whenever the level
is positive and may drive it negative, so one request larger than the capacity still goes (once the debt
is repaid) and an estimate can be corrected afterwards with `adjust`. Pure: the caller passes the clock.
"""

from __future__ import annotations


class TokenBucket:
    """A refilling allowance of `per_min` units per minute."""

    def __init__(self, per_min: float, *, capacity: float | None = None, now: float = 0.0) -> None:
        if per_min <= 0:
            raise ValueError(f"a rate limit must be positive, got {per_min} per minute")
        self.rate_s = per_min / 60.0
        self.capacity = capacity if capacity is not None else max(1.0, per_min / 6.0)
        self.level = self.capacity
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self.level = min(self.capacity, self.level + (now - self._at) * self.rate_s)
            self._at = now

    def wait_s(self, now: float) -> float:
        """Seconds until a take is allowed (0.0: allowed now)."""
        self._refill(now)
        if self.level > 0:
            return 0.0
        return (1e-9 - self.level) / self.rate_s

    def try_take(self, amount: float, now: float) -> float:
        """Take `amount` if allowed now and return 0.0; else take nothing and return seconds to wait."""
        wait = self.wait_s(now)
        if wait == 0.0:
            self.level -= amount
        return wait

    def adjust(self, delta: float, now: float) -> None:
        """Correct an earlier take by `delta` units (positive: more was used than taken)."""
        self._refill(now)
        self.level = min(self.capacity, self.level - delta)
