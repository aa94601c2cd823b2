"""What the monitor's screens ask of their App: `MonitorApp`, the base of `app.tui.app.EaglewatchApp`.

A screen types `self.app` as this (textual's `getters.app`, for the type checker only) rather than as the App
itself, whose module imports every screen: the screens depend on this small surface, not on the App.
"""

from __future__ import annotations

from textual.app import App

from app.engine.record.snapshot import RunRecord
from app.tui.source import DataSource


class MonitorApp(App):
    """The App a screen runs in: the run's data source, its last polled record, and the drill-downs."""

    source: DataSource

    @property
    def last_record(self) -> RunRecord | None:
        """The run's record as last polled (None before the first poll)."""
        raise NotImplementedError

    def open_conversation(self, conversation_id: str) -> None:
        """Drill down from a conversation to its turns."""
        raise NotImplementedError

    def open_diff(self, sample_id: str) -> None:
        """Drill down from a mismatch to its token diff."""
        raise NotImplementedError

    def open_sample(self, sample_id: str) -> None:
        """Show everything stored about one sample."""
        raise NotImplementedError
