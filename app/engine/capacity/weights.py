"""Spreading requests over endpoints by weight: smooth weighted round robin (nginx's rule).

Each pick adds every eligible endpoint's weight to its running score, takes the highest, and subtracts
the eligible total from the winner: over any window the picks follow the weights closely, with no bursts
to one endpoint. Endpoints that cannot take a request now (full, cooling down) are left out of the pick.
"""

from __future__ import annotations

from collections.abc import Sequence


class WeightedRoundRobin:
    """Picks indexes 0..n-1 in proportion to `weights`, among those currently eligible."""

    def __init__(self, weights: Sequence[float]) -> None:
        if not weights or any(w <= 0 for w in weights):
            raise ValueError(f"endpoint weights must be positive, got {list(weights)}")
        self.weights = list(weights)
        self._score = [0.0] * len(weights)

    def pick(self, eligible: Sequence[bool] | None = None) -> int | None:
        """Index of the next endpoint among the eligible ones, or None when none is eligible."""
        best = None
        total = 0.0
        for i, w in enumerate(self.weights):
            if eligible is not None and not eligible[i]:
                continue
            self._score[i] += w
            total += w
            if best is None or self._score[i] > self._score[best]:
                best = i
        if best is not None:
            self._score[best] -= total
        return best
