"""The sample reference file, its cases list and the prompt datasets agree with each other and the tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def tok(sample_tokenizer_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(sample_tokenizer_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def records(sample_reference):
    return [json.loads(line) for line in sample_reference.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def cases(sample_data_dir):
    return json.loads((sample_data_dir / "reference_cases.json").read_text(encoding="utf-8"))


def _decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def test_script_reproduces_the_committed_files(repo_root, sample_data_dir, tmp_path):
    subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "build_sample_reference.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    for name in (
        "reference.jsonl",
        "reference_cases.json",
        "prompts.openai.jsonl",
        "prompts.sharegpt.jsonl",
        "prompts.specforge.jsonl",
    ):
        assert (tmp_path / name).read_bytes() == (sample_data_dir / name).read_bytes(), name


def test_a_few_hundred_samples_with_unique_ids(records):
    ids = [r["id"] for r in records]
    assert 200 <= len(ids) <= 500
    assert len(set(ids)) == len(ids)


def test_every_record_has_the_sglang_fields(records):
    for r in records:
        assert r["messages"] and r["messages"][-1]["role"] in ("user", "tool"), r["id"]
        assert r["meta_info"]["finish_reason"]["type"] in ("stop", "length"), r["id"]
        assert r["meta_info"]["completion_tokens"] == len(r["output_ids"]), r["id"]
        assert r["meta_info"]["prompt_tokens"] > 0, r["id"]


def test_output_ids_decode_cleanly(records, tok):
    for r in records:
        assert "\ufffd" not in _decode(tok, r["output_ids"]), r["id"]


def test_finished_samples_end_with_im_end_and_truncated_ones_do_not(records, cases, tok):
    im_end = tok.token_to_id("<|im_end|>")
    for r in records:
        truncated = "truncated" in cases["samples"][r["id"]]["kinds"]
        assert (r["meta_info"]["finish_reason"]["type"] == "length") is truncated, r["id"]
        assert (r["output_ids"][-1] == im_end) is (not truncated), r["id"]
        assert r["output_ids"].count(im_end) == (0 if truncated else 1), r["id"]


def test_outputs_follow_the_k25_thinking_layout(records, cases, tok):
    think_close = tok.token_to_id("</think>")
    for r in records:
        kinds = cases["samples"][r["id"]]["kinds"]
        ids = r["output_ids"]
        if "truncated" in kinds:
            continue
        assert ids.count(think_close) == 1, r["id"]
        assert tok.token_to_id("<think>") not in ids, r["id"]
        if "no_reasoning" in kinds:
            assert ids[0] == think_close, r["id"]
        text = _decode(tok, ids)
        has_tools = "<|tool_calls_section_begin|>" in text
        assert has_tools is ("tool_calls" in kinds), r["id"]
        if has_tools:
            assert text.endswith("<|tool_calls_section_end|><|im_end|>"), r["id"]


def test_tool_ids_count_across_the_conversation(records, cases, tok):
    import re

    for r in records:
        kinds = cases["samples"][r["id"]]["kinds"]
        if "tool_calls" not in kinds or "truncated" in kinds:
            continue
        earlier = sum(len(m.get("tool_calls") or []) for m in r["messages"])
        text = _decode(tok, r["output_ids"])
        found = re.findall(
            r"<\|tool_call_begin\|>functions\.([a-z_]+):(\d+)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>",
            text,
        )
        assert [int(i) for _, i, _ in found] == list(range(earlier, earlier + len(found))), r["id"]
        declared = {t["function"]["name"] for t in r["tools"]}
        for name, _, args in found:
            assert name in declared, r["id"]
            assert json.dumps(json.loads(args), separators=(",", ":"), ensure_ascii=False) == args, r["id"]


def test_cases_cover_exactly_the_reference_ids(records, cases):
    assert set(cases["samples"]) == {r["id"] for r in records}
    for sample_id, case in cases["samples"].items():
        assert case["kinds"] and set(case["kinds"]) <= set(cases["kinds"]), sample_id


def test_every_kind_is_present(cases):
    present = {k for case in cases["samples"].values() for k in case["kinds"]}
    assert present == set(cases["kinds"])


def test_a_few_percent_are_non_canonical(records, cases):
    n = sum("non_canonical" in c["kinds"] for c in cases["samples"].values())
    assert 0.02 * len(records) <= n <= 0.06 * len(records)


def test_non_canonical_samples_decode_the_same_but_reencode_differently(records, cases, tok):
    for r in records:
        case = cases["samples"][r["id"]]
        if "non_canonical" not in case["kinds"]:
            continue
        ids = r["output_ids"]
        canonical = _encode(tok, _decode(tok, ids))
        assert canonical != ids, r["id"]
        assert _decode(tok, canonical) == _decode(tok, ids), r["id"]
        pos = case["non_canonical_position"]
        assert canonical[:pos] == ids[:pos], r["id"]
        assert canonical[pos] != ids[pos], r["id"]
        merged = tok.id_to_token(ids[pos]) + tok.id_to_token(ids[pos + 1])
        assert tok.id_to_token(canonical[pos]) == merged, r["id"]


def test_all_other_samples_are_canonical(records, cases, tok):
    for r in records:
        case = cases["samples"][r["id"]]
        if "non_canonical" in case["kinds"]:
            continue
        assert "non_canonical_position" not in case, r["id"]
        assert _encode(tok, _decode(tok, r["output_ids"])) == r["output_ids"], r["id"]


def test_prompt_tokens_match_the_chat_template(records, sample_tokenizer_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(sample_tokenizer_dir))
    for r in records:
        ids = hf.apply_chat_template(r["messages"], tools=r.get("tools"), add_generation_prompt=True, tokenize=False)
        assert len(hf.encode(ids, add_special_tokens=False)) == r["meta_info"]["prompt_tokens"], r["id"]


def _jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_openai_prompts_cover_every_reference_id_with_the_same_prompt(records, sample_data_dir):
    prompts = {p["id"]: p for p in _jsonl(sample_data_dir / "prompts.openai.jsonl")}
    assert set(prompts) == {r["id"] for r in records}
    for r in records:
        assert prompts[r["id"]]["messages"] == r["messages"]
        assert prompts[r["id"]].get("tools") == r.get("tools")


def test_sharegpt_and_specforge_prompts_match_reference_prompts(records, sample_data_dir):
    by_id = {r["id"]: r for r in records}
    from_names = {"system": "system", "human": "user", "gpt": "assistant"}
    share = _jsonl(sample_data_dir / "prompts.sharegpt.jsonl")
    spec = _jsonl(sample_data_dir / "prompts.specforge.jsonl")
    assert len(share) >= 10 and len(spec) >= 10
    for row in share:
        msgs = [{"role": from_names[t["from"]], "content": t["value"]} for t in row["conversations"]]
        assert msgs == by_id[row["id"]]["messages"]
    for row in spec:
        assert row["conversations"] == by_id[row["id"]]["messages"]


def test_sample_data_stays_small(sample_data_dir):
    total = sum(p.stat().st_size for p in sample_data_dir.rglob("*") if p.is_file())
    assert total < 3_000_000
