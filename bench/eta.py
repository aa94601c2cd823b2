"""How right the ETA and projected cost are early: the demo config through the engine, against the final values.

    python bench/eta.py [--config sample_data/demo.toml] [--at 0.25 0.5] [--runs 4]

Runs the config (its own simulators, its faults, its concurrency: the demo's limit grows from 8 to 64) into
a fresh database in a temporary folder, polls the engine's snapshot every 0.25 s, and prints, at each
fraction of samples ended, the projected end (elapsed + ETA) and the projected total cost against the run's
real end and cost. About 35 s a run for the demo; with --runs N, N runs one after another (their timing,
and so the limit's path and the faults' draws, differ) and the largest error at each fraction.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


async def trace(config_path: Path) -> tuple[list[tuple[float, float, float | None, float | None, int]], float, float]:
    """(elapsed, fraction ended, ETA, projected cost, limit) every 0.25 s; then the final time and cost."""
    from app.config import load_config
    from app.engine.session import open_run

    config = load_config(config_path)
    with tempfile.TemporaryDirectory() as tmp:
        run = config.run.model_copy(update={"database": Path(tmp) / "eta.db", "output_dir": Path(tmp) / "out"})
        config = config.model_copy(update={"run": run})
        rows = []
        async with open_run(config) as opened:
            engine = opened.run
            waiter = asyncio.ensure_future(engine.wait())
            while not waiter.done():
                s = engine.snapshot()
                ended = (s.done + s.failed + s.skipped) / max(1, s.total)
                # the time since this engine started (the projection's clock), not the run's since its first answer
                rows.append(
                    (
                        s.read_at - s.live.started_at,
                        ended,
                        s.live.eta_s,
                        s.live.projected_cost_usd,
                        s.live.concurrency_limit,
                    )
                )
                await asyncio.wait({waiter}, timeout=0.25)
            s = engine.snapshot()
            return rows, s.read_at - s.live.started_at, s.cost_usd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "sample_data" / "demo.toml")
    parser.add_argument("--at", type=float, nargs="+", default=[0.25, 0.5])
    parser.add_argument("--runs", type=int, default=1, help="runs one after another (default 1)")
    args = parser.parse_args()
    worst: dict[float, list[float]] = {}
    for n in range(args.runs):
        rows, end, cost = asyncio.run(trace(args.config))
        print(f"run {n + 1}: final {end:.1f} s, ${cost:.4f}")
        print("| ended | elapsed | limit | projected end | error | projected cost | error |")
        print("|---|---|---|---|---|---|---|")
        for at in args.at:
            row = next((r for r in rows if r[1] >= at and r[2] is not None), None)
            if row is None:
                continue
            t, ended, eta, projected, limit = row
            e_end, e_cost = (t + eta) / end - 1, projected / cost - 1
            w = worst.setdefault(at, [0.0, 0.0])
            w[0], w[1] = max(w[0], abs(e_end)), max(w[1], abs(e_cost))
            print(
                f"| {ended:.0%} | {t:.1f} s | {limit} | {t + eta:.1f} s | {e_end:+.0%} | "
                f"${projected:.4f} | {e_cost:+.0%} |"
            )
    if args.runs > 1:
        print(
            f"largest error over {args.runs} runs: "
            + "; ".join(f"at {at:.0%} end {w[0]:.0%}, cost {w[1]:.0%}" for at, w in worst.items())
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
