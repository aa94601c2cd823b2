"""Extraction jobs: state and progress, pause / resume / cancel (with confirmation), log tail."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from app.tui.fetch import Fetched, FetchFailed, fetch_in_thread
from app.tui.screens.confirm import ConfirmScreen
from widgets.jobs_table import JobRow, JobsTable

if TYPE_CHECKING:
    from textual import getters

    from app.tui.monitor import MonitorApp

REFRESH_S = 1.0
ACTIVE = ("pending", "submitted", "running")


class JobsScreen(Screen):
    """The jobs table on top, the highlighted job's log tail below; refreshed at 1 Hz off-thread."""

    if TYPE_CHECKING:  # self.app: textual's typing hook (nothing at run time)
        app = getters.app(MonitorApp)

    class JobsLoaded(Fetched):
        """(jobs, log tail) (`result`) arrived."""

    class JobsFailed(FetchFailed):
        """The jobs could not be read."""

    BINDINGS = [
        Binding("p", "job('pause')", "Pause job", id="jobs.pause"),
        Binding("r", "job('resume')", "Resume job", id="jobs.resume"),
        Binding("c", "job('cancel')", "Cancel job", id="jobs.cancel"),
        Binding("escape", "app.pop_screen", "Back", id="jobs.back"),
    ]

    def compose(self) -> ComposeResult:
        yield Static("jobs", id="jobs-caption")
        yield JobsTable(id="jobs-table")
        with VerticalScroll(id="job-log-box"):
            yield Static("", id="job-log")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#job-log-box").border_title = "log"
        self.query_one(JobsTable).focus()
        self._polling = False
        self._log = ""
        self._keys_for: object = object()  # nothing shown yet
        self.poll()
        self._timer = self.set_interval(REFRESH_S, self.poll)

    def on_screen_suspend(self) -> None:
        self._timer.pause()

    def on_screen_resume(self) -> None:
        self._timer.resume()

    def poll(self) -> None:
        if self._polling:
            return
        self._polling = True
        job = self.query_one(JobsTable).highlighted_job()
        self._fetch(job.job_id if job else None)

    def _fetch(self, job_id: int | None) -> None:
        source = self.app.source

        def fetch() -> tuple[tuple[JobRow, ...], str]:
            jobs = tuple(source.jobs())
            shown = job_id if job_id is not None else (jobs[0].job_id if jobs else None)
            log = source.job_log(shown, 200) if shown is not None else "no extraction jobs in this run yet"
            return jobs, log

        fetch_in_thread(self, fetch, self.JobsLoaded, self.JobsFailed, group="jobs-poll")

    @on(JobsLoaded)
    def _jobs_loaded(self, message: JobsLoaded) -> None:
        try:
            self._show(*message.result)
        except Exception as exc:  # a rendering bug must not stop the 1 Hz refresh
            self._show((), f"cannot show jobs: {exc}")

    @on(JobsFailed)
    def _jobs_failed(self, message: JobsFailed) -> None:
        self._show((), f"cannot read jobs: {message.error}")

    def _show(self, jobs: tuple[JobRow, ...], log: str) -> None:
        self._polling = False
        table = self.query_one(JobsTable)
        table.show(jobs)
        active = sum(1 for job in jobs if job.state in ACTIVE)
        self.query_one("#jobs-caption", Static).update(f"jobs · {len(jobs)} total · {active} active", layout=False)
        if log != self._log:
            self._log = log
            self.query_one("#job-log", Static).update(Text(log))
        self._refresh_keys()

    def _refresh_keys(self) -> None:
        # The footer recomposes on refresh_bindings: only when the highlighted job's state changed.
        job = self.query_one(JobsTable).highlighted_job()
        key = (job.job_id, job.state) if job else None
        if key != self._keys_for:
            self._keys_for = key
            self.refresh_bindings()

    @on(DataTable.RowHighlighted, "#jobs-table")
    def highlighted(self) -> None:
        self._refresh_keys()
        self.poll()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action != "job":
            return True
        if not self.app.source.can_control:
            return False
        job = self.query_one(JobsTable).highlighted_job()
        if job is None:
            return False
        verb = parameters[0]
        if verb == "pause":
            return job.state in ("running", "submitted")
        if verb == "resume":
            return job.state == "paused"
        return job.state in ACTIVE or job.state == "paused"

    def action_job(self, verb: str) -> None:
        job = self.query_one(JobsTable).highlighted_job()
        if job is None:
            return

        async def confirmed(yes: bool | None) -> None:
            if yes:
                await self.app.source.job_command(job.job_id, verb)
                self.notify(f"{verb} sent to job {job.job_id} ({job.name})")
                self.poll()

        self.app.push_screen(
            ConfirmScreen(f"{verb.capitalize()} job {job.job_id} ({job.name}, {job.state})?"), confirmed
        )
