"""`eaglewatch watch DB`: the monitor over a run database (attached to a headless run, or read-only); an eval run
(`runs.kind` = eval) gets the eval monitor."""

from __future__ import annotations

import argparse
from pathlib import Path

EXAMPLE = """\
eaglewatch watch /tmp/eaglewatch-demo.db                 # steer a headless run (p pauses it)
eaglewatch watch runs.db --run big-run --readonly --no-mouse"""

THEMES = ("textual-dark", "textual-light", "ansi-dark", "ansi-light")


def add_theme_arguments(parser: argparse.ArgumentParser) -> None:
    """--no-mouse and --theme, shared by every verb that opens the monitor."""
    parser.add_argument(
        "--no-mouse", action="store_true", help="leave the mouse to the terminal (text selection in tmux/SSH)"
    )
    parser.add_argument(
        "--theme",
        choices=THEMES,
        default="textual-dark",
        help="colour theme; ansi-dark / ansi-light use the terminal's own palette (odd SSH terminals, 16 colours)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", type=Path, metavar="DB", help="run database (the run's eaglewatch.db)")
    parser.add_argument(
        "--run", dest="run_name", metavar="NAME", help="run to show (needed when the database holds several)"
    )
    parser.add_argument("--readonly", action="store_true", help="view only: send no pause/resume or job commands")
    add_theme_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from app.tui.app import make_app
    from app.tui.db_source import open_attached
    from app.tui.eval_source import is_eval_run

    if is_eval_run(args.db, args.run_name):  # an eval run: the eval monitor (acceptance, guards, requests)
        from app.tui.eval_app import make_eval_app
        from app.tui.eval_source import open_eval_attached

        eval_source = open_eval_attached(args.db, args.run_name, readonly=args.readonly)
        make_eval_app(eval_source, theme=args.theme).run(mouse=not args.no_mouse)
        return 0
    source = open_attached(args.db, args.run_name, readonly=args.readonly)
    make_app(source, theme=args.theme).run(mouse=not args.no_mouse)
    return 0
