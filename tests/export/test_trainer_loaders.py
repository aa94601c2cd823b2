"""Every row of a demo export read through the trainers' own code (SpecForge, speculators, Model-Optimizer;
scripts/trainer_venv.sh builds their environment): 0 rows dropped, ids and masks equal to eaglewatch's, with the
settings the manifest records. The code runs in a child process (tests/export/trainers/consumers.py names the
function each check calls); hidden states and training steps: tests/export/test_smoke_training.py."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from app.export import Export, ExportOptions
from app.extract.manifest import read_manifest, read_shard
from tests.export.trainers.env import proven, run_consumer, run_trainer_cli, trainer_site

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def truth(built_run, tmp_path_factory):
    """eaglewatch's own ids and masks per sample: the eagle3-shards export of the demo run, in export order."""
    trainer_site()
    out = tmp_path_factory.mktemp("truth") / "shards"
    Export(built_run.db, out, "eagle3-shards", ExportOptions(shard_size=100000)).run()
    samples = [s for e in read_manifest(out).shards for s in read_shard(e)]
    return out, {s.sample_id: (list(s.input_ids), list(s.loss_mask)) for s in samples}, [s.sample_id for s in samples]


@pytest.fixture(scope="module")
def specforge_text(built_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("sf") / "sf"
    report = Export(built_run.db, out, "specforge-text").run()
    return out, report, json.loads((out / "manifest.json").read_text())


def test_specforge_single_file_prompts_give_every_row_exactly(truth, built_run, tmp_path):
    """`--format specforge`: one file of pre-tokenized rows, read by SpecForge's `prepare_prompt_tasks` with the
    manifest's data.max_length (the longest row): every row, ids and masks equal. SpecForge's default
    max_length of 2048 would have cut rows and lost loss tokens, which is why the manifest sets it."""
    _, want, _ = truth
    out = tmp_path / "sf"
    report = Export(built_run.db, out, "specforge").run()
    run_consumer("specforge-prompts", out, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    rows = got["rows"]
    assert {sid: (r["input_ids"], r["loss_mask"]) for sid, r in rows.items()} == want
    assert report.max_length > 2048 and got["default_loss_tokens"] < report.loss_tokens
    proven(
        f"specforge data.prompts_path (one file): {len(rows)}/{len(want)} rows, 0 dropped, ids and masks equal, "
        f"{report.loss_tokens} loss tokens with data.max_length={report.max_length} (the default 2048 keeps "
        f"{got['default_loss_tokens']})"
    )


def test_specforge_preformatted_text_gives_the_shard_ids(
    truth, built_run, specforge_text, sample_tokenizer_dir, tmp_path
):
    """SpecForge's pre-formatted route gives eaglewatch's ids for every sample; its mask adds K2.5's prefilled
    `<think>` (the last prompt token) to the loss of every sample, and the export says so, measured."""
    _, want, _ = truth
    out, report, manifest = specforge_text
    assert manifest["specforge"]["data"]["chat_template"] == "kimi-k2-thinking"
    assert manifest["train"]["settings"]["specforge"]["data.max_length"] == report.max_length
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
    assert manifest["specforge"]["exact_route"].startswith("--format specforge")
    [warning] = report.warnings
    assert manifest["warnings"] == [warning]
    for part in (
        f"masks {extra} tokens in {extra} of {len(got)} samples",
        "'<think>'",
        "kimi-k2-thinking",
        "--format specforge",
        "data.prompts_path",
    ):
        assert part in warning, part
    proven(
        f"specforge-text (is_preformatted): {len(got)}/{len(want)} rows ({len(bpe)} non-canonical skipped), ids "
        f"equal, masks differ by {extra} tokens ('<think>' prefill): warned, the exact route named"
    )


def test_no_specforge_template_masks_k25_text_exactly(truth, specforge_text, sample_tokenizer_dir, tmp_path):
    """Every template SpecForge 0.2 registers (all `data.chat_template` can name), last turn only or every
    turn: none gives eaglewatch's mask for all samples; the Kimi ones miss by exactly the prefilled `<think>` in
    every sample (the others are read over the first 60 rows: consumers.py). So the warning's route
    (pre-tokenized rows) is the only exact one, proven above."""
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


def _arrow_rows(prepared, column):
    from array import array

    from app.extract.arrow_stream import IntListColumn, prepared_files

    out = []
    for path in prepared_files(prepared):
        col = IntListColumn(path, column)
        out += [array("q", bytes(v)).tolist() for v in col.rows()]
        col.close()
    return out


def test_speculators_prepare_data_cli_passes_every_row_through(truth, built_run, sample_tokenizer_dir, tmp_path):
    """The real `speculators prepare-data` command line on `--format speculators`'s data folder, with the
    manifest's --seq-length: every row comes through with its ids and mask, shuffled (the extraction finds them
    by ids: tests/export/test_smoke_training.py), and its --no-skip-token-freq count of the loss tokens is the
    one `eaglewatch vocab` writes."""
    from app.export.draft_vocab import LossTokenCounts

    _, want, order = truth
    out = tmp_path / "spec"
    Export(built_run.db, out, "speculators", ExportOptions(shard_size=40)).run()
    assert not list((out / "data").rglob("*.json"))  # speculators loads every *.json below --data
    settings = json.loads((out / "manifest.json").read_text())["train"]["settings"]["speculators"]
    prepared = tmp_path / "prepared"
    proc = run_trainer_cli(
        "speculators",
        "prepare-data",
        "--model",
        sample_tokenizer_dir,
        "--data",
        out / "data",
        "--output",
        prepared,
        "--seq-length",
        settings["prepare-data --seq-length"],
        "--no-skip-token-freq",
        "--num-preprocessing-workers",
        "1",
        scratch=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids, masks = _arrow_rows(prepared, "input_ids"), _arrow_rows(prepared, "loss_mask")
    assert Counter(map(tuple, zip(map(tuple, ids), map(tuple, masks), strict=True))) == Counter(
        (tuple(i), tuple(m)) for i, m in want.values()
    )
    assert [i for i in ids] != [want[sid][0] for sid in order]  # shuffled: export order is not prepared order
    counts = LossTokenCounts()
    for i, m in want.values():
        counts.add(i, m)
    assert torch.load(prepared / "token_freq.pt", weights_only=True) == counts.as_dict()
    proven(
        f"speculators prepare-data (CLI, --seq-length {settings['prepare-data --seq-length']}): {len(ids)}/"
        f"{len(want)} rows, 0 dropped, ids and masks equal (shuffled), token_freq.pt equal to eaglewatch's"
    )


def test_modelopt_readers_give_every_row_its_ids_and_mask(truth, built_run, sample_tokenizer_dir, tmp_path):
    """`--format modelopt` rows through Model-Optimizer's three readers (the offline/streaming tokenisation, the
    streaming dataset's entry reader, the online collator) with the manifest's chat_template, training_seq_len
    and answer_only_loss: ids and masks equal eaglewatch's for every row, tools included (they are in the
    rendered context); a non-canonical split cannot come back from text and is skipped, counted."""
    _, want, _ = truth
    out = tmp_path / "mo"
    report = Export(built_run.db, out, "modelopt").run()
    rows = [json.loads(line) for line in (out / "data" / "modelopt.jsonl").read_text().splitlines()]
    bpe = {sid for sid, cat in built_run.categories.items() if cat == "bpe_equivalent" and sid in want}
    assert {r["conversation_id"] for r in rows} == set(want) - bpe
    assert report.skipped["not_reproducible"] == len(bpe)
    run_consumer("modelopt-data", out, sample_tokenizer_dir, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert set(got) == set(want) - bpe
    with_tools = {sid for sid in got if built_run.records[sid].get("tools")}
    for sid, row in got.items():
        ids, mask = want[sid]
        assert row["input_ids"] == row["stream_ids"] == ids, sid
        assert row["loss_mask"] == row["stream_mask"] == mask and row["stream_cid"] == sid, sid
        n = len(ids)
        # the online collator pads to training_seq_len and masks labels: label i is token i+1, kept where i+1 is
        # in the loss
        assert row["online_ids"][:n] == ids
        assert [x != -100 for x in row["online_labels"][: n - 1]] == [bool(m) for m in mask[1:]], sid
    assert with_tools
    proven(
        f"modelopt messages + generation-tag template (answer_only_loss, training_seq_len={report.max_length}): "
        f"{len(got)}/{len(want)} rows ({len(bpe)} non-canonical skipped, counted), ids and masks equal in its "
        f"3 readers, {len(with_tools)} rows with tools"
    )


def test_specforge_text_masks_qwen3_exactly_and_says_nothing(tmp_path):
    """Where the generation prompt ends at the template's assistant_header (Qwen3 thinking: `<|im_start|>
    assistant\\n`, the model writes `<think>` itself), SpecForge's pre-formatted route gives eaglewatch's ids
    and masks exactly and the export warns of nothing: the K2.5 warning is measured, not assumed."""
    from tests.export.conftest import build_run_db
    from tests.realserver.tiny_qwen3 import CASES, build_tokenizer

    trainer_site()
    tok_dir = tmp_path / "qwen3"
    hf = build_tokenizer(tok_dir)
    rows = [
        {
            "id": f"q{i}",
            "messages": m,
            **({"tools": t} if t else {}),
            "meta_info": {"finish_reason": {"type": "stop"}},
            "output_ids": hf.encode(target, add_special_tokens=False),
        }
        for i, (m, t, target) in enumerate(CASES)
    ]
    reference = tmp_path / "reference.jsonl"
    reference.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    db = tmp_path / "run.db"
    build_run_db(db, reference, tok_dir, {"samples": {r["id"]: {"kinds": ["short"]} for r in rows}}, mismatches=0)
    Export(db, tmp_path / "shards", "eagle3-shards", ExportOptions(profile_name="qwen3")).run()
    want = {
        s.sample_id: (list(s.input_ids), list(s.loss_mask))
        for e in read_manifest(tmp_path / "shards").shards
        for s in read_shard(e)
    }
    report = Export(db, tmp_path / "sf", "specforge-text", ExportOptions(profile_name="qwen3")).run()
    manifest = json.loads((tmp_path / "sf" / "manifest.json").read_text())
    assert report.exported == len(rows) and report.warnings == () and manifest["warnings"] == []
    assert manifest["specforge"]["data"]["chat_template"] == "qwen3-thinking"
    assert manifest["specforge"]["loss_mask_differs"] == {"samples": 0, "tokens": 0, "prompt_text_in_loss": {}}
    run_consumer("specforge-text", tmp_path / "sf", tok_dir, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert {sid: (r["input_ids"], r["loss_mask"]) for sid, r in got.items()} == want
    # the same prompts with thinking switched off end `<think>\n\n</think>\n\n` after the header: measured, warned
    off = Export(
        db,
        tmp_path / "sf-off",
        "specforge-text",
        ExportOptions(profile_name="qwen3", template_kwargs={"enable_thinking": False}),
    ).run()
    differs = json.loads((tmp_path / "sf-off" / "manifest.json").read_text())["specforge"]["loss_mask_differs"]
    assert differs["prompt_text_in_loss"] == {"<think>\n\n</think>\n\n": len(rows)} and len(off.warnings) == 1


# ---------------------------------------------------------------------------------------------- whole conversations

MULTI_TURN = {"per-turn": {}, "merged": {"template_kwargs": {"preserve_thinking": True}}}  # merged: several spans


@pytest.fixture(scope="module", params=list(MULTI_TURN))
def conversation_truth(request, conversation_run, tmp_path_factory):
    """eaglewatch's ids and masks of the sample conversations, per turn or merged (every conversation merges with
    earlier reasoning kept in the history), as the eagle3-shards export writes them."""
    trainer_site()
    mode = request.param
    out = tmp_path_factory.mktemp(f"conv-{mode}") / "shards"
    Export(conversation_run, out, "eagle3-shards", ExportOptions(conversations=mode, **MULTI_TURN[mode])).run()
    rows = {
        s.sample_id: (list(s.input_ids), list(s.loss_mask)) for e in read_manifest(out).shards for s in read_shard(e)
    }
    spans = sum(sum(1 for a, b in zip([0, *mask], mask) if b and not a) for _, mask in rows.values())
    assert spans > len(rows) if mode == "merged" else spans == len(rows)
    return mode, rows


def _export(conversation_run, out, fmt, mode):
    return Export(conversation_run, out, fmt, ExportOptions(conversations=mode, **MULTI_TURN[mode])).run()


def test_specforge_prompts_take_multi_turn_rows(conversation_truth, conversation_run, tmp_path):
    mode, want = conversation_truth
    _export(conversation_run, tmp_path / "sf", "specforge", mode)
    run_consumer("specforge-prompts", tmp_path / "sf", result=tmp_path / "r.pt")
    rows = torch.load(tmp_path / "r.pt")["rows"]
    assert {sid: (r["input_ids"], r["loss_mask"]) for sid, r in rows.items()} == want
    proven(f"specforge data.prompts_path, conversations {mode}: {len(rows)}/{len(want)} rows, ids and masks equal")


def test_speculators_prepare_data_takes_multi_turn_rows(
    conversation_truth, conversation_run, sample_tokenizer_dir, tmp_path
):
    mode, want = conversation_truth
    _export(conversation_run, tmp_path / "spec", "speculators", mode)
    run_consumer(
        "speculators-data",
        tmp_path / "spec" / "data",
        sample_tokenizer_dir,
        tmp_path / "prepared",
        result=tmp_path / "r.pt",
    )
    rows = torch.load(tmp_path / "r.pt")["rows"]
    assert Counter((tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in rows) == Counter(
        (tuple(i), tuple(m)) for i, m in want.values()
    )
    proven(
        f"speculators load_and_preprocess_dataset, conversations {mode}: {len(rows)}/{len(want)} rows, ids and "
        "masks equal"
    )


def test_modelopt_generation_blocks_mask_every_turn_of_a_multi_turn_row(
    conversation_truth, conversation_run, sample_tokenizer_dir, tmp_path
):
    """Model-Optimizer's readers mask each assistant message's `{% generation %}` block: a merged row's several
    generated spans come back as several masked runs, equal to eaglewatch's mask, in all three readers."""
    mode, want = conversation_truth
    report = _export(conversation_run, tmp_path / "mo", "modelopt", mode)
    run_consumer("modelopt-data", tmp_path / "mo", sample_tokenizer_dir, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert set(got) == set(want) and not report.skipped  # every row's text gives its ids back
    for sid, row in got.items():
        ids, mask = want[sid]
        assert row["input_ids"] == row["stream_ids"] == ids, sid
        assert row["loss_mask"] == row["stream_mask"] == mask, sid
        n = len(ids)
        assert [x != -100 for x in row["online_labels"][: n - 1]] == [bool(m) for m in mask[1:]], sid
    proven(
        f"modelopt generation-tag template, conversations {mode}: {len(got)}/{len(want)} rows, ids and masks "
        "equal in its 3 readers"
    )
