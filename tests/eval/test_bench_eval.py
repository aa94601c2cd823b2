"""bench/eval.py runs at a tiny size: both clients answer every prompt and the ratio is printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_eval_benchmark_runs_both_clients_and_prints_the_ratio() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "eval.py"), "--n", "24", "--cap", "4", "--median-ms", "5",
         "--p95-ms", "10"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\| eval \(adaptive, stored\) \| cap 4 \| 24 \| 24 \|", result.stdout)
    assert re.search(r"\| oracle \(fixed 4\) \| cap 4 \| 24 \| 24 \|", result.stdout)
    assert re.search(r"ratio eval/oracle = \d+\.\d{3} \(target <= 1\.10", result.stdout)
