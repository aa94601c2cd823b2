"""`eaglewatch run`: not available yet (filled by a later change)."""

from __future__ import annotations

import argparse

from app.errors import EaglewatchError

EXAMPLE = "eaglewatch run --help"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise EaglewatchError("'run' is not available yet in this version of eaglewatch")
