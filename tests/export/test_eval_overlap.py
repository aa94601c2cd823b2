"""Eval prompts kept out of training: exact overlap (normalised prompt hash) left out and counted, near-duplicates
(word 8-gram containment) reported, and the export's own eval split never sharing a prompt with its train split."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from app.errors import InputError
from app.export import EVAL_DIR, Export, ExportOptions
from app.export.eval_overlap import prompt_hash, split_key


def _ids(folder: Path) -> list[str]:
    with (folder / "samples.tsv").open(encoding="utf-8") as fh:
        return [row["id"] for row in csv.DictReader(fh, delimiter="\t")]


def _plain(messages: list[dict]) -> bool:
    return all(isinstance(m.get("content"), str) and m["role"] in ("system", "user") for m in messages)


def _respaced(text: str) -> str:
    return "  " + text.replace(" ", " \n\t ") + "\n"


def _as_sharegpt(sid: str, messages: list[dict]) -> str:
    who = {"system": "system", "user": "human"}
    return json.dumps(
        {"id": sid, "conversations": [{"from": who[m["role"]], "value": _respaced(m["content"])} for m in messages]}
    )


@pytest.fixture(scope="module")
def overlap_case(built_run, tmp_path_factory):
    """An eval file holding 10 % of the exported training prompts (re-spaced, in ShareGPT form) and, in
    openai-messages form, near-variants of a few others (their last word changed): (file, exact ids, near ids)."""
    tmp = tmp_path_factory.mktemp("overlap")
    Export(built_run.db, tmp / "plain", "eagle3-shards").run()
    exported = [sid for sid in _ids(tmp / "plain") if _plain(built_run.records[sid]["messages"])]
    exact = exported[::10]
    words = {
        sid: " ".join(m["content"] for m in built_run.records[sid]["messages"] if m["role"] == "user").split()
        for sid in exported
    }
    near = [sid for sid in exported if sid not in exact and len(words[sid]) >= 24][:4]
    assert len(exact) >= 20 and len(near) == 4
    lines = [_as_sharegpt(f"eval-{sid}", built_run.records[sid]["messages"]) for sid in exact]
    for sid in near:
        text = " ".join(words[sid][:-1] + ["different"])
        lines.append(json.dumps({"id": f"near-{sid}", "messages": [{"role": "user", "content": text}]}))
    (tmp / "eval.sharegpt.jsonl").write_text("\n".join(lines[: len(exact)]) + "\n", encoding="utf-8")
    (tmp / "eval.messages.jsonl").write_text("\n".join(lines[len(exact) :]) + "\n", encoding="utf-8")
    return [tmp / "eval.sharegpt.jsonl", tmp / "eval.messages.jsonl"], set(exact), set(near), set(_ids(tmp / "plain"))


def test_the_hash_ignores_whitespace_runs_and_nothing_else():
    one = [{"role": "user", "content": "Sum  the\nlist "}]
    assert prompt_hash(one) == prompt_hash([{"role": "user", "content": " Sum the list"}])
    assert prompt_hash(one) != prompt_hash([{"role": "user", "content": "sum the list"}])
    assert prompt_hash(one) != prompt_hash([{"role": "system", "content": "Sum the list"}])


def test_training_prompts_equal_to_eval_prompts_are_counted_and_left_out(built_run, overlap_case, tmp_path):
    files, exact, near, everything = overlap_case
    report = Export(built_run.db, tmp_path / "out", "eagle3-shards", ExportOptions(eval_prompts=tuple(files))).run()
    written = set(_ids(tmp_path / "out"))
    assert written == everything - exact
    tally = report.eval_overlap
    assert (tally["eval_prompts"], tally["exact"], tally["removed"]) == (len(exact) + len(near), len(exact), len(exact))
    assert report.skipped["eval_overlap"] == len(exact) and report.exported == len(everything) - len(exact)
    assert {e["sample_id"] for e in tally["exact_examples"]} <= exact
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["eval_overlap"]["exact"] == len(exact) and manifest["counts"]["skipped"]["eval_overlap"] == len(
        exact
    )


def test_near_duplicates_are_reported_with_their_ids_but_kept(built_run, overlap_case, tmp_path):
    files, exact, near, everything = overlap_case
    report = Export(built_run.db, tmp_path / "out", "eagle3-shards", ExportOptions(eval_prompts=tuple(files))).run()
    tally = report.eval_overlap
    assert tally["near_duplicates"] == len(near)
    assert {(e["sample_id"], e["eval_id"]) for e in tally["near_examples"]} == {(s, f"near-{s}") for s in near}
    assert all(e["containment"] >= 0.5 for e in tally["near_examples"])
    assert near <= set(_ids(tmp_path / "out"))


def test_keep_eval_overlap_counts_but_keeps_them(built_run, overlap_case, tmp_path):
    files, exact, near, everything = overlap_case
    report = Export(
        built_run.db,
        tmp_path / "out",
        "eagle3-shards",
        ExportOptions(eval_prompts=tuple(files), keep_eval_overlap=True),
    ).run()
    assert set(_ids(tmp_path / "out")) == everything
    assert (report.eval_overlap["exact"], report.eval_overlap["removed"]) == (len(exact), 0)


def test_the_cli_takes_eval_prompts_and_says_what_it_found(built_run, overlap_case, tmp_path, capsys):
    from app.cli import main

    files, exact, near, _ = overlap_case
    assert (
        main(
            [
                "export",
                "--db",
                str(built_run.db),
                "--format",
                "specforge",
                "--out",
                str(tmp_path / "o"),
                "--eval-prompts",
                *map(str, files),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"{len(exact)} training prompt(s) equal one, left out; {len(near)} near-duplicate(s)" in out


def test_an_eval_file_of_no_known_format_is_refused_with_its_name(built_run, tmp_path):
    bad = tmp_path / "eval.jsonl"
    bad.write_text('{"prompt": "hi"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"eval\.jsonl:1: eval prompts need a 'messages' or 'conversations'"):
        Export(built_run.db, tmp_path / "out", "eagle3-shards", ExportOptions(eval_prompts=(bad,))).run()
    assert not (tmp_path / "out").exists()


def test_the_eval_split_never_shares_a_prompt_with_the_train_split(
    tmp_path, sample_reference, sample_tokenizer_dir, sample_cases
):
    from tests.export.conftest import build_run_db

    records = [json.loads(line) for line in sample_reference.read_text(encoding="utf-8").splitlines()]
    for i in range(1, len(records), 3):  # every third sample repeats the prompt before it, re-spaced
        records[i]["messages"] = [
            dict(m, content=_respaced(m["content"])) if isinstance(m.get("content"), str) else m
            for m in records[i - 1]["messages"]
        ]
    reference = tmp_path / "reference.jsonl"
    reference.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    built = build_run_db(tmp_path / "run.db", reference, sample_tokenizer_dir, sample_cases)
    Export(built.db, tmp_path / "out", "eagle3-shards", ExportOptions(eval_fraction=0.3)).run()
    train, evals = _ids(tmp_path / "out"), _ids(tmp_path / "out" / EVAL_DIR)
    side: dict[str, set[str]] = {}
    for where, ids in (("train", train), ("eval", evals)):
        for sid in ids:
            side.setdefault(prompt_hash(built.records[sid]["messages"]), set()).add(where)
    shared = [h for h, sides in side.items() if len(sides) > 1]
    assert evals and train and not shared
    pairs = sum(1 for i in range(1, len(records), 3) if {records[i]["id"], records[i - 1]["id"]} <= set(train + evals))
    assert pairs > 20  # the duplicated prompts were exported, so the split had something to keep together


def test_a_conversations_turns_share_one_split_key():
    opening = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = [*opening, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert split_key(opening) == split_key(later) == prompt_hash(opening)


def test_the_run_configs_export_section_names_the_eval_prompts(built_run, overlap_case, tmp_path):
    import shutil
    import sqlite3

    files, exact, near, everything = overlap_case
    db = tmp_path / "run.db"
    shutil.copy(built_run.db, db)
    with sqlite3.connect(db) as conn:
        config = json.loads(conn.execute("SELECT config FROM runs").fetchone()[0])
        config["export"] = {"eval_prompts": [str(f) for f in files], "keep_eval_overlap": False}
        conn.execute("UPDATE runs SET config = ?", (json.dumps(config),))
    report = Export(db, tmp_path / "out", "eagle3-shards").run()
    assert report.eval_overlap["exact"] == len(exact) and set(_ids(tmp_path / "out")) == everything - exact
    kept = Export(db, tmp_path / "kept", "eagle3-shards", ExportOptions(keep_eval_overlap=True)).run()  # the flag wins
    assert kept.eval_overlap["removed"] == 0 and set(_ids(tmp_path / "kept")) == everything
