"""Wall time of `eaglewatch eval` at a simulated server's capacity against the oracle that knows the capacity.

    python bench/eval.py [--n 1200] [--cap 16] [--median-ms 200 --p95-ms 400] [--profile cap|queue]

Two simulators alike (vLLM personality, per-request acceptance figures, lognormal latency, replaying
sample_data/reference.jsonl non-streaming): `cap` refuses past a hidden concurrency cap with 429 + Retry-After;
`queue` is a queueing server with that many batch slots (never a 429; latency grows with the queue). Against one,
the real eval engine (`app.eval.run.EvalRun`: ingest, the adaptive limit from concurrency_max 64 with no hint of
the capacity, retries, every answer stored in SQLite with its figures); against the other, a naive loop fixed at
exactly the capacity that only sends and reads (the oracle). Same prompts, same run, one after the other. Prints
a table and the ratio eval / oracle (target <= 1.10).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "sample_data"
TARGET = 1.10


def profile_options(profile: str, cap: int, median_ms: float, p95_ms: float) -> dict:
    """The simulator options of a profile (as a config's [endpoints.simulator] table)."""
    capacity = {"concurrency_cap": cap} if profile == "cap" else {"batch_slots": cap}
    return {
        "personality": "vllm", "latency_median_ms": median_ms, "latency_p95_ms": p95_ms, "logprobs": False,
        "spec_acceptance": [0.8, 0.6, 0.4], "seed": 1, **capacity,
    }  # fmt: skip


def prompt_rows(n: int) -> list[dict]:
    """`n` prompts: sample_data's, cycled (ids made distinct; the simulator answers a prompt by its messages)."""
    with open(SAMPLE / "prompts.openai.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [{**rows[k % len(rows)], "id": f"p{k}"} for k in range(n)]


def write_config(folder: Path, n: int, options: dict) -> Path:
    sim = "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in prompt_rows(n)))
    path = folder / "eval.toml"
    path.write_text(f"""
[run]
name = "bench-eval"
database = "{folder / "eval.db"}"
[data]
reference = "{SAMPLE / "reference.jsonl"}"
[[data.datasets]]
path = "{prompts}"
format = "openai-messages"
[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{SAMPLE / "tokenizer"}"
[[endpoints]]
name = "sim"
timeout_s = 60
[endpoints.simulator]
{sim}
[generation]
stream = false
[limits]
concurrency_max = 64
[eval]
drafter = "bench/drafter"
max_tokens = 8192
bootstrap = 100
""")
    return path


async def eval_run(config_path: Path) -> tuple[float, int]:
    from app.config import load_config
    from app.eval.run import EvalRun

    engine = EvalRun(load_config(config_path))
    t0 = time.perf_counter()
    await engine.run()
    return time.perf_counter() - t0, engine.progress.done


async def oracle_run(n: int, cap: int, options: dict) -> tuple[float, int]:
    """A fixed concurrency of exactly `cap`, sending and reading only (what knowing the capacity buys)."""
    import aiohttp

    from app.config import SimulatorOptions
    from app.simulator.server import SimulatorServer

    sim = SimulatorServer(
        SimulatorOptions(reference=SAMPLE / "reference.jsonl", **options), tokenizer_dir=SAMPLE / "tokenizer",
        model="moonshotai/kimi-k2.5", profile="kimi-k2.5",
    )  # fmt: skip
    await sim.start()
    prompts = [r["messages"] for r in prompt_rows(n)]
    bodies = [
        json.dumps({"model": "moonshotai/kimi-k2.5", "messages": m, "max_tokens": 8192, "temperature": 0}).encode()
        for m in prompts
    ]
    done = 0
    queue = list(range(len(bodies)))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def worker() -> None:
                nonlocal done
                while queue:
                    i = queue.pop()
                    async with session.post(
                        f"{sim.base_url}/chat/completions", data=bodies[i], headers={"Content-Type": "application/json"}
                    ) as resp:
                        await resp.read()
                        if resp.status == 200:
                            done += 1
                        else:
                            queue.append(i)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(cap)))
            return time.perf_counter() - t0, done
    finally:
        await sim.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1200, help="prompts (sample_data's 300, cycled; default 1200)")
    parser.add_argument("--cap", type=int, default=16, help="the server's capacity (default 16)")
    parser.add_argument("--median-ms", type=float, default=200.0)
    parser.add_argument("--p95-ms", type=float, default=400.0)
    parser.add_argument("--profile", choices=("cap", "queue"), default="cap")
    args = parser.parse_args(argv)
    n = args.n
    options = profile_options(args.profile, args.cap, args.median_ms, args.p95_ms)
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as folder:
        eval_s, eval_done = asyncio.run(eval_run(write_config(Path(folder), n, options)))
    oracle_s, oracle_done = asyncio.run(oracle_run(n, args.cap, options))
    ratio = eval_s / oracle_s
    print("| client | profile | requests | answered | wall s |\n|---|---|---|---|---|")
    print(f"| eval (adaptive, stored) | {args.profile} {args.cap} | {n} | {eval_done} | {eval_s:.2f} |")
    print(f"| oracle (fixed {args.cap}) | {args.profile} {args.cap} | {n} | {oracle_done} | {oracle_s:.2f} |")
    print(f"ratio eval/oracle = {ratio:.3f} (target <= {TARGET:.2f}: {'met' if ratio <= TARGET else 'NOT met'})")
    return 0 if eval_done == oracle_done == n else 1


if __name__ == "__main__":
    raise SystemExit(main())
