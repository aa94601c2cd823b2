"""`eaglewatch jobs`: list extraction jobs, show one job's shards, or pause/resume/cancel/retry a job."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from app.errors import InputError

EXAMPLE = """\
eaglewatch jobs --db eaglewatch.db                 # every job, newest first
eaglewatch jobs --db eaglewatch.db 3 --json         # job 3 with its shards
eaglewatch jobs --db eaglewatch.db cancel 3 --shard 2
eaglewatch jobs --db eaglewatch.db pause 3          # then: resume 3"""

ACTIONS = ("cancel", "pause", "resume", "retry")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        nargs="?",
        default=None,
        metavar="JOB_ID | ACTION",
        help=f"a job id to show, or one of {', '.join(ACTIONS)} followed by the job id",
    )
    parser.add_argument("job_id", nargs="?", type=int, default=None, metavar="JOB_ID", help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, default=Path("eaglewatch.db"), help="run database (default ./eaglewatch.db)")
    parser.add_argument("--shard", type=int, default=None, help="cancel: only this shard")
    parser.add_argument("--stop-running", action="store_true", help="pause: also SIGSTOP running local shards")
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")


def run(args: argparse.Namespace) -> int:
    from app.jobs import job_control as control
    from app.jobs.job_status import status_to_dict

    target = args.target
    if target in ACTIONS:
        if args.job_id is None:
            raise InputError(f"`eaglewatch jobs {target}` needs a job id, e.g. `eaglewatch jobs {target} 3`")
        if target == "cancel":
            control.cancel_job(args.db, args.job_id, args.shard)
        elif target == "pause":
            control.pause_job(args.db, args.job_id, stop_running=args.stop_running)
        elif target == "resume":
            control.resume_job(args.db, args.job_id)
        else:
            control.retry_job(args.db, args.job_id)
        status = control.job_status(args.db, args.job_id)
        if args.json:
            print(json.dumps(status_to_dict(status), indent=2))
        else:
            print(status.summary())
        return 0
    if target is not None:
        if not target.isdigit() or args.job_id is not None:
            raise InputError(f"`{target}`: expected a job id or one of {', '.join(ACTIONS)} followed by a job id")
        status = control.job_status(args.db, int(target), refresh=True)
        if args.json:
            print(json.dumps(status_to_dict(status), indent=2))
        else:
            print(_job_text(status))
        return 0
    jobs = [control.job_status(args.db, j.id, refresh=False) for j in control.list_jobs(args.db)]
    if args.json:
        print(json.dumps([status_to_dict(s) | {"shards": None} for s in jobs], indent=2))
        return 0
    if not jobs:
        print(f"no extraction jobs in {args.db}; start one with `eaglewatch extract CONFIG`")
        return 0
    rows = [("ID", "NAME", "EXECUTOR", "STATE", "SHARDS", "ITEMS", "TOKENS", "CREATED")]
    for s in jobs:
        c = s.counts
        rows.append(
            (
                str(s.job.id),
                s.job.name,
                s.job.executor,
                s.job.state,
                f"{c.get('done', 0)}/{len(s.shards)}" + (f" ({c['failed']} failed)" if c.get("failed") else ""),
                f"{s.done_items}/{s.total_items}",
                str(s.tokens),
                _when(s.job.created_at),
            )
        )
    print(_table(rows))
    return 0


def _job_text(status) -> str:
    job = status.job
    head = [
        status.summary(),
        f"output: {job.output_dir}" + (f"   slurm array: {job.external_id}" if job.external_id else ""),
    ]
    rows = [("SHARD", "STATE", "ITEMS", "TOKENS", "EXIT", "ID", "LOG")]
    for s in status.shards:
        ident = s.external_id if job.executor == "slurm" else (str(s.pid) if s.pid else "")
        rows.append(
            (
                str(s.shard),
                s.state,
                f"{s.done}/{s.total}",
                str(s.tokens),
                "" if s.exit_code is None else str(s.exit_code),
                ident or "",
                s.log_path or "",
            )
        )
    errors = [
        s.error if s.error.startswith(f"shard {s.shard} ") else f"shard {s.shard}: {s.error}"
        for s in status.shards
        if s.error
    ]
    return "\n".join(head + [_table(rows)] + errors)


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else ""
