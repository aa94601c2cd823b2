"""The eval run's writes and its engine's reads (schema v11 (eval)): marking a run as an eval run, the work left
(each prompt × each eval endpoint without an answer), and one answered request stored in one transaction.

An eval run's prompts are its `samples` (ingested like a generation run's); its answers are `eval_requests`
rows, one per (sample, endpoint). A failed request is stored too, with its error; the next `eval` of the same
run replaces it (`INSERT OR REPLACE`), so a run resumes where it stopped, answered requests kept.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from app.errors import InputError
from app.store.rows import EVAL_REQUEST_COLUMNS, EvalRequestRow, encode_eval_request, loads

_PLACEHOLDERS = ", ".join("?" * len(EVAL_REQUEST_COLUMNS.split(",")))


@dataclass(frozen=True, slots=True)
class EvalWork:
    """One prompt still to send to one endpoint."""

    sample_pk: int
    sample_id: str
    endpoint: str
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    category: str | None


def mark_eval_run(conn: sqlite3.Connection, run_id: int) -> None:
    """Make `run_id` an eval run; InputError when it is a generation run that already holds answers."""
    kind, answers = conn.execute(
        "SELECT kind, (SELECT COUNT(*) FROM responses WHERE run_id = runs.id) FROM runs WHERE id = ?", (run_id,)
    ).fetchone()
    if kind != "eval" and answers:
        name = conn.execute("SELECT name FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
        raise InputError(
            f"run {name!r} is a generation run with {answers} stored answers; give the eval config its own "
            "run.name (an eval run is a second run in the same database)"
        )
    conn.execute("UPDATE runs SET kind = 'eval' WHERE id = ?", (run_id,))


def eval_work(conn: sqlite3.Connection, run_id: int, endpoints: list[str]) -> list[EvalWork]:
    """Each (prompt, endpoint) of the run without a successful answer yet, in sample order then endpoint order."""
    done = {
        (pk, ep)
        for pk, ep in conn.execute(
            "SELECT sample_pk, endpoint FROM eval_requests WHERE run_id = ? AND error IS NULL", (run_id,)
        )
    }
    out: list[EvalWork] = []
    rows = conn.execute(
        "SELECT pk, sample_id, messages, tools, COALESCE(category, dataset) FROM samples "
        "WHERE run_id = ? AND state != 'skipped' ORDER BY pk",
        (run_id,),
    )
    for pk, sample_id, messages, tools, category in rows:
        for ep in endpoints:
            if (pk, ep) not in done:
                out.append(EvalWork(pk, sample_id, ep, loads(messages, []), loads(tools), category))
    return out


def record_eval_request(conn: sqlite3.Connection, row: EvalRequestRow) -> None:
    """Store one answered (or failed) eval request, replacing an earlier try of the same prompt and endpoint."""
    conn.execute(
        f"INSERT OR REPLACE INTO eval_requests ({EVAL_REQUEST_COLUMNS}) VALUES ({_PLACEHOLDERS})",
        encode_eval_request(row),
    )


def eval_prompts(conn: sqlite3.Connection, run_id: int) -> dict[int, tuple[str, list[dict[str, Any]]]]:
    """Each prompt of an eval run by sample pk: its sample id and messages (what the report's guards hash)."""
    return {
        pk: (sample_id, loads(messages, []))
        for pk, sample_id, messages in conn.execute(
            "SELECT pk, sample_id, messages FROM samples WHERE run_id = ? ORDER BY pk", (run_id,)
        )
    }


@dataclass(frozen=True, slots=True)
class EvalWindow:
    """One window of an eval run on one endpoint (`eval_windows`, schema v12): the deltas of the server's
    Prometheus spec-decode counters between a scrape before and one after (`per_position[k]`: accepted at k)."""

    run_id: int
    endpoint: str
    started_at: float
    ended_at: float
    requests: int
    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]


def record_eval_window(conn: sqlite3.Connection, window: EvalWindow) -> None:
    """Store one counter window."""
    conn.execute(
        "INSERT INTO eval_windows (run_id, endpoint, started_at, ended_at, requests, drafts, draft_tokens, accepted, "
        "per_position) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            window.run_id, window.endpoint, window.started_at, window.ended_at, window.requests, window.drafts,
            window.draft_tokens, window.accepted, json.dumps(list(window.per_position)),
        ),
    )  # fmt: skip


def eval_windows(conn: sqlite3.Connection, run_id: int) -> list[EvalWindow]:
    """The run's counter windows in the order they closed ([] on a database before schema v12)."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'eval_windows'").fetchone():
        return []
    rows = conn.execute(
        "SELECT run_id, endpoint, started_at, ended_at, requests, drafts, draft_tokens, accepted, per_position "
        "FROM eval_windows WHERE run_id = ? ORDER BY id",
        (run_id,),
    )
    return [
        EvalWindow(
            run_id=r[0],
            endpoint=r[1],
            started_at=r[2],
            ended_at=r[3],
            requests=r[4],
            drafts=r[5],
            draft_tokens=r[6],
            accepted=r[7],
            per_position=tuple(loads(r[8], [])),
        )  # fmt: skip
        for r in rows
    ]
