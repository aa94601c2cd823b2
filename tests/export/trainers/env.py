"""The trainer environment (scripts/trainer_venv.sh): where it is, and running the consumers' own loaders in it.

The consumers' code runs in a child process whose PYTHONPATH puts the trainer folder (SpecForge, speculators,
Model-Optimizer, installed with --no-deps) before the checkout, so nothing of it leaks into the test process.
Without the folder the tests skip with a loud reason; with EAGLEWATCH_REQUIRE_TRAINERS=1 (scripts/test sets
it after building the folder) they fail instead, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# one line per trainer route a test proved (counts of rows, ids and masks equal), printed at the end of the session
PROVEN: list[str] = []


def proven(line: str) -> None:
    """Record what a test measured through a trainer's own code (tests/export/conftest.py prints the list)."""
    PROVEN.append(line)


def trainer_site() -> Path:
    """The trainer folder, or skip (fail under EAGLEWATCH_REQUIRE_TRAINERS=1) when it was not built."""
    site = Path(os.environ.get("EAGLEWATCH_TRAINERS_SITE") or ROOT / ".trainers" / "site")
    if not (site / ".eaglewatch-stamp").exists():
        reason = (f"TRAINER ENV ABSENT: {site} not built; run scripts/trainer_venv.sh to test eaglewatch's outputs "
                  "through SpecForge, speculators and Model-Optimizer's own loaders")
        if os.environ.get("EAGLEWATCH_REQUIRE_TRAINERS"):
            pytest.fail(reason)
        pytest.skip(reason)
    return site


def _env(scratch: Path, overlay: str | None = None) -> dict[str, str]:
    site = trainer_site()
    if overlay and not (site / "overlays" / overlay).is_dir():
        reason = (f"TRAINER ENV OUTDATED: {site} has no overlays/{overlay} (built by an older scripts/trainer_venv.sh); "
                  "run scripts/trainer_venv.sh again")
        if os.environ.get("EAGLEWATCH_REQUIRE_TRAINERS"):
            pytest.fail(reason)
        pytest.skip(reason)
    paths = ([str(site / "overlays" / overlay)] if overlay else []) + [str(site), str(ROOT)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "TOKENIZERS_PARALLELISM": "false",
            "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(scratch / "hf-cache"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def run_consumer(check: str, *args: str | Path, result: Path, overlay: str | None = None) -> dict:
    """Run `tests/export/trainers/consumers.py CHECK ARGS... RESULT` in the trainer env (with `overlay`, the
    folder of scripts/trainer_venv.sh's overlays put first); return its JSON summary (what it loaded is in
    RESULT, a torch.save file)."""
    env = _env(result.parent, overlay)
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("consumers.py")), check,
                           *map(str, args), str(result)], capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise AssertionError(f"consumer check {check} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_trainer_cli(module: str, *args: str | Path, scratch: Path) -> subprocess.CompletedProcess:
    """Run a trainer's own command line, `python -m MODULE ARGS...` (e.g. `speculators prepare-data`), in the
    trainer env; the finished process (its exit status and output), whatever the status."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          env=_env(scratch), timeout=900, cwd=scratch)
