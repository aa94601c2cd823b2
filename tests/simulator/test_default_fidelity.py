"""Proven by default, per server personality × quirk mix: the engine with its default settings (no calibrate, no
reference, probes as they come) over the simulator, then the default export. No exported sample carries other ids
than the model's (the reference's, which the simulator replays by sample id); the yield — exported samples among
those whose text can carry their ids at all (a canonical encoding) — is reported for each mix.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.cli import main
from app.config import parse_config
from app.engine.fidelity.pool import build_reconstructor
from app.tokens import Reconstructor, get_profile, load_tokenizer, split_output
from app.tokens.reconstruct import Fields
from tests.engine.conftest import until  # noqa: F401 - the engine tests' helpers, shared
from tests.realserver.tiny_qwen3 import WEATHER_TOOL, build_tokenizer

KIMI_N = 60
YIELDS: list[str] = []

# Qwen3-layout answers with the edges that stripping servers lose (a leading space, a trailing newline), empty
# thinking, tool calls with and without content, non-ASCII arguments, a cut; the last four share one prompt
QWEN_OUTPUTS = [
    "<think>\nThe user greets me.\n</think>\n\nHello! How can I help you today?<|im_end|>",
    "<think>\nA number.\n</think>\n\n increasing values follow.<|im_end|>",
    "<think>\nList them.\n</think>\n\nOne, two.\n<|im_end|>",
    "<think>\n\n</think>\n\nJust the answer.<|im_end|>",
    '<think>\nI should call the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
    "\n</tool_call><|im_end|>",
    '<think>\nCheck first.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Beijing"}}\n</tool_call><|im_end|>',
    '<think>\nZurich.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}'
    "\n</tool_call><|im_end|>",
    "<think>\nA long thought that never",
    "<think>\nHmm \n</think>\n\nOk.<|im_end|>",
    "<think>\nTwo paragraphs.\n</think>\n\nLine one.\n\nLine two.<|im_end|>",
    "<think>\nSame prompt, first answer.\n</think>\n\nFirst.<|im_end|>",
    "<think>\nSame prompt, second answer.\n</think>\n\nSecond.<|im_end|>",
    "<think>\nSame prompt, third answer.\n</think>\n\n Third.<|im_end|>",
    "<think>\nSame prompt, fourth answer.\n</think>\n\nFourth.\n<|im_end|>",
]


@pytest.fixture(scope="module")
def qwen_data(tmp_path_factory) -> Path:
    """A Qwen3-layout data folder: tiny tokenizer (with Qwen3's NFC normaliser), prompts, reference ids."""
    root = tmp_path_factory.mktemp("qwen-data")
    build_tokenizer(root / "tokenizer")
    tok = load_tokenizer(root / "tokenizer")
    with open(root / "prompts.openai.jsonl", "w") as prompts, open(root / "reference.jsonl", "w") as ref:
        for copy in range(3):
            for k, text in enumerate(QWEN_OUTPUTS):
                sid = f"q{copy}-{k}"
                content = "one prompt shared by four samples" if k >= 10 else f"prompt {copy} {k}"
                messages = [{"role": "user", "content": content}]
                row = {"id": sid, "messages": messages}
                if "tool_call" in text:
                    row["tools"] = [WEATHER_TOOL]
                prompts.write(json.dumps(row) + "\n")
                ref.write(json.dumps({"id": sid, "messages": messages, "output_ids": tok.encode(text)}) + "\n")
    return root


def _config(tmp_path: Path, data: Path, profile: str, endpoint: dict, stream: bool, n: int | None):
    dataset = {"path": str(data / "prompts.openai.jsonl")}
    if n is not None:
        dataset["limit"] = n
    return parse_config(
        {
            "run": {"name": "defaults", "database": str(tmp_path / "run.db"), "output_dir": str(tmp_path / "out")},
            "data": {"datasets": [dataset]},
            "model": {"name": "m", "tokenizer": str(data / "tokenizer"), "profile": profile},
            "endpoints": [endpoint],
            "generation": {"max_tokens": 4096, "stream": stream, "attempts": 2},
            "limits": {"concurrency_initial": 8, "concurrency_min": 1, "concurrency_max": 16},
            "pricing": {"m": {"prompt_per_m": 0.0, "completion_per_m": 0.0}},
        },
        base_dir=tmp_path,
    )


async def _run(config) -> None:
    from app.engine.run import Run
    from app.engine.work.config_ingest import ingest_config
    from app.store.run_store import RunStore

    store = await RunStore.open(config.run.database)
    try:
        await ingest_config(store, config)
        run = Run(config, store, reconstructor=build_reconstructor(config))
        try:
            await run.start()
            outcome = await asyncio.wait_for(run.wait(), 60)
        finally:
            await run.close()
    finally:
        await store.close()
    assert outcome.state == "done", outcome


def _export(tmp_path: Path, db: Path, capsys) -> tuple[dict[str, list[int]], dict]:
    out = tmp_path / "export"
    capsys.readouterr()
    assert main(["export", "--db", str(db), "--format", "sglang-raw", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {}
    for line in (out / "data" / "sglang_raw.jsonl").read_text().splitlines():
        obj = json.loads(line)
        rows[obj["id"]] = obj["output_ids"]
    return rows, report


def _truth(data: Path) -> dict[str, list[int]]:
    return {o["id"]: o["output_ids"] for o in map(json.loads, (data / "reference.jsonl").read_text().splitlines())}


def _can_carry(rec: Reconstructor, ids: list[int]) -> bool:
    """A finished answer whose ids are the canonical encoding of what an ideal server returns for them."""
    view = split_output(ids, rec.profile, rec.tokenizer)
    return view.finish_reason != "length" and rec.encode_fields(
        Fields(view.reasoning, view.content, view.tool_calls, view.finish_reason)
    ) == list(ids)


MIXES = [
    ("kimi-k2.5", "openrouter", []),
    ("kimi-k2.5", "openrouter", ["think_spaces"]),
    ("kimi-k2.5", "openrouter", ["strip_whitespace"]),
    ("kimi-k2.5", "openrouter", ["json_reserialised", "replacement_char"]),
    ("kimi-k2.5", "openrouter", ["tool_whitespace", "no_content", "tool_ids_reindexed"]),
    ("kimi-k2.5", "vllm", []),
    ("kimi-k2.5", "vllm", ["think_spaces", "json_reserialised"]),
    ("kimi-k2.5", "sglang", []),
    ("kimi-k2.5", "sglang", ["strip_whitespace"]),
    ("qwen3", "transformers-serve", []),
    ("qwen3", "openrouter", []),
    ("qwen3", "vllm", ["strip_whitespace"]),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("profile", "personality", "quirks"), MIXES, ids=[f"{p}-{s}-{'+'.join(q) or 'clean'}" for p, s, q in MIXES]
)
async def test_defaults_export_no_wrong_ids(
    tmp_path, sample_data_dir, qwen_data, capsys, profile, personality, quirks, stream
):
    data = sample_data_dir if profile == "kimi-k2.5" else qwen_data
    sim = {
        "latency_median_ms": 0.0,
        "latency_p95_ms": 0.0,
        "tokens_per_s": 0.0,
        "seed": 5,
        "logprobs": True,
        "personality": personality,
        "quirks": quirks,
        "reference": str(data / "reference.jsonl"),
    }
    config = _config(
        tmp_path,
        data,
        profile,
        {"name": "sim", "simulator": sim, "timeout_s": 10.0},
        stream,
        KIMI_N if profile == "kimi-k2.5" else None,
    )
    await _run(config)
    rows, report = await asyncio.to_thread(_export, tmp_path, config.run.database, capsys)
    truth = _truth(data)
    rec = Reconstructor(get_profile(profile), load_tokenizer(data / "tokenizer"))
    asked = {
        json.loads(line)["id"]
        for line in (data / "prompts.openai.jsonl")
        .read_text()
        .splitlines()[: KIMI_N if profile == "kimi-k2.5" else None]
    }
    carry = {sid for sid in asked if _can_carry(rec, truth[sid])}
    wrong = sorted(sid for sid, ids in rows.items() if ids != truth[sid])
    kept = len(carry & set(rows))
    line = (
        f"{profile:9} {personality:18} {'+'.join(quirks) or 'clean':45} {'stream' if stream else 'plain':6} "
        f"exported {len(rows):3} of {len(asked):3}, kept {kept:3} of {len(carry):3} that can carry "
        f"({kept / max(1, len(carry)):.0%}); ids {report['ids_sources']}; wrong {len(wrong)}"
    )
    YIELDS.append(line)
    print("\n" + line + (f"\n  warnings: {report['warnings']}" if report["warnings"] else ""))
    assert wrong == [], (wrong, report)
