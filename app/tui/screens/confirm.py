"""A yes/no modal for actions that stop or cancel something."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True on `y`/enter, False on `n`/esc."""

    BINDINGS = [
        Binding("y,enter", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]

    def __init__(self, question: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Label(self.question, id="confirm-question", markup=False)
            yield Label("y / enter: yes     n / esc: no", id="confirm-keys")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
