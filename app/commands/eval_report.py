"""`eaglewatch eval report`: an eval run's report from its database (read-only; safe while it runs), as text or
JSON, with its Markdown (`--markdown`) and its picture (`--svg`); `--against B` adds the A/B table of this run's
drafter against run B's, paired by prompt. `eaglewatch eval-report` is the old spelling, still accepted, and says so.

Exit codes: 0; 2 bad input (no such run, not an eval run); 4 a `--min-acceptance` gate not met.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SUMMARY = "an eval run's report: acceptance lengths with intervals, by category, per position, A/B, verdicts"
EXAMPLE = """\
eaglewatch eval report --db eaglewatch.db
eaglewatch eval report --db runs.db --run drafter-v2 --against drafter-v1 --markdown ab.md --svg ab.svg
eaglewatch eval report --db runs.db --run drafter-v2 --json --min-acceptance 2.0 --min-acceptance code=2.4"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from app.commands.eval import add_gate_arguments

    parser.add_argument("--db", type=Path, metavar="PATH", default=Path("eaglewatch.db"), help="run database")
    parser.add_argument("--run", metavar="NAME", help="the eval run (default: the only run in the database)")
    parser.add_argument(
        "--against", metavar="NAME", help="another eval run in the database: the A/B table of this drafter against it"
    )
    add_gate_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from app.commands.eval import print_report
    from app.config import check_name

    if getattr(args, "spoken", "") == "eaglewatch eval-report":
        print("eaglewatch eval-report: deprecated, say `eaglewatch eval report` (same flags)", file=sys.stderr)
    if args.against is not None:
        check_name(args.against, "--against")
    return print_report(args.db, args.run, args, against=args.against)
