"""`eaglewatch eval`: evaluate a served drafter on a run config's prompts, every answer stored in the run database.

The config is a run config with an `[eval]` table (docs/config-reference.md). Each prompt goes to each eval
endpoint (and the baseline); the server's acceptance figures are stored as given, then the report is printed
(figures, intervals, verdicts). By default the eval monitor shows the run live (acceptance per endpoint over time,
per position, by category, the guards, each request's output; `p` pauses and resumes; quitting stops the eval,
which resumes when run again); `--headless` prints progress on stderr instead. `watch` and `serve` on the run's
database show the same monitor and steer a headless eval (pause, resume). Exit codes: 0 done; 1 some requests
failed; 2 bad input; 3 an endpoint refused the credentials (401/403: the eval stops at once); 4 a
`--min-acceptance` gate (the run's or a category's) not met (`EXIT_BELOW_MIN`). `eaglewatch eval report` prints the
report again from the database. A run that stopped resumes with the
requests not answered yet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.config import RunConfig

EXIT_BELOW_MIN = 4

EXAMPLE = """\
eaglewatch eval eval.toml                              # the monitor: p pauses, r lists the requests
eaglewatch eval --headless eval.toml
eaglewatch eval --headless eval.toml --min-acceptance 1.8 --min-acceptance code=2.0 --json > report.json
eaglewatch eval report --db eaglewatch.db --run my-eval --markdown report.md --svg report.svg"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="run config (TOML) with an [eval] table")
    from app.commands.watch import add_theme_arguments

    parser.add_argument("--headless", action="store_true", help="no monitor: progress on stderr")
    parser.add_argument("--db", type=Path, metavar="PATH", help="run database (default: the config's run.database)")
    parser.add_argument("--run", dest="run_name", metavar="NAME", help="run name (default: the config's run.name)")
    add_gate_arguments(parser)
    add_theme_arguments(parser)


def min_acceptance(text: str) -> tuple[str, float]:
    """A `--min-acceptance` value: `X` (the whole run, "*") or `CATEGORY=X`."""
    category, _, value = text.rpartition("=")
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a mean acceptance length (e.g. 1.8) or CATEGORY=X (e.g. code=2.0)"
        ) from None
    return (category.strip() or "*", number)


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="also write the report as Markdown to FILE")
    parser.add_argument(
        "--svg", type=Path, metavar="FILE", help="also write its picture (by category, per position, histogram)"
    )
    parser.add_argument(
        "--min-acceptance",
        type=min_acceptance,
        action="append",
        default=[],
        metavar="[CATEGORY=]X",
        help=f"exit {EXIT_BELOW_MIN} when the mean acceptance length (request-weighted, loops left out) is below X: "
        "the whole run's, or with CATEGORY= that category's (repeatable; [eval] min_acceptance adds more)",
    )


def run(args: argparse.Namespace) -> int:
    from app.config import apply_overrides, load_config
    from app.eval.run import EvalRun

    config = load_config(args.config)
    overrides: dict = {}
    if args.db is not None:
        overrides["run.database"] = str(args.db.resolve())
    if args.run_name:
        overrides["run.name"] = args.run_name
    if overrides:
        config = apply_overrides(config, overrides)
    _check_guard_inputs(config)
    if not args.headless:
        from app.tui.eval_app import host_eval

        engine = EvalRun(config)
        asyncio.run(
            host_eval(
                engine,
                database=config.run.database,
                run_name=config.run.name,
                mouse=not getattr(args, "no_mouse", False),
                theme=getattr(args, "theme", "textual-dark"),
            )
        )
        if engine.state not in ("done", "failed"):
            print(
                f"eaglewatch eval: stopped with {engine.progress.done} answered this time; run it again to resume",
                file=sys.stderr,
            )
    else:
        progress = _Progress()
        engine = EvalRun(config, on_progress=progress.update, on_notice=lambda m: progress.say(f"warning: {m}"))
        try:
            asyncio.run(engine.run())
        finally:
            progress.stop()
    code = print_report(config.run.database, config.run.name, args)
    if code == 0 and engine.progress.failed:
        print(
            f"eaglewatch eval: {engine.progress.failed} requests failed (their errors are stored); run it again to "
            "retry them",
            file=sys.stderr,
        )
        return 1
    return code


def _check_guard_inputs(config: RunConfig) -> None:
    """The training export and d2t the guards read, checked before any request is sent (InputError, exit 2)."""
    from app.eval.training import TrainingData, read_d2t

    ev = config.eval
    if ev is not None and ev.training is not None:
        TrainingData.load(ev.training)
    if ev is not None and ev.d2t is not None:
        read_d2t(ev.d2t)


def print_report(db: Path, run_name: str | None, args: argparse.Namespace, against: str | None = None) -> int:
    """Print the stored report of an eval run (and write its Markdown and SVG when asked); the gate's exit code."""
    from app.config import EvalSection
    from app.eval.figures import ab_text, counter_windows_report, gates, render_text
    from app.eval.render import render_markdown, render_svg
    from app.eval.report import against_report, stored_report
    from app.store import eval_ops, queries

    conn = queries.connect_readonly(db, upgrade=True)
    try:
        run = queries.resolve_run(conn, run_name, db_label=str(db))
        report = stored_report(conn, run)
        if against is not None:
            report["against"] = against_report(conn, run, queries.resolve_run(conn, against, db_label=str(db)))
        # server-wide Prometheus deltas, apart from the per-request figures (app.eval.counters)
        report["counter_windows"] = counter_windows_report(eval_ops.eval_windows(conn, run.id))
    finally:
        conn.close()
    stored = EvalSection.model_validate(run.config["eval"]).min_acceptance
    thresholds = {**stored, **dict(args.min_acceptance)}
    failures = gates(report, thresholds)
    report["gate"] = None if not thresholds else {"min_acceptance": thresholds, "failures": failures}
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        text = render_text(report)
        if report.get("against"):
            text += "\n" + ab_text(report["against"])
        sys.stdout.write(text + "\n")
    if args.markdown is not None:
        _write(args.markdown, render_markdown(report))
    if args.svg is not None:
        _write(args.svg, render_svg(report))
    for failure in failures:
        print(f"eaglewatch: gate failed: {failure}", file=sys.stderr)
    return EXIT_BELOW_MIN if failures else 0


def _write(path: Path, text: str) -> None:
    from app.errors import InputError

    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot be written ({exc.strerror or exc})") from None


class _Progress:
    """A rich progress bar on stderr (on a terminal), else a line at the end."""

    def __init__(self) -> None:
        self._bar = None
        self._task = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("eval"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[failed]} failed"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._bar.start()
            self._task = self._bar.add_task("eval", total=None, failed=0)
        self._last = (0, 0, 0)

    def update(self, p) -> None:  # noqa: ANN001
        self._last = (p.done, p.failed, p.total)
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=p.done + p.failed, total=p.total, failed=p.failed)

    def say(self, message: str) -> None:
        if self._bar is not None:
            self._bar.console.print(message)
        else:
            print(message, file=sys.stderr)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        done, failed, total = self._last
        print(f"eval: {done} answered, {failed} failed of {total} requests", file=sys.stderr)
