"""bench/data_worth.py --quick end to end on real vLLM: the tiny target is built, eaglewatch regenerates the prompts
against it, the exact and the off-policy training sets get hidden states from vLLM's extractor, speculators' trainer
trains one EAGLE-3 drafter on each, vLLM serves each as a draft and `eaglewatch eval` measures it on held-out
prompts. The loop must close (every stage done, every held-out request measured, a table written), the drafter
trained on the server's own ids must beat the one trained on the dataset's own answers, and a second run over the
same work folder must skip every stage. Skips without a vLLM environment (fails under EAGLEWATCH_REQUIRE_VLLM).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realserver.conftest import vllm_python

pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(2400)

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "data_worth.py"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[Path, dict]:
    python = vllm_python()
    if python is None or not os.path.exists(python):
        message = "VLLM TESTS NOT RUN: no vLLM environment (scripts/vllm_venv.sh, EAGLEWATCH_VLLM_PYTHON)"
        if os.environ.get("EAGLEWATCH_REQUIRE_VLLM"):
            pytest.fail(message.replace("NOT RUN", "REQUIRED but missing"))
        pytest.skip(message)
    work = tmp_path_factory.mktemp("data-worth") / "work"
    proc = _bench(work, python)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return work, json.loads((work / "table.json").read_text())


def _bench(work: Path, python: str) -> subprocess.CompletedProcess:
    """`bench/data_worth.py WORK --quick`, offline, with vLLM's Python named."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"EAGLEWATCH_VLLM_PYTHON": python, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(BENCH), str(work), "--quick"], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_the_quick_loop_closes_on_every_held_out_prompt(quick_run):
    work, table = quick_run
    plan = json.loads((work / "plan.json").read_text())
    assert [r["arm"] for r in table["rows"]] == ["exact", "off-policy"]
    for stage in ("target", "prompts", "generate", "arms", "prepare", "extract", "drafters", "table"):
        assert (work / f"{stage}.done.json").exists(), stage
    drafters = json.loads((work / "drafters.done.json").read_text())
    assert sorted(drafters["eval"]) == ["exact-s0", "off-policy-s0"]
    for name, figures in drafters["eval"].items():
        assert figures["requests"] == plan["heldout"], (name, figures)
        assert len(figures["per_position_acceptance"]) == 3, (name, figures)
    for name, run in drafters["train"].items():
        assert (Path(run["draft"]) / "config.json").exists(), name
    assert "| exact |" in (work / "table.md").read_text()


def test_the_exact_arm_beats_the_off_policy_arm(quick_run):
    _, table = quick_run
    by_arm = {r["arm"]: r for r in table["rows"]}
    assert by_arm["exact"]["token_share_differing"] == 0.0
    assert by_arm["off-policy"]["token_share_differing"] > 0.3
    assert by_arm["exact"]["acceptance_length"] > by_arm["off-policy"]["acceptance_length"], table["rows"]


def test_a_second_run_over_the_work_folder_skips_every_stage(quick_run):
    work, _ = quick_run
    proc = _bench(work, str(vllm_python()))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("done before, skipped") == 8, proc.stdout
