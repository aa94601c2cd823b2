"""Token diff of one sample: a header in words, then reference vs reconstructed tokens aligned."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.tui.source import SampleDiff
from widgets.token_diff import TokenDiffView


class DiffScreen(Screen):
    """Loads the alignment in a thread worker (it may take a tokenizer and 32k tokens), then shows it."""

    BINDINGS = [
        Binding("s", "open_sample", "Sample", id="diff.sample"),
        Binding("escape", "app.pop_screen", "Back", id="diff.back"),
    ]

    def __init__(self, sample_id: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sample_id = sample_id
        self.diff: SampleDiff | None = None

    def compose(self) -> ComposeResult:
        yield Static(f"sample {self.sample_id} · loading…", id="diff-header")
        yield Static("", id="diff-position")
        yield TokenDiffView(id="token-diff")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        view = self.query_one(TokenDiffView)
        view.loading = True
        view.focus()
        self._load(self.sample_id)

    @work(thread=True, exclusive=True, group="diff-align", exit_on_error=False)
    def _load(self, sample_id: str) -> None:
        try:
            diff = self.app.source.sample_diff(sample_id)
        except Exception as exc:
            self.app.call_from_thread(self._failed, exc)
            return
        self.app.call_from_thread(self.show_diff, diff)

    def _failed(self, exc: Exception) -> None:
        view = self.query_one(TokenDiffView)
        view.loading = False
        self.query_one("#diff-header", Static).update(
            Text(f"sample {self.sample_id}: cannot show a token diff: {exc}", style="bold red")
        )

    def show_diff(self, diff: SampleDiff) -> None:
        """Show a loaded diff (UI thread)."""
        self.diff = diff
        header = Text()
        header.append(f"sample {diff.sample_id}", style="bold")
        header.append(f" · {diff.verdict}", style="bold yellow" if diff.verdict != "exact" else "bold green")
        if diff.strategy:
            header.append(f" · strategy {diff.strategy}")
        header.append(f"\n{diff.headline}")
        self.query_one("#diff-header", Static).update(header)
        view = self.query_one(TokenDiffView)
        view.loading = False
        view.set_alignment(diff.alignment)
        self._show_position(-1, view.diff_count)

    @on(TokenDiffView.DiffChanged)
    def diff_changed(self, event: TokenDiffView.DiffChanged) -> None:
        self._show_position(event.index, event.total)

    def _show_position(self, index: int, total: int) -> None:
        if self.diff is None:
            return
        alignment = self.diff.alignment
        where = f"difference {index + 1}/{total}" if total and index >= 0 else f"{total} differences"
        self.query_one("#diff-position", Static).update(
            f"{where} · ref {alignment.ref_len:,} tokens · rec {alignment.rec_len:,} tokens · n/N next/prev · i ids · u layout"
        )

    def action_open_sample(self) -> None:
        self.app.open_sample(self.sample_id)
