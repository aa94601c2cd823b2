"""Whole conversations through the engine, over the simulator: every assistant turn is regenerated in order, each
request carrying the model's own earlier answers and none of the dataset's; a divergent tool call ends its
conversation under the stop policy and is marked under replay; the counts agree with the rows."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from app.config import parse_config
from app.engine.run import Run
from app.engine.work.config_ingest import ingest_config
from app.store.queries import run_counts
from app.store.run_store import RunStore
from tests.engine.conftest import config_data

DATASET_ANSWER = "The dataset says:"  # every recorded assistant answer in sample_data's conversations starts so


def _config(tmp_path: Path, sample_data: Path, *, policy: str = "stop", concurrency: int = 8):
    data = config_data(tmp_path, sample_data, simulator={"prompt_cache": True})
    data["data"] = {
        "datasets": [
            {
                "path": str(sample_data / "conversations.openai.jsonl"),
                "format": "openai-messages",
                "regenerate": "all",
                "on_tool_divergence": policy,
            },
            {"path": str(sample_data / "conversations.sharegpt.jsonl"), "format": "sharegpt", "regenerate": "all"},
        ],
        "reference": str(sample_data / "conversations.reference.jsonl"),
    }
    data["limits"]["concurrency_initial"] = concurrency
    return parse_config(data, base_dir=tmp_path)


async def _run(config) -> None:
    store = await RunStore.open(config.run.database)
    try:
        await ingest_config(store, config)
        run = Run(config, store)
        try:
            await run.start()
            await asyncio.wait_for(run.wait(), 60)
        finally:
            await run.close()
    finally:
        await store.close()


def _turns(db: Path) -> dict[str, list[dict]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = conn.execute(
        "SELECT s.pk, s.sample_id, s.conversation_id, s.turn, s.turns, s.state, s.error_class, s.messages, "
        "s.segment, s.off_policy, r.content, r.tool_calls FROM samples s LEFT JOIN responses r "
        "ON r.sample_pk = s.pk AND r.content IS NOT NULL ORDER BY s.conversation_id, s.turn"
    ).fetchall()
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["conversation_id"], []).append(dict(r))
    conn.close()
    return out


async def test_every_turn_is_regenerated_on_the_models_own_history(tmp_path, sample_data_dir):
    config = _config(tmp_path, sample_data_dir)
    await _run(config)
    conversations = _turns(config.run.database)
    assert len(conversations) == 16 and all(cid is not None for cid in conversations)
    checked = 0
    for _cid, turns in conversations.items():
        assert [t["turn"] for t in turns] == list(range(1, turns[0]["turns"] + 1))
        for prev, t in zip(turns, turns[1:]):
            if t["state"] != "done":
                continue
            messages = json.loads(t["messages"])
            segment = json.loads(t["segment"])
            # the request: the parent's request, the model's own answer to it, then this turn's new messages
            assert messages[: len(json.loads(prev["messages"]))] == json.loads(prev["messages"])
            added = messages[len(messages) - len(segment) :]
            answer = messages[len(json.loads(prev["messages"]))]
            assert answer["role"] == "assistant"
            # the recorded tool results answer the model's own calls (their ids rewritten to the model's)
            own_ids = {c["id"] for c in answer.get("tool_calls") or []}
            for m, recorded in zip(added, segment, strict=True):
                if m.get("role") == "tool":
                    assert m["tool_call_id"] in own_ids
                    m, recorded = dict(m, tool_call_id=None), dict(recorded, tool_call_id=None)
                assert m == recorded
            assert (answer.get("content") or "") == (prev["content"] or "")
            calls = json.loads(prev["tool_calls"] or "[]")
            assert [c["function"]["name"] for c in answer.get("tool_calls") or []] == [c["name"] for c in calls]
            checked += 1
        for t in turns:  # no turn's request holds one of the dataset's own answers
            for m in json.loads(t["messages"]):
                if m.get("role") == "assistant":
                    assert DATASET_ANSWER not in (m.get("content") or ""), (t["sample_id"], m)
    assert checked >= 40  # 68 turns in 16 conversations: every later turn but the diverged one's


async def test_the_stop_policy_ends_a_conversation_at_its_divergent_call_and_counts_it(tmp_path, sample_data_dir):
    config = _config(tmp_path, sample_data_dir, policy="stop")
    await _run(config)
    conversations = _turns(config.run.database)
    diverged = {cid: ts for cid, ts in conversations.items() if any(t["error_class"] == "diverged" for t in ts)}
    assert list(diverged) == ["conv-oa-03"]
    turns = diverged["conv-oa-03"]
    first = next(t for t in turns if t["error_class"] == "diverged")
    assert all(t["state"] == "done" for t in turns if t["turn"] < first["turn"])
    assert all(t["state"] == "skipped" for t in turns if t["turn"] >= first["turn"])
    others = [t for cid, ts in conversations.items() if cid != "conv-oa-03" for t in ts]
    assert all(t["state"] == "done" for t in others)
    conn = sqlite3.connect(config.run.database)
    try:
        counts = run_counts(conn, 1).conversations
    finally:
        conn.close()
    assert counts is not None
    assert (counts.total, counts.done, counts.diverged, counts.open) == (16, 15, 1, 0)
    assert counts.turns["done"] == len(others) + first["turn"] - 1
    assert counts.turns["waiting"] == counts.turns["pending"] == counts.turns["leased"] == 0


async def test_the_replay_policy_goes_on_with_the_recorded_results_marked_off_policy(tmp_path, sample_data_dir):
    config = _config(tmp_path, sample_data_dir, policy="replay")
    await _run(config)
    turns = _turns(config.run.database)["conv-oa-03"]
    assert all(t["state"] == "done" for t in turns)
    marked = [t["turn"] for t in turns if t["off_policy"]]
    assert marked and marked == list(range(marked[0], turns[0]["turns"] + 1))  # from the divergence on
    conn = sqlite3.connect(config.run.database)
    try:
        counts = run_counts(conn, 1).conversations
    finally:
        conn.close()
    assert counts.diverged == 0 and counts.done == 16 and counts.off_policy_turns == len(marked)


@pytest.mark.parametrize("concurrency", [1, 16])
async def test_no_turn_is_sent_before_its_parent_is_stored(tmp_path, sample_data_dir, concurrency):
    config = _config(tmp_path, sample_data_dir, concurrency=concurrency)
    await _run(config)
    conn = sqlite3.connect(config.run.database)
    try:
        rows = conn.execute(
            "SELECT c.sample_id, MIN(rc.created_at), MAX(rp.created_at) FROM samples c "
            "JOIN samples p ON p.pk = c.parent_pk JOIN responses rc ON rc.sample_pk = c.pk "
            "JOIN responses rp ON rp.sample_pk = p.pk GROUP BY c.pk"
        ).fetchall()
        sent = conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        samples = conn.execute("SELECT COUNT(*) FROM samples WHERE state = 'done'").fetchone()[0]
    finally:
        conn.close()
    assert rows and all(child >= parent for _, child, parent in rows)
    assert sent == samples  # no faults: one request per turn, none generated twice


async def test_a_sigkill_storm_mid_conversation_loses_no_turn_and_generates_none_twice(tmp_path, sample_data_dir):
    """The engine killed at random moments while conversations are half way: resumed, every turn ends once, none
    before its parent, each request the parent's plus the model's answer, and the ledger is the stored costs."""
    import random
    import signal
    import time

    from tests.engine.test_crash import OK, _start

    config = _config(tmp_path, sample_data_dir)
    store = await RunStore.open(config.run.database)
    try:
        await ingest_config(store, config)
    finally:
        await store.close()
    cfg_path = tmp_path / "config.json"
    rng = random.Random(20261202)
    db_path = config.run.database
    done_before = 0
    for r in range(8):
        data = config_data(
            tmp_path,
            sample_data_dir,
            faults={"500": 0.05},
            simulator={"latency_median_ms": 150.0, "latency_p95_ms": 250.0, "seed": 2000 + r},
            limits={"concurrency_initial": 8, "concurrency_max": 8},
        )
        data["data"] = {
            "datasets": [
                dict(
                    path=str(d.path), format=d.format, regenerate=d.regenerate, on_tool_divergence=d.on_tool_divergence
                )
                for d in config.data.datasets
            ],
            "reference": str(config.data.reference),
        }
        cfg_path.write_text(json.dumps(data))
        proc = _start(cfg_path)
        time.sleep(rng.uniform(0.1, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        db = sqlite3.connect(db_path)
        done_now = db.execute("SELECT COUNT(*) FROM samples WHERE state = 'done'").fetchone()[0]
        db.close()
        assert done_now >= done_before  # nothing committed is lost
        done_before = done_now
    assert done_before < 68, "the kills came too late to test anything"
    proc = _start(cfg_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    engine_spent = float(out.split("spent=")[1])

    db = sqlite3.connect(db_path)
    try:
        states = dict(db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())
        assert states.get("pending", 0) == states.get("leased", 0) == states.get("waiting", 0) == 0
        done = states["done"]
        # every done turn answered exactly once
        assert db.execute(f"SELECT COUNT(*), COUNT(DISTINCT sample_pk) FROM responses WHERE {OK}").fetchone() == (
            done,
            done,
        )
        # no turn done whose parent is not done, none answered before its parent's answer was stored
        assert (
            db.execute(
                "SELECT COUNT(*) FROM samples c JOIN samples p ON p.pk = c.parent_pk "
                "WHERE c.state = 'done' AND p.state != 'done'"
            ).fetchone()[0]
            == 0
        )
        order = db.execute(
            f"SELECT COUNT(*) FROM samples c JOIN samples p ON p.pk = c.parent_pk "
            "JOIN responses rc ON rc.sample_pk = c.pk JOIN responses rp ON rp.sample_pk = p.pk AND "
            f"rp.{OK.replace(' AND ', ' AND rp.')} "
            f"WHERE rc.created_at < rp.created_at"
        ).fetchone()[0]
        assert order == 0
        # each turn's request extends its parent's
        for child, parent in db.execute(
            "SELECT c.messages, p.messages FROM samples c JOIN samples p ON p.pk = c.parent_pk WHERE c.state = 'done'"
        ):
            assert json.loads(child)[: len(json.loads(parent))] == json.loads(parent)
        ledger = db.execute("SELECT SUM(cost_usd) FROM responses").fetchone()[0]
        priced = db.execute(
            f"SELECT SUM(prompt_tokens * 0.6 + completion_tokens * 2.5) / 1e6 FROM responses WHERE {OK}"
        ).fetchone()[0]
    finally:
        db.close()
    assert ledger == pytest.approx(priced, rel=1e-9)
    assert engine_spent == pytest.approx(ledger, rel=1e-9)
