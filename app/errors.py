"""The error an operator sees: a sentence naming what happened, where, and what to do."""

from __future__ import annotations


class EaglewatchError(Exception):
    """Base of every error that should reach the operator as a plain sentence (no traceback).

    `exit_code` is what the CLI exits with: 2 for bad input or usage, 1 for a failed operation,
    3 for a run stopped by the provider (auth, credits), 4 for a threshold check that failed.
    """

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(EaglewatchError):
    """Bad input: a config key, a JSONL line, a tokenizer dir, a database file."""

    exit_code = 2
