"""Smoke test: `eaglewatch demo` in a real terminal (tmux): live numbers, keys, pause/resume, quit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

TMUX = shutil.which("tmux")
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed, so there is no real terminal to drive")


class Terminal:
    """A detached tmux session running one command; keys in, screen text out."""

    def __init__(self, name: str, command: str, width: int = 100, height: int = 30) -> None:
        self.name = name
        env = {"TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none"}
        exports = " ".join(f"{k}={v}" for k, v in env.items())
        subprocess.run(
            [
                TMUX,
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                str(width),
                "-y",
                str(height),
                f"cd {REPO} && env {exports} {command}; echo EXITED $?; sleep 60",
            ],
            check=True,
        )

    def screen(self) -> str:
        out = subprocess.run([TMUX, "capture-pane", "-p", "-t", self.name], capture_output=True, text=True)
        return out.stdout

    def press(self, *keys: str) -> None:
        for key in keys:
            subprocess.run([TMUX, "send-keys", "-t", self.name, key], check=True)
            if key == "Escape":
                time.sleep(0.3)  # ESC followed at once by a key reads as alt+key

    def wait_for(self, pattern: str, timeout: float = 15.0) -> str:
        """The screen once `pattern` (a regex) shows on it; fails with the last screen otherwise."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if re.search(pattern, text):
                return text
            time.sleep(0.25)
        pytest.fail(f"{pattern!r} did not appear within {timeout} s; the screen was:\n{text}")

    def wait_gone(self, pattern: str, timeout: float = 15.0) -> None:
        """Wait until `pattern` no longer shows (e.g. a modal closed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not re.search(pattern, self.screen()):
                return
            time.sleep(0.25)
        pytest.fail(f"{pattern!r} still showed after {timeout} s:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run([TMUX, "kill-session", "-t", self.name], capture_output=True)


def test_demo_runs_live_and_answers_keys(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    term = Terminal(f"ew-smoke-{os.getpid()}", f"{sys.executable} -m app.cli demo --no-mouse --db {db}")
    try:
        # Live numbers: samples finishing (N/368: 300 prompts and 68 conversation turns, N > 0) while RUNNING.
        term.wait_for(r"RUNNING\s+demo · [1-9][\d,]*/368", timeout=25)
        term.press("m")
        screen = term.wait_for(r"mismatches · ")
        assert "sample" in screen and "verdict" in screen
        term.press("Escape")
        term.wait_for(r"(RUNNING|PAUSED|DONE)\s+(\(.*\)\s+)?demo")
        term.press("p")
        term.wait_for(r"PAUSED")
        term.press("p")
        term.wait_for(r"RUNNING")
        term.press("?")
        term.wait_for(r"keys · dashboard")
        term.press("Escape")
        term.wait_gone(r"keys · dashboard")
        term.press("q")
        term.wait_for(r"Stop it and quit\?")
        term.press("y")
        term.wait_for(r"EXITED 0", timeout=20)
    finally:
        term.close()
