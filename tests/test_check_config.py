"""scripts/check's ruff reads the project's settings: the line length (120) and the rule set (isort's I among
them, which ruff's defaults leave out), proved on a file given on stdin as if it were in app/."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (dev extra)")


def _ruff_check(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "--stdin-filename",
            str(ROOT / "app" / "example.py"),
            "-",
        ],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_a_line_of_120_characters_passes_and_one_of_121_does_not() -> None:
    fits = 'TEXT = "' + "x" * (120 - len('TEXT = ""')) + '"\n'
    assert len(fits.rstrip("\n")) == 120
    assert _ruff_check(fits).returncode == 0
    result = _ruff_check(fits.replace('"x', '"xx', 1))
    assert result.returncode == 1
    assert "E501" in result.stdout


def test_unsorted_imports_are_reported() -> None:
    result = _ruff_check("import sys\nimport os\n\nprint(os, sys)\n")
    assert result.returncode == 1
    assert "I001" in result.stdout
