"""A real vLLM's thinking budget, met as a user would: `thinking_token_budget` sent through the endpoint's `extra`
(vLLM 0.32 accepts it with the qwen3 reasoning parser on: `ReasoningConfig` takes `<think>` / `</think>` from the
parser). vLLM closes the reasoning itself at the budget and says nothing of it (an ordinary finish_reason): the
engine measures it, flags the sample `intervened:thinking_budget`, counts it in `status --json` and the export
leaves it out; an answer whose reasoning fits the budget, or that has none, is not flagged."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.realserver.test_transformers_serve import _cli
from tests.realserver.test_vllm import _endpoint, _sid, _write
from tests.realserver.tiny_qwen3 import CASES, VLLM_CASES

BUDGET = 4  # reasoning tokens: "Say hello." and "What is two plus two?" think longer, "Answer at once" not at all


def test_vllms_thinking_budget_stop_is_flagged_counted_and_not_exported(vllm_server, vllm_model_dir, tmp_path):
    base_url, model = vllm_server
    cases = [CASES[0], CASES[1], VLLM_CASES[0]]
    config = _write(
        tmp_path,
        "budget",
        cases,
        _endpoint("vllm", base_url, 'server = "vllm"', f"extra = {{ thinking_token_budget = {BUDGET} }}"),
        stream=False,
        model=model,
        model_dir=vllm_model_dir,
    )
    _cli("run", "--headless", str(config))
    db = tmp_path / "budget.db"
    with sqlite3.connect(db) as conn:
        flags = {
            sid: json.loads(f or "[]")
            for sid, f in conn.execute(
                "SELECT s.sample_id, r.flags FROM samples s JOIN reconstructions r ON r.sample_pk = s.pk"
            )
        }
        reasoning = dict(
            conn.execute(
                "SELECT s.sample_id, p.reasoning FROM samples s JOIN reconstructions r ON r.sample_pk = s.pk "
                "JOIN responses p ON p.id = r.response_id"
            ).fetchall()
        )
    budgeted = {_sid(0), _sid(1)}
    assert {sid for sid, f in flags.items() if "intervened:thinking_budget" in f} == budgeted, (flags, reasoning)
    status = json.loads(_cli("status", "--db", str(db), "--json").stdout)
    run = status["runs"][0]
    assert run["interventions"] == {"samples": 2, "by_kind": {"thinking_budget": 2}}
    out = tmp_path / "export"
    report = json.loads(
        _cli("export", "--db", str(db), "--format", "sglang-raw", "--out", str(out), "--json", timeout=120).stdout
    )
    assert report["skipped"]["intervened"] == 2, report["skipped"]
    rows = [json.loads(line) for path in (Path(out) / "data").glob("*.jsonl") for line in path.read_text().splitlines()]
    assert not {row["id"] for row in rows} & budgeted
