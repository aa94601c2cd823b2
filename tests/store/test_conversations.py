"""Whole conversations in the store (schema v8): read from files, ingested as turn rows, each turn made ready (or
the conversation ended) in the transaction that stores its parent's result, leased longest chain first, counted."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.config import parse_config
from app.conversation import ConversationInput, split_turns
from app.datasets import ReadStats, iter_conversations
from app.engine.work.config_ingest import ingest_config
from app.records import Completion, ToolCall
from app.store import queries, tallies
from app.store.conversation_ops import restore_children_of
from app.store.db import migrate
from app.store.run_store import RunStore, StoreWriteError
from app.store.schema import MIGRATIONS
from app.store.store_records import ResultRecord, SampleInput


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


AGENT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [call("r0", "get_weather", '{"city": "Paris"}')]},
    {"role": "tool", "tool_call_id": "r0", "content": "sunny"},
    {"role": "assistant", "content": "Sunny, says the dataset."},
    {"role": "user", "content": "And tomorrow?"},
    {"role": "assistant", "content": "Rain, says the dataset."},
]


def conv(cid: str, messages=AGENT, policy: str = "stop") -> ConversationInput:
    return ConversationInput(cid, "agent", None, split_turns(messages), policy)


def tool_answer(city: str = "Paris") -> Completion:
    return Completion(
        "",
        "I call the tool.",
        (ToolCall("functions.get_weather:0", "get_weather", json.dumps({"city": city})),),
        "tool_calls",
    )


async def opened(tmp_path: Path) -> tuple[RunStore, int, sqlite3.Connection]:
    store = await RunStore.open(tmp_path / "run.db")
    run_id = await store.ensure_run("r")
    return store, run_id, sqlite3.connect(tmp_path / "run.db")


def states(conn: sqlite3.Connection) -> dict[str, tuple[str, str | None]]:
    return {sid: (state, err) for sid, state, err in conn.execute("SELECT sample_id, state, error_class FROM samples")}


# ---------------------------------------------------------------------------------------------- reading


def test_conversation_files_read_in_every_format_with_bad_lines_named(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    lines = [
        {"id": "a", "messages": AGENT},
        {"id": "b", "messages": [{"role": "user", "content": "u"}, {"role": "tool", "content": "r"}]},
        {"id": "c#1", "messages": AGENT},
        {"messages": AGENT[:2]},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    stats = ReadStats()
    got = list(iter_conversations(path, "openai-messages", stats=stats, on_tool_divergence="replay"))
    assert [c.conversation_id for c in got][0] == "a" and got[1].conversation_id.startswith("c-")
    assert [len(c.turns) for c in got] == [3, 1] and got[0].on_tool_divergence == "replay"
    assert stats.bad == 2
    assert (
        stats.examples[0] == f"{path}:2: messages[1] is a tool result, but the assistant message before it has no "
        "tool_calls; regenerating whole conversations needs structured tool calls (openai-messages)"
    )
    assert "holds '#'" in stats.examples[1] and stats.examples[1].startswith(f"{path}:3:")
    share = tmp_path / "s.jsonl"
    share.write_text(
        json.dumps(
            {
                "id": "s",
                "conversations": [
                    {"from": "human", "value": "hi"},
                    {"from": "gpt", "value": "hello"},
                    {"from": "human", "value": "bye"},
                ],
            }
        )
        + "\n"
    )
    (only,) = iter_conversations(share, "sharegpt")
    assert [t.recorded for t in only.turns] == [{"role": "assistant", "content": "hello"}, None]


# ---------------------------------------------------------------------------------------------- ingest


async def test_ingest_writes_turn_one_pending_and_later_turns_waiting_with_their_parents(tmp_path: Path):
    store, run_id, conn = await opened(tmp_path)
    try:
        report = await store.ingest_conversations(run_id, [conv("a"), conv("b")])
        assert (report.added, report.already_present, report.conflicts) == (2, 0, 0)
        rows = conn.execute(
            "SELECT sample_id, state, turn, turns, parent_pk, messages, pk FROM samples ORDER BY pk"
        ).fetchall()
        assert [(r[0], r[1], r[2], r[3]) for r in rows[:3]] == [
            ("a#1", "pending", 1, 3),
            ("a#2", "waiting", 2, 3),
            ("a#3", "waiting", 3, 3),
        ]
        assert rows[1][4] == rows[0][6] and rows[2][4] == rows[1][6] and rows[0][4] is None
        assert json.loads(rows[0][5]) == AGENT[:1] and rows[1][5] == "[]"
        assert queries.state_counts(conn, run_id) == {
            "pending": 2,
            "waiting": 4,
            "leased": 0,
            "done": 0,
            "failed": 0,
            "skipped": 0,
        }
        again = await store.ingest_conversations(run_id, [conv("a"), conv("b", AGENT[:4])])
        assert (again.added, again.already_present, again.conflicts) == (0, 1, 1)
        assert "conversation 'b' is already held with other turns or content" in again.conflict_examples[0]
        assert conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 6
        counts = queries.conversation_counts(conn, run_id)
        tallies.recount(conn, run_id)
        assert queries.conversation_counts(conn, run_id) == counts and counts.total == counts.not_started == 2
    finally:
        await store.close()


async def test_ingest_config_reads_a_regenerate_all_dataset_as_conversations(tmp_path: Path, sample_data_dir: Path):
    data = tmp_path / "conv.jsonl"
    data.write_text(json.dumps({"id": "a", "messages": AGENT}) + "\n")
    config = parse_config(
        {
            "run": {"name": "c", "database": str(tmp_path / "run.db")},
            "data": {"datasets": [{"path": str(data), "regenerate": "all", "on_tool_divergence": "replay"}]},
            "model": {"name": "m", "tokenizer": str(sample_data_dir / "tokenizer")},
            "endpoints": [{"base_url": "http://127.0.0.1:9/v1"}],
        },
        base_dir=tmp_path,
    )
    store = await RunStore.open(config.run.database)
    try:
        report = await ingest_config(store, config)
        assert report.added == 1
        again = await ingest_config(store, config)
        assert again.datasets[0].state == "unchanged"
    finally:
        await store.close()
    conn = sqlite3.connect(tmp_path / "run.db")
    assert conn.execute("SELECT sample_id, divergence FROM samples ORDER BY pk").fetchall() == [
        ("a#1", "replay"),
        ("a#2", "replay"),
        ("a#3", "replay"),
    ]


# ---------------------------------------------------------------------------------------------- a turn's end


async def test_a_stored_answer_makes_the_next_turn_ready_with_the_models_own_history(tmp_path: Path):
    store, run_id, conn = await opened(tmp_path)
    try:
        await store.ingest_conversations(run_id, [conv("a")])
        (t1,) = await store.lease(run_id, 10, 60)
        assert (t1.conversation_id, t1.turn, t1.turns) == ("a", 1, 3)
        assert await store.lease(run_id, 10, 60) == []  # turn 2 waits on turn 1
        await store.record_result(ResultRecord(run_id, t1.pk, 1, "ep", tool_answer(), 0.0, profile="kimi-k2.5"))
        (t2,) = await store.lease(run_id, 10, 60)
        assert t2.sample_id == "a#2"
        assert t2.messages == [
            AGENT[0],
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "I call the tool.",
                "tool_calls": [call("functions.get_weather:0", "get_weather", '{"city": "Paris"}')],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
        ]
        await store.record_result(
            ResultRecord(run_id, t2.pk, 1, "ep", Completion("Sunny!", "It says sunny."), 0.0, profile="kimi-k2.5")
        )
        (t3,) = await store.lease(run_id, 10, 60)
        assert t3.messages[3] == {"role": "assistant", "content": "Sunny!", "reasoning_content": "It says sunny."}
        assert t3.messages[4] == AGENT[4] and AGENT[3] not in t3.messages and AGENT[1] not in t3.messages
        stored = dict(conn.execute("SELECT sample_id, messages FROM samples").fetchall())
        assert stored["a#3"].startswith(stored["a#2"][:-1]) and stored["a#2"].startswith(stored["a#1"][:-1])
    finally:
        await store.close()


async def test_a_profile_that_drops_history_reasoning_sends_none(tmp_path: Path):
    store, run_id, _ = await opened(tmp_path)
    try:
        await store.ingest_conversations(run_id, [conv("a")])
        (t1,) = await store.lease(run_id, 10, 60)
        await store.record_result(ResultRecord(run_id, t1.pk, 1, "ep", tool_answer(), 0.0, profile="deepseek-v3.1"))
        (t2,) = await store.lease(run_id, 10, 60)
        assert "reasoning_content" not in t2.messages[1]
    finally:
        await store.close()


async def test_the_child_is_made_ready_in_the_parents_transaction_or_not_at_all(tmp_path: Path):
    store, run_id, conn = await opened(tmp_path)
    try:
        await store.ingest_conversations(run_id, [conv("a")])
        (t1,) = await store.lease(run_id, 10, 60)
        from app.records import Reconstruction, Verdict

        with pytest.raises(StoreWriteError):  # a bad verdict fails the whole result: no response, no ready child
            await store.record_result(
                ResultRecord(
                    run_id,
                    t1.pk,
                    1,
                    "ep",
                    tool_answer(),
                    0.1,
                    Reconstruction((1,), "canonical"),
                    Verdict("bogus"),
                    None,
                )
            )
        assert states(conn)["a#2"] == ("waiting", None)
        assert conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 0
    finally:
        await store.close()


@pytest.mark.parametrize("policy", ["stop", "replay"])
async def test_a_divergent_tool_call_stops_or_replays_marked_off_policy(tmp_path: Path, policy: str):
    store, run_id, conn = await opened(tmp_path)
    try:
        await store.ingest_conversations(run_id, [conv("a", policy=policy)])
        (t1,) = await store.lease(run_id, 10, 60)
        await store.record_result(ResultRecord(run_id, t1.pk, 1, "ep", tool_answer("Lyon"), 0.0, profile="kimi-k2.5"))
        counts = queries.conversation_counts(conn, run_id)
        if policy == "stop":
            assert states(conn) == {
                "a#1": ("done", None),
                "a#2": ("skipped", "diverged"),
                "a#3": ("skipped", "parent_skipped"),
            }
            assert counts.diverged == 1 and counts.open == 0
            assert "Lyon" in conn.execute("SELECT last_error FROM samples WHERE sample_id = 'a#2'").fetchone()[0]
        else:
            (t2,) = await store.lease(run_id, 10, 60)
            assert t2.messages[2]["content"] == "sunny"
            await store.record_result(ResultRecord(run_id, t2.pk, 1, "ep", Completion("Lyon is sunny."), 0.0))
            off = dict(conn.execute("SELECT sample_id, off_policy FROM samples").fetchall())
            assert off == {"a#1": 0, "a#2": 1, "a#3": 1}
            assert queries.conversation_counts(conn, run_id).off_policy_turns == 2
    finally:
        await store.close()


async def test_a_turn_failed_for_good_ends_its_conversation_and_retrying_restores_it(tmp_path: Path):
    store, run_id, conn = await opened(tmp_path)
    try:
        await store.ingest_conversations(run_id, [conv("a")])
        (t1,) = await store.lease(run_id, 10, 60)
        await store.record_failure(run_id, t1.pk, "500", "server error", final=True, endpoint="ep", attempt=1)
        assert states(conn) == {
            "a#1": ("failed", "500"),
            "a#2": ("skipped", "parent_failed"),
            "a#3": ("skipped", "parent_skipped"),
        }
        assert queries.conversation_counts(conn, run_id).failed == 1
        conn.execute("BEGIN")  # what --retry-failed does in its transaction: the turn pending, its children waiting
        conn.execute("UPDATE samples SET state = 'pending', error_class = NULL WHERE pk = ?", (t1.pk,))
        assert restore_children_of(conn, run_id, [t1.pk]) == 2
        conn.execute("COMMIT")
        assert states(conn) == {"a#1": ("pending", None), "a#2": ("waiting", None), "a#3": ("waiting", None)}
        counts = queries.conversation_counts(conn, run_id)
        assert (counts.open, counts.failed, counts.not_started) == (1, 0, 1)
    finally:
        await store.close()


async def test_a_skipped_turn_and_a_truncated_answer_end_the_conversation(tmp_path: Path):
    store, run_id, conn = await opened(tmp_path)
    try:
        await store.ingest_conversations(run_id, [conv("a"), conv("b")])
        t1a, t1b = await store.lease(run_id, 10, 60)
        await store.skip(run_id, [t1a.pk], "prompt too long")
        await store.record_result(ResultRecord(run_id, t1b.pk, 1, "ep", Completion("cut", finish_reason="length"), 0.0))
        s = states(conn)
        assert s["a#2"] == ("skipped", "parent_skipped") and s["b#2"] == ("skipped", "parent_truncated")
        counts = queries.conversation_counts(conn, run_id)
        assert (counts.ended_skipped, counts.truncated, counts.open) == (1, 1, 0)
    finally:
        await store.close()


async def test_leases_take_the_longest_remaining_chain_first(tmp_path: Path):
    store, run_id, _ = await opened(tmp_path)
    try:
        await store.ingest(run_id, [SampleInput("single", "one", [{"role": "user", "content": "x"}])])
        await store.ingest_conversations(run_id, [conv("short", AGENT[:2]), conv("long")])
        leased = await store.lease(run_id, 10, 60)
        assert [s.sample_id for s in leased] == ["long#1", "single", "short#1"]
        assert [s.turns_after for s in leased] == [2, 0, 0]
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------------- reads, migration


async def test_the_conversation_view_reads_each_conversation_and_its_turns(tmp_path: Path):
    store, run_id, conn = await opened(tmp_path)
    try:
        await store.ingest_conversations(run_id, [conv("a"), conv("b")])
        t1a, _ = await store.lease(run_id, 10, 60)
        await store.record_result(ResultRecord(run_id, t1a.pk, 1, "ep", tool_answer(), 0.0))
        page = queries.conversation_page(conn, run_id)
        assert [(c.conversation_id, c.status, c.at_turn, c.done_turns) for c in page] == [
            ("a", "ready", 2, 1),
            ("b", "running", 1, 0),
        ]
        assert queries.conversation_page(conn, run_id, after_pk=page[0].pk)[0].conversation_id == "b"
        turns = queries.conversation_turns(conn, run_id, "a")
        assert [(t.sample_id, t.state) for t in turns] == [("a#1", "done"), ("a#2", "pending"), ("a#3", "waiting")]
        counts = queries.conversation_counts(conn, run_id)
        assert (counts.total, counts.open, counts.in_flight, counts.waiting_on_parent, counts.in_progress) == (
            2,
            2,
            1,
            1,
            2,
        )
    finally:
        await store.close()


def test_a_v6_database_migrates_with_its_rows_and_accepts_waiting_turns(tmp_path: Path):
    path = tmp_path / "old.db"
    migrate(path, migrations=MIGRATIONS[:6])
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('r', 0, 0)")
    conn.executemany(
        "INSERT INTO samples (run_id, sample_id, dataset, messages, state) VALUES (1, ?, 'd', '[]', ?)",
        [("a", "pending"), ("b", "done")],
    )
    conn.commit()
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO samples (run_id, sample_id, dataset, messages, state) VALUES (1, 'w', 'd', '[]', 'waiting')"
        )
    conn.close()
    assert migrate(path) == len(MIGRATIONS)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.execute(
        "INSERT INTO samples (run_id, sample_id, dataset, messages, state) VALUES (1, 'w', 'd', '[]', 'waiting')"
    )
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO samples (run_id, sample_id, dataset, messages, state) VALUES (1, 'x', 'd', '[]', 'bogus')"
        )
    assert conn.execute("SELECT sample_id, state FROM samples ORDER BY pk").fetchall() == [
        ("a", "pending"),
        ("b", "done"),
        ("w", "waiting"),
    ]
