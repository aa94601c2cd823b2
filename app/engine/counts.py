"""The engine's live sample counts per state, moved only by named transitions beside the store calls.

The store is the truth (`RunStore.counts`); these counts mirror it between reads so the snapshot costs no
I/O. Each transition is called right after the store call that makes the same change has committed.
"""

from __future__ import annotations

from collections import Counter

from app.store.schema import SAMPLE_STATES


class SampleCounts:
    """Samples per state (app.store.schema.SAMPLE_STATES) as this engine last knew them."""

    def __init__(self, stored: dict[str, int] | None = None) -> None:
        self._c: Counter[str] = Counter(dict.fromkeys(SAMPLE_STATES, 0))
        if stored:
            self.reset(stored)

    def reset(self, stored: dict[str, int]) -> None:
        """Take the store's counts as they are (after a read of the whole run)."""
        self._c = Counter({**dict.fromkeys(SAMPLE_STATES, 0), **stored})

    def leased(self, n: int) -> None:
        """n pending samples were leased (RunStore.lease)."""
        self._move("pending", "leased", n)

    def released(self, n: int = 1) -> None:
        """n leased samples went back to pending unused (RunStore.release)."""
        self._move("leased", "pending", n)

    def ended(self, state: str) -> None:
        """A leased sample ended as `state` (done or failed: RunStore.record_result / record_failure)."""
        self._move("leased", state, 1)

    def followed(self, ready: int, skipped: int) -> None:
        """A conversation turn's end made `ready` waiting turns pending and `skipped` of them skipped (the
        conversation ended there), in the transaction that stored it."""
        self._move("waiting", "pending", ready)
        self._move("waiting", "skipped", skipped)

    def _move(self, src: str, dst: str, n: int) -> None:
        if n:
            self._c[src] -= n
            self._c[dst] += n

    def __getitem__(self, state: str) -> int:
        return max(0, self._c[state])

    @property
    def total(self) -> int:
        return sum(max(0, v) for v in self._c.values())

    @property
    def remaining(self) -> int:
        """Samples still to end (pending, leased, or a conversation's turn waiting on its parent)."""
        return self["pending"] + self["leased"] + self["waiting"]
