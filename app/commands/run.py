"""`eaglewatch run`: generate responses for a run config, in the TUI or headless with progress on stderr.

Before anything is written the config's inputs are checked (`app.datasets.check_inputs`: files, dataset lines,
tokenizer, the database folder, each endpoint's API key). Headless exit codes: 0 every sample done; 1 some
samples failed (how many, and `--retry-failed` to put them back), or the run paused (budget, operator, every
endpoint down: the reason is printed); 3 a run-stopping error from the provider (key, credits, permissions).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

from app.errors import EaglewatchError

EXAMPLE = """\
eaglewatch run --headless sample_data/demo.toml
eaglewatch run --headless run.toml --db runs.db --concurrency 32 --budget 5 --limit 1000
eaglewatch run --headless run.toml --retry-failed   # failed samples back to pending, fresh attempts
eaglewatch run run.toml          # the same run inside the terminal UI"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="run config (TOML)")
    parser.add_argument("--headless", action="store_true", help="no TUI: progress on stderr, events as log lines")
    parser.add_argument("--db", type=Path, metavar="PATH", help="run database (default: the config's run.database)")
    parser.add_argument("--run", dest="run_name", metavar="NAME", help="run name (default: the config's run.name)")
    parser.add_argument(
        "--concurrency", type=int, metavar="N", help="start with N requests in flight (raises the max if needed)"
    )
    parser.add_argument("--budget", type=float, metavar="USD", help="pause before spending would pass USD")
    parser.add_argument("--limit", type=int, metavar="N", help="ingest at most N samples per dataset")
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="put the run's failed samples back to pending first, each with a fresh allowance of "
        "generation.attempts (their earlier responses stay in the ledger)",
    )


def load_run_config(args: argparse.Namespace):
    """The config with the command line's overrides applied."""
    from app.config import apply_overrides, load_config

    config = load_config(args.config)
    overrides: dict = {}
    if args.db is not None:
        overrides["run.database"] = str(args.db.resolve())
    if args.run_name:
        overrides["run.name"] = args.run_name
    if args.concurrency is not None:
        if args.concurrency < 1:
            raise EaglewatchError("--concurrency must be at least 1", exit_code=2)
        overrides["limits.concurrency_initial"] = args.concurrency
        if args.concurrency > config.limits.concurrency_max:
            overrides["limits.concurrency_max"] = args.concurrency
        if args.concurrency < config.limits.concurrency_min:
            overrides["limits.concurrency_min"] = args.concurrency
    if args.budget is not None:
        overrides["limits.budget_usd"] = args.budget
    if args.limit is not None:
        if args.limit < 1:
            raise EaglewatchError("--limit must be at least 1", exit_code=2)
        if config.data.total is not None:  # a weighted mix: the limit caps the total, the weights still share it
            overrides["data.total"] = min(args.limit, config.data.total)
        for i, ds in enumerate(config.data.datasets if config.data.total is None else ()):
            overrides[f"data.datasets[{i}].limit"] = min(args.limit, ds.limit or args.limit)
    if overrides:
        config = apply_overrides(config, overrides)
    return config


def run(args: argparse.Namespace) -> int:
    config = load_run_config(args)
    if not args.headless:
        try:
            from app.tui.app import run_tui
        except ImportError:
            raise EaglewatchError(
                "the terminal UI is not available in this build; use 'eaglewatch run --headless "
                f"{args.config}' for progress on stderr"
            ) from None
        return int(run_tui(config=config, run=config.run.name, retry_failed=args.retry_failed) or 0)
    return asyncio.run(run_headless(config, retry_failed=args.retry_failed))


async def run_headless(config, *, progress: bool = True, stream=None, retry_failed: bool = False) -> int:
    """Run to the end: exit 0 when every sample is done, 1 when some failed or the run paused (budget, operator,
    every endpoint down), 3 on a run-stopping error; Ctrl-C pauses. `retry_failed` first puts failed samples
    back to pending (`Run.retry_failed`)."""
    from app.engine.run import VIEWER_PAUSE
    from app.engine.session import open_run

    stream = stream or sys.stderr
    database = config.run.database
    async with open_run(
        config,
        on_ingested=lambda summary: print(f"{summary} ({database})", file=stream),
        on_readings=lambda readings: print("\n".join(f"read {r}" for r in readings), file=stream),
    ) as opened:
        engine = opened.run
        if retry_failed:
            n = await engine.retry_failed()
            print(f"{n} failed samples put back to pending ({database})", file=stream)
        loop = asyncio.get_running_loop()
        interrupts = 0

        def on_sigint() -> None:
            nonlocal interrupts
            interrupts += 1
            if interrupts == 1:
                print("\npausing: in-flight requests finish and are stored (Ctrl-C again to cancel them)", file=stream)
                loop.create_task(engine.pause(reason="operator (Ctrl-C)"))
            else:
                print("\ncancelling in-flight requests (providers may still bill for them)", file=stream)
                loop.create_task(engine.pause(now=True, reason="operator (Ctrl-C)"))

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        loop.add_signal_handler(signal.SIGTERM, on_sigint)
        try:
            outcome = await _watch(engine, stream, progress)
            # paused from an attached viewer: stay alive for its resume (p and P alike), until Ctrl-C here
            while outcome.state == "paused" and outcome.reason == VIEWER_PAUSE and not interrupts:
                print(
                    "paused from an attached viewer: waiting for its resume (Ctrl-C here stops this engine)",
                    file=stream,
                )
                while engine.state == "paused" and engine.state_reason == VIEWER_PAUSE and not interrupts:
                    await asyncio.sleep(0.25)
                outcome = await _watch(engine, stream, progress)
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)
        snap = engine.snapshot()
    if outcome.state == "done":
        if snap.failed:
            print(
                f"run finished with {snap.failed} failed samples of {snap.total} ({snap.done} done); "
                f"'eaglewatch status --db {database}' shows why, and 'eaglewatch run --headless {_config_arg(config)} "
                "--retry-failed' puts them back to pending with fresh attempts",
                file=stream,
            )
            return 1
        return 0
    print(
        f"run paused: {outcome.reason}; {snap.counts.samples.pending + snap.counts.samples.leased} samples "
        f"pending; run the same command again "
        "to resume",
        file=stream,
    )
    return 3 if outcome.stopping_error else 1


