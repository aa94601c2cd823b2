"""The store's side of whole conversations (schema v8): ingesting them as turn rows, and what a turn's end makes
of the turns after it, inside the transaction that stores that end.

Ingest: each conversation's T turns are sample rows `conv#1` … `conv#T` (app.conversation.ConversationInput),
turn 1 pending with its segment as messages, the later turns waiting with messages '[]' and parent_pk set. A
conversation is ingested whole or not at all: one the run already holds (its turn 1's id) is "already present"
when every turn's dataset, tools, segment and recorded answer and the number of turns are the same, else a
conflict reported by file:line (none of its turns is inserted or changed).

`after_turn(conn, ...)` runs inside `RunStore.record_result` / `record_failure` / `skip` (same transaction as the
turn's own state change): a done turn makes the next one pending with its request (the parent's messages + the
model's answer + its segment: `app.conversation.next_turn`), or ends the conversation there (divergent tool calls,
an answer cut at max_tokens); a turn failed or skipped for good ends it. Ending skips the next turn with the
reason and every later one with `parent_skipped`. `restore_children_of` undoes such an ending for a turn that is
tried again (`--retry-failed`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.conversation import (
    ENDED_CLASSES,
    PARENT_FAILED,
    PARENT_SKIPPED,
    ConversationInput,
    answer_message,
    next_turn,
)
from app.store.ingest_ops import INGEST_CHUNK, MAX_CONFLICT_EXAMPLES, StoreWriter, _progress, pipelined
from app.store.store_records import IngestReport
from app.store.tallies import add_ingested_rows

__all__ = [
    "OpenTurnWork",
    "TurnEnd",
    "after_turn",
    "ingest_conversations",
    "next_turn_state",
    "open_turn_work",
    "restore_children_of",
]


# ---------------------------------------------------------------------------------------------- ingest


@dataclass(frozen=True, slots=True)
class _ConversationBatch:
    """A chunk of conversations: per conversation (id, turn-1 sample id, turns, line, its rows as JSON arrays
    [sample_id, dataset, messages, tools, line, conversation_id, turn, turns, segment, recorded, divergence,
    state])."""

    conversations: list[tuple[str, str, int, int, list[list[Any]]]]
    turns: int
    last_line: int


def _conversation_batch(it: Iterator[ConversationInput], chunk: int) -> _ConversationBatch:
    """Up to `chunk` turns' worth of conversations (at least one conversation)."""
    out: list[tuple[str, str, int, int, list[list[Any]]]] = []
    n = 0
    last = 0
    for conv in it:
        total = len(conv.turns)
        rows = []
        for k, t in enumerate(conv.turns, 1):
            segment = list(t.segment)
            rows.append(
                [
                    conv.turn_id(k),
                    conv.dataset,
                    segment if k == 1 else [],
                    conv.tools,
                    conv.line,
                    conv.conversation_id,
                    k,
                    total,
                    segment,
                    t.recorded,
                    conv.on_tool_divergence,
                    "pending" if k == 1 else "waiting",
                    conv.category,
                ]
            )
        out.append((conv.conversation_id, conv.turn_id(1), total, conv.line, rows))
        n += total
        last = max(last, conv.line)
        if n >= chunk:
            break
    return _ConversationBatch(out, n, last)


async def ingest_conversations(
    store: StoreWriter,
    run_id: int,
    conversations: Iterable[ConversationInput],
    *,
    chunk: int = INGEST_CHUNK,
    source: str = "",
    track: tuple[str, str] | None = None,
) -> IngestReport:
    """Insert the conversations the run does not hold yet, as turn rows (module doc), in chunked transactions.
    The report counts conversations (added, already present, conflicts). `source` prefixes each conflict's
    `file:line`; `track` = (role, name) advances that file's `ingest_files` row in each chunk's transaction."""
    return await pipelined(
        store,
        conversations,
        chunk,
        _conversation_batch,
        lambda b: bool(b.conversations),
        lambda b: _insert_conversations_op(run_id, b, source, track),
    )


