"""Ingest a config's input files into its run: the one `ingest_config` every face calls (`eaglewatch ingest`,
`run`, the TUI's in-process run).

Resumable and idempotent: each dataset and the reference file is recorded in `ingest_files` (schema v5) with
its sha256 fingerprint and whether its last pass finished. A file already fully ingested with the same
fingerprint and read options is skipped; a file whose pass was interrupted (SIGKILL, a full disk) or that
changed is read again from the start — lines the run holds are "already present", so a second pass adds
exactly what the first did not. The reference file is attached again whenever a dataset pass added samples.

Before anything is written the config's inputs are checked (`app.datasets.check_inputs`: paths, dataset
lines, tokenizer, reference ids inside the vocabulary, the database folder, API keys), so `run` fails on a bad
path before it ingests; `preflight` runs that check before the store is even opened (no file is created). Bad lines are
counted,
reported by file:line and skipped; conflicting duplicate ids likewise. A dataset with `regenerate = "all"` is
ingested as whole conversations (`RunStore.ingest_conversations`: one row per turn; its report counts
conversations).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.config import RunConfig
from app.datasets import (
    DatasetReading,
    InputsCheck,
    ReadStats,
    check_inputs,
    file_fingerprint,
    iter_dataset,
    iter_dataset_conversations,
    iter_references,
)
from app.errors import InputError
from app.store.ingest_ops import IngestStatus, begin_file, file_record, finish_file, ingest_status, require_complete
from app.store.run_store import RunStore

# progress(label, path, stats) -> an async context manager shown while that file is read (None: no progress)
Progress = Callable[[str, Path, ReadStats], AbstractAsyncContextManager[object]]

__all__ = ["FileReport", "IngestConfigReport", "ingest_config", "preflight"]


async def preflight(config: Any, *, require_keys: bool = True) -> InputsCheck:
    """Check the config's inputs (`check_inputs`, in a thread) before anything is opened or written; raise
    InputError with every problem found (a missing API key only with `require_keys`: `ingest` sends nothing).
    Pass the result to `ingest_config(..., inputs=)`."""
    inputs = await asyncio.to_thread(check_inputs, config, require_keys=require_keys)
    if inputs.errors:
        raise InputError("\n".join(inputs.errors))
    return inputs


@dataclass(frozen=True)
class FileReport:
    """What ingesting one input file did. state: ingested | resumed (a pass had been interrupted) |
    unchanged (complete with the same fingerprint: not read) | failed (with `allow_partial`, see error)."""

    role: str
    name: str
    path: str
    format: str
    state: str
    read: int = 0
    added: int = 0
    already_present: int = 0
    conflicts: int = 0
    conflict_examples: tuple[str, ...] = ()
    bad_lines: int = 0
    bad_examples: tuple[str, ...] = ()
    attached: int = 0
    unmatched: int = 0
    error: str | None = None


@dataclass(frozen=True)
class IngestConfigReport:
    """What `ingest_config` did to the run: one FileReport per dataset, then the reference's (if any)."""

    run: str
    run_id: int
    database: str
    files: tuple[FileReport, ...] = ()
    complete: bool = True
    warnings: tuple[str, ...] = field(default_factory=tuple)
    # how each dataset whose `format` is "auto" or not set was read: its container, the formats its columns told
    readings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def datasets(self) -> tuple[FileReport, ...]:
        """The dataset files' reports, in config order."""
        return tuple(f for f in self.files if f.role == "dataset")

    @property
    def reference(self) -> FileReport | None:
        """The reference file's report, or None when the config names none."""
        return next((f for f in self.files if f.role == "reference"), None)

    @property
    def added(self) -> int:
        """Samples added by this call."""
        return sum(f.added for f in self.datasets)

    def summary(self) -> str | None:
        """One line for a log: what was added, refused and attached; None when every file was unchanged."""
        if all(f.state == "unchanged" for f in self.files):
            return None
        bad = sum(f.bad_lines for f in self.files)
        conflicts = sum(f.conflicts for f in self.files)
        resumed = [f.name for f in self.files if f.state == "resumed"]
        line = f"ingested {self.added} samples into run {self.run!r}"
        if resumed:
            line += f" (finished the interrupted ingest of {', '.join(resumed)})"
        if bad:
            line += f", {bad} bad lines skipped"
        if conflicts:
            line += f", {conflicts} lines skipped whose id the run holds with other content"
        ref = self.reference
        if ref is not None and ref.state != "unchanged":
            line += f", reference ids for {ref.attached}"
            if ref.unmatched:
                line += f" ({ref.unmatched} reference lines match no sample)"
        if bad or conflicts:
            line += "; 'eaglewatch ingest CONFIG' lists them by file:line"
        failed = [f for f in self.files if f.state == "failed"]
        if failed:
            line += "; NOT ingested: " + "; ".join(f"{f.name}: {f.error}" for f in failed)
        return line

    def as_json(self) -> dict[str, Any]:
        """JSON-ready: run, database, added, complete, datasets (list) and reference (or null)."""
        ref = self.reference
        return {
            "run": self.run,
            "database": self.database,
            "added": self.added,
            "complete": self.complete,
            "warnings": list(self.warnings),
            "readings": list(self.readings),
            "datasets": [_file_json(f) for f in self.datasets],
            "reference": None if ref is None else _file_json(ref),
        }


def _file_json(f: FileReport) -> dict[str, Any]:
    data = asdict(f)
    data["conflict_examples"] = list(f.conflict_examples)
    data["bad_examples"] = list(f.bad_examples)
    return data


