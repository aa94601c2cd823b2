"""`eaglewatch eval` against a real vLLM (the CPU build, fp32) serving the tiny Qwen3 with an ngram draft and
`--per-request-spec-decode-metrics detailed`: the totals eaglewatch stores (accepted draft tokens, draft tokens,
draft steps, per position) equal the deltas of vLLM's own Prometheus counters over the run, and a draft that does
get tokens accepted is not called dead. The prompts repeat the story the model was trained to tell, so the ngram
draft finds its continuations in the prompt. Skips without a vLLM environment, fails under EAGLEWATCH_REQUIRE_VLLM.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import defaultdict

import httpx
import pytest

from app.cli import main
from tests.realserver.conftest import start_vllm
from tests.realserver.tiny_qwen3 import CASES

pytestmark = pytest.mark.timeout(900)

DRAFT_TOKENS = 3
STORY = next(case for case in CASES if case[0][0]["content"] == "Write a long story.")
PROMPTS = 8


@pytest.fixture(scope="module")
def ngram_vllm(vllm_model_dir):
    spec = {"method": "ngram", "num_speculative_tokens": DRAFT_TOKENS, "prompt_lookup_max": 3}
    yield from start_vllm(
        vllm_model_dir, ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
    )


def spec_counters(base_url: str) -> dict[str, float]:
    """vLLM's spec-decode counters from /metrics, summed over their labels (per position by `position`)."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = re.match(r"^(vllm:spec_decode_\w+?)(?:_total)?(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        pos = re.search(r'position="(\d+)"', labels)
        out[name + (f"[{pos.group(1)}]" if pos else "")] += value
    return out


def test_stored_acceptance_equals_vllms_counter_deltas_and_ngram_is_not_dead(ngram_vllm, vllm_model_dir, tmp_path):
    base_url, model = ngram_vllm
    story = STORY[2].removesuffix("<|im_end|>")
    data = tmp_path / "prompts.jsonl"
    with open(data, "w", encoding="utf-8") as out:
        for k in range(PROMPTS):
            messages = [
                {"role": "user", "content": "Write a long story."},
                {"role": "assistant", "content": story},
                {"role": "user", "content": "Write a long story." + " Again." * k},
            ]
            out.write(json.dumps({"id": f"story-{k}", "messages": messages}) + "\n")
    config = tmp_path / "eval.toml"
    config.write_text(f"""
[run]
name = "ngram-eval"
database = "{tmp_path / "eval.db"}"
[[data.datasets]]
path = "{data}"
format = "openai-messages"
[model]
name = "{model}"
tokenizer = "{vllm_model_dir}"
profile = "qwen3"
[[endpoints]]
name = "vllm-ngram"
base_url = "{base_url}"
server = "vllm"
timeout_s = 300.0
[generation]
stream = true
[limits]
concurrency_max = 4
[eval]
drafter = "ngram(prompt_lookup_max=3)"
num_draft_tokens = {DRAFT_TOKENS}
max_tokens = 96
dead_after = {PROMPTS}
""")
    before = spec_counters(base_url)
    assert main(["eval", "--headless", str(config)]) == 0
    after = spec_counters(base_url)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}

    conn = sqlite3.connect(tmp_path / "eval.db")
    rows = conn.execute(
        "SELECT accepted, drafted, steps, per_position, spec_source, error FROM eval_requests"
    ).fetchall()
    conn.close()
    assert len(rows) == PROMPTS and all(r[5] is None and r[4] == "vllm" for r in rows), rows
    assert sum(r[0] for r in rows) == delta["vllm:spec_decode_num_accepted_tokens"]
    assert sum(r[1] for r in rows) == delta["vllm:spec_decode_num_draft_tokens"]
    assert sum(r[2] for r in rows) == delta["vllm:spec_decode_num_drafts"]
    for k in range(DRAFT_TOKENS):
        per_pos = sum(json.loads(r[3])[k] for r in rows)
        assert per_pos == delta[f"vllm:spec_decode_num_accepted_tokens_per_pos[{k}]"], k
    assert sum(r[0] for r in rows) > 0

    from app.eval.report import stored_report
    from app.store import queries

    conn = queries.connect_readonly(tmp_path / "eval.db")
    try:
        report = stored_report(conn, queries.resolve_run(conn, None))
    finally:
        conn.close()
    assert report["overall"]["figures"]["mean_acceptance_length"] > 1.1
    assert "dead drafter" not in [v["verdict"] for v in report["verdicts"]]