_INSERT_TURNS = (
    "INSERT OR IGNORE INTO samples (run_id, sample_id, dataset, messages, tools, conversation_id, turn, turns, "
    "segment, recorded, divergence, state, category, updated_at) "
    "SELECT ?1, json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), "
    "CASE json_type(value, '$[3]') WHEN 'null' THEN NULL ELSE json_extract(value, '$[3]') END, "
    "json_extract(value, '$[5]'), json_extract(value, '$[6]'), json_extract(value, '$[7]'), "
    "json_extract(value, '$[8]'), "
    "CASE json_type(value, '$[9]') WHEN 'null' THEN NULL ELSE json_extract(value, '$[9]') END, "
    "json_extract(value, '$[10]'), json_extract(value, '$[11]'), json_extract(value, '$[12]'), ?2 "
    "FROM json_each(?3)"
)
# the turns of conversations the run holds whose stored content differs from the line's (or that are missing)
_TURN_CONFLICTS = (
    "SELECT json_extract(j.value, '$[5]') FROM json_each(?2) AS j LEFT JOIN samples AS s "
    "ON s.run_id = ?1 AND s.sample_id = json_extract(j.value, '$[0]') "
    "WHERE s.pk IS NULL OR s.dataset != json_extract(j.value, '$[1]') OR s.turns != json_extract(j.value, '$[7]') "
    "OR s.segment IS NOT json_extract(j.value, '$[8]') "
    "OR s.recorded IS NOT (CASE json_type(j.value, '$[9]') WHEN 'null' THEN NULL ELSE json_extract(j.value, "
    "'$[9]') END) "
    "OR s.tools IS NOT (CASE json_type(j.value, '$[3]') WHEN 'null' THEN NULL ELSE json_extract(j.value, '$[3]') END)"
)


def _insert_conversations_op(run_id: int, batch: _ConversationBatch, source: str, track: tuple[str, str] | None):
    def op(conn: sqlite3.Connection) -> IngestReport:
        firsts = [c[1] for c in batch.conversations]
        held = {
            sid
            for (sid,) in conn.execute(
                "SELECT s.sample_id FROM json_each(?2) AS j CROSS JOIN samples AS s "
                "ON s.run_id = ?1 AND s.sample_id = j.value",
                (run_id, orjson.dumps(firsts).decode()),
            )
        }
        fresh = [row for c in batch.conversations if c[1] not in held for row in c[4]]
        conflicts: list[str] = []
        present = 0
        if held:
            old = [c for c in batch.conversations if c[1] in held]
            rows = [row for c in old for row in c[4]]
            differing = {cid for (cid,) in conn.execute(_TURN_CONFLICTS, (run_id, orjson.dumps(rows).decode()))}
            stored_turns = dict(
                conn.execute(
                    "SELECT j.value, COUNT(s.pk) FROM json_each(?2) AS j CROSS JOIN samples AS s "
                    "ON s.run_id = ?1 AND s.conversation_id = j.value GROUP BY j.value",
                    (run_id, orjson.dumps([c[0] for c in old]).decode()),
                ).fetchall()
            )
            for cid, _, total, line, _ in old:
                if cid in differing or stored_turns.get(cid, 0) != total:
                    where = (f"{source}:{line}: " if source else f"line {line}: ") if line else ""
                    conflicts.append(
                        f"{where}conversation {cid!r} is already held with other turns or content; "
                        "skipped (give the line a distinct id)"
                    )
                else:
                    present += 1
        added = 0
        if fresh:
            max_pk_before = conn.execute("SELECT COALESCE(MAX(pk), 0) FROM samples").fetchone()[0]
            conn.execute(_INSERT_TURNS, (run_id, time.time(), orjson.dumps(fresh).decode()))
            conn.execute(
                "UPDATE samples SET parent_pk = (SELECT p.pk FROM samples AS p WHERE p.run_id = samples.run_id "
                "AND p.conversation_id = samples.conversation_id AND p.turn = samples.turn - 1) "
                "WHERE run_id = ? AND pk > ? AND turn > 1",
                (run_id, max_pk_before),
            )
            add_ingested_rows(conn, run_id, max_pk_before)
            added = len(batch.conversations) - len(held)
        _progress(conn, run_id, track, batch.last_line)
        return IngestReport(
            added=added,
            already_present=present,
            conflicts=len(conflicts),
            conflict_examples=tuple(conflicts[:MAX_CONFLICT_EXAMPLES]),
        )

    return op