async def ingest_config(
    store: RunStore,
    config: RunConfig,
    *,
    progress: Progress | None = None,
    allow_partial: bool = False,
    force: bool = False,
    check: bool = True,
    inputs: InputsCheck | None = None,
) -> IngestConfigReport:
    """Bring the run `config` names up to date with its dataset and reference files; return what happened.

    Raises InputError before writing anything when the inputs check finds an error (`check`), and after the
    files when the run is still half-ingested (a file failed to read) unless `allow_partial`. `force` reads
    files again even when unchanged since their last complete pass. `store` is an open RunStore. `inputs`: the
    result of a `preflight` already run (the check is not run again).
    """
    warnings: tuple[str, ...] = ()
    readings: tuple[DatasetReading, ...] = ()
    vocab_size = None
    if inputs is None and check:
        inputs = await preflight(config, require_keys=False)
    if inputs is not None:
        warnings, vocab_size, readings = inputs.warnings, inputs.vocab_size, inputs.readings
    run_id = await store.ensure_run(config.run.name, config.redacted())
    reports: list[FileReport] = []
    grew = False
    for ds in config.data.datasets:
        read_options: dict[str, Any] = {"format": ds.format, "id_field": ds.id_field, "limit": ds.row_limit}
        if ds.columns or ds.sample_fraction is not None:  # (only then: files ingested before keep their options)
            read_options.update(columns=ds.columns, sample_fraction=ds.sample_fraction, sample_seed=ds.sample_seed)
        whole = ds.regenerate == "all"
        if whole:  # (only then: a regenerate = "last" file ingested before keeps its recorded options)
            read_options.update(regenerate=ds.regenerate, on_tool_divergence=ds.on_tool_divergence)
        options = json.dumps(read_options, sort_keys=True)
        read = (
            (lambda stats, ds=ds: iter_dataset_conversations(ds, stats))
            if whole
            else (lambda stats, ds=ds: iter_dataset(ds, stats))
        )
        report = await _one_file(
            store,
            run_id,
            "dataset",
            ds.name,
            Path(ds.path),
            ds.format,
            options,
            force,
            allow_partial,
            progress,
            read,
            conversations=whole,
        )
        grew = grew or report.added > 0
        reports.append(report)
    if config.data.reference is not None:
        ref = Path(config.data.reference)
        options = json.dumps({"vocab_size": vocab_size}, sort_keys=True)
        reports.append(
            await _one_file(
                store,
                run_id,
                "reference",
                "reference",
                ref,
                "reference",
                options,
                force or grew,
                allow_partial,
                progress,
                lambda stats: iter_references(ref, stats=stats, vocab_size=vocab_size),
            )
        )
    status: IngestStatus = await store.read(lambda conn: ingest_status(conn, run_id))
    result = IngestConfigReport(
        config.run.name,
        run_id,
        str(config.run.database),
        tuple(reports),
        status.complete,
        tuple(warnings),
        tuple(str(r) for r in readings),
    )
    line = result.summary()
    if line is not None:
        await store.add_event(run_id, "info" if status.complete else "warning", "ingest", line)
    datasets = result.datasets
    for reading in readings:  # the operator's log says how a file read this time was read (the monitor shows it)
        if reading.index < len(datasets) and datasets[reading.index].state != "unchanged":
            await store.add_event(run_id, "info", "ingest", f"read {reading}")
    require_complete(status, allow_partial=allow_partial)
    return result


async def _one_file(
    store: RunStore,
    run_id: int,
    role: str,
    name: str,
    path: Path,
    fmt: str,
    options: str,
    force: bool,
    allow_partial: bool,
    progress: Progress | None,
    read: Callable[[ReadStats], Any],
    *,
    conversations: bool = False,
) -> FileReport:
    try:
        fingerprint = await asyncio.to_thread(file_fingerprint, path)
    except InputError as exc:
        if not allow_partial:
            raise
        return FileReport(role, name, str(path), fmt, "failed", error=str(exc))
    before = await store.read(lambda conn: file_record(conn, run_id, role, name))
    if (
        before is not None
        and before.complete
        and before.fingerprint == fingerprint
        and before.options == options
        and not force
    ):
        return FileReport(
            role, name, str(path), fmt, "unchanged", bad_lines=before.bad_lines, conflicts=before.conflicts
        )
    state = "resumed" if before is not None and not before.complete else "ingested"
    await begin_file(store, run_id, role, name, str(path), fingerprint, options)
    stats = ReadStats()
    track = (role, name)
    try:
        async with progress(name, path, stats) if progress is not None else nullcontext():
            if role == "dataset":
                ingest = store.ingest_conversations if conversations else store.ingest
                part = await ingest(run_id, read(stats), source=str(path), track=track)
                counts: dict[str, Any] = dict(
                    added=part.added,
                    already_present=part.already_present,
                    conflicts=part.conflicts,
                    conflict_examples=part.conflict_examples,
                )
            else:
                attached, unmatched = await store.attach_references(run_id, read(stats), track=track)
                counts = dict(attached=attached, unmatched=unmatched)
    except (InputError, OSError) as exc:
        if not allow_partial:
            raise
        return FileReport(role, name, str(path), fmt, "failed", read=stats.good, error=str(exc))
    await finish_file(store, run_id, role, name, stats.lines, bad_lines=stats.bad, conflicts=counts.get("conflicts", 0))
    return FileReport(
        role,
        name,
        str(path),
        fmt,
        state,
        read=stats.good,
        bad_lines=stats.bad,
        bad_examples=tuple(stats.examples),
        **counts,
    )
