"""True ids first, the suspect / failed-round-trip policy, and an export that is all or nothing."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3

import pytest

from app.errors import InputError
from app.export import Export, ExportOptions, ExportPolicy
from app.store.ids import pack_ids
from tests.export.conftest import build_run_db


@pytest.fixture
def run_db(tmp_path, sample_reference, sample_tokenizer_dir, sample_cases):
    """A fresh copy of the demo run whose first exact samples get: a failed round-trip, suspect flags, an
    empty flag list, and server-returned ids that differ from the stored reconstruction."""
    built = build_run_db(tmp_path / "run.db", sample_reference, sample_tokenizer_dir, sample_cases, limit=60)
    exact = [sid for sid, cat in built.categories.items() if cat == "exact"]
    roles = dict(zip(("roundtrip", "suspect", "empty_flags", "server"), exact[:4], strict=True))
    conn = sqlite3.connect(built.db, isolation_level=None)

    def pk(sid):
        return conn.execute("SELECT pk FROM samples WHERE sample_id = ?", (sid,)).fetchone()[0]

    conn.execute("UPDATE reconstructions SET roundtrip = 0 WHERE sample_pk = ?", (pk(roles["roundtrip"]),))
    conn.execute(
        "UPDATE reconstructions SET flags = ? WHERE sample_pk = ?", ('["replacement_char"]', pk(roles["suspect"]))
    )
    conn.execute("UPDATE reconstructions SET flags = '[]' WHERE sample_pk = ?", (pk(roles["empty_flags"]),))
    server_ids = [*built.output_ids[roles["server"]][:-1], 7, built.output_ids[roles["server"]][-1]]
    conn.execute("UPDATE responses SET token_ids = ? WHERE sample_pk = ?", (pack_ids(server_ids), pk(roles["server"])))
    conn.close()
    return built, roles, server_ids


def _rows(out):
    return {
        json.loads(line)["id"]: json.loads(line)
        for p in sorted((out / "data").glob("shard_*.jsonl"))
        for line in p.read_text().splitlines()
    }


def _sources(out):
    with (out / "samples.tsv").open() as fh:
        return {r["id"]: r["ids_source"] for r in csv.DictReader(fh, delimiter="\t")}


def test_failed_round_trips_and_suspect_samples_are_dropped_by_default(run_db, tmp_path):
    built, roles, _ = run_db
    report = Export(built.db, tmp_path / "out", "eagle3-shards").run()
    rows = _rows(tmp_path / "out")
    assert roles["roundtrip"] not in rows and roles["suspect"] not in rows
    assert roles["empty_flags"] in rows  # [] = not suspect
    assert report.skipped["roundtrip_failed"] == 1 and report.skipped["suspect"] == 1
    kept = Export(
        built.db,
        tmp_path / "all",
        "eagle3-shards",
        ExportOptions(policy=ExportPolicy(keep_roundtrip_failed=True, keep_suspect=True)),
    ).run()
    assert {roles["roundtrip"], roles["suspect"]} <= set(_rows(tmp_path / "all"))
    assert "roundtrip_failed" not in kept.skipped and "suspect" not in kept.skipped
    policy = json.loads((tmp_path / "all" / "manifest.json").read_text())["policy"]
    assert policy["keep_roundtrip_failed"] and policy["keep_suspect"]


def test_true_ids_are_exported_and_their_source_recorded(run_db, tmp_path):
    built, roles, server_ids = run_db
    Export(built.db, tmp_path / "out", "eagle3-shards").run()
    rows, sources = _rows(tmp_path / "out"), _sources(tmp_path / "out")
    server = rows[roles["server"]]
    assert server["input_ids"][server["loss_mask"].index(1) :] == server_ids
    assert server["ids_source"] == sources[roles["server"]] == "server"
    for sid, row in rows.items():
        completion = row["input_ids"][row["loss_mask"].index(1) :]
        if built.categories[sid] == "bpe_equivalent":  # the reference, not the re-encoded text
            assert completion == built.records[sid]["output_ids"] != built.output_ids[sid]
            assert sources[sid] == row["ids_source"] == "reference"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert sum(manifest["ids_sources"].values()) == manifest["counts"]["exported"] == len(rows)
    assert manifest["ids_sources"]["server"] == 1


def test_an_interrupted_export_leaves_the_previous_one_whole(run_db, tmp_path):
    built, _, _ = run_db
    out = tmp_path / "out"
    Export(built.db, out, "eagle3-shards", ExportOptions(shard_size=10)).run()
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def stop(seen, exported):
        if seen == 25:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Export(built.db, out, "eagle3-shards", ExportOptions(shard_size=7, overwrite=True), stop).run()
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial folder left
    Export(built.db, out, "eagle3-shards", ExportOptions(shard_size=7, overwrite=True)).run()
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(p.name for p in (out / "data").iterdir()) == [s["path"].split("/")[1] for s in manifest["shards"]]


def test_the_manifest_is_never_among_the_data(run_db, tmp_path):
    built, _, _ = run_db
    for fmt in ("sglang-raw", "specforge", "specforge-text", "speculators", "modelopt", "eagle3-shards"):
        out = tmp_path / fmt
        Export(built.db, out, fmt).run()
        assert (out / "manifest.json").exists() and not list((out / "data").rglob("*.json")), fmt


def test_a_folder_of_other_files_is_refused(run_db, tmp_path):
    built, _, _ = run_db
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="holds no eaglewatch export"):
        Export(built.db, tmp_path / "mine", "eagle3-shards", ExportOptions(overwrite=True)).run()
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    shutil.rmtree(tmp_path / "mine")


def test_a_lone_surrogate_in_a_message_still_writes_valid_json(tmp_path):
    from app.export.writers import _jsonl

    line = _jsonl({"id": "x", "messages": [{"role": "user", "content": "a\ud800b"}]})
    assert json.loads(line.decode("utf-8"))["messages"][0]["content"] == "a\ud800b"
    assert _jsonl({"t": "é"}) == '{"t":"é"}\n'.encode()


def test_the_cli_keeps_suspect_and_failed_samples_when_asked(run_db, tmp_path, capsys):
    from app.cli import main

    built, roles, _ = run_db
    out = tmp_path / "cli"
    assert (
        main(
            [
                "export",
                "--db",
                str(built.db),
                "--format",
                "speculators",
                "--out",
                str(out),
                "--keep-suspect",
                "--keep-roundtrip-failed",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["ids_sources"]["server"] == 1 and "suspect" not in report["skipped"]
    assert {roles["suspect"], roles["roundtrip"]} <= set(_sources(out))
    assert report["files"][0] == "data/speculators_00000.jsonl"
    assert main(["export", "--db", str(built.db), "--format", "modelopt", "--out", str(tmp_path / "text")]) == 0
    line = capsys.readouterr().out
    assert "ids from: " in line and "1 suspect" in line and "1 round-trip failed" in line


def test_a_server_that_leaves_out_the_end_token_is_exported_with_it(
    tmp_path, sample_reference, sample_tokenizer_dir, sample_cases
):
    """Stored true ids (ids_source = server) carry the end token the reconstruction appended where the server's own
    `token_ids` stopped short of it; the export takes the stored ids, not the raw response column."""
    built = build_run_db(tmp_path / "run.db", sample_reference, sample_tokenizer_dir, sample_cases, limit=20)
    sid = next(s for s, cat in built.categories.items() if cat == "exact")
    full = built.output_ids[sid]
    conn = sqlite3.connect(built.db, isolation_level=None)
    pk = conn.execute("SELECT pk FROM samples WHERE sample_id = ?", (sid,)).fetchone()[0]
    conn.execute("UPDATE responses SET token_ids = ? WHERE sample_pk = ?", (pack_ids(full[:-1]), pk))
    conn.execute("UPDATE reconstructions SET ids_source = 'server' WHERE sample_pk = ?", (pk,))
    conn.close()
    Export(built.db, tmp_path / "out", "eagle3-shards").run()
    row = _rows(tmp_path / "out")[sid]
    assert row["input_ids"][row["loss_mask"].index(1) :] == list(full)
    assert row["ids_source"] == _sources(tmp_path / "out")[sid] == "server"
