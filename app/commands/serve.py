"""`eaglewatch serve DB`: the attached monitor in a web browser (textual-serve), read-only unless --control.

Each browser tab gets its own `eaglewatch watch DB` process behind a websocket. The server binds to
127.0.0.1 by default; exposing it needs an explicit `--host`, and then anyone who can reach the port sees
the run (and, with --control, can pause it): the warning on stderr says so.
"""

from __future__ import annotations

import argparse
import ipaddress
import shlex
import sys
from pathlib import Path

from app.errors import InputError

EXAMPLE = """\
eaglewatch serve /tmp/eaglewatch-demo.db                     # http://127.0.0.1:8566, view only
eaglewatch serve runs.db --run big-run --port 9000 --control   # also send pause/resume from the browser
ssh -L 8566:127.0.0.1:8566 gpu-box   # then open http://127.0.0.1:8566 on your laptop"""

DEFAULT_PORT = 8566


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", type=Path, metavar="DB", help="run database (the run's eaglewatch.db)")
    parser.add_argument(
        "--run", dest="run_name", metavar="NAME", help="run to show (needed when the database holds several)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to bind (default {DEFAULT_PORT})")
    parser.add_argument(
        "--control",
        action="store_true",
        help="let the browser pause/resume the run and its jobs (default: view only, no control keys)",
    )


def watch_command(db: Path, run_name: str | None, *, control: bool) -> str:
    """The shell command each browser session runs: the attached viewer over DB, read-only unless control."""
    argv = [sys.executable, "-m", "app.cli", "watch", str(db.resolve())]
    if run_name:
        argv += ["--run", run_name]
    if not control:
        argv.append("--readonly")
    return shlex.join(argv)


def is_loopback(host: str) -> bool:
    """True for localhost and 127.0.0.0/8 / ::1 addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from app.tui.db_source import open_attached
    from app.tui.serve import serve_command

    if not args.db.exists():
        raise InputError(
            f"{args.db}: no such run database; pass the run's eaglewatch.db (see `eaglewatch status --db`)"
        )
    if not 0 < args.port < 65536:
        raise InputError(f"--port {args.port}: not a TCP port (1-65535)")
    # open it once here so a wrong path or run name fails now, in this terminal, not in every browser tab
    source = open_attached(args.db, args.run_name, readonly=True)
    source.close()
    if not is_loopback(args.host):
        print(
            f"warning: serving on {args.host}:{args.port}: anyone who can reach this address sees the run"
            + (" and can pause it (--control)" if args.control else "")
            + "; prefer the default 127.0.0.1 with an SSH tunnel",
            file=sys.stderr,
        )
    mode = "with control" if args.control else "view only"
    print(f"serving the monitor of {args.db} at http://{args.host}:{args.port} ({mode}); Ctrl-C stops", file=sys.stderr)
    serve_command(
        watch_command(args.db, args.run_name, control=args.control),
        host=args.host,
        port=args.port,
        title=f"eaglewatch · {args.db.name}",
    )
    return 0
