"""`eaglewatch demo`: the built-in simulator over sample_data/, live in the monitor; no network, no key."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from app.commands.watch import add_theme_arguments
from app.errors import EaglewatchError

EXAMPLE = """\
eaglewatch demo                       # q quits; m mismatches, enter a token diff, ? every key
eaglewatch demo --db /tmp/demo.db --no-mouse --theme ansi-dark"""

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "sample_data" / "demo.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", type=Path, help="run database to create or resume (default: a fresh one under the temp dir)")
    parser.add_argument("--config", type=Path, default=DEMO_CONFIG, help="demo config (default: sample_data/demo.toml)")
    add_theme_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from app.config import apply_overrides, load_config
    from app.tui.app import run_tui

    if not args.config.exists():
        raise EaglewatchError(
            f"{args.config}: the demo config is missing; reinstall eaglewatch from a checkout that has sample_data/",
            exit_code=2,
        )
    config = load_config(args.config)
    # A fresh database each time, so the demo always shows a live run; --db resumes a chosen one.
    database = args.db.resolve() if args.db is not None else Path(tempfile.mkdtemp(prefix="eaglewatch-demo-")) / "demo.db"
    config = apply_overrides(config, {"run.database": str(database)})
    status = run_tui(config=config, mouse=not args.no_mouse, theme=args.theme)
    print(f"demo run database: {database}  (look again with: eaglewatch watch {database})", file=sys.stderr)
    return status
