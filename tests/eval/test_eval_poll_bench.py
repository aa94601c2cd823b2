"""bench/eval_poll.py runs end to end at a tiny size: it seeds both databases, its eval poll sees every request
stored (the seeded ones and those its stand-in engine adds before each timed poll), and it reports each figure
(no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_eval_poll_bench_runs_at_a_tiny_size(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "eval_poll.py"), "--requests", "300", "--repeat", "3",
         "--per-poll", "7", "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["stored_seen"] == 300 + 3 * 7
    for key in ("eval_poll_live_ms", "eval_poll_idle_ms", "generation_poll_ms"):
        s = out[key]
        assert 0 < s["min"] <= s["median"] <= s["max"]
    assert out["ratio_eval_to_generation"] > 0 and out["eval_first_read"]["polls"] >= 1
    assert (tmp_path / "eval.db").exists() and (tmp_path / "generation.db").exists()
