"""Group samples into batches by length so padding stays small (pure, no torch)."""

from __future__ import annotations

from collections.abc import Sequence


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Sample positions grouped into batches, longest first, each padded size (rows x longest) within
    `batch_tokens`; a sample longer than the budget gets a batch of its own. Every position appears once."""
    if batch_tokens < 1:
        raise ValueError("batch_tokens must be >= 1")
    order = sorted(range(len(lengths)), key=lambda k: (-lengths[k], k))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for k in order:
        # longest first: the batch's first sample fixes its padded width
        if current and (len(current) + 1) * longest > batch_tokens:
            batches.append(current)
            current = []
        if not current:
            longest = lengths[k]
        current.append(k)
    if current:
        batches.append(current)
    return batches
