"""Whole conversations in the export, over a real run of sample_data's conversations through the engine and the
simulator: each done turn is a row whose prompt ids are transformers' own apply_chat_template of that turn's request
(the model's own earlier answers in it) and whose one loss span is that turn's answer; merged rows are exactly the
concatenation they claim, and a conversation whose template breaks the prefix property keeps its per-turn rows,
counted by why."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest

from app.errors import InputError
from app.export import Export, ExportOptions, ExportPolicy, TrainingRow
from app.export.conversation_rows import merged_row, prefix_break
from app.export.report import summary_line
from app.extract.manifest import read_manifest, read_shard

PRESERVE = {"preserve_thinking": True}  # the sample K2.5 template then renders every earlier answer's reasoning


def _rows(out: Path) -> dict[str, tuple[list[int], list[int]]]:
    return {
        s.sample_id: (list(s.input_ids), list(s.loss_mask)) for e in read_manifest(out).shards for s in read_shard(e)
    }


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def _turns(db: Path) -> dict[str, dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            "SELECT sample_id, conversation_id, turn, turns, state, messages, tools, off_policy "
            "FROM samples ORDER BY pk"
        ).fetchall()
    finally:
        conn.close()
    return {r["sample_id"]: dict(r) for r in rows}


def _hf_prompt(hf, messages, tools) -> list[int]:
    out = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture(scope="module")
def references(sample_data_dir) -> dict[str, list[int]]:
    """The model's answer per turn sample id, as the simulator replays it (independent of the store)."""
    lines = (sample_data_dir / "conversations.reference.jsonl").read_text(encoding="utf-8").splitlines()
    return {(rec := json.loads(line))["id"]: rec["output_ids"] for line in lines}


