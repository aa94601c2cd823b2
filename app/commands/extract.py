"""`eaglewatch extract CONFIG`: launch hidden-state extraction over eagle3-shards, headless.

Progress goes to stderr; `--json` prints the final job (with every shard) on stdout. Ctrl-C leaves the
shards running (local shards run in their own sessions, Slurm tasks in Slurm): `--job ID` follows the job
again, `eaglewatch jobs cancel ID` stops it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from app.errors import InputError

EXAMPLE = """\
eaglewatch extract sample_data/demo.toml --manifest /tmp/demo-shards --dry-run
eaglewatch extract run.toml --manifest out/eagle3-shards --executor slurm --layout speculators
eaglewatch extract run.toml --job 3          # follow (or, after a restart, resume) job 3"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="run config TOML (its [extraction] section)")
    parser.add_argument("--db", type=Path, default=None, help="run database (default: the config's run.database)")
    parser.add_argument(
        "--manifest",
        type=Path,
        default=None,
        help="eagle3-shards manifest.json or its folder (default: <run.output_dir>/eagle3-shards)",
    )
    parser.add_argument(
        "--executor", choices=("local", "slurm"), default=None, help="where shards run (default: extraction.executor)"
    )
    parser.add_argument(
        "--layout",
        choices=("packed", "specforge", "speculators", "modelopt"),
        default=None,
        help="built-in extractor: files as that consumer reads them (default: extraction.layout)",
    )
    parser.add_argument("--shards", default=None, metavar="LIST", help="only these shards, e.g. 0-3,7")
    parser.add_argument(
        "--slots",
        type=int,
        default=1,
        metavar="N",
        help="local executor with extraction.gpus = 0: shards run in parallel on the CPU (default 1)",
    )
    parser.add_argument(
        "--job",
        type=int,
        default=None,
        metavar="ID",
        help="follow an existing job instead of starting one (resumes it after a restart)",
    )
    parser.add_argument("--detach", action="store_true", help="start the job and return (Slurm jobs keep going)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the planned command per shard and the disk estimate; works without a GPU",
    )
    parser.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the plan or the final job as JSON on stdout")


