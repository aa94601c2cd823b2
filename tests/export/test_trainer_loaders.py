"""Every sample of a demo export loaded through the trainers' own code (SpecForge, speculators,
Model-Optimizer; scripts/trainer_venv.sh builds their environment) with zero differences from eaglewatch's ids
and masks. The loaders run in a child process (tests/export/trainers/consumers.py names the function each calls)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from app.export import export_run
from app.extract.manifest import read_manifest, read_shard
from tests.export.trainers.env import run_consumer, trainer_site

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def truth(built_run, tmp_path_factory):
    """eaglewatch's own ids and masks per sample: the eagle3-shards export of the demo run, in export order."""
    trainer_site()
    out = tmp_path_factory.mktemp("truth") / "shards"
    export_run(built_run.db, out, "eagle3-shards", shard_size=100000)
    samples = [s for e in read_manifest(out).shards for s in read_shard(e)]
    return out, {s.sample_id: (list(s.input_ids), list(s.loss_mask)) for s in samples}, [s.sample_id for s in samples]


@pytest.fixture(scope="module")
def specforge_text(built_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("sf") / "sf"
    report = export_run(built_run.db, out, "specforge-text")
    return out, report, json.loads((out / "manifest.json").read_text())


def test_specforge_preformatted_text_gives_the_shard_ids(truth, built_run, specforge_text, sample_tokenizer_dir,
                                                         tmp_path):
    """SpecForge's pre-formatted route gives eaglewatch's ids for every sample; its mask adds K2.5's prefilled
    `<think>` (the last prompt token) to the loss of every sample, and the export says so, measured."""
    _, want, _ = truth
    out, report, manifest = specforge_text
    assert manifest["specforge"]["data"]["chat_template"] == "kimi-k2-thinking"
    run_consumer("specforge-text", out, sample_tokenizer_dir, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    # text cannot carry a non-canonical split: those (bpe_equivalent, true ids kept) are skipped, and counted
    bpe = {sid for sid, cat in built_run.categories.items() if cat == "bpe_equivalent" and sid in want}
    assert set(got) == set(want) - bpe and report.skipped.get("not_reproducible", 0) == len(bpe)
    extra = 0
    for sid, row in got.items():
        ids, mask = want[sid]
        assert row["input_ids"] == ids, sid
        # SpecForge's span starts after the template's assistant_header; K2.5's generation prompt adds
        # `<think>` after it, the one token eaglewatch leaves out of the loss (the server prefilled it)
        diff = [i for i, (a, b) in enumerate(zip(row["loss_mask"], mask, strict=True)) if a != b]
        assert diff == [mask.index(1) - 1], sid
        extra += len(diff)
    assert extra == len(got)
    differs = manifest["specforge"]["loss_mask_differs"]
    assert differs == {"samples": extra, "tokens": extra, "prompt_text_in_loss": {"<think>": extra}}
    assert manifest["specforge"]["exact_route"] == "eagle3-shards rows as data.prompts_path"
    [warning] = report.warnings
    assert manifest["warnings"] == [warning]
    for part in (f"masks {extra} tokens in {extra} of {len(got)} samples", "'<think>'", "kimi-k2-thinking",
                 "--format eagle3-shards", "data.prompts_path"):
        assert part in warning, part


def test_no_specforge_template_masks_k25_text_exactly(truth, specforge_text, sample_tokenizer_dir, tmp_path):
    """Every template SpecForge 0.2 registers (all `data.chat_template` can name), last turn only or every
    turn: none gives eaglewatch's mask for all samples; the Kimi ones miss by exactly the prefilled `<think>`.
    So the warning's route (pre-tokenized rows) is the only exact one, proven by the next test."""
    _, want, _ = truth
    out, _, _ = specforge_text
    run_consumer("specforge-text-templates", out, sample_tokenizer_dir, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert {"kimi-k2-thinking", "kimi-k2-instruct", "kimi-k3-thinking", "qwen3-thinking", "llama3"} <= set(got)
    failed = set()
    for name, by_turns in got.items():
        for turns, rows in by_turns.items():
            if isinstance(rows, str):  # SpecForge cannot parse this text with it at all (e.g. no end_of_turn_token)
                failed.add(name)
                continue
            exact = sum(rows[sid][1].tolist() == want[sid][1] for sid in rows)
            assert all(rows[sid][0].tolist() == want[sid][0] for sid in rows), (name, turns)
            assert exact < len(rows), f"{name} ({turns} turns) masks every sample as eaglewatch does"
            if name.startswith("kimi-k2") and turns == "last":
                assert exact == 0
                for sid, (_, mask) in rows.items():
                    ours = want[sid][1]
                    assert [i for i, (a, b) in enumerate(zip(mask.tolist(), ours)) if a != b] == [ours.index(1) - 1]
    assert len(failed) < len(got) // 4, failed


def test_specforge_reads_the_shards_as_pretokenized_prompts(truth, tmp_path):
    shards, want, _ = truth
    [entry] = read_manifest(shards).shards
    run_consumer("specforge-prompts", entry.path, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert {sid: (r["input_ids"], r["loss_mask"]) for sid, r in got.items()} == want


def test_speculators_prepare_data_keeps_ids_and_masks(truth, built_run, sample_tokenizer_dir, tmp_path):
    _, want, order = truth
    out = tmp_path / "spec"
    export_run(built_run.db, out, "speculators", shard_size=40)
    assert not list((out / "data").rglob("*.json"))  # speculators loads every *.json below --data
    run_consumer("speculators-data", out / "data", sample_tokenizer_dir, tmp_path / "prepared", result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    rows = Counter((tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in got["shuffled"])
    assert rows == Counter((tuple(i), tuple(m)) for i, m in want.values())
    assert all(r["seq_len"] == len(r["input_ids"]) for r in got["shuffled"])
    assert [(r["input_ids"], r["loss_mask"]) for r in got["ordered"]] == [want[sid] for sid in order]


def test_modelopt_conversations_tokenise_to_the_shard_ids(truth, built_run, sample_tokenizer_dir, tmp_path):
    _, want, _ = truth
    out = tmp_path / "mo"
    export_run(built_run.db, out, "modelopt")
    rows = [json.loads(line) for line in (out / "data" / "modelopt.jsonl").read_text().splitlines()]
    assert {r["conversation_id"] for r in rows} == set(want)
    run_consumer("modelopt-data", out / "data" / "modelopt.jsonl", sample_tokenizer_dir, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert set(got) == set(want)
    with_tools = {r["conversation_id"] for r in rows if r.get("tools")}
    assert json.loads((out / "manifest.json").read_text())["modelopt"]["rows_with_tools"] == len(with_tools) > 0
    checked = 0
    for sid, ids in got.items():
        # text re-tokenised: canonical splits only; and Model-Optimizer's reader passes no `tools` to the template
        if built_run.categories[sid] != "bpe_equivalent" and sid not in with_tools:
            assert ids == want[sid][0], sid
            checked += 1
    assert checked > len(got) // 3


def test_specforge_text_masks_qwen3_exactly_and_says_nothing(tmp_path):
    """Where the generation prompt ends at the template's assistant_header (Qwen3 thinking: `<|im_start|>
    assistant\\n`, the model writes `<think>` itself), SpecForge's pre-formatted route gives eaglewatch's ids
    and masks exactly and the export warns of nothing: the K2.5 warning is measured, not assumed."""
    from tests.export.conftest import build_run_db
    from tests.realserver.tiny_qwen3 import CASES, build_tokenizer

    trainer_site()
    tok_dir = tmp_path / "qwen3"
    hf = build_tokenizer(tok_dir)
    rows = [{"id": f"q{i}", "messages": m, **({"tools": t} if t else {}), "meta_info": {"finish_reason": {"type": "stop"}},
             "output_ids": hf.encode(target, add_special_tokens=False)} for i, (m, t, target) in enumerate(CASES)]
    reference = tmp_path / "reference.jsonl"
    reference.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    db = tmp_path / "run.db"
    build_run_db(db, reference, tok_dir, {"samples": {r["id"]: {"kinds": ["short"]} for r in rows}}, mismatches=0)
    export_run(db, tmp_path / "shards", "eagle3-shards", profile_name="qwen3")
    want = {s.sample_id: (list(s.input_ids), list(s.loss_mask))
            for e in read_manifest(tmp_path / "shards").shards for s in read_shard(e)}
    report = export_run(db, tmp_path / "sf", "specforge-text", profile_name="qwen3")
    manifest = json.loads((tmp_path / "sf" / "manifest.json").read_text())
    assert report.exported == len(rows) and report.warnings == () and manifest["warnings"] == []
    assert manifest["specforge"]["data"]["chat_template"] == "qwen3-thinking"
    assert manifest["specforge"]["loss_mask_differs"] == {"samples": 0, "tokens": 0, "prompt_text_in_loss": {}}
    run_consumer("specforge-text", tmp_path / "sf", tok_dir, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert {sid: (r["input_ids"], r["loss_mask"]) for sid, r in got.items()} == want
    # the same prompts with thinking switched off end `<think>\n\n</think>\n\n` after the header: measured, warned
    off = export_run(db, tmp_path / "sf-off", "specforge-text", profile_name="qwen3",
                     template_kwargs={"enable_thinking": False})
    differs = json.loads((tmp_path / "sf-off" / "manifest.json").read_text())["specforge"]["loss_mask_differs"]
    assert differs["prompt_text_in_loss"] == {"<think>\n\n</think>\n\n": len(rows)} and len(off.warnings) == 1
