"""`eaglewatch status`: per run, samples by state, cost so far, and verdict counts (read-only; safe during a run)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXAMPLE = """\
eaglewatch status --db eaglewatch.db
eaglewatch status sample_data/demo.toml --json | jq '.runs[0].states'
eaglewatch status --db /data/runs.db --run kimi-2025-06"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", metavar="CONFIG", help="run config TOML whose database to read")
    parser.add_argument("--db", metavar="PATH", help="run database (default: the config's, else ./eaglewatch.db)")
    parser.add_argument("--run", metavar="NAME", help="only this run (default: every run in the database)")
    parser.add_argument("--json", action="store_true", help="print the status as JSON on stdout")


def run(args: argparse.Namespace) -> int:
    from app.store import queries

    db = _database(args)
    conn = queries.connect_readonly(db, upgrade=True)
    try:
        if args.run is not None:
            runs = [queries.resolve_run(conn, args.run, db_label=str(db))]
        else:
            runs = queries.list_runs(conn)
        report = {"database": str(db), "runs": [run_status(conn, r) for r in runs]}
    finally:
        conn.close()
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        _print(report)
    return 0


def _database(args: argparse.Namespace) -> Path:
    if args.db:
        return Path(args.db)
    if args.config:
        from app.config import load_config

        return load_config(args.config).run.database
    from app.config import RunSection

    return Path(RunSection.model_fields["database"].default)


def run_status(conn: Any, run: Any) -> dict[str, Any]:
    """One run's status as JSON-ready data; `engine` is the heartbeat's verdict (running | stopped | gone |
    never) and, while the engine runs, its live in-flight, waiting, limit and ETA."""
    from app.store import queries

    states = queries.state_counts(conn, run.id)
    return {
        "name": run.name,
        "state": run.state,
        "reason": run.reason,
        "samples": sum(states.values()),
        "states": states,
        "cost_usd": _money(queries.cost_total(conn, run.id)),
        "verdicts": queries.verdict_counts(conn, run.id),
        "strategies": queries.strategy_counts(conn, run.id),
        "engine": engine_status(conn, run),
    }


def engine_status(conn: Any, run: Any) -> dict[str, Any]:
    """The run's engine as its heartbeat tells (app.store.heartbeat), with the live numbers while it beats."""
    import time

    from app.engine.dbsnapshot import with_engine
    from app.engine.snapshot import MetricsSnapshot
    from app.store.heartbeat import liveness, read_heartbeat

    try:
        hb = read_heartbeat(conn, run.id)
    except Exception:  # a database from before heartbeats
        hb = None
    live = liveness(hb, time.time())
    out: dict[str, Any] = {"state": live.state, "text": live.text, "pid": live.pid, "host": live.host,
                           "last_seen_s": None if live.age_s is None else round(live.age_s, 1)}
    if live.alive:
        snap = with_engine(MetricsSnapshot(run.name, run.state), hb, live)
        out.update(in_flight=snap.in_flight, waiting=snap.waiting, concurrency_limit=snap.concurrency_limit,
                   eta_s=None if snap.eta_s is None else round(snap.eta_s, 1))
    return out


def _money(amount: float | None) -> float | None:
    """A ledger figure for JSON: rounded, or null when it is not a finite number (JSON has no NaN)."""
    from app.engine.budget import finite_or_none

    value = finite_or_none(amount)
    return None if value is None else round(value, 6)


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from app.engine.budget import usd

    console = Console(highlight=False)
    if not report["runs"]:
        console.print(f"{report['database']}: no runs yet (`eaglewatch ingest CONFIG` adds one)")
        return
    for r in report["runs"]:
        engine = r["engine"]
        if engine["state"] == "gone" and r["state"] in ("running", "paused"):
            # the database says live, but no engine beats: the state shown is the truth, not the row
            head = f"[b]{r['name']}[/b]  [b red]{engine['text']}[/b red] (recorded {r['state']})"
        else:
            head = f"[b]{r['name']}[/b]  {r['state']}" + (f" ({r['reason']})" if r["reason"] else "")
        console.print(f"{head}  {r['samples']} samples  {usd(r['cost_usd'])} spent")
        if engine["state"] == "running":
            eta = "" if engine.get("eta_s") is None else f"  ETA {engine['eta_s']:.0f} s"
            console.print(f"{engine['text']}: {engine['in_flight']} in flight/{engine['concurrency_limit']}, "
                          f"{engine['waiting']} waiting{eta}")
        table = Table(box=None, pad_edge=False, show_header=True)
        for name in r["states"]:
            table.add_column(name, justify="right")
        table.add_row(*(str(n) for n in r["states"].values()))
        console.print(table)
        verdicts = Table(box=None, pad_edge=False, show_header=True)
        for name in r["verdicts"]:
            verdicts.add_column(name, justify="right")
        verdicts.add_row(*(str(n) for n in r["verdicts"].values()))
        console.print(verdicts)
        if r["strategies"]:
            console.print("strategies: " + "  ".join(f"{k} {v}" for k, v in r["strategies"].items()))
        console.print()
