"""`eaglewatch status`: per run, its record (app.engine.record.snapshot.RunRecord) as every face shows it: the state in
words, samples by state, whole conversations (when the run has any), cost, verdicts and the verification classes,
errors, the engine's live figures or a finished run's (read-only; safe during a run)."""

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
    """One run's record (app.engine.record.reads.read_record: the store's counts, the engine's live figures while it
    beats, finished figures once nothing moves the run) as JSON-ready data, in the words every face uses."""
    from app.engine.record.reads import read_record
    from app.engine.record.snapshot import state_words
    from app.store.queries import dataset_mix, run_kind

    rec = read_record(conn, run.name)
    c, a = rec.counts, rec.counts.answers
    words = state_words(rec)
    out: dict[str, Any] = {
        "name": rec.run_name,
        "state": run.state,  # as recorded (runs.state); `words` says what is true now
        "reason": run.reason,
        "words": words.text,
        "samples": c.samples.total,
        "states": c.samples.as_dict(),
        "cost_usd": _money(c.cost_usd),
        "requests": c.requests,
        "retried": c.retried,
        "errors_by_class": dict(c.errors_by_class),  # failed requests per class
        "failed_by_class": dict(c.failed_by_class),  # failed samples per class
        "answers": a.answers,
        "verdicts": dict(a.verdicts),  # per verdict category; `unchecked` there means "no reference"
        "verification": a.verification(),
        "truncated": a.truncated,
        "suspects": a.suspects,
        "measured": {
            "n": a.measured,
            "exact": a.measured_exact,
            "benign": a.measured_benign,
            "truncated": a.measured_truncated,
            "corrupt": dict(a.measured_corrupt),
            "matched": a.measured_matched,
        },
        "prompt_checks": dict(a.prompt_checks),
        # samples a server intervened on (app.engine.interventions): in all, and per kind (a sample may have several)
        "interventions": {"samples": c.intervened, "by_kind": dict(c.interventions)},
        "strategies": dict(c.strategies),
        "endpoints": [
            {
                "name": e.name,
                "completed": e.completed,
                "failed": e.failed,
                "retried": e.retried,
                "cost_usd": _money(e.cost_usd),
                "errors_by_class": dict(e.errors_by_class),
            }
            for e in c.endpoints
        ],
        "conversations": conversations_status(c.conversations),
        "figures": _figures(rec),
        "engine": engine_status(conn, run, rec),
        "trust": [t.as_json() for t in rec.trust],
        "mix": [row.as_json() for row in dataset_mix(conn, run.id)],
        "kind": run_kind(conn, run.id),
    }
    if out["kind"] == "eval":
        out["eval"] = eval_headline(conn, run)
    return out


def eval_headline(conn: Any, run: Any) -> dict[str, Any]:
    """An eval run's headline (`eaglewatch eval report` has the whole report): the drafter, the overall mean
    acceptance length (request-weighted, loops left out) with its interval, and the verdicts."""
    from app.eval.report import stored_report

    report = stored_report(conn, run)
    fig = report["overall"]["figures"]
    return {
        "drafter": report["drafter"],
        "requests": fig["requests"],
        "mean_acceptance_length": fig["mean_acceptance_length"],
        "mean_acceptance_length_ci95": fig["mean_acceptance_length_ci95"],
        "verdicts": [v["verdict"] for v in report["verdicts"]],
    }


def conversations_status(conv: Any) -> dict[str, Any] | None:
    """A run's whole conversations (app.store.rows.ConversationCounts) as JSON-ready data: each conversation
    counted once by how it stands, its turns by state, the off-policy turns; None for a run without any."""
    if conv is None:
        return None
    return {
        "total": conv.total,
        "done": conv.done,
        "open": conv.open,
        "diverged": conv.diverged,
        "failed": conv.failed,
        "truncated": conv.truncated,
        "ended_skipped": conv.ended_skipped,
        "not_started": conv.not_started,
        "in_flight": conv.in_flight,
        "waiting_on_parent": conv.waiting_on_parent,
        "turns": dict(conv.turns),
        "off_policy_turns": conv.off_policy_turns,
    }


def interventions_line(ledger: dict[str, Any]) -> str:
    """The status line of the intervention ledger: samples in all, then per kind in the faces' words."""
    from app.engine.interventions import ledger_words

    words = ledger_words(ledger["samples"], ledger["by_kind"].items())
    return f"server {words}: left out of exports unless --keep-intervened"