def run(args: argparse.Namespace) -> int:
    from app.config import load_config
    from app.jobs.job_status import status_to_dict
    from app.jobs.plan import executor_for, local_slots, spec_from_config
    from app.jobs.store import JobStore
    from app.store.queries import run_by_name

    config = load_config(args.config)
    if args.layout is not None:
        config = config.model_copy(update={"extraction": config.extraction.model_copy(update={"layout": args.layout})})
    kind = args.executor or config.extraction.executor
    db = args.db or config.run.database
    notes: list[str] = []
    try:
        slots = local_slots(config.extraction.gpus, args.slots) if kind == "local" else None
    except InputError as exc:
        if not args.dry_run:
            raise
        # a dry run plans on any machine (a login node, a laptop): say what a real run would need
        slots, notes = None, [f"not runnable here: {exc}"]
    if args.dry_run and config.extraction.extractor == "builtin" and config.extraction.model_path is None:
        notes.append("extraction.model_path is not set: {model} stays a placeholder and the disk estimate needs it")
        config = config.model_copy(
            update={"extraction": config.extraction.model_copy(update={"model_path": Path("{model}")})}
        )

    if args.job is not None:
        store = JobStore(db, create=False)
        job = store.job(args.job)
        if job.executor != kind and args.executor is not None:
            raise InputError(f"job {args.job} runs on {job.executor}, not {kind}; drop --executor")
        ex = executor_for(job.executor, store, slots)
        return _follow(ex, args.job, args)

    manifest = args.manifest or Path(config.run.output_dir) / "eagle3-shards"
    spec = spec_from_config(config, manifest, shards=_parse_shards(args.shards))
    estimate = None if any("model_path" in n for n in notes) else _disk_estimate(config, spec)

    if args.dry_run:
        plan: dict[str, Any] = {
            "executor": kind,
            "slots": slots,
            "layout": config.extraction.layout if config.extraction.extractor == "builtin" else None,
            "notes": notes,
            "output_dir": str(spec.output_dir),
            "shards": {str(s): spec.argv_for(s) for s in spec.shards},
            "estimate_bytes": estimate,
        }
        if kind == "slurm":
            from app.jobs.slurm import SlurmExecutor

            plan["sbatch"] = SlurmExecutor.sbatch_argv(spec, list(spec.shards), spec.logs / "job_<id>.sbatch")
        if args.json:
            print(json.dumps(plan, indent=2))
            return 0
        print(
            f"executor: {kind}" + (f" ({len(slots)} slot(s): {', '.join(s or 'cpu' for s in slots)})" if slots else "")
        )
        if plan["layout"]:
            print(f"layout: {plan['layout']}")
        for note in notes:
            print(f"note: {note}")
        if kind == "slurm":
            print("sbatch: " + shlex.join(plan["sbatch"]))
        for s in spec.shards:
            print(f"shard {s}: {shlex.join(spec.argv_for(s))}")
        if estimate is not None:
            from app.extract.disk_budget import free_bytes

            print(
                f"disk: about {estimate:,} bytes of hidden states into {spec.output_dir} "
                f"({free_bytes(spec.output_dir):,} bytes free)"
            )
        return 0

    if estimate is not None:
        from app.extract.disk_budget import check_disk_room

        check_disk_room(spec.output_dir, estimate)
    store = JobStore(db)
    run = run_by_name(store.conn, config.run.name)
    ex = executor_for(kind, store, slots)
    job_id = ex.submit(spec, run.id if run else None)
    print(
        f"eaglewatch extract: job {job_id} started on {kind} ({len(spec.shards)} shards); "
        f"`eaglewatch jobs --db {db} {job_id}` shows it",
        file=sys.stderr,
    )
    if args.detach:
        if args.json:
            print(json.dumps(status_to_dict(ex.poll(job_id, launch=False)), indent=2))
        return 0
    return _follow(ex, job_id, args)


def _follow(ex, job_id: int, args: argparse.Namespace) -> int:
    from app.jobs.job_status import status_to_dict

    last = ""
    last_t = 0.0
    try:
        while True:
            status = ex.poll(job_id)
            line = status.summary()
            if line != last or time.monotonic() - last_t > 30:
                print(line, file=sys.stderr, flush=True)
                last, last_t = line, time.monotonic()
            if status.finished:
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        print(
            f"eaglewatch extract: stopped following job {job_id}; its shards keep running. "
            f"Follow again with `eaglewatch extract CONFIG --job {job_id}`, stop them with "
            f"`eaglewatch jobs cancel {job_id}`",
            file=sys.stderr,
        )
        return 130
    for s in status.failures():
        print(f"  {s.error}", file=sys.stderr)
    if args.json:
        print(json.dumps(status_to_dict(status), indent=2))
    return 0 if status.job.state == "done" else 1


def _parse_shards(text: str | None) -> list[int] | None:
    if text is None:
        return None
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        raise InputError(f"--shards {text!r}: expected shard numbers and ranges such as 0-3,7") from None
    return sorted(set(out))


def _disk_estimate(config, spec) -> int | None:
    """Bytes the built-in extractor will write (None for a command template or when it cannot be known)."""
    ext = config.extraction
    if ext.extractor != "builtin" or ext.model_path is None:
        return None
    try:
        from app.extract.disk_budget import estimate_output_bytes
    except ImportError:
        return None
    config_json = Path(ext.model_path) / "config.json"
    if not config_json.exists():
        raise InputError(f"{config_json}: missing; extraction.model_path must be a model folder with config.json")
    return estimate_output_bytes(
        spec.manifest,
        config_json,
        ext.aux_layers,
        "bf16" if ext.gpus else "fp32",
        shards=spec.shards,
        per_sample_files=ext.layout != "packed",
    )
