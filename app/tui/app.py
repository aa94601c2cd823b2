"""The monitor's Textual App and its faces: in-process (`run_tui`) and attached (`run_attached`).

The App renders whatever a `DataSource` returns and turns keys into its control calls; it never
imports the engine's internals or the store's writer.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

from textual import on
from textual.app import SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from app.engine.control import RunControl
from app.engine.record.snapshot import RunRecord
from app.tui.monitor import MonitorApp
from app.tui.screens.confirm import ConfirmScreen, NumberScreen
from app.tui.screens.conversations import ConversationScreen, ConversationsScreen
from app.tui.screens.dashboard import DashboardScreen, engine_gone
from app.tui.screens.diff import DiffScreen
from app.tui.screens.help import HelpScreen
from app.tui.screens.jobs import JobsScreen
from app.tui.screens.mismatches import MismatchesScreen
from app.tui.screens.mix import MixScreen
from app.tui.screens.sample import SampleScreen
from app.tui.source import DataSource
from app.tui.steer import pause_now_question, steer

KEYMAP_ENV = "EAGLEWATCH_KEYMAP"  # e.g. "run.pause=space;app.help=f1"
THEMES = ("textual-dark", "textual-light", "ansi-dark", "ansi-light")


def parse_keymap(text: str | None) -> dict[str, str]:
    """`id=keys;id=keys` -> {binding id: keys}; raises ValueError naming the bad entry."""
    keymap: dict[str, str] = {}
    for entry in (text or "").split(";"):
        entry = entry.strip()
        if not entry:
            continue
        binding_id, sep, keys = entry.partition("=")
        if not sep or not binding_id.strip() or not keys.strip():
            raise ValueError(f"{KEYMAP_ENV}: {entry!r} is not of the form binding_id=keys (e.g. run.pause=space)")
        keymap[binding_id.strip()] = keys.strip()
    return keymap


class EaglewatchApp(MonitorApp):
    """The operator's monitor over one run."""

    CSS_PATH = "app.tcss"
    TITLE = "eaglewatch"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("p", "toggle_pause", "Pause", id="run.pause"),
        Binding("P", "pause_now", "Pause now", show=False, id="run.pause_now"),
        Binding("c", "set_concurrency", "Set concurrency limit", show=False, id="run.concurrency"),
        Binding("R", "retry_failed", "Retry failed samples", show=False, id="run.retry_failed"),
        Binding("q", "quit_monitor", "Quit", id="app.quit"),
        Binding("ctrl+q", "quit_monitor", "Quit", show=False, id="app.quit_ctrl", priority=True),
    ]

    def __init__(
        self, source: DataSource, *, theme: str = "textual-dark", keymap: dict[str, str] | None = None
    ) -> None:
        super().__init__()
        self.source = source
        self._run_record: RunRecord | None = None
        self._theme_name = theme
        self._keymap = keymap or {}

    # --- lifecycle -------------------------------------------------------------------------
    def on_mount(self) -> None:
        self.theme = self._theme_name
        if self._keymap:
            self.set_keymap(self._keymap)
        self.title = self.source.title
        self.push_screen(DashboardScreen(id="dashboard"))

    async def on_unmount(self) -> None:
        aclose = getattr(self.source, "aclose", None)
        if aclose is not None:
            await aclose()
        self.source.close()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A failed data worker becomes a toast; the monitor keeps running."""
        if event.state == WorkerState.ERROR:
            self.notify(
                f"{event.worker.name}: {event.worker.error}", title="internal error", severity="error", timeout=10
            )

    @property
    def last_record(self) -> RunRecord | None:
        """The run's latest polled record (None before the first poll): what the run keys check."""
        return self._run_record

    @on(DashboardScreen.Polled)
    def _record_polled(self, message: DashboardScreen.Polled) -> None:
        """The dashboard's polls bubble here: keep the record, and re-check the run keys on a state change."""
        previous, self._run_record = self._run_record, message.result.record
        if previous is None or _key_state(previous) != _key_state(self._run_record):
            self.refresh_bindings()  # `p`, `P`, `c` and `C` show only while they apply

    # --- navigation ------------------------------------------------------------------------
    def action_show_mismatches(self) -> None:
        self.push_screen(MismatchesScreen(id="mismatches"))

    def action_show_jobs(self) -> None:
        self.push_screen(JobsScreen(id="jobs"))

    def action_show_conversations(self) -> None:
        """The run's whole conversations (offered only while the run has any)."""
        if self.check_action("show_conversations", ()) and not isinstance(self.screen, ConversationsScreen):
            self.push_screen(ConversationsScreen(id="conversations"))

    def action_show_mix(self) -> None:
        """The run's mix per dataset and category."""
        if not isinstance(self.screen, MixScreen):
            self.push_screen(MixScreen(id="mix"))

    def open_conversation(self, conversation_id: str) -> None:
        """Drill down from a conversation to its turns."""
        self.push_screen(ConversationScreen(conversation_id))

    def open_diff(self, sample_id: str) -> None:
        """Drill down from a mismatch to its token diff."""
        self.push_screen(DiffScreen(sample_id))

    def open_sample(self, sample_id: str) -> None:
        """Show everything stored about one sample."""
        self.push_screen(SampleScreen(sample_id))

    def action_help(self) -> None:
        screen = self.screen
        if isinstance(screen, HelpScreen):
            return
        shown: list[tuple[str, str]] = []
        seen: set[str] = set()
        # Only eaglewatch's own bindings (they carry ids); the key shown is the live one, so remaps show.
        for active in screen.active_bindings.values():
            binding = active.binding
            if not binding.id or binding.id in seen or not binding.description:
                continue
            seen.add(binding.id)
            shown.append((self.get_key_display(binding), f"{binding.description}  ({binding.id})"))
        glossary = getattr(screen, "glossary", None)
        words = glossary() if callable(glossary) else ()
        self.push_screen(HelpScreen(shown, type(screen).__name__.removesuffix("Screen").lower(), words))

    # --- run control -----------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "show_conversations":
            snap = self.last_record
            return snap is not None and snap.counts.conversations is not None
        if action == "retry_failed":
            snap = self.last_record
            return (
                self.source.can_control
                and not isinstance(self.screen, JobsScreen)
                and snap is not None
                and not engine_gone(snap)
                and snap.failed > 0
            )
        if action in ("pause_now", "toggle_pause", "set_concurrency"):
            snap = self.last_record
            if not self.source.can_control or isinstance(self.screen, JobsScreen) or snap is None:
                return False
            if engine_gone(snap):
                return False  # no engine polls the commands table: a key would queue what nothing acts on
            if action == "pause_now":
                return snap.state == "running"
            return snap.state in ("running", "paused")
        return True

    def _control(self) -> RunControl:
        """The run's control, for the keys that steer it (check_action hides them without one)."""
        control = self.source.control
        assert control is not None  # can_control is False for a read-only viewer
        return control

    async def action_toggle_pause(self) -> None:
        snap = self.last_record
        if snap is None or not self.source.can_control:
            return
        if snap.state == "paused":
            await steer(self, "resume", self._control().resume, "leasing goes on")
        else:
            await steer(self, "pause", self._control().pause, "nothing new is leased; requests in flight finish")

    def action_pause_now(self) -> None:
        snap = self.last_record
        if snap is None or not self.source.can_control or snap.state != "running":
            return

        async def answered(yes: bool | None) -> None:
            if yes:
                await steer(
                    self,
                    "pause now",
                    lambda: self._control().pause(now=True),
                    "requests on the wire are cancelled (providers may still bill them)",
                    severity="warning",
                )

        if not isinstance(self.screen, ConfirmScreen):
            self.push_screen(ConfirmScreen(pause_now_question(snap)), answered)

    def action_set_concurrency(self) -> None:
        """Ask for a new in-flight limit and send it through the run's control."""
        if not self.check_action("set_concurrency", ()) or isinstance(self.screen, NumberScreen):
            return
        snap = self.last_record
        current = snap.live.concurrency_limit if snap is not None and snap.live is not None else 0

        async def answered(limit: int | None) -> None:
            if limit is not None:
                await steer(
                    self,
                    f"concurrency limit {limit}",
                    lambda: self._control().set_concurrency(limit),
                    "clamped to the configured min/max",
                )

        question = "New concurrency limit (requests in flight across all endpoints)"
        if current:
            question += f"; now {current}"
        self.push_screen(NumberScreen(question, initial=current or None), answered)

    def action_retry_failed(self) -> None:
        """Ask, then put the run's failed samples back to pending through the run's control."""
        if not self.check_action("retry_failed", ()) or isinstance(self.screen, ConfirmScreen):
            return
        snap = self.last_record
        assert snap is not None  # check_action asked for one

        async def answered(yes: bool | None) -> None:
            if yes:
                await steer(
                    self,
                    "retry failed samples",
                    self._control().retry_failed,
                    "they are pending again, each with a fresh allowance of attempts",
                )

        self.push_screen(
            ConfirmScreen(
                f"Put the {snap.failed} failed samples back to pending, each with a fresh "
                "allowance of attempts? The provider bills the new requests."
            ),
            answered,
        )

    async def action_quit_monitor(self) -> None:
        if not self.source.live:
            self.exit()
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.exit()

        if not isinstance(self.screen, ConfirmScreen):
            self.push_screen(ConfirmScreen("The run is live in this process. Stop it and quit?"), answered)

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """Save an SVG of the screen: into ~/Downloads when it exists (Textual's default), else the working
        directory (a server account often has no Downloads folder, and saving there failed)."""
        if path is None:
            downloads = Path.home() / "Downloads"
            path = str(downloads if downloads.is_dir() else Path.cwd())
        self.deliver_screenshot(filename, path)

    # --- palette ---------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Mismatches", "Every non-exact sample, filterable", self.action_show_mismatches)
        yield SystemCommand("Jobs", "Extraction jobs: pause, resume, cancel, log", self.action_show_jobs)
        yield SystemCommand(
            "Dataset mix",
            "Per dataset and category: shares of prompts, answers, loss tokens; reasoning, tool calls, scripts (x)",
            self.action_show_mix,
        )
        if self.check_action("show_conversations", ()):
            yield SystemCommand(
                "Conversations",
                "Whole conversations: turn k of T, status, each turn's verdict (C)",
                self.action_show_conversations,
            )
        # the same rule as the keys (check_action): nothing that would do nothing, e.g. pause on a DONE run
        if self.check_action("toggle_pause", ()):
            yield SystemCommand("Pause or resume the run", "Same as p", self.action_toggle_pause)
        if self.check_action("pause_now", ()):
            yield SystemCommand(
                "Pause now", "Cancel requests in flight too (P); providers may still bill them", self.action_pause_now
            )
        if self.check_action("set_concurrency", ()):
            yield SystemCommand(
                "Set concurrency limit", "Requests in flight across all endpoints (c)", self.action_set_concurrency
            )
        if self.check_action("retry_failed", ()):
            yield SystemCommand(
                "Retry failed samples",
                "Back to pending with a fresh allowance of attempts (R)",
                self.action_retry_failed,
            )
        for name in THEMES:
            yield SystemCommand(
                f"Theme: {name}", "ansi-* use your terminal's own palette", partial(setattr, self, "theme", name)
            )