def _figures(rec: Any) -> dict[str, Any]:
    """The live figures while an engine moves the run, else the finished ones over the whole run."""
    if rec.finished is None and rec.live is not None:
        live = rec.live
        return {
            "kind": "live",
            "elapsed_s": round(rec.elapsed_s, 1),
            "req_s": round(live.rate.req_s_10s, 3),
            "tok_s": round(live.rate.tok_s_10s, 1),
            "cost_per_hour": round(live.cost_per_hour, 6),
            "latency_p95_ms": live.latency_p95_ms,
            "ttft_p95_ms": live.ttft_p95_ms,
            "eta_s": None if rec.eta_s is None else round(rec.eta_s, 1),
            "projected_cost_usd": live.projected_cost_usd,
        }
    fin = rec.finished
    return {
        "kind": "finished",
        "elapsed_s": round(fin.elapsed_s, 1),
        "req_s": round(fin.req_s, 3),
        "tok_s": round(fin.tok_s, 1),
        "cost_per_hour": round(fin.cost_per_hour, 6),
        "latency_p95_ms": fin.percentiles.latency_p95_ms,
        "ttft_p95_ms": fin.percentiles.ttft_p95_ms,
    }


def engine_status(conn: Any, run: Any, rec: Any) -> dict[str, Any]:
    """The run's engine as its heartbeat tells (app.store.heartbeat), with its live numbers while it beats."""
    import time

    from app.store.heartbeat import liveness, read_heartbeat

    live_seen = liveness(read_heartbeat(conn, run.id), time.time())
    out: dict[str, Any] = {
        "state": live_seen.state,
        "text": live_seen.text,
        "pid": live_seen.pid,
        "host": live_seen.host,
        "last_seen_s": None if live_seen.age_s is None else round(live_seen.age_s, 1),
    }
    if live_seen.alive and rec.live is not None:
        out.update(
            in_flight=rec.live.in_flight,
            waiting=rec.live.waiting,
            concurrency_limit=rec.live.concurrency_limit,
            eta_s=None if rec.eta_s is None else round(rec.eta_s, 1),
        )
    return out


def _money(amount: float | None) -> float | None:
    """A ledger figure for JSON: rounded, or null when it is not a finite number (JSON has no NaN)."""
    from app.engine.money.budget import finite_or_none

    value = finite_or_none(amount)
    return None if value is None else round(value, 6)


TURN_WORDS = {
    "done": "done",
    "leased": "in flight",
    "pending": "pending",
    "waiting": "waiting on parent",
    "failed": "failed",
    "skipped": "skipped",
}


def conversations_line(conv: dict[str, Any]) -> str:
    """`conversations: 15/16 done · 0 open · 1 diverged · …` and the turns by state, from `conversations_status`."""
    skipped = f" · {conv['ended_skipped']} skipped" if conv["ended_skipped"] else ""
    turns = " · ".join(f"{conv['turns'].get(state, 0)} {words}" for state, words in TURN_WORDS.items())
    return (
        f"conversations: {conv['done']}/{conv['total']} done · {conv['open']} open · {conv['diverged']} diverged · "
        f"{conv['failed']} failed · {conv['truncated']} truncated{skipped} · {conv['off_policy_turns']} "
        f"off-policy turns\nturns: {turns}"
    )


MIX_HEADER = ("dataset", "prompts", "answers", "loss tokens", "reasoning", "tool calls", "scripts")


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def mix_rows(mix: list[dict[str, Any]]) -> list[Any]:
    """`status --json`'s `mix` (MixRow.as_json) back as app.store.queries.MixRow."""
    from app.store.queries import MixRow

    return [
        MixRow(
            m["dataset"],
            m["category"],
            m["prompts"],
            m["answers"],
            m["loss_tokens"],
            m["reasoning"],
            m["tool_calls"],
            tuple(m["languages"].items()),
        )
        for m in mix
    ]


def mix_headline(mix: list[dict[str, Any]]) -> str:
    """`mix of 40 prompts, 30 answers, 2,800 loss tokens`: what the mix table's shares are shares of."""
    from app.store.queries import mix_total

    total = mix_total(mix_rows(mix))
    return (
        f"mix of {total.prompts:,} prompts, {total.answers:,} answers, {total.loss_tokens:,} loss tokens "
        "(reasoning and tool calls: shares of the row's answers)"
    )


