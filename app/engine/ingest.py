"""Ingest a config's datasets into its run on first start, so `run` works on a fresh database.

A run that already holds samples is left as it is (running again resumes); use `eaglewatch ingest` to
add new lines to a started run. Bad lines are counted and skipped, as `eaglewatch ingest` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


async def ensure_ingested(store: Any, config: Any) -> str | None:
    """Ingest every dataset (and the reference ids) when the run holds no sample yet; return a one-line
    summary of what was added, or None when the run already had samples."""
    from app.datasets import ReadStats, iter_dataset, iter_references

    run_id = await store.ensure_run(config.run.name, config.redacted())
    if sum((await store.counts(run_id)).values()) > 0:
        return None
    added = bad = 0
    for ds in config.data.datasets:
        stats = ReadStats()
        report = await store.ingest(run_id, iter_dataset(ds, stats))
        added += report.added
        bad += stats.bad
    summary = f"ingested {added} samples into run {config.run.name!r}"
    if bad:
        summary += f" ({bad} bad lines skipped; 'eaglewatch ingest' lists them)"
    if config.data.reference is not None:
        stats = ReadStats()
        attached, unmatched = await store.attach_references(run_id, iter_references(Path(config.data.reference), stats=stats))
        summary += f", reference ids for {attached}"
        if unmatched:
            summary += f" ({unmatched} reference lines match no sample)"
    await store.add_event(run_id, "info", "ingest", summary)
    return summary
