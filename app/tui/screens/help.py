"""`?`: every key of the current screen and of the app, from the live bindings (so remaps show), and the words
the screen abbreviates with their meaning (the dashboard's glossary)."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

GENERAL = (
    ("enter", "drill down (mismatch → token diff)"),
    ("esc", "go back"),
    ("/", "filter (mismatches)"),
    ("ctrl+p", "command palette: screens, pause/resume, themes"),
    ("n / N", "next / previous difference (token diff)"),
    ("remap", "EAGLEWATCH_KEYMAP='run.pause=space;nav.jobs=J' (ids in brackets above)"),
)


class HelpScreen(ModalScreen[None]):
    """Lists the bindings active on the screen below, then the general conventions."""

    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "Close", id="help.close")]

    def __init__(
        self, bindings: list[tuple[str, str]], screen_name: str, words: tuple[tuple[str, str], ...] = (), **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.bindings_shown = bindings
        self.screen_name = screen_name
        self.words = words

    def compose(self) -> ComposeResult:
        table = Table(title=f"keys · {self.screen_name}", show_header=False, box=None, padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for key, description in self.bindings_shown:
            table.add_row(key, description)
        table.add_row("", "")
        for key, description in GENERAL:
            table.add_row(key, description)
        if self.words:
            table.add_row("", "")
            table.add_row("words", f"what the {self.screen_name} abbreviates")
            for word, meaning in self.words:
                table.add_row(word, meaning)
        table.add_row("", "")
        table.add_row("esc / ?", "close this help")
        with VerticalScroll(id="help-box"):
            yield Static(table)
