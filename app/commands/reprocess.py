"""`eaglewatch reprocess`: reconstruct stored responses again (after a tokenizer or profile fix), no API calls.

For each sample of the run, the latest successful response is read back into a Completion, reconstructed with
the tokenizer and profile (flags, or the run's stored config), compared with the sample's reference ids,
and the sample's reconstruction row is replaced.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.errors import InputError

if TYPE_CHECKING:
    from app.store.rows import ReconstructionRow

EXAMPLE = """\
eaglewatch reprocess --db eaglewatch.db
eaglewatch reprocess --db runs.db --run kimi-sweep --tokenizer ../shared/tokenizers/kimi-k2.5 --profile kimi-k2.5
eaglewatch reprocess --db runs.db --run kimi-sweep --json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, metavar="PATH", help="run database")
    parser.add_argument("--run", metavar="NAME", help="run name (optional when the database holds one run)")
    parser.add_argument(
        "--tokenizer", metavar="DIR", help="tokenizer folder (default: the run config's model.tokenizer)"
    )
    parser.add_argument("--profile", metavar="P", help="template profile (default: the run config's model.profile)")
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="reconstruction threads (default 1)")
    parser.add_argument("--json", action="store_true", help="print verdict counts before and after as JSON")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    from app.store.queries import (
        connect_readonly,
        latest_completions,
        resolve_run,
        run_intervention_flags,
        verdict_counts,
    )
    from app.store.rows import StoredCompletion, reconstruction_row
    from app.store.store_records import ReconstructionLabels
    from app.tokens import Reconstructor, get_profile, load_tokenizer
    from app.tokens.flags import INTERVENED

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
        rows = latest_completions(conn, run_row.id)
        ledger = run_intervention_flags(conn, run_row.id)
    finally:
        conn.close()

    profile = get_profile(profile_name)
    tokenizer = load_tokenizer(tokenizer_dir, profile.pretokenizer_pattern)
    reconstructor = Reconstructor(profile, tokenizer)
    # a reprocess labels its rows with the profile and tokenizer only (ids source and flags stay unrecorded)
    labels = ReconstructionLabels(profile=profile.name, tokenizer=tokenizer.fingerprint)

    def one(stored: StoredCompletion) -> ReconstructionRow:
        rec, verdict = reconstructor.process(stored.completion, stored.reference_ids)
        # the server's interventions on this answer stay flagged (the export leaves them out by default)
        kinds = ledger.get((stored.sample_pk, stored.response_id), ()) + ledger.get((stored.sample_pk, None), ())
        flagged = labels
        if kinds:
            flags = tuple(rec.flags) + tuple(INTERVENED + kind for kind in kinds)
            flagged = dataclasses.replace(labels, flags=tuple(dict.fromkeys(flags)))
        return reconstruction_row(
            run_row.id, stored.sample_pk, rec, verdict, stored.reference_ids, flagged, response_id=stored.response_id
        )

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
        print(
            f"{db}: run {run_row.name}: reconstructed {len(params)} responses again "
            f"(tokenizer {tokenizer.path}, profile {profile.name})"
        )
        print(f"  {'verdict':<20} {'before':>7} {'after':>7}")
        for cat in now:
            print(f"  {cat:<20} {before.get(cat, 0):>7} {now.get(cat, 0):>7}")
    return 0


async def _write(db: Path, params: list[ReconstructionRow]) -> None:
    from app.store.run_store import RunStore

    store = await RunStore.open(db)
    try:
        chunk = 500
        for i in range(0, len(params), chunk):
            part = params[i : i + chunk]
            await store.upsert_reconstructions(part)
    finally:
        await store.close()