@pytest.fixture(scope="module")
def per_turn(conversation_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("per-turn") / "out"
    return out, Export(conversation_run, out, "eagle3-shards").run()


def test_each_turn_is_a_row_of_its_requests_prompt_by_transformers_and_its_answer(
    per_turn, conversation_run, hf_sample_tokenizer, references
):
    out, report = per_turn
    rows = _rows(out)
    turns = _turns(conversation_run)
    done = {sid for sid, t in turns.items() if t["state"] == "done"}
    assert set(rows) == done and report.exported == len(done) == report.seen
    later = 0
    for sid, (ids, mask) in rows.items():
        turn = turns[sid]
        messages, tools = json.loads(turn["messages"]), json.loads(turn["tools"]) if turn["tools"] else None
        [(start, end)] = _spans(mask)  # one loss span: this turn's answer
        assert ids[:start] == _hf_prompt(hf_sample_tokenizer, messages, tools), sid
        assert ids[start:end] == references[sid] and end == len(ids), sid
        if turn["turn"] > 1:  # its request carries the model's own earlier answers, none of the dataset's
            answers = [m for m in messages if m["role"] == "assistant"]
            assert len(answers) >= turn["turn"] - 1
            assert not any("The dataset says:" in (m.get("content") or "") for m in answers), sid
            later += 1
    assert later >= 40
    c = report.conversations
    assert (c["mode"], c["conversations"], c["turns"], c["exported_turns"], c["merged"]) == (
        "per-turn",
        16,
        len(done),
        len(done),
        0,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["conversations"] == c
    with (out / "samples.tsv").open(encoding="utf-8") as fh:
        listed = {r["id"]: r for r in csv.DictReader(fh, delimiter="\t")}
    assert {sid: int(r["turns"]) for sid, r in listed.items()} == {sid: turns[sid]["turn"] for sid in rows}


def test_a_conversations_rows_fall_on_one_side_of_the_eval_split(conversation_run, tmp_path):
    out = tmp_path / "split"
    report = Export(conversation_run, out, "eagle3-shards", ExportOptions(eval_fraction=0.4)).run()
    train, held = _rows(out), _rows(out / "eval")
    assert train and held and report.eval_exported == len(held)
    sides: dict[str, set[str]] = {}
    for side, rows in (("train", train), ("eval", held)):
        for sid in rows:
            sides.setdefault(sid.split("#")[0], set()).add(side)
    assert all(len(s) == 1 for s in sides.values()), sides


@pytest.fixture(scope="module")
def merged_pair(conversation_run, tmp_path_factory):
    """The per-turn and the merged export with earlier reasoning kept in the history (every conversation merges)."""
    tmp = tmp_path_factory.mktemp("merged")
    Export(conversation_run, tmp / "turns", "eagle3-shards", ExportOptions(template_kwargs=PRESERVE)).run()
    report = Export(
        conversation_run,
        tmp / "merged",
        "eagle3-shards",
        ExportOptions(template_kwargs=PRESERVE, conversations="merged"),
    ).run()
    return _rows(tmp / "turns"), _rows(tmp / "merged"), report


def test_a_merged_row_is_the_concatenation_of_its_turns_rows(merged_pair, conversation_run):
    turns_rows, merged, report = merged_pair
    turns = _turns(conversation_run)
    assert set(merged) == {t["conversation_id"] for t in turns.values()}
    for cid, (ids, mask) in merged.items():
        done = sorted(
            (t["turn"], sid) for sid, t in turns.items() if t["conversation_id"] == cid and t["state"] == "done"
        )
        spans = _spans(mask)
        assert len(spans) == len(done), cid
        for (start, end), (_, sid) in zip(spans, done, strict=True):
            turn_ids, turn_mask = turns_rows[sid]
            # turn k's row is the merged row up to the end of span k, and span k is that row's own loss span
            assert ids[:end] == turn_ids and _spans(turn_mask) == [(start, end)], sid
        assert sum(mask) == sum(sum(turns_rows[sid][1]) for _, sid in done)
    c = report.conversations
    assert (c["merged"], c["merged_turns"], sum(c["per_turn"].values())) == (16, len(turns_rows), 0)
    assert report.exported - c["merged"] + c["merged_turns"] + sum(report.skipped.values()) == report.seen


def test_a_conversation_that_ended_early_merges_its_done_prefix(merged_pair, conversation_run):
    _, merged, report = merged_pair
    turns = [t for t in _turns(conversation_run).values() if t["conversation_id"] == "conv-oa-03"]
    done = [t for t in turns if t["state"] == "done"]
    assert 0 < len(done) < turns[0]["turns"]  # it diverged: the stop policy ended it
    assert len(_spans(merged["conv-oa-03"][1])) == len(done)
    assert report.conversations["merged_prefix"] == 1


def test_merged_keeps_per_turn_rows_where_the_template_drops_earlier_reasoning(per_turn, conversation_run, tmp_path):
    """The run's own template settings (K2.5: reasoning only after the last user message): a conversation whose
    answers had reasoning cannot merge; its per-turn rows are written unchanged and counted under why."""
    out = tmp_path / "merged"
    report = Export(conversation_run, out, "eagle3-shards", ExportOptions(conversations="merged")).run()
    c = report.conversations
    assert c["per_turn"]["history_reasoning_dropped"] > 0
    assert c["merged"] + sum(c["per_turn"].values()) + c["none_kept"] == c["conversations"] == 16
    rows, turn_rows = _rows(out), _rows(per_turn[0])
    for sid, row in rows.items():
        if "#" in sid:  # a conversation kept per-turn: exactly its per-turn row
            assert row == turn_rows[sid]
        else:  # merged: ends as its last turn's row does
            last = max((k for k in turn_rows if k.startswith(sid + "#")), key=lambda k: int(k.split("#")[1]))
            assert row[0] == turn_rows[last][0]
    assert report.exported - c["merged"] + c["merged_turns"] + sum(report.skipped.values()) == report.seen
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["conversations"] == c
    line = summary_line(report)
    assert f"{c['merged']} merged into one row each" in line
    assert f"{c['per_turn']['history_reasoning_dropped']} history reasoning dropped" in line


def test_off_policy_turns_are_exported_counted_and_marked_or_dropped(conversation_run_replay, tmp_path):
    turns = _turns(conversation_run_replay)
    off = {sid for sid, t in turns.items() if t["off_policy"] and t["state"] == "done"}
    assert off
    report = Export(conversation_run_replay, tmp_path / "all", "eagle3-shards").run()
    assert report.conversations["off_policy_turns"] == len(off)
    with (tmp_path / "all" / "samples.tsv").open(encoding="utf-8") as fh:
        marked = {r["id"] for r in csv.DictReader(fh, delimiter="\t") if r["off_policy"] == "1"}
    assert marked == off
    dropped = Export(
        conversation_run_replay,
        tmp_path / "on",
        "eagle3-shards",
        ExportOptions(policy=ExportPolicy(keep_off_policy=False)),
    ).run()
    assert dropped.skipped == {"off_policy": len(off)} and not set(_rows(tmp_path / "on")) & off


def test_sglang_raw_refuses_merged_conversations(conversation_run, tmp_path):
    with pytest.raises(InputError, match="sglang-raw holds one request"):
        Export(conversation_run, tmp_path / "raw", "sglang-raw", ExportOptions(conversations="merged")).run()
    assert not (tmp_path / "raw").exists()


@pytest.mark.parametrize("mode", ["per-turn", "merged"])
def test_rendering_in_worker_processes_writes_the_same_conversation_rows(conversation_run, tmp_path, mode):
    Export(conversation_run, tmp_path / "one", "eagle3-shards", ExportOptions(conversations=mode)).run()
    Export(conversation_run, tmp_path / "two", "eagle3-shards", ExportOptions(conversations=mode, workers=2)).run()
    assert _rows(tmp_path / "two") == _rows(tmp_path / "one")
    assert (tmp_path / "two" / "samples.tsv").read_text() == (tmp_path / "one" / "samples.tsv").read_text()


@pytest.mark.kimi
def test_kimi_per_turn_prompts_equal_transformers_rendering_encoded_by_tiktoken(
    conversation_run, kimi_tokenizer_dir, sample_tokenizer_dir, tmp_path
):
    """The same conversations with the real Kimi K2.5 vocabulary (the answers re-encoded with it; the files ship
    no template, so the sample's K2.5 template is given): each turn's prompt ids are what transformers' own
    renderer (`render_jinja_template`, behind apply_chat_template) gives for its request, encoded by tiktoken's
    own loop with every special token allowed."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from app.export import load_chat_template
    from app.store.db import configure, migrate
    from app.store.ids import pack_ids, unpack_ids
    from app.tokens import load_tokenizer

    kimi, small = load_tokenizer(kimi_tokenizer_dir), load_tokenizer(sample_tokenizer_dir)
    db = tmp_path / "kimi.db"
    migrate(db)
    src = sqlite3.connect(conversation_run)
    conn = sqlite3.connect(db, isolation_level=None)
    configure(conn)
    config = {"model": {"tokenizer": str(kimi_tokenizer_dir), "profile": "kimi-k2.5"}, "endpoints": []}
    conn.execute("BEGIN")
    run_id = conn.execute(
        "INSERT INTO runs (name, config, state, created_at, updated_at) VALUES ('k', ?, 'done', 0, 0)",
        (json.dumps(config),),
    ).lastrowid
    for sid, messages, tools, cid, turn, turns, ids in src.execute(
        "SELECT s.sample_id, s.messages, s.tools, s.conversation_id, s.turn, s.turns, r.output_ids FROM samples s "
        "JOIN reconstructions r ON r.sample_pk = s.pk WHERE s.state = 'done' ORDER BY s.pk"
    ):
        output = kimi.encode(small.decode(unpack_ids(ids)))
        pk = conn.execute(
            "INSERT INTO samples (run_id, sample_id, dataset, messages, tools, conversation_id, turn, "
            "turns, state, attempts, updated_at) VALUES (?, ?, 'c', ?, ?, ?, ?, ?, 'done', 1, 0)",
            (run_id, sid, messages, tools, cid, turn, turns),
        ).lastrowid
        rid = conn.execute(
            "INSERT INTO responses (run_id, sample_pk, attempt, endpoint, finish_reason, created_at) "
            "VALUES (?, ?, 1, 'sim', 'stop', 0)",
            (run_id, pk),
        ).lastrowid
        conn.execute(
            "INSERT INTO reconstructions (run_id, sample_pk, response_id, tokenizer, strategy, output_ids, "
            "category, n_tokens, created_at) VALUES (?, ?, ?, ?, 'canonical', ?, 'exact', ?, 0)",
            (run_id, pk, rid, kimi.fingerprint, pack_ids(output), len(output)),
        )
    conn.execute("COMMIT")
    conn.close()
    src.close()
    template = tmp_path / "k25.jinja"
    template.write_text(load_chat_template(sample_tokenizer_dir).text, encoding="utf-8")
    report = Export(db, tmp_path / "out", "eagle3-shards", ExportOptions(chat_template=template)).run()
    merged = Export(
        db, tmp_path / "merged", "eagle3-shards", ExportOptions(chat_template=template, conversations="merged")
    ).run()
    specials = load_chat_template(sample_tokenizer_dir).special_tokens
    stored = _turns(db)
    rows = _rows(tmp_path / "out")
    assert len(rows) == report.seen > 40
    for sid, (ids, mask) in rows.items():
        t = stored[sid]
        [text], _ = render_jinja_template(
            conversations=[json.loads(t["messages"])],
            tools=json.loads(t["tools"]) if t["tools"] else None,
            chat_template=template.read_text(encoding="utf-8"),
            add_generation_prompt=True,
            **specials,
        )
        [(start, _)] = _spans(mask)
        assert ids[:start] == kimi.encoding.encode(text, allowed_special="all"), sid
    c = merged.conversations
    assert c["merged"] + sum(c["per_turn"].values()) == c["conversations"] == 16
    assert c["per_turn"]["history_reasoning_dropped"] > 0  # K2.5 drops earlier reasoning after a later user turn


def _row(sid, prompt, output, source="server", verdict="exact"):
    n = len(prompt)
    return TrainingRow(sid, [*prompt, *output], ((n, n + len(output)),), source, verdict)


def test_prefix_break_names_the_first_turn_whose_prompt_does_not_extend_the_row_before():
    one = _row("c#1", [1, 2], [3, 4])
    two = _row("c#2", [1, 2, 3, 4, 5], [6])
    assert prefix_break([one, two]) is None
    dropped = _row("c#2", [1, 2, 4, 5], [6])  # the history lost id 3 (as a dropped reasoning would)
    assert prefix_break([one, dropped]) == 1 and prefix_break([one, two, _row("c#3", [1, 2, 3], [9])]) == 2


def test_a_merged_row_takes_the_least_certain_ids_source_and_every_span():
    one = _row("c#1", [1, 2], [3, 4], "server")
    two = _row("c#2", [1, 2, 3, 4, 5], [6, 7], "text", "bpe_equivalent")
    row = merged_row("c", [one, two])
    assert (row.sample_id, row.split_key, row.input_ids) == ("c", "c", [1, 2, 3, 4, 5, 6, 7])
    assert row.loss_spans == ((2, 4), (5, 7)) and row.loss_mask == [0, 0, 1, 1, 0, 1, 1]
    assert (row.ids_source, row.verdict) == ("text", "bpe_equivalent+exact")
