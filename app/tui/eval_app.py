"""The eval monitor: the Textual App over an eval run (`eaglewatch eval CONFIG`, and `watch`/`serve` on an eval
run's database). In-process it hosts an `EvalRun` on its own event loop; attached it steers one in another process
through the `commands` table, like the generation monitor (`app.tui.steer.steer`: sent, then acknowledged or not).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from textual.binding import Binding

from app.tui.eval_source import EvalSource, in_process_eval_source
from app.tui.monitor import MonitorApp
from app.tui.screens.confirm import ConfirmScreen
from app.tui.screens.eval_dashboard import EvalDashboardScreen
from app.tui.screens.help import HelpScreen
from app.tui.steer import steer

PAUSE_EFFECT = "no new request starts; requests in flight finish"


class EvalApp(MonitorApp):
    """The operator's monitor over one eval run."""

    CSS_PATH = "app.tcss"
    TITLE = "eaglewatch eval"
    BINDINGS = [
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("p", "toggle_pause", "Pause", id="run.pause"),
        Binding("q", "quit_monitor", "Quit", id="app.quit"),
        Binding("ctrl+q", "quit_monitor", "Quit", show=False, id="app.quit_ctrl", priority=True),
    ]

    def __init__(self, source: EvalSource, *, theme: str = "textual-dark") -> None:
        super().__init__()
        self.source = source  # type: ignore[assignment]  # the eval screens read it as an EvalSource
        self._theme_name = theme

    def on_mount(self) -> None:
        self.theme = self._theme_name
        self.title = self.source.title
        self.dashboard = EvalDashboardScreen(id="eval-dashboard")
        self.push_screen(self.dashboard)

    async def on_unmount(self) -> None:
        await self.eval_source.aclose()
        self.eval_source.close()

    @property
    def eval_source(self) -> EvalSource:
        source = self.source
        assert isinstance(source, EvalSource)
        return source

    @property
    def last_record(self) -> None:
        return None  # an eval run has no generation record: the dashboard keeps its own poll

    def _state(self) -> str | None:
        """The run's state as last polled (None before the first poll, or while its engine is gone)."""
        dashboard = getattr(self, "dashboard", None)
        last = getattr(dashboard, "last", None)
        if last is None:
            return None
        return None if last.status.engine_gone else last.status.state

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "toggle_pause":
            return self.eval_source.can_control and self._state() in ("running", "paused")
        return True

    async def action_toggle_pause(self) -> None:
        control = self.eval_source.control
        state = self._state()
        if control is None or state not in ("running", "paused"):
            return
        if state == "paused":
            await steer(self, "resume", control.resume, "requests start again")
        else:
            await steer(self, "pause", control.pause, PAUSE_EFFECT)

    def action_help(self) -> None:
        screen = self.screen
        if isinstance(screen, HelpScreen):
            return
        shown: list[tuple[str, str]] = []
        seen: set[str] = set()
        for active in screen.active_bindings.values():
            binding = active.binding
            if not binding.id or binding.id in seen or not binding.description:
                continue
            seen.add(binding.id)
            shown.append((self.get_key_display(binding), f"{binding.description}  ({binding.id})"))
        glossary = getattr(screen, "glossary", None)
        words = glossary() if callable(glossary) else ()
        self.push_screen(HelpScreen(shown, type(screen).__name__.removesuffix("Screen").lower(), words))

    async def action_quit_monitor(self) -> None:
        if not self.source.live:
            self.exit()
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.exit()

        if not isinstance(self.screen, ConfirmScreen):
            self.push_screen(
                ConfirmScreen("The eval runs in this process. Stop it and quit? (run it again to resume)"), answered
            )


def make_eval_app(source: EvalSource, *, theme: str = "textual-dark") -> EvalApp:
    """The eval monitor over a source (the CLI and the tests use this)."""
    return EvalApp(source, theme=theme)


async def host_eval(
    engine: Any, *, database: Path, run_name: str, mouse: bool = True, theme: str = "textual-dark"
) -> int:
    """Run `engine` (an `app.eval.run.EvalRun`) on this loop with the monitor over it until the operator quits;
    quitting while it runs cancels it (the run stays resumable). Returns the engine's run id (0 if it never
    started) and re-raises what the engine raised."""
    task = asyncio.create_task(engine.run())
    while not engine.run_id and not task.done():
        await asyncio.sleep(0.02)
    if task.done():
        return int(task.result())
    source = in_process_eval_source(database, run_name, engine)
    await make_eval_app(source, theme=theme).run_async(mouse=mouse)
    if not task.done():
        task.cancel()
    try:
        return int(await task)
    except asyncio.CancelledError:
        return int(engine.run_id)