# ---------------------------------------------------------------------------------------------- a turn's end


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """How a turn ended, as `after_turn` needs it: the stored state (done | failed | skipped | pending) and for a
    done turn the model's answer (content, reasoning, tool calls as app.records.ToolCall) and whether it was cut
    at max_tokens; `history_reasoning` is the profile's (app.tokens.profile.Profile.history_reasoning)."""

    state: str
    content: str | None = None
    reasoning: str | None = None
    tool_calls: Sequence[Any] = ()
    truncated: bool = False
    history_reasoning: str = "keep"
    why: str = ""  # the turn's own error, quoted in the skipped turns' last_error


def after_turn(conn: sqlite3.Connection, run_id: int, pk: int, end: TurnEnd) -> str | None:
    """What the end of turn `pk` makes of the turn after it, in the caller's transaction (module doc). Returns
    "ready", the error class the conversation ended with, or None (not a turn with a waiting successor, or the
    turn goes back to pending)."""
    if end.state not in ("done", "failed", "skipped"):
        return None
    row = conn.execute(
        "SELECT conversation_id, turn, turns, messages, recorded, divergence, off_policy FROM samples "
        "WHERE pk = ? AND run_id = ?",
        (pk, run_id),
    ).fetchone()
    if row is None or row[0] is None or row[1] >= row[2]:
        return None
    cid, turn, _, messages, recorded, policy, off = row
    child = conn.execute(
        "SELECT pk, state, segment FROM samples WHERE run_id = ? AND conversation_id = ? AND turn = ?",
        (run_id, cid, turn + 1),
    ).fetchone()
    if child is None or child[1] != "waiting":
        return None
    now = time.time()
    if end.state == "done":
        answer = answer_message(end.content, end.reasoning, end.tool_calls, end.history_reasoning, turn=turn)
        step = next_turn(
            messages,
            answer,
            json.loads(recorded) if recorded else None,
            json.loads(child[2]) if child[2] else [],
            policy=policy or "stop",
            parent_off_policy=bool(off),
            truncated=end.truncated,
        )
        if step.kind == "ready":
            note = (
                f"off-policy: after turn {turn}, {step.reason}; the recorded tool results were replayed"
                if step.off_policy and step.reason
                else None
            )
            conn.execute(
                "UPDATE samples SET state = 'pending', messages = ?, off_policy = ?, last_error = COALESCE(?, "
                "last_error), updated_at = ? WHERE pk = ?",
                (step.messages_json, int(step.off_policy), note, now, child[0]),
            )
            return "ready"
        error_class, reason = step.error_class or PARENT_SKIPPED, f"turn {turn}: {step.reason}"
    elif end.state == "failed":
        error_class, reason = PARENT_FAILED, f"turn {turn} failed" + (f": {end.why}" if end.why else "")
    else:
        error_class, reason = PARENT_SKIPPED, f"turn {turn} was skipped" + (f": {end.why}" if end.why else "")
    _end_after(conn, run_id, cid, turn, error_class, reason, now)
    return error_class


def _end_after(
    conn: sqlite3.Connection, run_id: int, cid: str, turn: int, error_class: str, reason: str, now: float
) -> None:
    """The conversation ends after `turn`: the next turn skipped with `error_class`, the later ones with
    `parent_skipped`."""
    conn.execute(
        "UPDATE samples SET state = 'skipped', error_class = CASE WHEN turn = ?4 + 1 THEN ?5 ELSE ?6 END, "
        "last_error = ?7, updated_at = ?8 "
        "WHERE run_id = ?1 AND conversation_id = ?2 AND turn > ?3 AND state = 'waiting'",
        (run_id, cid, turn, turn, error_class, PARENT_SKIPPED, reason[:2000], now),
    )


