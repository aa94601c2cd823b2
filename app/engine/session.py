"""`open_run`: the one way every face (headless `run`, the TUI, tests) opens a run to generate.

Store open + ingest (`app.engine.work.config_ingest`) + the Reconstructor + a started `Run`, and on the way out the
engine closed (in-flight requests cancelled) and the store closed, whatever happened in between.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from app.config import RunConfig
from app.engine.run import Run
from app.store.run_store import RunStore


@dataclass(frozen=True, slots=True)
class OpenRun:
    """A started engine over its open store; `ingested` is the ingest summary (None: nothing was added)."""

    run: Run
    store: RunStore
    ingested: str | None


@asynccontextmanager
async def open_run(
    config: RunConfig,
    *,
    resume_paused: bool = True,
    reconstruct: bool = True,
    on_ingested: Callable[[str], None] | None = None,
    on_readings: Callable[[tuple[str, ...]], None] | None = None,
) -> AsyncIterator[OpenRun]:
    """Open the config's database, ingest what the run lacks, build the Reconstructor (unless
    reconstruct=False) and start the engine; yield it, then close engine and store. `on_readings` gets how each
    dataset whose `format` is "auto" or not set is read (its container, the formats its columns told)."""
    from app.engine.fidelity.pool import build_reconstructor
    from app.engine.work.config_ingest import ingest_config, preflight

    inputs = await preflight(config)  # before the database is opened: a refused config writes nothing
    if inputs.readings and on_readings is not None:
        on_readings(tuple(str(r) for r in inputs.readings))
    store = await RunStore.open(config.run.database)
    try:
        # finishes an interrupted ingest and refuses to start on a half-ingested run (app.engine.work.config_ingest)
        summary = (await ingest_config(store, config, inputs=inputs)).summary()
        if summary and on_ingested is not None:
            on_ingested(summary)
        reconstructor = build_reconstructor(config) if reconstruct else None
        engine = Run(
            config, store, reconstructor=reconstructor, db_path=config.run.database, resume_paused=resume_paused
        )
        await engine.start()
        try:
            yield OpenRun(engine, store, summary)
        finally:
            await engine.close(cancel_in_flight=True)
    finally:
        await store.close()
