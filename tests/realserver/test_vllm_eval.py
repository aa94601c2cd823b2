"""`eaglewatch eval` against a real vLLM (the CPU build, fp32) serving the tiny Qwen3 with an ngram draft and
`--per-request-spec-decode-metrics detailed`, one server for the module: the totals eaglewatch stores (accepted
draft tokens, draft tokens, draft steps, per position) equal the deltas of vLLM's own Prometheus counters over the
run, its per-position acceptance rates agree with the counters and with vLLM's own `SpecDecoding metrics` log
lines, a draft that does get tokens accepted is not called dead, prompts that drive the tiny target into loops are
caught and left out (both figures shown), and the same drafter asked through a raw completions prompt is reported
as a template mismatch. The story prompts repeat the story the model was trained to tell, so the ngram draft finds
its continuations in the prompt. Skips without a vLLM environment, fails under EAGLEWATCH_REQUIRE_VLLM.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from app.cli import main
from tests.realserver.conftest import VLLM_LOGS, start_vllm
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
    # the gate passes a drafter that gets tokens accepted (the random EAGLE-3 draft fails it: test_vllm_eval_eagle3)
    assert main(["eval", "--headless", str(config), "--min-acceptance", "1.3"]) == 0
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


# prompts the tiny target answers with "Two plus two two two two ..." to max_tokens (found with transformers'
# greedy fp32 generate, which vLLM at fp32 reproduces)
LOOP_PROMPTS = ("Hello there, how are you?", "Hello there, how are you today?", "Hello, how are you?")
# vllm/v1/spec_decode/metrics.py SpecDecodingLogging.log (every VLLM_LOG_STATS_INTERVAL seconds with drafts)
SPEC_LOG = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: [0-9.]+, Accepted throughput: [0-9.]+ tokens/s, "
    r"Drafted throughput: [0-9.]+ tokens/s, Accepted: (\d+) tokens, Drafted: (\d+) tokens, "
    r"Per-position acceptance rate: ([0-9., ]+), Avg Draft acceptance rate"
)


def story_rows(n: int, start: int = 0) -> list[dict]:
    story = STORY[2].removesuffix("<|im_end|>")
    return [
        {
            "id": f"story-{k}",
            "messages": [
                {"role": "user", "content": "Write a long story."},
                {"role": "assistant", "content": story},
                {"role": "user", "content": "Write a long story." + " Again." * k},
            ],
        }
        for k in range(start, start + n)
    ]


def eval_config(tmp_path, rows: list[dict], base_url: str, model: str, model_dir, *, raw: bool = False) -> Path:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw_endpoint = f"""
[[endpoints]]
name = "vllm-raw"
base_url = "{base_url}"
server = "vllm"
timeout_s = 300.0
""" if raw else ""  # fmt: skip
    config = tmp_path / "eval.toml"
    config.write_text(f"""
