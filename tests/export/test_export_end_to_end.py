"""From the real writer to the shards: ingest with RunStore, reconstruct with Reconstructor, export, read back."""

from __future__ import annotations

import json
from collections import Counter

from app.export import Export, ExportOptions
from app.extract.manifest import read_manifest, read_shard
from app.store.run_store import RunStore
from app.store.store_records import ResultRecord, SampleInput
from app.tokens import get_profile, load_tokenizer, split_output
from app.tokens.reconstruct import Reconstructor


async def test_a_run_written_by_the_engine_path_exports_its_reference_ids(
    tmp_path, sample_reference, sample_tokenizer_dir, sample_cases
):
    tok = load_tokenizer(sample_tokenizer_dir)
    profile = get_profile("kimi-k2.5")
    reconstructor = Reconstructor(profile, tok)
    records = [json.loads(line) for line in sample_reference.read_text(encoding="utf-8").splitlines()]
    db = tmp_path / "run.db"
    config = {"run": {"name": "e2e"}, "model": {"tokenizer": str(sample_tokenizer_dir), "profile": profile.name}}
    store = await RunStore.open(db)
    try:
        run_id = await store.ensure_run("e2e", config)
        await store.ingest(
            run_id,
            [SampleInput(r["id"], "prompts", r["messages"], r.get("tools"), tuple(r["output_ids"])) for r in records],
        )
        leased = await store.lease(run_id, len(records), 600)
        assert len(leased) == len(records)
        for sample in leased:
            # what a clean server returns for these ids
            completion = split_output(sample.reference_ids, profile, tok).to_completion()
            rec, verdict = reconstructor.process(completion, sample.reference_ids)
            await store.record_result(
                ResultRecord(
                    run_id,
                    sample.pk,
                    1,
                    "simulator",
                    completion,
                    0.0,
                    rec,
                    verdict,
                    sample.reference_ids,
                    profile=profile.name,
                    tokenizer=tok.fingerprint,
                )
            )
    finally:
        await store.close()

    report = Export(db, tmp_path / "out", "eagle3-shards", ExportOptions(shard_size=128)).run()
    manifest = read_manifest(tmp_path / "out")
    samples = {s.sample_id: s for e in manifest.shards for s in read_shard(e)}
    by_id = {r["id"]: r for r in records}
    kinds = {sid: sample_cases["samples"][sid]["kinds"] for sid in by_id}
    # every untruncated sample reconstructs benignly from clean text, so it is exported
    expected = {sid for sid in by_id if "truncated" not in kinds[sid]}
    assert set(samples) == expected, Counter(report.skipped)
    for sid, sample in samples.items():
        completion = list(sample.input_ids[sample.loss_mask.index(1) :])
        # true ids first: a bpe_equivalent sample exports the reference's (non-canonical) ids, not the re-encoding
        assert completion == by_id[sid]["output_ids"], sid
    written = json.loads((tmp_path / "out" / "manifest.json").read_text())
    counts = written["counts"]
    assert (counts["seen"], counts["exported"]) == (len(records), len(expected))
    # the run's mix: every prompt of the run under its dataset, the languages counting each once
    assert sum(m["prompts"] for m in written["run_mix"]) == len(records)
    assert all(sum(m["languages"].values()) == m["prompts"] for m in written["run_mix"])
    # the skipped are the truncated samples, every one counted as truncated: the two cut inside a tool section
    # (a marker left spelled in the text: marker_as_text, so also suspect) are truncated first (the precedence)
    truncated = sum("truncated" in kinds[sid] for sid in by_id)
    assert {k: n for k, n in counts["skipped"].items() if n} == {"truncated": truncated}
    assert truncated == len(records) - len(expected)
