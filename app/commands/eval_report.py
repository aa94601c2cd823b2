"""`eaglewatch eval-report`: an eval run's report from its database (read-only; safe while it runs).

Exit codes: 0; 2 bad input (no such run, not an eval run); 4 `--min-acceptance` not met.
"""

from __future__ import annotations

import argparse
from pathlib import Path

EXAMPLE = """\
eaglewatch eval-report --db eaglewatch.db
eaglewatch eval-report --db runs.db --run drafter-v2 --json --min-acceptance 2.0"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from app.commands.eval import add_gate_arguments

    parser.add_argument("--db", type=Path, metavar="PATH", default=Path("eaglewatch.db"), help="run database")
    parser.add_argument("--run", metavar="NAME", help="the eval run (default: the only run in the database)")
    add_gate_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from app.commands.eval import print_report

    return print_report(args.db, args.run, args)
