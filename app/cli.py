"""`eaglewatch <verb>`: the command line.

Each verb lives in `app/commands/<verb>.py` and exposes HELP (one line), EXAMPLE (shown at the end of
its --help), `add_arguments(parser)` and `run(args) -> int`. Only the chosen verb's module is imported,
so `eaglewatch --help` stays fast and quiet.

Contract for scripts: every verb that reads or writes a run takes `--db PATH` and `--run NAME`; verbs
that report results take `--json`; exit 0 means success; anything else names the failure on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import sqlite3
import sys

from app.errors import EaglewatchError
from app.libnoise import silence_library_noise

# verb -> one-line summary; the order is the order in --help
VERBS: dict[str, str] = {
    "demo": "run the built-in provider simulator over sample data and watch it live (no network, no key)",
    "run": "generate responses for a run config (TUI, or --headless with progress on stderr)",
    "watch": "open the monitor over a run database (attached: steer a headless run, or --readonly)",
    "serve": "serve the monitor of a run database to a web browser (read-only unless --control)",
    "ingest": "stream prompt datasets into a run without generating",
    "status": "per-run counts by state, cost so far and verdict counts",
    "validate": "check reconstruction against ground-truth output_ids from a reference file",
    "audit": "check a tokenizer's special tokens (and given id constants) against a template profile",
    "calibrate": "learn each endpoint's fidelity profile (server-side text steps) from probes with true ids",
    "fidelity": "measured text-path fidelity per endpoint and upstream provider, with advice",
    "reprocess": "reconstruct stored responses again after a tokenizer or profile fix (no API calls)",
    "export": "write training data for a trainer: specforge, speculators, modelopt, eagle3-shards, specforge-text or "
    "sglang-raw",
    "vocab": "the reduced draft vocabulary (d2t/t2d, token_freq.pt) from the loss tokens, with its coverage",
    "extract": "launch hidden-state extraction jobs on local GPUs or Slurm (--dry-run plans without a GPU)",
    "jobs": "list extraction jobs and their shards",
    "eval": "evaluate a served drafter on a run config's prompts: acceptance as the server reports it, with guards",
    "eval-report": "deprecated spelling of `eval report`: an eval run's report (--json, --markdown, --svg)",
    "simulate": "run the OpenAI-compatible provider simulator on its own",
    "config": "validate a run config and print the effective configuration (secrets redacted)",
}

EPILOG = """\
Start here:
  eaglewatch demo                                 watch a simulated run live
  eaglewatch config check sample_data/demo.toml   validate a config
  eaglewatch run --headless sample_data/demo.toml generate without the TUI

Every verb has its own --help with an example.
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


# verbs spoken as two words: (first, second) -> the verb module's name in VERBS
TWO_WORD_VERBS = {("eval", "report"): "eval-report"}


def build_parser(verb: str | None, prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eaglewatch",
        description="Build EAGLE-3 training data from LLM APIs with token ids proven right, and watch it live.",
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"eaglewatch {_version()}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs")
    for name, summary in VERBS.items():
        if name != verb:
            sub.add_parser(name, help=summary)
            continue
        module = importlib.import_module(f"app.commands.{name.replace('-', '_')}")
        p = sub.add_parser(
            name,
            prog=prog,
            help=summary,
            description=(getattr(module, "SUMMARY", summary) if prog else summary)[0].upper()
            + (getattr(module, "SUMMARY", summary) if prog else summary)[1:]
            + ".",
            epilog="Example:\n  " + module.EXAMPLE.strip().replace("\n", "\n  "),
            formatter_class=_Formatter,
        )
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("eaglewatch")
    except Exception:
        return "0+unknown"


def main(argv: list[str] | None = None) -> int:
    silence_library_noise()
    argv = list(sys.argv[1:] if argv is None else argv)
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    verb = None if at is None else argv[at]
    prog = None
    two = TWO_WORD_VERBS.get((verb or "", argv[at + 1] if at is not None and at + 1 < len(argv) else ""))
    if two is not None and at is not None:
        prog = f"eaglewatch {verb} {argv[at + 1]}"
        argv[at : at + 2] = [two]
        verb = two
    parser = build_parser(verb if verb in VERBS else None, prog)
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 0
    args.spoken = prog or f"eaglewatch {args.verb}"
    try:
        _check_names(args)
        return int(args._module.run(args) or 0)
    except EaglewatchError as exc:
        print(f"eaglewatch {args.verb}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"eaglewatch {args.verb}: interrupted", file=sys.stderr)
        return 130
    except sqlite3.DatabaseError as exc:
        # the last line of defence: a damaged page met after the open-time check (or a disk error)
        print(
            f"eaglewatch {args.verb}: error: the run database failed: {exc}. If it says 'malformed', the file "
            "is damaged: restore it from a backup or recover it with `sqlite3 DB .recover`",
            file=sys.stderr,
        )
        return 2


# flags that name a run, dataset, endpoint or job: refused here, before any verb sees them
_NAME_FLAGS = {"run": "--run", "run_name": "--run"}


def _check_names(args: argparse.Namespace) -> None:
    for attr, flag in _NAME_FLAGS.items():
        value = getattr(args, attr, None)
        if isinstance(value, str):
            from app.config import check_name

            check_name(value, flag)


if __name__ == "__main__":
    sys.exit(main())
