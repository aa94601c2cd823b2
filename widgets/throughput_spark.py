"""ThroughputSpark: a labelled sparkline of recent output tokens/s buckets."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline


class ThroughputSpark(Vertical):
    """Shows a one-line caption and a sparkline of `history` (oldest first)."""

    DEFAULT_CSS = """
    ThroughputSpark { height: auto; }
    ThroughputSpark > Label { width: 1fr; color: $text-muted; }
    ThroughputSpark > Sparkline { height: 2; }
    ThroughputSpark > Sparkline > .sparkline--max-color { color: $success; }
    ThroughputSpark > Sparkline > .sparkline--min-color { color: $primary 60%; }
    """

    def __init__(self, caption: str = "tok/s, recent 10 s buckets", **kwargs) -> None:
        super().__init__(**kwargs)
        self._caption = caption
        self._history: tuple[float, ...] = ()

    def compose(self) -> ComposeResult:
        yield Label(self._caption)
        yield Sparkline([0.0])

    def show(self, history: Sequence[float], caption: str | None = None) -> None:
        """Replace the data (a no-op when unchanged)."""
        history = tuple(round(v, 1) for v in history)
        if caption is not None and caption != self._caption:
            self._caption = caption
            self.query_one(Label).update(caption)
        if history == self._history:
            return
        self._history = history
        self.query_one(Sparkline).data = list(history) or [0.0]