def _config_arg(config) -> str:
    """The config file as the operator would type it again (its path, else a placeholder)."""
    return str(config.source) if getattr(config, "source", None) else "CONFIG"


async def _watch(engine, stream, progress: bool):
    """Show progress and new events until the engine is idle (done, or paused with nothing in flight).

    On a terminal the progress is a live rich bar; otherwise (nohup, a log file) a plain line every 10 s.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    tty = stream.isatty()
    console = Console(file=stream, highlight=False, width=None if tty else 140, force_terminal=tty or None)
    waiter = asyncio.ensure_future(engine.wait())
    last_event = 0
    last_line = 0.0
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=24),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[stats]}"),
        console=console,
        transient=False,
        disable=not (progress and tty),
    )
    with bar:
        task = bar.add_task(engine.config.run.name, total=None, stats="")
        while True:
            last_event = _print_events(engine, console, last_event)
            s = engine.snapshot()
            line = progress_line(s)
            bar.update(task, completed=s.done + s.failed + s.skipped, total=s.total or None, stats=line)
            if progress and not tty and (time.monotonic() - last_line >= 10 or waiter.done()):
                console.print(
                    f"{time.strftime('%H:%M:%S')} progress    {s.done + s.failed + s.skipped}/{s.total} {line}",
                    markup=False,
                )
                last_line = time.monotonic()
            if waiter.done():
                break
            await asyncio.wait({waiter}, timeout=0.5)
        _print_events(engine, console, last_event)
    return waiter.result()


def progress_line(s) -> str:
    """One short line of a run's record (app.engine.record.snapshot.RunRecord), in the words every face uses: the
    engine's answers and tokens per second (a finished run's averages), what is spent, the ETA, requests in
    flight / the limit and the samples waiting, failed samples, the samples a server intervened on by kind, and the
    state's words once it is not running. A run
    of whole conversations starts it with its conversations done (`conv 15/16 done`, and the diverged ones)."""
    from app.engine.interventions import ledger_words
    from app.engine.money.budget import usd
    from app.engine.record.snapshot import finished_figures, state_words
    from app.store.count_records import RunLatency

    live, fin = s.live, s.finished
    if fin is None and s.state == "done":  # the engine's own record at the end: averages over the run's span
        fin = finished_figures(s.counts, RunLatency())
    if fin is None and live is not None:
        rates = f"{live.rate.req_s_10s:.1f} req/s {live.rate.tok_s_10s:.0f} tok/s"
    else:
        rates = f"avg {fin.req_s:.1f} req/s {fin.tok_s:.0f} tok/s" if fin is not None else "- req/s - tok/s"
    eta = "-" if s.eta_s is None else time.strftime("%H:%M:%S", time.gmtime(s.eta_s))
    line = f"{conversations_words(s.counts.conversations)}{rates} {usd(s.cost_usd)} ETA {eta}"
    if live is not None and fin is None:
        line += f" in flight {live.in_flight}/{live.concurrency_limit} waiting {live.waiting}"
    line += f" failed {s.failed}"
    ledger = ledger_words(s.counts.intervened, s.counts.interventions)
    if ledger:  # samples a server intervened on (left out of exports): counted by kind
        line += f" {ledger}"
    if s.state != "running":
        line += f" · {state_words(s).text}"
    return line


def conversations_words(conv) -> str:
    """`conv 15/16 done · 1 diverged · ` for a run of whole conversations (failed ones too when any); "" without."""
    if conv is None:
        return ""
    ended = "".join(f" · {n} {word}" for n, word in ((conv.diverged, "diverged"), (conv.failed, "failed")) if n)
    return f"conv {conv.done}/{conv.total} done{ended} · "


def _print_events(engine, console, after_id: int) -> int:
    for ev in engine.events_since(after_id):
        when = time.strftime("%H:%M:%S", time.localtime(ev.ts))
        style = {"warning": "yellow", "error": "bold red"}.get(ev.level, "")
        console.print(f"{when} {ev.level:<7} {ev.kind:<11} {ev.message}", style=style, markup=False)
        after_id = max(after_id, ev.id)
    return after_id
