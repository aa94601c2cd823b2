"""`eaglewatch ingest CONFIG`: stream the config's prompt datasets (and reference ids) into a run.

Nothing is generated. Re-running adds nothing new: sample ids are unique per run. Bad lines are reported
with file:line and the reason, counted and skipped; the rest ingests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EXAMPLE = """\
eaglewatch ingest sample_data/demo.toml
eaglewatch ingest my-run.toml --db /data/runs.db --run kimi-2025-06 --json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="run config TOML")
    parser.add_argument("--db", metavar="PATH", help="run database (overrides run.database)")
    parser.add_argument("--run", metavar="NAME", help="run name (overrides run.name)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


@dataclass
class DatasetSummary:
    """What ingesting one file did."""

    name: str
    path: str
    format: str
    read: int = 0
    added: int = 0
    already_present: int = 0
    conflicts: int = 0
    conflict_examples: list[str] = field(default_factory=list)
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)


@dataclass
class IngestSummary:
    run: str
    database: str
    datasets: list[DatasetSummary] = field(default_factory=list)
    reference: dict[str, Any] | None = None

    @property
    def added(self) -> int:
        return sum(d.added for d in self.datasets)


def run(args: argparse.Namespace) -> int:
    from app.config import apply_overrides, load_config

    config = load_config(args.config)
    config = apply_overrides(config, {"run.database": args.db, "run.name": args.run})
    summary = asyncio.run(ingest_config(config, progress=sys.stderr.isatty() and not args.json))
    if args.json:
        payload = asdict(summary)
        payload["added"] = summary.added
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        sys.stdout.write(_render(summary))
    return 0


async def ingest_config(config: Any, *, progress: bool = False) -> IngestSummary:
    """Ingest every dataset of `config` (then its reference file) into the run it names; return what happened."""
    from app.datasets import ReadStats, iter_dataset, iter_references
    from app.store.run_store import RunStore

    summary = IngestSummary(run=config.run.name, database=str(config.run.database))
    store = await RunStore.open(config.run.database)
    try:
        run_id = await store.ensure_run(config.run.name, config.redacted())
        for ds in config.data.datasets:
            stats = ReadStats()
            async with _Progress(progress, f"{ds.name}", Path(ds.path), stats):
                report = await store.ingest(run_id, iter_dataset(ds, stats))
            summary.datasets.append(
                DatasetSummary(
                    name=ds.name,
                    path=str(ds.path),
                    format=ds.format,
                    read=stats.good,
                    added=report.added,
                    already_present=report.already_present,
                    conflicts=report.conflicts,
                    conflict_examples=list(report.conflict_examples),
                    bad_lines=stats.bad,
                    bad_examples=list(stats.examples),
                )
            )
        if config.data.reference is not None:
            stats = ReadStats()
            ref = Path(config.data.reference)
            async with _Progress(progress, "reference", ref, stats):
                attached, unmatched = await store.attach_references(run_id, iter_references(ref, stats=stats))
            summary.reference = {
                "path": str(ref),
                "read": stats.good,
                "attached": attached,
                "unmatched": unmatched,
                "bad_lines": stats.bad,
                "bad_examples": list(stats.examples),
            }
        await store.add_event(
            run_id, "info", "ingest", f"ingested {summary.added} new samples from {len(summary.datasets)} dataset(s)"
        )
    finally:
        await store.close()
    return summary


class _Progress:
    """A rich progress bar on stderr following a reader's byte count (only on a terminal)."""

    def __init__(self, enabled: bool, label: str, path: Path, stats: Any) -> None:
        self.enabled = enabled
        self.label = label
        self.path = path
        self.stats = stats
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Progress:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        try:
            total = self.path.stat().st_size
        except OSError:
            total = None
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[rows]} rows"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._progress.start()
        tid = self._progress.add_task(self.label, total=total, rows=0)

        async def follow() -> None:
            while True:
                self._progress.update(tid, completed=self.stats.bytes_read, rows=self.stats.good)
                await asyncio.sleep(0.2)

        self._task = asyncio.create_task(follow())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            self._progress.stop()


def _render(s: IngestSummary) -> str:
    out = [f"run {s.run!r} in {s.database}"]
    for d in s.datasets:
        line = f"  {d.name} ({d.format}): {d.added} added, {d.already_present} already present"
        if d.conflicts:
            line += f", {d.conflicts} ids held by another dataset (skipped)"
        line += f", {d.bad_lines} bad line{'s' if d.bad_lines != 1 else ''}"
        out.append(line)
        for ex in d.bad_examples:
            out.append(f"    {ex}")
        if d.bad_lines > len(d.bad_examples):
            out.append(f"    ... and {d.bad_lines - len(d.bad_examples)} more")
        if d.conflict_examples:
            out.append(f"    ids already held by another dataset: {', '.join(d.conflict_examples)}")
    if s.reference is not None:
        r = s.reference
        out.append(
            f"  reference {r['path']}: {r['attached']} samples got reference ids, "
            f"{r['unmatched']} reference lines match no sample, {r['bad_lines']} bad lines"
        )
        for ex in r["bad_examples"]:
            out.append(f"    {ex}")
    return "\n".join(out) + "\n"