def _key_state(record: RunRecord) -> tuple[object, ...]:
    """What the run keys depend on: the run's state, its engine, whether it has conversations."""
    return record.state, record.engine, record.counts.conversations is not None


def keymap_from_env() -> dict[str, str]:
    """The operator's key remaps from EAGLEWATCH_KEYMAP (binding ids are listed in `?`)."""
    return parse_keymap(os.environ.get(KEYMAP_ENV))


def make_app(source: DataSource, *, theme: str = "textual-dark") -> EaglewatchApp:
    """Build the monitor over a data source (the CLI and the tests use this)."""
    return EaglewatchApp(source, theme=theme, keymap=keymap_from_env())


async def host_run(*, config: Any, run: Any, mouse: bool = True, theme: str = "textual-dark") -> None:
    """Show the monitor over an engine `Run` already started on this event loop, until the operator quits.

    The engine's tasks keep running underneath (same loop); the caller closes the run afterwards.
    """
    from app.tui.db_source import InProcessSource

    source = InProcessSource(run=run, config=config)
    await make_app(source, theme=theme).run_async(mouse=mouse)


def run_tui(
    *, config: Any, run: str | None = None, mouse: bool = True, theme: str = "textual-dark", retry_failed: bool = False
) -> int:
    """`eaglewatch run CONFIG` with the monitor: ingest, start the engine, host the TUI, close the engine on quit.

    `run` may name the run (it must match `config.run.name`, which the caller has already applied);
    `retry_failed` puts the run's failed samples back to pending first. Returns 0 once the operator quits.
    """
    import asyncio

    if run is not None and not isinstance(run, str):
        raise TypeError("run_tui takes the run's name; use host_run() with a started engine Run")
    return asyncio.run(_run_in_process(config, mouse=mouse, theme=theme, retry_failed=retry_failed))


async def _run_in_process(config: Any, *, mouse: bool, theme: str, retry_failed: bool = False) -> int:
    from app.errors import EaglewatchError

    try:
        from app.engine.session import open_run
    except ImportError as exc:
        raise EaglewatchError(
            f"the generation engine is not available in this build ({exc.name} is missing); "
            "watch an existing run with 'eaglewatch watch DB' instead"
        ) from None
    async with open_run(config) as opened:
        if retry_failed:
            await opened.run.retry_failed()
        await host_run(config=config, run=opened.run, mouse=mouse, theme=theme)
    return 0
