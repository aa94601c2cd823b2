"""`eaglewatch reprocess`: not available yet (filled by a later change)."""

from __future__ import annotations

import argparse

from app.errors import EaglewatchError

EXAMPLE = "eaglewatch reprocess --help"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise EaglewatchError("'reprocess' is not available yet in this version of eaglewatch")
