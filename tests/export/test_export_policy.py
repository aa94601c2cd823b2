"""Which samples an export keeps, and the errors an operator sees."""

from __future__ import annotations

import json
import sqlite3

import pytest

from app.errors import InputError
from app.export import Export, ExportOptions, ExportPolicy
from tests.export.conftest import build_run_db


def _ids(out, name="sglang_raw.jsonl"):
    return {json.loads(line)["id"] for line in (out / "data" / name).read_text().splitlines()}


def _with(built_run, *categories):
    return {sid for sid, cat in built_run.categories.items() if cat in categories}


def test_default_keeps_exact_and_bpe_equivalent_only(built_run, tmp_path):
    report = Export(built_run.db, tmp_path, "sglang-raw").run()
    assert _ids(tmp_path) == _with(built_run, "exact", "bpe_equivalent")
    assert report.skipped == {"corrupt": 3, "truncated": len(_with(built_run, "truncated"))}


def test_drop_bpe_equivalent(built_run, tmp_path):
    report = Export(
        built_run.db, tmp_path, "sglang-raw", ExportOptions(policy=ExportPolicy(keep_bpe_equivalent=False))
    ).run()
    assert _ids(tmp_path) == _with(built_run, "exact")
    assert report.skipped["bpe_equivalent"] == len(_with(built_run, "bpe_equivalent")) > 0


def test_keep_mismatches_and_truncated(built_run, tmp_path):
    Export(
        built_run.db,
        tmp_path,
        "sglang-raw",
        ExportOptions(policy=ExportPolicy(keep_mismatches=True, keep_truncated=True)),
    ).run()
    assert _ids(tmp_path) == set(built_run.records)


