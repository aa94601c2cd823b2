"""Export with the real Kimi K2.5 tokenizer files: prompt + completion ids equal the server's tokenization.

The Kimi files ship no chat template (K2.5 renders it in remote code), so the export is given the sample
tokenizer's K2.5-style template with --chat-template; the ids come from the real tiktoken vocabulary.
"""

from __future__ import annotations

import json

import pytest

from app.export import Export, ExportOptions, assistant_turn, load_chat_template
from app.extract.manifest import read_manifest, read_shard
from app.tokens import get_profile, load_tokenizer, split_output
from tests.export.conftest import build_run_db

pytestmark = pytest.mark.kimi

# From ../shared/reference/tokenization.md 1.3, verified there against the real files.
WEATHER_OUTPUT = (
    "Let me check the weather.</think>I'll look it up.<|tool_calls_section_begin|><|tool_call_begin|>"
    'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|>'
    "<|tool_calls_section_end|><|im_end|>"
)
WEATHER_IDS = [
    9413,
    1019,
    2598,
    276,
    10666,
    13,
    163607,
    65447,
    1799,
    483,
    979,
    13,
    163595,
    163597,
    41937,
    1150,
    21055,
    2800,
    25,
    15,
    163598,
    8264,
    37666,
    1289,
    414,
    4396,
    39556,
    16934,
    163599,
    163596,
    163586,
]


@pytest.fixture(scope="module")
def kimi_export(kimi_tokenizer_dir, sample_tokenizer_dir, sample_reference, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kimi")
    kimi = load_tokenizer(kimi_tokenizer_dir)
    small = load_tokenizer(sample_tokenizer_dir)
    rows, cases = [], {"samples": {}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    rows.append(
        {
            "id": "weather",
            "messages": [{"role": "user", "content": "What's the weather in Beijing?"}],
            "tools": tools,
            "output_ids": WEATHER_IDS,
            "meta_info": {"finish_reason": {"type": "stop"}},
        }
    )
    for line in sample_reference.read_text(encoding="utf-8").splitlines()[:40]:
        rec = json.loads(line)
        if rec["meta_info"]["finish_reason"]["type"] != "stop":
            continue
        rec["output_ids"] = kimi.encode(small.decode(rec["output_ids"]))
        rows.append(rec)
    for rec in rows:
        cases["samples"][rec["id"]] = {"kinds": ["short"]}
    reference = tmp / "kimi_reference.jsonl"
    reference.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    db = tmp / "kimi.db"
    build_run_db(db, reference, kimi_tokenizer_dir, cases, mismatches=0)
    template = tmp / "k25.jinja"
    template.write_text(load_chat_template(sample_tokenizer_dir).text, encoding="utf-8")
    out = tmp / "out"
    Export(db, out, "eagle3-shards", ExportOptions(chat_template=template)).run()
    manifest = read_manifest(out)
    samples = {s.sample_id: s for e in manifest.shards for s in read_shard(e)}
    return kimi, template, {r["id"]: r for r in rows}, samples, manifest


def test_kimi_marker_ids_frame_the_prompt_and_completion(kimi_export):
    kimi, _, _, samples, _ = kimi_export
    sample = samples["weather"]
    n_prompt = sample.loss_mask.index(1)
    prompt, completion = list(sample.input_ids[:n_prompt]), list(sample.input_ids[n_prompt:])
    assert completion == WEATHER_IDS
    assert kimi.decode(completion) == WEATHER_OUTPUT
    # <|im_assistant|> 'assistant' <|im_middle|> <think> closes the prompt; the tool declaration opens it
    assert prompt[0] == 163594 and prompt[-1] == 163606
    assert prompt[-2] == 163601 and 163588 in prompt[-5:]
    assert prompt.count(163586) == 2  # tool_declare and the user turn end with <|im_end|>


def test_kimi_input_ids_equal_the_server_rendering_of_the_whole_conversation(kimi_export):
    kimi, template_path, records, samples, manifest = kimi_export
    template = load_chat_template(template_path.parent, template_path)
    profile = get_profile("kimi-k2.5")
    assert manifest.tokenizer_fingerprint == kimi.fingerprint
    assert len(samples) >= 20
    for sid, sample in samples.items():
        rec = records[sid]
        view = split_output(rec["output_ids"], profile, kimi)
        text = template.render(
            [*rec["messages"], assistant_turn(view)],
            rec.get("tools"),
            add_generation_prompt=False,
            preserve_thinking=True,
        )
        assert kimi.encode(text) == list(sample.input_ids), sid
