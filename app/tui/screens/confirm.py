"""Modals: a yes/no question for actions that stop or cancel something, and a whole-number prompt."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True on `y`/enter, False on `n`/esc."""

    # The box is as wide as its content (app.tcss): a question without a width of its own is one long line the
    # box cuts. Give it one that wraps inside the terminal (64 cells at 80 columns, less on narrower ones).
    DEFAULT_CSS = """
    ConfirmScreen #confirm-question { width: 64; }
    """

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

    def on_resize(self, event: events.Resize) -> None:
        self.query_one("#confirm-question", Label).styles.width = max(min(64, event.size.width - 10), 10)

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class NumberScreen(ModalScreen[int | None]):
    """Asks for a whole number >= `minimum`; dismisses with it on enter, with None on esc."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="number.cancel")]

    def __init__(self, question: str, *, initial: int | None = None, minimum: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.question = question
        self.initial = initial
        self.minimum = minimum

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Label(self.question, id="number-question", markup=False)
            yield Input(value="" if self.initial is None else str(self.initial), type="integer", id="number-input")
            yield Label(
                f"enter: set (a whole number >= {self.minimum})     esc: cancel", id="number-hint", markup=False
            )

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            value = int(event.value.strip())
        except ValueError:
            value = None
        if value is None or value < self.minimum:
            self.query_one("#number-hint", Label).update(
                f"{event.value.strip() or 'nothing'} is not a whole number >= {self.minimum}"
            )
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)
