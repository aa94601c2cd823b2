"""One huge answer among small ones: do the small reconstructions wait behind it?

    python bench/big_answer.py [--mb 4] [--small 400] [--workers 1]

The engine's ReconstructionPool over the sample tokenizer (worker processes, as a run uses them) reconstructs one answer
of
`--mb` MB and `--small` ordinary answers submitted right after it. Two rounds in the same process: the big
answer in the big lane (`BIG_RECONSTRUCT_CHARS`, the engine's rule) and, as the baseline, in a worker's batch like
any other (the rule switched off). Prints when the last small reconstruction finished and when the big one did.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "sample_data"


def big_text(mb: float) -> str:
    words = "the quick brown fox jumps over a lazy dog; ünï 中文 data, science and 42 more words".split()
    rng = random.Random(1)
    out: list[str] = []
    size = 0
    while size < mb * 1_000_000:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


async def one_round(mb: float, n_small: int, workers: int, lane: bool) -> dict:
    from app.engine.fidelity import pool as reconstruction_pool
    from app.engine.fidelity.pool import ReconstructionPool, build_reconstructor, open_endpoint_reconstructor
    from app.records import Completion
    from app.store.store_records import LeasedSample

    class Cfg:
        class model:
            tokenizer = SAMPLE / "tokenizer"
            profile = "kimi-k2.5"

        endpoints = ()
        run = None

    base = build_reconstructor(Cfg)
    endpoint_reconstructor, _ = await open_endpoint_reconstructor(base, Cfg, Path("/nonexistent.db"))
    saved = reconstruction_pool.BIG_RECONSTRUCT_CHARS
    reconstruction_pool.BIG_RECONSTRUCT_CHARS = saved if lane else 10**12
    pool = await ReconstructionPool.open(endpoint_reconstructor, workers)
    try:
        sample = LeasedSample(1, "s", "d", [{"role": "user", "content": "hi"}], None, 1, None)
        big = Completion(content=big_text(mb), reasoning="thinking", finish_reason="stop")
        smalls = [
            Completion(content=f"answer {i}: the quick brown fox", reasoning="short thought", finish_reason="stop")
            for i in range(n_small)
        ]
        t0 = time.perf_counter()
        done: dict[str, float] = {}

        async def timed(name: str, c: Completion) -> None:
            await pool.reconstruct(c, sample, "sim", False)
            done[name] = time.perf_counter() - t0

        big_task = asyncio.ensure_future(timed("big", big))
        await asyncio.sleep(0)  # the big answer arrives first
        await asyncio.gather(*(timed(f"s{i}", c) for i, c in enumerate(smalls)))
        last_small = max(v for k, v in done.items() if k != "big")
        await big_task
        return {
            "lane": "big lane" if lane else "in a worker's batch (baseline)",
            "last_small_s": round(last_small, 3),
            "big_s": round(done["big"], 3),
            "workers": pool.workers,
        }
    finally:
        pool.close()
        reconstruction_pool.BIG_RECONSTRUCT_CHARS = saved


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--small", type=int, default=400)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    rows = [await one_round(args.mb, args.small, args.workers, lane) for lane in (False, True)]
    print(
        f"| where the {args.mb:g} MB answer is reconstructed | last of {args.small} small reconstructions done "
        "| big one done |"
    )
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['lane']} ({r['workers']} worker process) | {r['last_small_s']:.2f} s | {r['big_s']:.2f} s |")
    ratio = rows[1]["last_small_s"] / rows[0]["last_small_s"] if rows[0]["last_small_s"] else float("nan")
    print(f"\nsmall reconstructions finish in {ratio:.2f}x the time they take behind the big one in a worker")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "big_answer.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
