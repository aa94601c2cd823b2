"""Token diff of one sample: a header in words, then reference vs reconstructed tokens aligned."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.records import VERDICT_LABELS, Category
from app.tui.fetch import Fetched, FetchFailed, fetch_in_thread
from app.tui.source import SampleDiff
from widgets.token_diff import TokenDiffView

if TYPE_CHECKING:
    from textual import getters

    from app.tui.monitor import MonitorApp


class DiffScreen(Screen):
    """Loads the alignment in a thread worker (it may take a tokenizer and 32k tokens), then shows it."""

    if TYPE_CHECKING:  # self.app: textual's typing hook (nothing at run time)
        app = getters.app(MonitorApp)

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
        self._position = (-1, 0)

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
        fetch_in_thread(
            self,
            lambda: source.sample_diff(sample_id),
            self.DiffLoaded,
            self.DiffFailed,
            group="diff-align",
            exclusive=True,
        )

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
        header.append(
            f" · {VERDICT_LABELS.get(diff.category, diff.category)}",
            style="bold green" if diff.category == Category.EXACT else "bold yellow",
        )
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
        self._position = (index, total)
        alignment = self.diff.alignment
        where = f"difference {index + 1}/{total}" if total and index >= 0 else f"{total} differences"
        ref, rec = f"{alignment.ref_len:,}", f"{alignment.rec_len:,}"
        line = self.query_one("#diff-position", Static)
        room = line.content_region.width or self.size.width - 2
        # one line, every key whole: the token counts lose their word "tokens" first, then the keys their verbs
        candidates = (
            f"{where} · ref {ref} tokens · rec {rec} tokens · n/N next/prev · i ids · u layout",
            f"{where} · ref {ref} · rec {rec} tokens · n/N next/prev · i ids · u layout",
            f"{where} · ref {ref} · rec {rec} · n/N next/prev · i ids · u layout",
            f"{where} · ref {ref} · rec {rec} · n/N · i ids · u layout",
        )
        line.update(next((c for c in candidates if cell_len(c) <= room), candidates[-1]))

    def on_resize(self) -> None:
        if self.diff is not None:
            self.call_after_refresh(lambda: self._show_position(*self._position))

    def action_open_sample(self) -> None:
        self.app.open_sample(self.sample_id)