[run]
name = "guard-eval"
database = "{tmp_path / "eval.db"}"
[[data.datasets]]
path = "{data}"
format = "openai-messages"
[model]
name = "{model}"
tokenizer = "{model_dir}"
profile = "qwen3"
[[endpoints]]
name = "vllm-ngram"
base_url = "{base_url}"
server = "vllm"
timeout_s = 300.0
{raw_endpoint}
[generation]
stream = true
[limits]
concurrency_max = 4
[eval]
drafter = "ngram(prompt_lookup_max=3)"
num_draft_tokens = {DRAFT_TOKENS}
max_tokens = 96
dead_after = 2
counter_window_requests = 3
{'raw_completion_endpoints = ["vllm-raw"]' if raw else ""}
""")
    return config


def report_of(db: Path) -> dict:
    from app.eval.report import stored_report
    from app.store import queries

    conn = queries.connect_readonly(db)
    try:
        return stored_report(conn, queries.resolve_run(conn, None))
    finally:
        conn.close()


def spec_log_lines(log: Path, offset: int) -> list[tuple[int, int, list[float]]]:
    """(accepted, drafted, per-position rates) of each SpecDecoding log line after byte `offset`."""
    text = log.read_bytes()[offset:].decode(errors="replace")
    return [(int(a), int(d), [float(x) for x in p.split(",")]) for a, d, p in SPEC_LOG.findall(text)]


def test_per_position_rates_agree_with_vllms_counters_and_its_log_line(ngram_vllm, vllm_model_dir, tmp_path):
    base_url, model = ngram_vllm
    log = VLLM_LOGS[base_url]
    time.sleep(3)  # lets vLLM log (and so close) the stats window of earlier requests: 2 s intervals here
    offset = log.stat().st_size
    config = eval_config(tmp_path, story_rows(PROMPTS), base_url, model, vllm_model_dir)
    before = spec_counters(base_url)
    assert main(["eval", "--headless", str(config)]) == 0
    after = spec_counters(base_url)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    report = report_of(tmp_path / "eval.db")
    fig = report["endpoints"]["vllm-ngram"]["figures_with_loops"]
    drafts = delta["vllm:spec_decode_num_drafts"]
    assert fig["steps"] == drafts and fig["accepted_tokens"] == delta["vllm:spec_decode_num_accepted_tokens"]
    counter_rates = [delta[f"vllm:spec_decode_num_accepted_tokens_per_pos[{k}]"] / drafts for k in range(DRAFT_TOKENS)]
    assert fig["per_position_acceptance"] == [round(r, 4) for r in counter_rates]
    assert counter_rates[0] > 0

    # vLLM's log lines of the run: their accepted and drafted sums equal the stored totals, and their
    # per-position rates (3 decimals, each over its own window's drafts) give the stored per-position counts: a
    # window's accepted tokens are the sum of its per-position counts, so position k's count is accepted x its
    # rate over the sum of the window's rates
    deadline = time.monotonic() + 60
    lines = spec_log_lines(log, offset)
    while sum(d for _, d, _ in lines) < fig["draft_tokens"] and time.monotonic() < deadline:
        time.sleep(0.5)
        lines = spec_log_lines(log, offset)
    assert sum(a for a, _, _ in lines) == fig["accepted_tokens"], lines
    assert sum(d for _, d, _ in lines) == fig["draft_tokens"], lines
    logged = [sum(a * p[k] / sum(p) for a, _, p in lines if a) for k in range(DRAFT_TOKENS)]
    stored_counts = [r * drafts for r in fig["per_position_acceptance"]]
    for k in range(DRAFT_TOKENS):
        assert logged[k] == pytest.approx(stored_counts[k], abs=1.0 + 0.01 * stored_counts[k]), (k, lines)
    if len(lines) == 1:  # one window: its rates are the run's
        assert lines[0][2] == pytest.approx(fig["per_position_acceptance"], abs=0.0006)

    # the counter windows eaglewatch scraped around the run add up to the same deltas
    conn = sqlite3.connect(tmp_path / "eval.db")
    windows = conn.execute("SELECT drafts, accepted, per_position, requests FROM eval_windows").fetchall()
    conn.close()
    assert len(windows) >= 2 and sum(w[3] for w in windows) == PROMPTS
    assert sum(w[0] for w in windows) == drafts
    assert sum(w[1] for w in windows) == fig["accepted_tokens"]
    assert [sum(json.loads(w[2])[k] for w in windows) for k in range(DRAFT_TOKENS)] == [
        delta[f"vllm:spec_decode_num_accepted_tokens_per_pos[{k}]"] for k in range(DRAFT_TOKENS)
    ]


def test_prompts_that_loop_the_target_are_caught_and_left_out(ngram_vllm, vllm_model_dir, tmp_path):
    base_url, model = ngram_vllm
    # story-1 ("... Again.") loops too: the healthy ones are the stories that do not
    healthy = [r for r in story_rows(4) if r["id"] != "story-1"]
    rows = healthy + [{"id": f"loop-{k}", "messages": [{"role": "user", "content": p}]}
                      for k, p in enumerate(LOOP_PROMPTS)]  # fmt: skip
    config = eval_config(tmp_path, rows, base_url, model, vllm_model_dir)
    assert main(["eval", "--headless", str(config)]) == 0
    conn = sqlite3.connect(tmp_path / "eval.db")
    loops = dict(conn.execute("SELECT s.sample_id, e.loop FROM eval_requests e JOIN samples s ON s.pk = e.sample_pk"))
    conn.close()
    assert loops == {**{r["id"]: 0 for r in healthy}, **{f"loop-{k}": 1 for k in range(3)}}
    ep = report_of(tmp_path / "eval.db")["endpoints"]["vllm-ngram"]
    assert ep["loops"] == 3
    assert ep["figures"]["requests"] == 3 and ep["figures_with_loops"]["requests"] == 6
    # the loops accept nearly every draft: they flatter the drafter, so they are left out
    assert ep["figures_with_loops"]["mean_acceptance_length"] > ep["figures"]["mean_acceptance_length"]
    (verdict,) = [v for v in ep["verdicts"] if v["verdict"] == "repetition loops"]
    assert "3 outputs caught in a repetition loop were left out" in verdict["message"]


def test_a_raw_completions_prompt_is_reported_as_a_template_mismatch(ngram_vllm, vllm_model_dir, tmp_path):
    base_url, model = ngram_vllm
    # single-turn prompts: the tiny model's own template keeps an earlier turn's think block, which eaglewatch's
    # qwen3 renderer drops (as Qwen3's does), so the story conversations differ even through the chat template
    rows = [{"id": f"case-{k}", "messages": case[0]} for k, case in enumerate(CASES) if case[1] is None][:3]
    config = eval_config(tmp_path, rows, base_url, model, vllm_model_dir, raw=True)
    assert main(["eval", "--headless", str(config)]) == 0
    conn = sqlite3.connect(tmp_path / "eval.db")
    rows = conn.execute("SELECT endpoint, prompt_ids, template, spec_source FROM eval_requests").fetchall()
    conn.close()
    chat = [r for r in rows if r[0] == "vllm-ngram"]
    raw = [r for r in rows if r[0] == "vllm-raw"]
    assert len(chat) == len(raw) == 3 and all(r[1] for r in rows)
    assert all(r[2] is None for r in chat)  # the chat template's prompt ids agree with eaglewatch's rendering
    finding = json.loads(raw[0][2])
    assert finding["position"] == 0 and finding["rendered_token"] == "<|im_start|>"
    report = report_of(tmp_path / "eval.db")
    # (these short single-turn answers give the ngram draft nothing to match: vLLM reports no acceptance)
    assert "template mismatch" not in [v["verdict"] for v in report["endpoints"]["vllm-ngram"]["verdicts"]]
    (mismatch,) = [v for v in report["endpoints"]["vllm-raw"]["verdicts"] if v["verdict"] == "template mismatch"]
    assert "in 3 of 3 requests; first at position 0" in mismatch["message"]
    assert "rendered id" in mismatch["message"] and "'<|im_start|>'" in mismatch["message"]
