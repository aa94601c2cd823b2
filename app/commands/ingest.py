"""`eaglewatch ingest CONFIG`: stream the config's prompt datasets (and reference ids) into a run.

Nothing is generated. Re-running adds only what is new: a file unchanged since its last complete ingest is
skipped, an interrupted or changed one is read again (sample ids are unique per run). Bad lines, and lines
whose id the run already holds with other content, are reported with file:line, counted and skipped.
The work is `app.engine.work.config_ingest.ingest_config`, the same one `run` calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
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
    parser.add_argument(
        "--force", action="store_true", help="read every file again, even one unchanged since its last complete ingest"
    )


def run(args: argparse.Namespace) -> int:
    from app.config import apply_overrides, load_config

    config = load_config(args.config)
    config = apply_overrides(config, {"run.database": args.db, "run.name": args.run})
    show = sys.stderr.isatty() and not args.json
    report = asyncio.run(_ingest(config, progress=_Progress if show else None, force=args.force))
    if args.json:
        sys.stdout.write(json.dumps(report.as_json(), indent=2) + "\n")
    else:
        sys.stdout.write(_render(report))
    return 0


async def _ingest(config: Any, **kw: Any) -> Any:
    from app.engine.work.config_ingest import ingest_config, preflight
    from app.store.run_store import RunStore

    inputs = await preflight(
        config, require_keys=False
    )  # before the database is opened: a refused config writes nothing
    store = await RunStore.open(config.run.database)
    try:
        return await ingest_config(store, config, inputs=inputs, **kw)
    finally:
        await store.close()


class _Progress:
    """A rich progress bar on stderr following a reader's byte count (only on a terminal)."""

    def __init__(self, label: str, path: Path, stats: Any, enabled: bool = True) -> None:
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


def _render(s: Any) -> str:
    out = [f"run {s.run!r} in {s.database}"]
    for r in s.readings:  # what was guessed (format "auto" or not set), so the config can say otherwise
        out.append(f"  read {r}")
    for w in s.warnings:
        out.append(f"  warning: {w}")
    for d in s.datasets:
        if d.state == "unchanged":
            out.append(f"  {d.name} ({d.format}): unchanged since its last complete ingest (--force reads it again)")
            continue
        line = f"  {d.name} ({d.format}): {d.added} added, {d.already_present} already present"
        if d.state == "resumed":
            line += " (finished an interrupted ingest)"
        if d.conflicts:
            line += f", {d.conflicts} skipped: id already held with other content"
        line += f", {d.bad_lines} bad line{'s' if d.bad_lines != 1 else ''}"
        out.append(line)
        _examples(out, d.bad_examples, d.bad_lines)
        _examples(out, d.conflict_examples, d.conflicts)
    r = s.reference
    if r is not None:
        if r.state == "unchanged":
            out.append(f"  reference {r.path}: unchanged since its last complete ingest")
        else:
            out.append(
                f"  reference {r.path}: {r.attached} samples got reference ids, "
                f"{r.unmatched} reference lines match no sample, {r.bad_lines} bad lines"
            )
            _examples(out, r.bad_examples, r.bad_lines)
    for f in s.files:
        if f.state == "failed":
            out.append(f"  NOT ingested: {f.name}: {f.error}")
    return "\n".join(out) + "\n"


def _examples(out: list[str], examples: tuple[str, ...], total: int) -> None:
    for ex in examples:
        out.append(f"    {ex}")
    if total > len(examples):
        out.append(f"    ... and {total - len(examples)} more")