def test_truncated_shards_have_no_end_of_turn(built_run, tmp_path, hf_sample_tokenizer):
    Export(built_run.db, tmp_path, "eagle3-shards", ExportOptions(policy=ExportPolicy(keep_truncated=True))).run()
    im_end = hf_sample_tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = [
        json.loads(line)
        for p in sorted((tmp_path / "data").glob("shard_*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    truncated = [r for r in rows if built_run.categories[r["id"]] == "truncated"]
    assert truncated
    for r in truncated:
        assert r["input_ids"][-1] != im_end
        assert r["input_ids"][-len(built_run.exported_ids[r["id"]]) :] == built_run.exported_ids[r["id"]]


def test_max_length_skips_long_samples_without_cutting(built_run, tmp_path):
    report = Export(built_run.db, tmp_path, "eagle3-shards", ExportOptions(policy=ExportPolicy(max_length=600))).run()
    rows = [
        json.loads(line)
        for p in sorted((tmp_path / "data").glob("shard_*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    assert rows and all(len(r["input_ids"]) <= 600 for r in rows)
    assert report.skipped["too_long"] > 0
    for r in rows:
        assert r["input_ids"][-len(built_run.exported_ids[r["id"]]) :] == built_run.exported_ids[r["id"]]


def test_an_existing_export_is_not_overwritten_without_asking(built_run, tmp_path):
    Export(built_run.db, tmp_path, "eagle3-shards").run()
    with pytest.raises(InputError, match="already holds an export.*--overwrite"):
        Export(built_run.db, tmp_path, "eagle3-shards").run()
    Export(built_run.db, tmp_path, "eagle3-shards", ExportOptions(overwrite=True)).run()


def test_unknown_run_names_the_runs_that_exist(built_run, tmp_path):
    with pytest.raises(InputError, match=r"no run named 'nope' \(runs: demo\)"):
        Export(built_run.db, tmp_path, "sglang-raw", ExportOptions(run="nope")).run()


def test_several_runs_need_run_name(tmp_path, sample_reference, sample_tokenizer_dir, sample_cases):
    db = tmp_path / "two.db"
    build_run_db(db, sample_reference, sample_tokenizer_dir, sample_cases, name="a", limit=5)
    build_run_db(db, sample_reference, sample_tokenizer_dir, sample_cases, name="b", limit=0)
    with pytest.raises(InputError, match=r"several runs \(a, b\); choose one with --run"):
        Export(db, tmp_path / "out", "sglang-raw").run()
    report = Export(db, tmp_path / "out", "sglang-raw", ExportOptions(run="a")).run()
    assert report.exported + sum(report.skipped.values()) == 5


def test_ids_from_another_tokenizer_are_refused(tmp_path, sample_reference, sample_tokenizer_dir, sample_cases):
    db = tmp_path / "other.db"
    build_run_db(db, sample_reference, sample_tokenizer_dir, sample_cases, limit=4, mismatches=0, fingerprint="f" * 64)
    with pytest.raises(InputError, match="reconstructed with tokenizer ffffffffffff.*--tokenizer.*reprocess"):
        Export(db, tmp_path / "out", "eagle3-shards").run()


def test_not_a_database_is_a_clear_error(tmp_path):
    bogus = tmp_path / "notes.db"
    bogus.write_text("hello")
    with pytest.raises(InputError, match="is not an SQLite database"):
        Export(bogus, tmp_path / "out", "sglang-raw").run()


def test_template_kwargs_from_the_run_reach_the_prompt(tmp_path, sample_reference, sample_tokenizer_dir, sample_cases):
    db = tmp_path / "nothink.db"
    build_run_db(db, sample_reference, sample_tokenizer_dir, sample_cases, limit=3, mismatches=0)
    conn = sqlite3.connect(db)
    config = json.loads(conn.execute("SELECT config FROM runs").fetchone()[0])
    config["endpoints"][0]["extra"] = {"chat_template_kwargs": {"thinking": False}}
    conn.execute("UPDATE runs SET config = ?", (json.dumps(config),))
    conn.commit()
    conn.close()
    from app.tokens import load_tokenizer

    tok = load_tokenizer(sample_tokenizer_dir)
    Export(db, tmp_path / "out", "eagle3-shards", ExportOptions(policy=ExportPolicy(keep_truncated=True))).run()
    row = json.loads((tmp_path / "out" / "data" / "shard_00000.jsonl").read_text().splitlines()[0])
    n_prompt = row["loss_mask"].index(1)
    assert tok.decode(row["input_ids"][:n_prompt]).endswith("<|im_assistant|>assistant<|im_middle|><think></think>")


def test_a_tokenizer_without_template_needs_one(tmp_path, sample_reference, sample_tokenizer_dir, sample_cases):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((sample_tokenizer_dir / "tokenizer.json").read_bytes())
    config = json.loads((sample_tokenizer_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    db = tmp_path / "bare.db"
    build_run_db(db, sample_reference, bare, sample_cases, limit=2, mismatches=0)
    import app.tokens

    if hasattr(app.tokens, "render_prompt"):
        pytest.skip("app.tokens now offers a profile renderer; the fallback is used instead")
    with pytest.raises(InputError, match="has no chat template.*--chat-template FILE"):
        Export(db, tmp_path / "out", "eagle3-shards").run()
    template = tmp_path / "t.jinja"
    template.write_text(json.loads((sample_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"])
    report = Export(db, tmp_path / "out", "eagle3-shards", ExportOptions(chat_template=template)).run()
    assert report.exported == 2


def test_parallel_prompt_rendering_writes_the_same_files(built_run, tmp_path):
    Export(built_run.db, tmp_path / "one", "eagle3-shards", ExportOptions(shard_size=50)).run()
    Export(built_run.db, tmp_path / "two", "eagle3-shards", ExportOptions(shard_size=50, workers=2)).run()
    names = sorted(str(p.relative_to(tmp_path / "one")) for p in (tmp_path / "one").rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(tmp_path / "two")) for p in (tmp_path / "two").rglob("*") if p.is_file())
    assert "data/shard_00000.jsonl" in names
    for name in names:  # the manifest names its own folder in the commands it records
        one = (tmp_path / "one" / name).read_bytes().replace(str(tmp_path / "one").encode(), b"OUT")
        assert one == (tmp_path / "two" / name).read_bytes().replace(str(tmp_path / "two").encode(), b"OUT"), name


def test_a_template_that_rejects_a_prompt_names_the_sample(built_run, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ raise_exception('only one user turn is supported') }}")
    with pytest.raises(InputError, match=r"sample 'sample-\d+': the chat template .*bad.jinja.*only one user turn"):
        Export(built_run.db, tmp_path / "out", "eagle3-shards", ExportOptions(chat_template=bad)).run()


def test_each_skipped_sample_is_counted_once_under_what_it_is(
    tmp_path, sample_reference, sample_tokenizer_dir, sample_cases
):
    """One label per skipped sample, by precedence: corrupt > truncated > suspect > round-trip failed. A corrupt
    sample whose round-trip also failed is corrupt (the earlier export said "roundtrip"); a truncated one also
    flagged suspect is truncated (the earlier export said "suspect", so its truncated count fell short of the
    run's); a sample no reference judged but cut at max_tokens is truncated too."""
    from app.export import SKIP_LABELS, summary_counts

    built = build_run_db(tmp_path / "run.db", sample_reference, sample_tokenizer_dir, sample_cases, limit=60)
    by = {cat: [sid for sid, c in built.categories.items() if c == cat] for cat in set(built.categories.values())}
    corrupt, truncated, exact = by["text_mismatch"], by["truncated"], by["exact"]
    conn = sqlite3.connect(built.db, isolation_level=None)

    def set_(sid, sql, *args):
        pk = conn.execute("SELECT pk FROM samples WHERE sample_id = ?", (sid,)).fetchone()[0]
        conn.execute(sql + " WHERE sample_pk = ?", (*args, pk))

    for sid in (*corrupt, *truncated, exact[0], exact[1]):
        set_(sid, "UPDATE reconstructions SET roundtrip = 0")
    for sid in (*corrupt, *truncated, exact[0]):
        set_(sid, "UPDATE reconstructions SET flags = ?", '["replacement_char"]')
    set_(exact[2], "UPDATE reconstructions SET category = 'unchecked'")
    set_(exact[2], "UPDATE responses SET finish_reason = 'length'")
    conn.close()
    report = Export(built.db, tmp_path / "out", "eagle3-shards").run()
    assert report.skipped == {
        "corrupt": len(corrupt),
        "truncated": len(truncated) + 1,
        "suspect": 1,
        "roundtrip_failed": 1,
    }
    counts = summary_counts(report)
    assert counts["seen"] == 60 == counts["exported"] + sum(counts["skipped"].values())
    assert list(report.skipped) == [k for k in counts["skipped"] if counts["skipped"][k]]  # precedence order
    assert (SKIP_LABELS["corrupt"], SKIP_LABELS["roundtrip_failed"]) == ("corrupt", "round-trip failed")


def test_every_summary_count_says_what_it_means(built_run, tmp_path):
    from app.export import COUNT_MEANINGS, summary_counts

    counts = summary_counts(Export(built_run.db, tmp_path, "sglang-raw").run())
    keys = [k for k in counts if k != "skipped"] + [f"skipped.{k}" for k in counts["skipped"]]
    assert set(keys) == set(COUNT_MEANINGS)
    assert all(len(COUNT_MEANINGS[k]) > 20 for k in keys)
