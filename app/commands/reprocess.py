"""`eaglewatch reprocess`: reconstruct stored responses again (after a tokenizer or profile fix), no API calls.

For each sample of the run, the latest successful response is read back into a Completion, rebuilt with
the tokenizer and profile (flags, or the run's stored config), compared with the sample's reference ids,
and the sample's reconstruction row is replaced.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.errors import InputError

EXAMPLE = """\
eaglewatch reprocess --db eaglewatch.db
eaglewatch reprocess --db runs.db --run kimi-sweep --tokenizer ../shared/tokenizers/kimi-k2.5 --profile kimi-k2.5
eaglewatch reprocess --db runs.db --run kimi-sweep --json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, metavar="PATH", help="run database")
    parser.add_argument("--run", metavar="NAME", help="run name (optional when the database holds one run)")
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: the run config's model.tokenizer)")
    parser.add_argument("--profile", metavar="P", help="template profile (default: the run config's model.profile)")
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="reconstruction threads (default 1)")
    parser.add_argument("--json", action="store_true", help="print verdict counts before and after as JSON")


def completion_from_row(row: dict[str, Any]):
    """A Completion rebuilt from a `responses` row (tool calls, logprobs and server ids included)."""
    from app.records import Completion, TokenLogprob, ToolCall
    from app.store.ids import unpack_ids

    calls = tuple(
        ToolCall(id=c.get("id", ""), name=c.get("name", ""), arguments=c.get("arguments", ""),
                 index=c.get("index", i), type=c.get("type", "function"))
        for i, c in enumerate(json.loads(row["tool_calls"]) if row["tool_calls"] else [])
    )
    lp = json.loads(row["logprobs"]) if row["logprobs"] else {}

    def logprobs(key: str):
        seq = lp.get(key)
        if seq is None:
            return None
        return tuple(TokenLogprob(t[0], tuple(t[1]) if t[1] is not None else None, float(t[2])) for t in seq)

    return Completion(
        content=row["content"] or "",
        reasoning=row["reasoning"],
        tool_calls=calls,
        finish_reason=row["finish_reason"],
        content_logprobs=logprobs("content"),
        reasoning_logprobs=logprobs("reasoning"),
        token_ids=unpack_ids(row["token_ids"]),
        provider=row["provider"],
        model=row["model"],
    )


def reconstruction_row(run_id: int, sample_pk: int, response_id: int | None, profile: str, fingerprint: str,
                       rec, verdict, reference_ids) -> tuple:
    """Parameters for the store's reconstruction upsert (same column order as RunStore.record_result)."""
    import time

    from app.store.ids import pack_ids

    return (
        run_id, sample_pk, response_id, profile, fingerprint, rec.strategy, rec.repair,
        None if rec.roundtrip is None else int(rec.roundtrip),
        json.dumps(list(rec.notes)), pack_ids(rec.output_ids), pack_ids(reference_ids), verdict.category,
        verdict.first_diff, len(rec.output_ids),
        verdict.ref_len if verdict.ref_len is not None else (len(reference_ids) if reference_ids is not None else None),
        verdict.explanation,
        json.dumps({"spans": [[s.ref_start, s.ref_end, s.rec_start, s.rec_end] for s in verdict.spans]}),
        time.time(),
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from app.store.ids import unpack_ids
    from app.store.queries import connect_readonly, resolve_run, verdict_counts
    from app.tokens import Reconstructor, get_profile, load_tokenizer

    db = Path(args.db)
    conn = connect_readonly(db)
    try:
        run_row = resolve_run(conn, args.run, db_label=str(db))
        model = (run_row.config or {}).get("model") or {}
        tokenizer_dir = args.tokenizer or model.get("tokenizer")
        profile_name = args.profile or model.get("profile") or "kimi-k2.5"
        if not tokenizer_dir:
            raise InputError(f"{db}: run {run_row.name} stores no model.tokenizer; pass --tokenizer DIR")
        before = verdict_counts(conn, run_row.id)
        conn.row_factory = _dict_row
        rows = conn.execute(
            "SELECT s.pk AS sample_pk, s.sample_id, s.reference_ids, r.* FROM samples s "
            "JOIN responses r ON r.id = (SELECT id FROM responses WHERE sample_pk = s.pk AND error_class IS NULL "
            "AND content IS NOT NULL ORDER BY attempt DESC, id DESC LIMIT 1) WHERE s.run_id = ? ORDER BY s.pk",
            (run_row.id,),
        ).fetchall()
    finally:
        conn.close()

    profile = get_profile(profile_name)
    tokenizer = load_tokenizer(tokenizer_dir, profile.pretokenizer_pattern)
    reconstructor = Reconstructor(profile, tokenizer)

    def one(row: dict[str, Any]) -> tuple:
        ref = unpack_ids(row["reference_ids"])
        rec, verdict = reconstructor.process(completion_from_row(row), ref)
        return reconstruction_row(run_row.id, row["sample_pk"], row["id"], profile.name, tokenizer.fingerprint, rec, verdict, ref)

    with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        params = list(pool.map(one, rows))
    asyncio.run(_write(db, params))

    conn = connect_readonly(db)
    try:
        now = verdict_counts(conn, run_row.id)
    finally:
        conn.close()
    if args.json:
        json.dump({"run": run_row.name, "reprocessed": len(params), "before": before, "after": now}, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(f"{db}: run {run_row.name}: reconstructed {len(params)} responses again "
              f"(tokenizer {tokenizer.path}, profile {profile.name})")
        print(f"  {'verdict':<20} {'before':>7} {'after':>7}")
        for cat in now:
            print(f"  {cat:<20} {before.get(cat, 0):>7} {now.get(cat, 0):>7}")
    return 0


async def _write(db: Path, params: list[tuple]) -> None:
    from app.store.run_store import RunStore

    store = await RunStore.open(db)
    try:
        chunk = 500
        for i in range(0, len(params), chunk):
            part = params[i : i + chunk]
            await store.upsert_reconstructions(part)
    finally:
        await store.close()


def _dict_row(cursor, row) -> dict[str, Any]:
    return {d[0]: v for d, v in zip(cursor.description, row)}
