"""Token diff of one sample: a header in words, then reference vs reconstructed tokens aligned."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.records import Category
from app.tui.fetch import FetchFailed, Fetched, fetch_in_thread
from app.tui.source import SampleDiff
from widgets.token_diff import TokenDiffView


class DiffScreen(Screen):
    """Loads the alignment in a thread worker (it may take a tokenizer and 32k tokens), then shows it."""

    class DiffLoaded(Fetched):
        """The SampleDiff (`result`) arrived."""

    class DiffFailed(FetchFailed):
        """The diff could not be built."""

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

    def _load(self, sample_id: str) -> None:
        source = self.app.source
        fetch_in_thread(self, lambda: source.sample_diff(sample_id), self.DiffLoaded, self.DiffFailed,
                        group="diff-align", exclusive=True)

    @on(DiffLoaded)
    def _diff_loaded(self, message: DiffLoaded) -> None:
        self.show_diff(message.result)

    @on(DiffFailed)
    def _diff_failed(self, message: DiffFailed) -> None:
        view = self.query_one(TokenDiffView)
        view.loading = False
        self.query_one("#diff-header", Static).update(
            Text(f"sample {self.sample_id}: cannot show a token diff: {message.error}", style="bold red")
        )

    def show_diff(self, diff: SampleDiff) -> None:
        """Show a loaded diff (UI thread)."""
        self.diff = diff
        header = Text()
        header.append(f"sample {diff.sample_id}", style="bold")
        header.append(f" · {diff.category}", style="bold green" if diff.category == Category.EXACT else "bold yellow")
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
