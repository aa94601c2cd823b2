"""MetricTile: a titled box of a few labelled values (throughput, latency, cost, verdicts...)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class MetricTile(Static):
    """A bordered tile showing `lines` (plain strings or rich Text); repaints only on change."""

    DEFAULT_CSS = """
    MetricTile {
        border: round $primary 50%;
        border-title-color: $text-accent;
        padding: 0 1;
        height: auto;
        min-height: 3;
        width: 1fr;
        text-wrap: nowrap;  /* a line never wraps: the tiles pick lines that fit their width */
        text-overflow: ellipsis;
    }
    """

    def __init__(self, title: str, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.border_title = title
        self._shown: tuple | None = None

    def show(self, *lines: str | Text) -> None:
        """Replace the tile's lines; a no-op when nothing changed (so 2 Hz ticks cost nothing)."""
        key = tuple(line.plain if isinstance(line, Text) else line for line in lines)
        if key == self._shown:
            return
        # Same number of lines: same size, so skip the layout pass (the dashboard ticks at 2 Hz).
        same_height = self._shown is not None and len(self._shown) == len(key)
        self._shown = key
        text = Text(no_wrap=True, overflow="ellipsis")  # a tile's line never wraps (its lines fit by design)
        for n, line in enumerate(lines):
            if n:
                text.append("\n")
            text.append(line if isinstance(line, Text) else Text(line))
        self.update(text, layout=not same_height)
