"""EventTail: the last few lines of the operator's event log, newest last."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static


@dataclass(frozen=True, slots=True)
class EventLine:
    """One event: a preformatted time, a level (info | warning | error), a kind and a message."""

    time: str
    level: str
    kind: str
    message: str


LEVEL_STYLES = {"error": "bold red", "warning": "yellow", "warn": "yellow"}


class EventTail(Static):
    """Renders EventLines as plain Text (model text is never parsed as markup): the newest that fit its
    height, one line each (a long message ends in …), newest last."""

    DEFAULT_CSS = """
    EventTail { height: auto; min-height: 1; color: $text; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self._shown: tuple[EventLine, ...] | None = None
        self._fits: int | None = None
        self._lines_drawn = 0

    def show(self, events: Sequence[EventLine]) -> None:
        """Replace the lines (a no-op when unchanged)."""
        events = tuple(events)
        if events == self._shown and self._fits == self._room():
            return
        self._shown = events
        self._draw()

    def _room(self) -> int | None:
        """How many lines fit: the content height, or with `height: auto` the max-height's (less the border
        and padding); None when nothing bounds it (every event shows)."""
        styles = self.styles
        if styles.height is not None and styles.height.is_auto:
            cap = styles.max_height
            if cap is None or not cap.is_cells:
                return None
            return max(int(cap.value) - styles.gutter.height, 1)
        height = self.content_size.height
        return height or None

    @property
    def lines_shown(self) -> int:
        """How many events are drawn now."""
        events = self._shown or ()
        return len(events) if self._fits is None else min(len(events), self._fits)

    def on_resize(self) -> None:
        if self._shown is not None and self._fits != self._room():
            self._draw()

    def _draw(self) -> None:
        events = self._shown or ()
        self._fits = self._room()
        if self._fits is not None:
            events = events[-self._fits :]
        text = Text(no_wrap=True, overflow="ellipsis")
        if not events:
            text.append("no events yet", style="dim")
        for n, event in enumerate(events):
            if n:
                text.append("\n")
            text.append(f"{event.time} ", style="dim")
            text.append(f"{event.level.upper():<5} ", style=LEVEL_STYLES.get(event.level, "dim"))
            text.append(f"{event.kind}: ", style="bold")
            text.append(event.message.replace("\n", " "))
        # a relayout only when the line count changed (the 2 Hz ticks usually change nothing or one line's text)
        lines = max(len(events), 1)
        self.update(text, layout=lines != self._lines_drawn)
        self._lines_drawn = lines
