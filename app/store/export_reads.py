"""The export's read side: every done sample of a run with its current reconstruction and the true ids known.

Rows stream in pages (keyset on `samples.pk`), so memory stays bounded whatever the run's size. Besides the
reconstruction's `output_ids` each row carries the other sources of output ids the store holds, so the export
can prefer true ids (server ids, then logprob-reconstructed ids, then the sample's reference) over a re-encoding:
`responses.token_ids` (what the server returned), `samples.reference_ids`, and the v5 columns
`reconstructions.ids_source` / `reconstructions.flags` (read with plain SQL: NULL on rows from before v5).
A whole conversation's turn (schema v8) is a row like any other (its `messages` are that turn's request: the
model's own earlier answers); it also carries its conversation id, turn, turns and off-policy mark.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app.errors import InputError
from app.store.ids import unpack_ids


@dataclass(frozen=True)
class ExportRow:
    """One done sample with its current reconstruction, as read from the store."""

    pk: int
    sample_id: str
    dataset: str
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    output_ids: tuple[int, ...] | None
    category: str | None
    finish_reason: str | None
    tokenizer_fingerprint: str
    strategy: str | None = None  # server_ids | logprobs | canonical | none
    roundtrip: bool | None = None  # None: not checked
    ids_source: str | None = None  # v5: server | logprobs | reference | text
    flags: tuple[str, ...] = ()  # v5: suspect flags; () = not suspect
    server_ids: tuple[int, ...] | None = None  # responses.token_ids
    reference_ids: tuple[int, ...] | None = None  # samples.reference_ids
    prompt_check: str | None = None  # v5: agree | differ | no_server_ids; None = not checked
    endpoint: str | None = None  # responses.endpoint of the stored answer
    provider: str | None = None  # responses.provider (the upstream behind it)
    conversation_id: str | None = None  # v8: a whole conversation's turn `turn` of `turns` (None: single-turn)
    turn: int | None = None
    turns: int | None = None
    off_policy: bool = False  # v8: recorded tool results replayed after a divergent call are in its history
    topic: str | None = None  # v9: the sample's category (samples.category), else its dataset's name


_ROWS_SQL = """
SELECT s.pk, s.sample_id, s.dataset, s.messages, s.tools,
       r.output_ids, r.category, r.tokenizer, p.finish_reason,
       r.strategy, r.roundtrip, r.ids_source, r.flags, p.token_ids, s.reference_ids, r.prompt_check,
       p.endpoint, p.provider, s.conversation_id, s.turn, s.turns, s.off_policy,
       COALESCE(s.category, s.dataset)
FROM samples AS s
LEFT JOIN reconstructions AS r ON r.run_id = s.run_id AND r.sample_pk = s.pk
LEFT JOIN responses AS p ON p.id = r.response_id
WHERE s.run_id = ? AND s.state = 'done' AND s.pk > ?
ORDER BY s.pk
LIMIT ?
"""


def iter_rows(conn: sqlite3.Connection, run_id: int, page_size: int = 256) -> Iterator[ExportRow]:
    """Every done sample of the run in pk order, read a page at a time (bounded memory)."""
    last = 0
    while True:
        page = conn.execute(_ROWS_SQL, (run_id, last, page_size)).fetchall()
        if not page:
            return
        for (
            pk,
            sample_id,
            dataset,
            messages,
            tools,
            ids,
            category,
            fingerprint,
            finish,
            strategy,
            roundtrip,
            ids_source,
            flags,
            server_ids,
            reference_ids,
            prompt_check,
            endpoint,
            provider,
            conversation_id,
            turn,
            turns,
            off_policy,
            topic,
        ) in page:
            yield ExportRow(
                pk=int(pk),
                sample_id=str(sample_id),
                dataset=str(dataset),
                messages=_json_field(messages, sample_id, "messages") or [],
                tools=_json_field(tools, sample_id, "tools"),
                output_ids=unpack_ids(ids) if ids is not None else None,
                category=category,
                finish_reason=finish,
                tokenizer_fingerprint=fingerprint or "",
                strategy=strategy,
                roundtrip=None if roundtrip is None else bool(roundtrip),
                ids_source=ids_source,
                flags=_flags(flags, sample_id),
                server_ids=unpack_ids(server_ids) if server_ids else None,
                reference_ids=unpack_ids(reference_ids) if reference_ids else None,
                prompt_check=prompt_check,
                endpoint=endpoint,
                provider=provider or None,
                conversation_id=conversation_id,
                turn=turn,
                turns=turns,
                off_policy=bool(off_policy),
                topic=topic,
            )
        last = int(page[-1][0])


def _flags(text: str | None, sample_id: str) -> tuple[str, ...]:
    """reconstructions.flags: a JSON list of flag names; NULL or [] means not suspect."""
    value = _json_field(text, sample_id, "reconstruction flags")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(
            f"sample {sample_id!r}: stored reconstruction flags are not a JSON list; run `eaglewatch "
            "reprocess` to reconstruct them"
        )
    return tuple(str(f) for f in value)


def _json_field(text: str | None, sample_id: str, name: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"sample {sample_id!r}: stored {name} is not valid JSON ({exc.msg}); re-ingest the run"
        ) from None


def conversation_is_open(conn: sqlite3.Connection, run_id: int, conversation_id: str) -> bool:
    """Whether a conversation still has turns to run (a turn pending, waiting on its parent, or leased); a
    conversation that is not open either finished every turn or ended (diverged, failed, truncated, skipped)."""
    row = conn.execute(
        "SELECT 1 FROM samples WHERE run_id = ? AND conversation_id = ? AND state IN ('pending', 'waiting', 'leased') "
        "LIMIT 1",
        (run_id, conversation_id),
    ).fetchone()
    return row is not None