def restore_children_of(conn: sqlite3.Connection, run_id: int, pks: Iterable[int]) -> int:
    """For turns put back to pending (`--retry-failed`): the turns after each that its end skipped
    (app.conversation.ENDED_CLASSES) wait again, their messages and off-policy mark cleared, as at ingest. Runs in
    the caller's transaction (call it in the one that requeues the turn); returns how many turns wait again."""
    restored = 0
    classes = orjson.dumps(list(ENDED_CLASSES)).decode()
    for pk in pks:
        row = conn.execute(
            "SELECT conversation_id, turn FROM samples WHERE pk = ? AND run_id = ?", (pk, run_id)
        ).fetchone()
        if row is None or row[0] is None:
            continue
        restored += conn.execute(
            "UPDATE samples SET state = 'waiting', messages = '[]', off_policy = 0, error_class = NULL, "
            "last_error = NULL, lease_expires = NULL, updated_at = ? "
            "WHERE run_id = ? AND conversation_id = ? AND turn > ? AND state = 'skipped' "
            "AND error_class IN (SELECT value FROM json_each(?))",
            (time.time(), run_id, row[0], row[1], classes),
        ).rowcount
    return restored


def next_turn_state(conn: sqlite3.Connection, run_id: int, conversation_id: str, turn: int) -> tuple[str, int]:
    """(state of the turn after `turn`, how many turns after it are skipped): what the engine reads after a
    turn settled to move its counts (`app.engine.work.leases.SampleLeases.after_turn`)."""
    rows = conn.execute(
        "SELECT turn, state FROM samples WHERE run_id = ? AND conversation_id = ? AND turn > ? ORDER BY turn",
        (run_id, conversation_id, turn),
    ).fetchall()
    if not rows:
        return "", 0
    return str(rows[0][1]), sum(1 for _, state in rows if state == "skipped")


@dataclass(frozen=True, slots=True)
class OpenTurnWork:
    """The open conversations' work to come: `waiting` per dataset (turns waiting on their parents, their prompts'
    JSON characters known now, the model's answers still to come in them) and `chains` (turns left, the current
    one included -> open conversations)."""

    waiting: dict[str, tuple[int, int, int]]
    chains: dict[int, int]


# Per open conversation (window over its unfinished turns, the current one first): a waiting turn's prompt is the
# current turn's request plus the segments up to it; the answers of the turns from the current one to it are to come.
_WAITING_WORK = (
    "SELECT dataset, COUNT(*), TOTAL(known), TOTAL(outputs) FROM ("
    " SELECT dataset, state, SUM(CASE WHEN state = 'waiting' THEN LENGTH(segment) ELSE LENGTH(messages) END "
    "   + COALESCE(LENGTH(tools), 0) * (state != 'waiting')) OVER w AS known, "
    "   turn - MIN(turn) OVER w AS outputs "
    " FROM samples WHERE run_id = ? AND conversation_id IS NOT NULL AND state IN ('pending', 'leased', 'waiting') "
    " WINDOW w AS (PARTITION BY conversation_id ORDER BY turn)"
    ") WHERE state = 'waiting' GROUP BY dataset"
)
_CHAINS = (
    "SELECT left, COUNT(*) FROM (SELECT COUNT(*) AS left FROM samples WHERE run_id = ? AND conversation_id IS NOT NULL "
    "AND state IN ('pending', 'leased', 'waiting') GROUP BY conversation_id) GROUP BY left"
)


def open_turn_work(conn: sqlite3.Connection, run_id: int) -> OpenTurnWork:
    """`OpenTurnWork` of a run (any connection)."""
    waiting = {str(d): (int(n), int(chars), int(outs)) for d, n, chars, outs in conn.execute(_WAITING_WORK, (run_id,))}
    chains = {int(k): int(n) for k, n in conn.execute(_CHAINS, (run_id,))}
    return OpenTurnWork(waiting, chains)
