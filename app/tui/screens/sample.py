"""Everything stored about one sample: prompt, reasoning, content, tool calls, usage, cost, timings, raw."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.tui import format as fmt
from app.tui.fetch import Fetched, FetchFailed, fetch_in_thread
from app.tui.source import SampleDetail

if TYPE_CHECKING:
    from textual import getters

    from app.tui.monitor import MonitorApp

RAW_NOT_KEPT = "raw bodies are not kept: set [run] keep_raw = true"
RAW_NOT_STORED = "no raw body was stored for this attempt (a failed attempt, or a body over the size cap)"


def detail_text(detail: SampleDetail, raw: bool) -> Text:
    """The sample as one Text (model output is never parsed as markup)."""
    text = Text()

    def section(title: str, body: str | None, absent: str = "(none)") -> None:
        text.append(f"── {title} ", style="bold")
        text.append("─" * max(0, 40 - len(title)) + "\n", style="dim")
        text.append((body if body else absent) + "\n\n", style=None if body else "dim")

    summary = (
        f"dataset {detail.dataset} · state {detail.state} · verdict {detail.category or '-'}"
        f" · strategy {detail.strategy or '-'} · endpoint {detail.endpoint or '-'}\n"
        f"finish {detail.finish_reason or '-'} · cost {fmt.money(detail.cost_usd)}"
        f" · latency {fmt.ms(detail.latency_ms)} · ttft {fmt.ms(detail.ttft_ms)}"
    )
    section(f"sample {detail.sample_id}", summary)
    if detail.interventions:  # tokens the model did not sample, or a prompt it did not see: left out of exports
        section(
            "server interventions",
            "\n".join(f"{kind}: {text}" for kind, text in detail.interventions)
            + "\n(left out of exports unless --keep-intervened)",
        )
    if detail.error:
        section("last error", detail.error)
    prompt = "\n".join(
        f"[{m.get('role', '?')}] "
        f"{m.get('content') if isinstance(m.get('content'), str) else json.dumps(m.get('content'), ensure_ascii=False)}"
        for m in detail.prompt
    )
    section("prompt", prompt)
    section("reasoning", detail.reasoning)
    section("content", detail.content)
    calls = "\n".join(
        f"{c.get('name', '?')}({c.get('arguments', '')})  id={c.get('id', '')}" for c in detail.tool_calls
    )
    section("tool calls", calls)
    section("usage", ", ".join(f"{k} {v}" for k, v in detail.usage.items()) if detail.usage else None)
    if raw:
        # honest about an absent body: say why, not "(none)" (responses.raw is kept only with [run] keep_raw)
        section("raw response", detail.raw, RAW_NOT_STORED if detail.keep_raw else RAW_NOT_KEPT)
    else:
        text.append("r shows the raw response", style="dim")
    return text


class SampleScreen(Screen):
    """A scrollable text page; `r` toggles the raw response."""

    if TYPE_CHECKING:  # self.app: textual's typing hook (nothing at run time)
        app = getters.app(MonitorApp)

    class DetailLoaded(Fetched):
        """The SampleDetail (`result`) arrived."""

    class DetailFailed(FetchFailed):
        """The sample could not be read."""

    BINDINGS = [
        Binding("r", "toggle_raw", "Raw", id="sample.raw"),
        Binding("escape", "app.pop_screen", "Back", id="sample.back"),
    ]

    def __init__(self, sample_id: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sample_id = sample_id
        self.detail: SampleDetail | None = None
        self.raw = False

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="sample-body"):
            yield Static(f"sample {self.sample_id} · loading…", id="sample-text")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#sample-body").focus()
        self._load(self.sample_id)

    def _load(self, sample_id: str) -> None:
        source = self.app.source
        fetch_in_thread(
            self,
            lambda: source.sample_detail(sample_id),
            self.DetailLoaded,
            self.DetailFailed,
            group="sample-detail",
            exclusive=True,
        )

    @on(DetailLoaded)
    def _detail_loaded(self, message: DetailLoaded) -> None:
        self.show_detail(message.result)

    @on(DetailFailed)
    def _detail_failed(self, message: DetailFailed) -> None:
        self.query_one("#sample-text", Static).update(
            Text(f"sample {self.sample_id}: cannot read it: {message.error}", style="bold red")
        )

    def show_detail(self, detail: SampleDetail) -> None:
        """Show a loaded sample (UI thread)."""
        self.detail = detail
        self.query_one("#sample-text", Static).update(detail_text(detail, self.raw))

    def action_toggle_raw(self) -> None:
        self.raw = not self.raw
        if self.detail is not None:
            self.show_detail(self.detail)
