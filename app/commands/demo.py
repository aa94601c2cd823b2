"""`eaglewatch demo`: the built-in simulator over sample_data/, live in the monitor; no network, no key."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.commands.watch import add_theme_arguments
from app.errors import EaglewatchError

EXAMPLE = """\
eaglewatch demo                       # q quits; m mismatches, enter a token diff, ? every key
eaglewatch demo --db /tmp/demo.db --no-mouse --theme ansi-dark"""

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "sample_data" / "demo.toml"


def default_demo_config() -> Path:
    """sample_data/demo.toml of the checkout you are in (a clone's root), else the one beside this package."""
    here = Path("sample_data") / "demo.toml"
    return here.resolve() if here.is_file() else DEMO_CONFIG


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        type=Path,
        help="run database to create or resume (default: the demo config's, /tmp/eaglewatch-demo.db, started afresh)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="demo config (default: ./sample_data/demo.toml in a checkout, else the package's)",
    )
    add_theme_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from app.config import apply_overrides, load_config
    from app.tui.app import run_tui

    args.config = args.config or default_demo_config()
    if not args.config.exists():
        raise EaglewatchError(
            f"{args.config}: the demo config is missing; reinstall eaglewatch from a checkout that has sample_data/",
            exit_code=2,
        )
    config = load_config(args.config)
    if args.db is not None:  # --db resumes (or starts) a chosen database
        database = args.db.resolve()
        config = apply_overrides(config, {"run.database": str(database)})
    else:
        # the config's own database (/tmp/eaglewatch-demo.db, where the README's next commands look), started
        # afresh each time so the demo always shows a live run
        database = Path(config.run.database)
        fresh_demo_database(database, config.run.name)
    status = run_tui(config=config, mouse=not args.no_mouse, theme=args.theme)
    print(f"demo run database: {database}  (look again with: eaglewatch watch {database})", file=sys.stderr)
    return status


def fresh_demo_database(database: Path, run_name: str) -> None:
    """Remove an earlier demo's database (and its -wal/-shm) unless an engine is running on it now."""
    from app.engine.health.lock import EngineLock

    if not database.exists():
        return
    lock = EngineLock(database, run_name)
    try:
        lock.acquire()
    except EaglewatchError:
        raise EaglewatchError(
            f"{database}: a demo engine is running on it now; watch it with `eaglewatch watch {database}`, "
            "or start another demo with --db PATH",
            exit_code=2,
        ) from None
    try:
        for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")):
            path.unlink(missing_ok=True)
    finally:
        lock.release()
