"""Each export format round-trips, and prompt + completion ids equal what a server would tokenize."""

from __future__ import annotations

import json

import pytest

from app.export import Export, ExportOptions, assistant_turn, iter_rows
from app.extract.manifest import read_manifest, read_shard
from app.tokens import get_profile, load_tokenizer, split_output


@pytest.fixture(scope="module")
def shards(built_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    report = Export(built_run.db, out, "eagle3-shards", ExportOptions(shard_size=64)).run()
    return out, report


def _read_all_shards(out):
    manifest = read_manifest(out)
    return manifest, {s.sample_id: s for entry in manifest.shards for s in read_shard(entry)}


def test_shards_are_read_back_by_the_extractor(shards, built_run, sample_tokenizer_dir):
    out, report = shards
    manifest, samples = _read_all_shards(out)
    kept = {sid for sid, cat in built_run.categories.items() if cat in ("exact", "bpe_equivalent")}
    assert set(samples) == kept
    assert report.exported == len(kept)
    assert [e.samples for e in manifest.shards][:-1] == [64] * (len(manifest.shards) - 1)
    assert manifest.tokenizer_fingerprint == load_tokenizer(sample_tokenizer_dir).fingerprint


def test_completion_is_the_stored_ids_under_a_loss_mask_of_ones(shards, built_run):
    out, _ = shards
    _, samples = _read_all_shards(out)
    for sid, sample in samples.items():
        output = built_run.exported_ids[sid]
        n_prompt = len(sample.input_ids) - len(output)
        assert list(sample.input_ids[n_prompt:]) == output, sid
        assert sample.loss_mask == (0,) * n_prompt + (1,) * len(output), sid


def test_prompt_part_is_the_template_with_generation_prompt(shards, built_run, hf_sample_tokenizer):
    out, _ = shards
    _, samples = _read_all_shards(out)
    for sid in list(samples)[:80]:
        rec = built_run.records[sid]
        text = hf_sample_tokenizer.apply_chat_template(
            rec["messages"], tools=rec.get("tools"), add_generation_prompt=True, tokenize=False
        )
        prompt = hf_sample_tokenizer.encode(text, add_special_tokens=False)
        assert list(samples[sid].input_ids[: len(prompt)]) == prompt, sid
        assert samples[sid].loss_mask[len(prompt) - 1] == 0 and prompt[-1] == hf_sample_tokenizer.convert_tokens_to_ids(
            "<think>"
        )


def test_input_ids_equal_the_server_rendering_of_the_whole_conversation(
    shards, built_run, hf_sample_tokenizer, sample_tokenizer_dir
):
    """Render prompt + assistant turn (from the reference text) the way a server would, tokenize, compare."""
    out, _ = shards
    _, samples = _read_all_shards(out)
    tok = load_tokenizer(sample_tokenizer_dir)
    profile = get_profile("kimi-k2.5")
    for sid, sample in samples.items():
        rec = built_run.records[sid]
        view = split_output(rec["output_ids"], profile, tok)
        conversation = [*rec["messages"], assistant_turn(view)]
        text = hf_sample_tokenizer.apply_chat_template(
            conversation, tools=rec.get("tools"), tokenize=False, preserve_thinking=True
        )
        rendered = hf_sample_tokenizer.encode(text, add_special_tokens=False)
        if built_run.categories[sid] == "bpe_equivalent":  # true (non-canonical) ids: same text, other split
            assert rendered != list(sample.input_ids) and hf_sample_tokenizer.decode(
                rendered
            ) == hf_sample_tokenizer.decode(list(sample.input_ids))
        else:
            assert rendered == list(sample.input_ids), sid


def test_manifest_records_tokenizer_profile_counts_and_lengths(shards, built_run, sample_tokenizer_dir):
    out, report = shards
    data = json.loads((out / "manifest.json").read_text())
    assert data["format"] == "eagle3-shards"
    assert data["tokenizer_fingerprint"] == load_tokenizer(sample_tokenizer_dir).fingerprint
    assert data["profile"] == "kimi-k2.5" and data["prompt_renderer"] == "chat_template"
    assert data["counts"]["seen"] == len(built_run.records)
    assert data["counts"]["exported"] + sum(data["counts"]["skipped"].values()) == len(built_run.records)
    _, samples = _read_all_shards(out)
    lengths = [len(s.input_ids) for s in samples.values()]
    assert data["lengths"]["tokens"] == sum(lengths) == sum(e["tokens"] for e in data["shards"])
    assert (data["lengths"]["min"], data["lengths"]["max"]) == (min(lengths), max(lengths))
    assert data["lengths"]["loss_tokens"] == sum(sum(s.loss_mask) for s in samples.values())


def test_sglang_raw_round_trips(built_run, tmp_path):
    report = Export(built_run.db, tmp_path, "sglang-raw", ExportOptions(policy=_keep_all())).run()
    rows = [json.loads(line) for line in (tmp_path / "data" / "sglang_raw.jsonl").read_text().splitlines()]
    assert report.exported == len(rows) == len(built_run.records)
    for row in rows:
        rec = built_run.records[row["id"]]
        assert row["output_ids"] == built_run.exported_ids[row["id"]]
        assert row["messages"] == rec["messages"] and row.get("tools") == rec.get("tools")
        assert row["meta_info"]["finish_reason"] == rec["meta_info"]["finish_reason"]
        assert row["meta_info"]["prompt_tokens"] == rec["meta_info"]["prompt_tokens"]
        assert row["meta_info"]["completion_tokens"] == len(row["output_ids"])
        assert row["meta_info"]["verdict"] == built_run.categories[row["id"]]


def test_specforge_rows_are_the_shard_rows_in_one_file(built_run, shards, tmp_path):
    """SpecForge's data.prompts_path takes one file: every row, whatever their number, pre-tokenized as the shards
    hold them; the manifest and the printed command set data.max_length to the longest row."""
    report = Export(built_run.db, tmp_path, "specforge").run()
    rows = [json.loads(line) for line in (tmp_path / "data" / "specforge.jsonl").read_text().splitlines()]
    _, samples = _read_all_shards(shards[0])
    assert [f for f in report.files if f.startswith("data/")] == ["data/specforge.jsonl"]
    assert {r["id"]: (r["input_ids"], r["loss_mask"]) for r in rows} == {
        sid: (list(s.input_ids), list(s.loss_mask)) for sid, s in samples.items()
    }
    train = json.loads((tmp_path / "manifest.json").read_text())["train"]
    longest = max(len(r["input_ids"]) for r in rows)
    assert train["max_length"] == report.max_length == longest
    assert train["settings"]["specforge"] == {
        "data.prompts_path": str(tmp_path / "data" / "specforge.jsonl"),
        "data.max_length": longest,
    }
    assert any(f"data.max_length={longest}" in c and "data.prompts_path=" in c for c in train["commands"])


def test_modelopt_rows_give_the_ids_and_masks_back_through_apply_chat_template(
    built_run, shards, tmp_path, hf_sample_tokenizer
):
    """transformers' own apply_chat_template over a row's `messages` with the exported chat_template.jinja (what
    Model-Optimizer calls, return_assistant_tokens_mask included) gives the shard's ids and loss mask; a
    non-canonical (bpe_equivalent) split cannot come back from text and is skipped as not_reproducible."""
    report = Export(built_run.db, tmp_path, "modelopt").run()
    rows = [json.loads(line) for line in (tmp_path / "data" / "modelopt.jsonl").read_text().splitlines()]
    _, samples = _read_all_shards(shards[0])
    bpe = {sid for sid in samples if built_run.categories[sid] == "bpe_equivalent"}
    assert {r["conversation_id"] for r in rows} == set(samples) - bpe
    assert report.skipped["not_reproducible"] == len(bpe) > 0
    template = (tmp_path / "chat_template.jinja").read_text()
    for row in rows:
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"] and "conversations" not in row
        out = hf_sample_tokenizer.apply_chat_template(
            row["messages"], chat_template=template, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        sample = samples[row["conversation_id"]]
        assert out["input_ids"] == list(sample.input_ids), row["conversation_id"]
        assert out["assistant_masks"] == list(sample.loss_mask), row["conversation_id"]
    modelopt = json.loads((tmp_path / "manifest.json").read_text())["train"]["settings"]["modelopt"]
    assert modelopt["training.training_seq_len"] == report.max_length and modelopt["training.answer_only_loss"]


def test_modelopt_refuses_a_tiktoken_tokenizer_and_names_the_exact_route(
    tmp_path, sample_reference, sample_cases, kimi_tokenizer_dir
):
    """Model-Optimizer loads a tiktoken tokenizer (Kimi K2.5's) as a slow one and masks it by its own recovery,
    ignoring the template's generation tags: the format is refused, naming the route that is exact."""
    from app.errors import InputError
    from tests.export.conftest import build_run_db

    db = tmp_path / "kimi.db"
    build_run_db(db, sample_reference, kimi_tokenizer_dir, sample_cases, limit=0)
    with pytest.raises(InputError, match=r"per-model recovery.*layout = \"modelopt\".*answer_only_loss"):
        Export(db, tmp_path / "out", "modelopt").run()
    assert not (tmp_path / "out").exists()


def test_rows_stream_in_pages_in_store_order(built_run):
    from app.store.db import connect_readonly

    conn = connect_readonly(built_run.db)
    try:
        pks = [row.pk for row in iter_rows(conn, 1, page_size=7)]
    finally:
        conn.close()
    assert len(pks) == len(built_run.records)
    assert pks == sorted(pks)


def _keep_all():
    from app.export import ExportPolicy

    return ExportPolicy(keep_bpe_equivalent=True, keep_mismatches=True, keep_truncated=True)
