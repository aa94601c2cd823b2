"""JobsTable: extraction jobs with state and progress, updated by key (no rebuild per tick)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual.coordinate import Coordinate
from textual.widgets import DataTable


@dataclass(frozen=True, slots=True)
class JobRow:
    """One extraction job as a face shows it."""

    job_id: int
    name: str
    state: str
    executor: str = "local"
    shards_done: int = 0
    shards_total: int = 0
    tokens: int = 0
    updated: str = ""
    log_path: str | None = None

    @property
    def progress(self) -> str:
        if not self.shards_total:
            return "-"
        return f"{self.shards_done}/{self.shards_total} ({100 * self.shards_done / self.shards_total:.0f}%)"


STATE_GLYPHS = {
    "running": "▶ running",
    "paused": "‖ paused",
    "done": "✓ done",
    "failed": "✗ failed",
    "cancelled": "■ cancelled",
    "pending": "… pending",
    "queued": "… queued",
}

COLUMNS = (("id", 4), ("job", 16), ("state", 12), ("executor", 8), ("shards", 14), ("tokens", 10))


class JobsTable(DataTable):
    """A row-cursor table of JobRow, keyed by job id; `show(rows)` applies a diff update."""

    DEFAULT_CSS = """
    JobsTable { height: auto; max-height: 12; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._rows: dict[int, JobRow] = {}

    def on_mount(self) -> None:
        for label, width in COLUMNS:
            self.add_column(label, width=width, key=label)

    @property
    def jobs(self) -> dict[int, JobRow]:
        return dict(self._rows)

    def highlighted_job(self) -> JobRow | None:
        """The job under the cursor, or None when the table is empty."""
        if not self._rows or self.cursor_row < 0 or self.cursor_row >= self.row_count:
            return None
        key = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key.value
        return self._rows.get(int(key)) if key is not None else None

    def show(self, rows: Sequence[JobRow]) -> None:
        """Apply rows by job id: add new, update changed cells, remove vanished."""
        incoming = {row.job_id: row for row in rows}
        with self.app.batch_update():
            for job_id in list(self._rows):
                if job_id not in incoming:
                    self.remove_row(str(job_id))
                    del self._rows[job_id]
            for job_id, row in incoming.items():
                cells = _cells(row)
                old = self._rows.get(job_id)
                if old is None:
                    self.add_row(*cells, key=str(job_id))
                elif old != row:
                    for (label, _), value in zip(COLUMNS, cells):
                        self.update_cell(str(job_id), label, value)
                self._rows[job_id] = row


def _cells(row: JobRow) -> tuple[str, ...]:
    return (
        str(row.job_id),
        row.name,
        STATE_GLYPHS.get(row.state, row.state),
        row.executor,
        row.progress,
        f"{row.tokens:,}",
    )
