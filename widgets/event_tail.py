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
    """Renders EventLines as plain Text (model text is never parsed as markup)."""

    DEFAULT_CSS = """
    EventTail { height: auto; min-height: 1; color: $text; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self._shown: tuple[EventLine, ...] | None = None

    def show(self, events: Sequence[EventLine]) -> None:
        """Replace the lines (a no-op when unchanged)."""
        events = tuple(events)
        if events == self._shown:
            return
        same_height = self._shown is not None and len(self._shown) == len(events)
        self._shown = events
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
        self.update(text, layout=not same_height)