def mix_cells(mix: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The mix table's rows from `status --json`'s `mix`: per (dataset, category) its shares of the run's prompts,
    answers and loss tokens, the shares of its own answers that reason and that call tools, and its prompts' top
    three scripts; then the whole run's row when there is more than one."""
    from app.store.queries import MixRow, mix_total

    rows = mix_rows(mix)
    total = mix_total(rows)

    def cells(row: MixRow, label: str) -> tuple[str, ...]:
        return (
            label,
            _share(row.prompts, total.prompts),
            _share(row.answers, total.answers),
            _share(row.loss_tokens, total.loss_tokens),
            _share(row.reasoning, row.answers),
            _share(row.tool_calls, row.answers),
            " · ".join(f"{script} {100 * share:.0f}%" for script, share in row.top_languages(3)) or "-",
        )

    out = [cells(row, row.label) for row in rows]
    if len(rows) > 1:
        out.append(cells(total, "all"))
    return out


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from app.engine.money.budget import usd
    from app.records import VERDICT_LABELS, VERIFICATION_WORDS

    console = Console(highlight=False)
    if not report["runs"]:
        console.print(f"{report['database']}: no runs yet (`eaglewatch ingest CONFIG` adds one)")
        return
    for r in report["runs"]:
        engine, fig = r["engine"], r["figures"]
        console.print(
            f"[b]{r['name']}[/b]  {r['words']}  {r['samples']} samples  {usd(r['cost_usd'])} spent", markup=True
        )
        if r.get("eval"):
            ev = r["eval"]
            console.print(
                f"eval of {ev['drafter']}: mean acceptance length {ev['mean_acceptance_length']} "
                f"(95 % CI {ev['mean_acceptance_length_ci95']}) over {ev['requests']} requests"
                + (f"; verdicts: {', '.join(ev['verdicts'])}" if ev["verdicts"] else "")
                + "  (eaglewatch eval report for the whole report)",
                markup=False,
            )
        if engine["state"] == "running":
            eta = "" if engine.get("eta_s") is None else f"  ETA {engine['eta_s']:.0f} s"
            console.print(
                f"{engine['text']}: {engine['in_flight']} in flight/{engine['concurrency_limit']}, "
                f"{engine['waiting']} waiting{eta}",
                markup=False,
            )
        elif engine["state"] in ("stopped", "gone"):
            console.print(engine["text"], markup=False)
        span = (
            "the engine's last 10 s" if fig["kind"] == "live" else f"averaged over the run's {fig['elapsed_s']:.0f} s"
        )
        console.print(
            f"{fig['req_s']:.2f} answers/s, {fig['tok_s']:.0f} tok/s, ${fig['cost_per_hour']:.4f}/h ({span})",
            markup=False,
        )
        table = Table(box=None, pad_edge=False, show_header=True)
        for name in r["states"]:
            table.add_column(name, justify="right")
        table.add_row(*(str(n) for n in r["states"].values()))
        console.print(table)
        conv = r["conversations"]
        if conv is not None:
            console.print(conversations_line(conv), markup=False)
        if r["mix"]:
            console.print(mix_headline(r["mix"]), markup=False)
            # names and scripts fold onto a second line when narrow, never cut; the shares never wrap
            mix = Table(box=None, pad_edge=False, show_header=True)
            for n, name in enumerate(MIX_HEADER):
                text = n in (0, len(MIX_HEADER) - 1)
                mix.add_column(name, justify="left" if text else "right", no_wrap=not text, overflow="fold")
            for cells in mix_cells(r["mix"]):
                mix.add_row(*(Text(c) for c in cells))  # a dataset's name is never read as markup
            console.print(mix)
        # one line that wraps between items, never a table column cut to fit the terminal
        console.print(
            "verdicts: " + " · ".join(f"{VERDICT_LABELS.get(k, k)} {n}" for k, n in r["verdicts"].items()), markup=False
        )
        console.print(
            "ids: "
            + " · ".join(f"{VERIFICATION_WORDS[k]} {n}" for k, n in r["verification"].items())
            + f"  (truncated {r['truncated']}, suspect {r['suspects']})",
            markup=False,
        )
        if r["interventions"]["samples"]:
            console.print(interventions_line(r["interventions"]), markup=False)
        for t in r["trust"]:  # verified | prior only | unverified, the words `fidelity` and the export use
            console.print(
                f"text path {t['endpoint']}" + (f" / {t['provider']}" if t["provider"] else "") + f": {t['text']}",
                markup=False,
            )
        m = r["measured"]
        if m["n"]:
            corrupt = sum(m["corrupt"].values())
            console.print(
                f"text path measured on {m['n']} verified answers: {m['matched']} the same text, "
                f"{corrupt} corrupt, {m['truncated']} truncated",
                markup=False,
            )
        if r["errors_by_class"] or r["retried"]:
            console.print(
                "failed requests: "
                + "  ".join(f"{k} {v}" for k, v in r["errors_by_class"].items())
                + f"  (retried {r['retried']})",
                markup=False,
            )
        if r["strategies"]:
            console.print("strategies: " + "  ".join(f"{k} {v}" for k, v in r["strategies"].items()), markup=False)
        console.print()
