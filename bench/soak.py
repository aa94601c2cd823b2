"""Soak: one long engine run with faults, checked for loss, duplicates, cost drift, memory growth and slowdown.

    python bench/soak.py [--n 100000] [--faults 500=0.02,502=0.01,reset=0.01,malformed=0.01,429=0.002]
                         [--concurrency 64] [--stream] [--reconstruct] [--latency-ms 5]

The built-in simulator (a real loopback HTTP server in this process) answers with the given faults; the
engine runs the whole set to the end over a fresh SQLite file. Reports: samples lost (neither done nor
failed) and duplicated (more than one stored answer), the cost error (ledger vs each response priced from
its tokens, and the engine's own figure vs the ledger), RSS over time, and the completion rate in the first
vs the last 10% of the samples. Writes bench/results/soak.json and prints a markdown summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "sample_data"
MODEL = "moonshotai/kimi-k2.5"
PRICES = {"prompt_per_m": 0.6, "completion_per_m": 2.5}


def rss_mb() -> float:
    """This process's resident set size in MB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def parse_faults(text: str) -> dict[str, float]:
    """`500=0.02,429=0.01` -> {"500": 0.02, "429": 0.01}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, rate = part.partition("=")
        out[kind.strip()] = float(rate)
    return out


def samples(n: int):
    """n samples cycling over the sample prompts, each with its own id (the simulator answers by content)."""
    from app.store.store_records import SampleInput

    base = [json.loads(line) for line in (SAMPLE / "prompts.openai.jsonl").read_text().splitlines()]
    for i in range(n):
        obj = base[i % len(base)]
        yield SampleInput(f"{obj['id']}-{i}", "soak", obj["messages"], obj.get("tools"))


def rate_between(history: list[tuple[float, int]], lo: int, hi: int) -> float:
    """Samples per second while the done count went from `lo` to `hi` (first ticks at or past each)."""
    t_lo = next((t for t, d in history if d >= lo), None)
    t_hi = next((t for t, d in history if d >= hi), None)
    if t_lo is None or t_hi is None or t_hi <= t_lo:
        return 0.0
    return (hi - lo) / (t_hi - t_lo)


async def soak(args: argparse.Namespace, db_dir: Path) -> dict:
    from app.config import parse_config
    from app.engine.fidelity.pool import build_reconstructor
    from app.engine.run import Run
    from app.store.run_store import RunStore

    faults = parse_faults(args.faults)
    cfg = parse_config(
        {
            "run": {"name": "soak", "database": str(db_dir / "soak.db")},
            "data": {
                "datasets": [{"path": str(SAMPLE / "prompts.openai.jsonl")}],
                "reference": str(SAMPLE / "reference.jsonl"),
            },
            "model": {"name": MODEL, "tokenizer": str(SAMPLE / "tokenizer")},
            "endpoints": [
                {
                    "name": "sim",
                    "timeout_s": 10,
                    "max_concurrency": args.concurrency,
                    "simulator": {
                        "latency_median_ms": args.latency_ms,
                        "latency_p95_ms": args.latency_ms * 2,
                        "tokens_per_s": 0.0,
                        "seed": 7,
                        "faults": faults,
                    },
                }
            ],
            "generation": {"max_tokens": 4096, "stream": args.stream, "attempts": 8},
            "limits": {
                "concurrency_initial": args.concurrency,
                "concurrency_min": 1,
                "concurrency_max": args.concurrency,
            },
            "pricing": {MODEL: PRICES},
        }
    )
    store = await RunStore.open(cfg.run.database)
    run_id = await store.ensure_run("soak", cfg.redacted())
    t_ingest = time.perf_counter()
    await store.ingest(run_id, samples(args.n))
    ingest_s = time.perf_counter() - t_ingest
    run = Run(cfg, store, reconstructor=build_reconstructor(cfg) if args.reconstruct else None)
    history: list[tuple[float, int]] = []
    rss: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    await run.start()

    async def sample_every_second() -> None:
        while True:
            s = run.snapshot()
            now = time.perf_counter() - t0
            history.append((now, s.done + s.failed))
            rss.append((round(now, 1), round(rss_mb(), 1)))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample_every_second())
    outcome = await run.wait()
    elapsed = time.perf_counter() - t0
    sampler.cancel()
    snap = run.snapshot()
    history.append((elapsed, snap.done + snap.failed))
    rss.append((round(elapsed, 1), round(rss_mb(), 1)))
    await run.close()
    await store.close()

    db = sqlite3.connect(cfg.run.database)
    states = dict(db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())
    ok = "content IS NOT NULL AND error_class IS NULL"
    answers, distinct = db.execute(f"SELECT COUNT(*), COUNT(DISTINCT sample_pk) FROM responses WHERE {ok}").fetchone()
    ledger = db.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM responses").fetchone()[0]
    priced = db.execute(
        f"SELECT COALESCE(SUM(prompt_tokens * ? + completion_tokens * ?), 0) / 1e6 FROM responses WHERE {ok}",
        (PRICES["prompt_per_m"], PRICES["completion_per_m"]),
    ).fetchone()[0]
    failed_attempts = db.execute("SELECT COUNT(*) FROM responses WHERE error_class IS NOT NULL").fetchone()[0]
    db.close()
    n = args.n
    tenth = max(1, n // 10)
    return {
        "n": n,
        "faults": faults,
        "concurrency": args.concurrency,
        "stream": args.stream,
        "reconstruct": args.reconstruct,
        "outcome": outcome.state,
        "states": states,
        "lost": n - states.get("done", 0) - states.get("failed", 0),
        "duplicated": answers - distinct,
        "failed_attempts_retried_or_logged": failed_attempts,
        "ledger_usd": ledger,
        "cost_error_usd": abs(ledger - priced),
        "engine_vs_ledger_usd": abs(snap.cost_usd - ledger),
        "elapsed_s": round(elapsed, 1),
        "ingest_s": round(ingest_s, 1),
        "rate_all": round(n / elapsed, 1),
        "rate_first_10pct": round(rate_between(history, 0, tenth), 1),
        "rate_last_10pct": round(rate_between(history, n - tenth, n), 1),
        "rss_mb": rss,
        "rss_peak_mb": max(r for _, r in rss),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="samples (default 100,000; use e.g. 20000 for a quick run)")
    ap.add_argument(
        "--faults",
        default="500=0.02,502=0.01,reset=0.01,malformed=0.01,429=0.002",
        help="simulator fault kinds and rates, comma-separated KIND=RATE",
    )
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency-ms", type=float, default=5.0, help="simulator median latency")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--reconstruct", action="store_true", help="reconstruct token ids with the sample tokenizer too")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="eaglewatch-soak-") as d:
        result = asyncio.run(soak(args, Path(d)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    rss = result["rss_mb"]
    marks = [rss[int(i * (len(rss) - 1) / 4)] for i in range(5)] if rss else []
    print(
        f"| soak: {result['n']} samples, faults {args.faults}, c={args.concurrency} | "
        f"lost {result['lost']}, duplicated {result['duplicated']}, cost error ${result['cost_error_usd']:.6f} "
        f"(engine vs ledger ${result['engine_vs_ledger_usd']:.6f}) | {result['rate_all']} samples/s; first 10% "
        f"{result['rate_first_10pct']}/s, last 10% {result['rate_last_10pct']}/s | RSS MB over time "
        f"{', '.join(f'{t:.0f}s {m:.0f}' for t, m in marks)} (peak {result['rss_peak_mb']:.0f}) |"
    )
    ok = result["lost"] == 0 and result["duplicated"] == 0 and result["cost_error_usd"] < 1e-6
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
