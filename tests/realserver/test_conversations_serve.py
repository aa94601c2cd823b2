"""Whole conversations regenerated against a real `transformers serve` (the tiny Qwen3-layout model): every turn's
request carries the model's own earlier answers and none of the dataset's, and the export's per-turn rows' prompt
ids are transformers' apply_chat_template of each turn's request."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realserver.test_transformers_serve import _cli
from tests.realserver.tiny_qwen3 import WEATHER_TOOL

pytestmark = pytest.mark.timeout(900)

MAX_TOKENS = 64  # the trained answers are shorter; a small budget keeps the CPU cost of the run low
DATASET = "The dataset says:"  # every recorded answer starts so: none may reach a request

CONVERSATIONS = [
    {
        "id": "conv-hello",
        "messages": [
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": f"{DATASET} hi there."},
            {"role": "user", "content": "What is two plus two?"},
            {"role": "assistant", "content": f"{DATASET} four."},
        ],
    },
    {
        "id": "conv-again",
        "messages": [
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": f"{DATASET} hello."},
            {"role": "user", "content": "What is two plus two?"},
            {"role": "assistant", "content": f"{DATASET} it is four."},
            {"role": "user", "content": "Say hello."},
        ],
    },
    {
        "id": "conv-weather",
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": f"{DATASET} let me look.",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": '{"temp_c": 21}'},
            {"role": "assistant", "content": f"{DATASET} 21 degrees in Paris."},
        ],
    },
]


def _env() -> dict[str, str]:
    return {
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
    }


def _write(tmp_path, base_url, model_dir):
    data = tmp_path / "conversations.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS), encoding="utf-8")
    config = tmp_path / "conv.toml"
    config.write_text(f"""
[run]
name = "conversations"
database = "{tmp_path / "conv.db"}"
output_dir = "{tmp_path / "out"}"

[[data.datasets]]
path = "{data}"
format = "openai-messages"
regenerate = "all"
on_tool_divergence = "replay"

[model]
name = "{model_dir}"
tokenizer = "{model_dir}"
profile = "qwen3"

[[endpoints]]
name = "serve"
base_url = "{base_url}"
server = "transformers-serve"
max_concurrency = 2
timeout_s = 120.0

[generation]
max_tokens = {MAX_TOKENS}
temperature = 0.0
attempts = 2

[limits]
concurrency_initial = 2
concurrency_min = 1
concurrency_max = 2

[pricing."{model_dir}"]
prompt_per_m = 0.0
completion_per_m = 0.0
""")
    return config


def test_conversations_regenerate_on_the_models_own_history_and_export_its_prompts(
    real_server, tiny_model_dir, tmp_path
):
    from transformers import AutoTokenizer

    base_url, model = real_server
    config = _write(tmp_path, base_url, model)
    # the tiny model may answer an untrained history with a broken tool call (the server's 500): that turn fails
    # and ends its conversation, which `run` reports with exit status 1
    done_run = subprocess.run(
        [sys.executable, "-m", "app.cli", "run", "--headless", str(config)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done_run.returncode in (0, 1), done_run.stderr[-3000:]
    db = tmp_path / "conv.db"
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        turns = {
            r["sample_id"]: dict(r)
            for r in conn.execute(
                "SELECT s.sample_id, s.conversation_id, s.turn, s.state, s.messages, s.tools, r.content, r.tool_calls "
                "FROM samples s LEFT JOIN responses r ON r.sample_pk = s.pk AND r.content IS NOT NULL ORDER BY s.pk"
            )
        }
    finally:
        conn.close()
    done = {sid: t for sid, t in turns.items() if t["state"] == "done"}
    later = [t for t in done.values() if t["turn"] > 1]
    assert len(later) >= 3, {sid: (t["state"]) for sid, t in turns.items()}
    assert done.get("conv-weather#2") is not None  # the tool result turn, after the model's own call
    for t in later:
        messages = json.loads(t["messages"])
        answers = [m for m in messages if m["role"] == "assistant"]
        assert len(answers) == t["turn"] - 1
        for k, answer in enumerate(answers, 1):  # turn k's request holds the model's answers to turns 1..k-1
            own = turns[f"{t['conversation_id']}#{k}"]
            assert (answer.get("content") or "") == (own["content"] or ""), (t["sample_id"], k)
            assert DATASET not in (answer.get("content") or "")
            calls = json.loads(own["tool_calls"] or "[]")
            assert [c["function"]["name"] for c in answer.get("tool_calls") or []] == [c["name"] for c in calls]

    out = tmp_path / "export"
    # every done turn, whatever its verdict: this checks the prompt side of each row
    _cli(
        "export",
        "--db",
        str(db),
        "--format",
        "eagle3-shards",
        "--out",
        str(out),
        "--keep-truncated",
        "--keep-suspect",
        "--keep-roundtrip-failed",
        "--accept-unverified",
        timeout=120,
    )
    hf = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = {}
    for path in sorted((out / "data").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            obj = json.loads(line)
            rows[obj["id"]] = obj
    assert set(rows) == set(done)
    for sid, row in rows.items():
        t = done[sid]
        want = hf.apply_chat_template(
            json.loads(t["messages"]),
            tools=json.loads(t["tools"]) if t["tools"] else None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        mask = row["loss_mask"]
        start = mask.index(1)
        assert row["input_ids"][:start] == list(want), sid
        assert all(mask[start:]) and not any(mask[:start]), sid  # one span: this turn's answer
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["conversations"]["conversations"] == 3
    assert manifest["conversations"]["exported_turns"] == len(done)
    merged = tmp_path / "merged"
    _cli(
        "export",
        "--db",
        str(db),
        "--format",
        "eagle3-shards",
        "--out",
        str(merged),
        "--keep-truncated",
        "--keep-suspect",
        "--keep-roundtrip-failed",
        "--accept-unverified",
        "--conversations",
        "merged",
        timeout=120,
    )
    counts = json.loads((merged / "manifest.json").read_text())["conversations"]
    print(f"\nreal server conversations: {len(done)} of {len(turns)} turns done; merged export: {counts}")
    assert counts["merged"] + sum(counts["per_turn"].values()) + counts["none_kept"] == 3
