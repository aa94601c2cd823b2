"""Wall time against providers with capacity: the adaptive limit vs an oracle and a naive fixed concurrency.

    python bench/capacity.py [--n 2000] [--profiles noise cap24 rpm queue16 drop] [--median-ms 300 --p95-ms 600]

Each profile is a real simulator (`app/simulator/capacity.py`) on loopback with lognormal latency, replaying
sample_data/reference.jsonl non-streaming:

- `noise`: 2 % random 429s (Retry-After 1 s), no capacity limit (the clients' maximum, 64, is the capacity);
- `cap24`: a hidden concurrency cap of 24, 429 beyond it;
- `rpm`: a requests/min quota (3,600/min, one second's worth of burst), 429 when exceeded;
- `queue16`: a queueing server (SGLang/vLLM) with 16 batch slots, latency grows with the queue, never a 429;
- `drop`: a cap of 48 that drops to 16 seven seconds in.

Three clients run the same small async loop (start while the policy allows; a refused request goes back to
the queue and waits out its own Retry-After), each against its own server, all three at once in separate
processes so they share the machine alike: `adaptive` (app.engine.capacity.limiter.AdaptiveLimit, max 64, initial
the engine's default, 64 = concurrency_max; `--initial 8` shows a slow start from 8), `oracle` (fixed at the
true capacity: 64, 24, a client-side pacer at the quota, 16, the cap schedule)
and `naive` (fixed 64, what SpecForge, speculators and Curator do). The figure with the engine's own
scheduler is pending the scheduler rewrite. Merges its rows into bench/results/capacity.json per profile (a
subset run keeps the other profiles' last rows) and prints markdown for the rows of this run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "sample_data"
MAX = 64
DROP_AT_S = 7.0

PROFILES = {
    "noise": ("2% random 429s, no limit", {"faults": {"429": 0.02}}),
    "cap24": ("hidden concurrency cap 24", {"concurrency_cap": 24}),
    "rpm": ("3,600 requests/min quota", {"requests_per_min": 3600.0}),
    "queue16": ("queueing server, 16 slots", {"batch_slots": 16}),
    "drop": (f"cap 48 -> 16 at {DROP_AT_S:g} s", {"concurrency_cap": 48, "cap_changes": [(DROP_AT_S, 16)]}),
}


class Fixed:
    """A fixed concurrency (optionally following a schedule, optionally paced at a requests/min quota)."""

    def __init__(self, limit: int, schedule=(), rpm: float = 0.0, start: float = 0.0) -> None:
        from app.token_bucket import TokenBucket

        self.limit, self.schedule, self.start = limit, list(schedule), start
        self.in_flight = 0
        self.bucket = TokenBucket(rpm, capacity=max(1.0, rpm / 60.0), now=start) if rpm else None
        self.cooldown_until = 0.0

    def _limit(self, now: float) -> int:
        limit = self.limit
        for at, cap in self.schedule:
            if now - self.start >= at:
                limit = cap
        return limit

    def can_start(self, now: float) -> bool:
        if self.in_flight >= self._limit(now):
            return False
        return self.bucket is None or self.bucket.wait_s(now) == 0.0

    def take(self, now: float):
        self.in_flight += 1
        if self.bucket is not None:
            self.bucket.try_take(1, now)
        return None

    def release(self) -> None:
        self.in_flight -= 1

    def on_success(self, saturated, *, ticket, latency_s, now):
        return None

    def on_overload(self, now, retry_after_s, *, ticket):
        return None


async def client_run(base_url: str, policy, n: int, messages: list, stats: dict) -> float:
    """Send n requests under `policy`; a refused request is re-queued and waits its own Retry-After."""
    import aiohttp

    from app.providers.parse import parse_retry_after

    loop = asyncio.get_running_loop()
    queue: deque[int] = deque(range(n))
    retries: list[tuple[float, int]] = []
    wake = asyncio.Event()
    done = 0
    limits: list[int] = []
    latencies: list[float] = []
    t0 = loop.time()
    body_of = [
        json.dumps(
            {"model": "moonshotai/kimi-k2.5", "messages": messages[i % len(messages)], "max_tokens": 8192}
        ).encode()
        for i in range(len(messages))
    ]
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(i: int, ticket, started: float) -> None:
            nonlocal done
            stats["requests"] += 1
            try:
                async with session.post(
                    f"{base_url}/chat/completions",
                    data=body_of[i % len(body_of)],
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    await resp.read()
                    status, headers = resp.status, resp.headers
            except (TimeoutError, aiohttp.ClientError):
                status, headers = 599, {}
            now = loop.time()
            policy.release()
            if status == 200:
                done += 1
                latencies.append(now - started)
                policy.on_success(
                    bool(queue) or policy.in_flight + 1 >= getattr(policy, "limit", MAX),
                    ticket=ticket,
                    latency_s=now - started,
                    now=now,
                )
            else:
                wait = parse_retry_after(headers) if status in (429, 503) else 0.5
                if status in (429, 503):
                    stats["429"] += 1
                    policy.on_overload(now, wait, ticket=ticket)
                retries.append((now + (wait if wait is not None else 1.0), i))
            wake.set()

        tasks = set()
        while done < n:
            now = loop.time()
            if retries:
                ready = [r for r in retries if r[0] <= now]
                if ready:
                    retries[:] = [r for r in retries if r[0] > now]
                    queue.extendleft(i for _, i in sorted(ready, reverse=True))
            while queue and policy.can_start(now):
                i = queue.popleft()
                ticket = policy.take(now)
                t = asyncio.ensure_future(one(i, ticket, now))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            limits.append(getattr(policy, "limit", 0))
            wake.clear()
            if done >= n:
                break
            try:
                await asyncio.wait_for(wake.wait(), timeout=0.005)
            except TimeoutError:
                pass
        wall = loop.time() - t0
        for t in list(tasks):
            t.cancel()
    stats["mean_limit"] = sum(limits) / max(1, len(limits))
    latencies.sort()
    stats["p50_ms"] = 1000 * latencies[len(latencies) // 2] if latencies else None
    return wall


async def one_run(
    profile: str, client: str, n: int, median_ms: float, p95_ms: float, seed: int, initial: int = MAX
) -> dict:
    """One client against its own simulator; returns wall time, requests, 429s."""
    from app.engine.capacity.limiter import AdaptiveLimit
    from app.simulator.options import SimulatorOptions
    from app.simulator.server import SimulatorServer

    extra = dict(PROFILES[profile][1])
    options = SimulatorOptions(
        reference=SAMPLE / "reference.jsonl", latency_median_ms=median_ms, latency_p95_ms=p95_ms, seed=seed, **extra
    )
    messages = [json.loads(line)["messages"] for line in (SAMPLE / "prompts.openai.jsonl").read_text().splitlines()]
    async with SimulatorServer(options, tokenizer_dir=SAMPLE / "tokenizer") as sim:
        now = asyncio.get_running_loop().time()
        if client == "adaptive":
            policy = AdaptiveLimit(initial, 1, MAX)
        elif client == "naive":
            policy = Fixed(MAX)
        else:  # the oracle knows the true capacity
            policy = {
                "noise": lambda: Fixed(MAX),
                "cap24": lambda: Fixed(24),
                "rpm": lambda: Fixed(MAX, rpm=extra["requests_per_min"], start=now),
                "queue16": lambda: Fixed(16),
                "drop": lambda: Fixed(48, schedule=extra["cap_changes"], start=now),
            }[profile]()
        stats = {"requests": 0, "429": 0}
        wall = await client_run(sim.base_url, policy, n, messages, stats)
        out = {
            "profile": profile,
            "client": client,
            "n": n,
            "wall_s": wall,
            **stats,
            "rate_429": stats["429"] / max(1, stats["requests"]),
            "server_peak": sim.capacity.model.peak if sim.capacity else None,
        }
        if client == "adaptive":
            st = policy.state()
            out.update(
                final_limit=st.limit,
                capacity_estimate=st.capacity_estimate,
                reason=st.reason,
                cuts=st.cuts,
                forgiven=st.forgiven,
            )
        return out


def write_results(path: Path, results: list[dict]) -> None:
    """Merge this run's rows into the results file per profile: a subset run replaces only its own profiles'
    rows (each row carries its own settings: n, latency, seed, initial, time)."""
    by_profile: dict[str, dict] = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
        for row in old.get("results", []) if isinstance(old, dict) else []:
            if isinstance(row, dict) and "adaptive" in row:
                by_profile[row["adaptive"]["profile"]] = row
    for row in results:
        by_profile[row["adaptive"]["profile"]] = row
    ordered = [by_profile[p] for p in PROFILES if p in by_profile]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"results": ordered}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="samples per run (default 2000)")
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument("--median-ms", type=float, default=300.0)
    parser.add_argument("--p95-ms", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--initial",
        type=int,
        default=MAX,
        help=f"the adaptive client's initial limit (default {MAX}, the engine's: concurrency_max)",
    )
    parser.add_argument("--one", nargs=2, metavar=("PROFILE", "CLIENT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = asyncio.run(
            one_run(args.one[0], args.one[1], args.n, args.median_ms, args.p95_ms, args.seed, args.initial)
        )
        print(json.dumps(result))
        return 0
    results = []
    for profile in args.profiles:
        procs = {
            c: subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    profile,
                    c,
                    "--n",
                    str(args.n),
                    "--median-ms",
                    str(args.median_ms),
                    "--p95-ms",
                    str(args.p95_ms),
                    "--seed",
                    str(args.seed),
                    "--initial",
                    str(args.initial),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for c in ("adaptive", "oracle", "naive")
        }
        row = {c: json.loads(p.communicate()[0].strip().splitlines()[-1]) for c, p in procs.items()}
        row["settings"] = {
            "n": args.n,
            "median_ms": args.median_ms,
            "p95_ms": args.p95_ms,
            "seed": args.seed,
            "initial": args.initial,
            "time": time.time(),
        }
        results.append(row)
        a, o, nv = row["adaptive"], row["oracle"], row["naive"]
        print(
            f"{profile}: adaptive {a['wall_s']:.1f}s ({a['rate_429']:.1%} 429, limit {a['final_limit']}, "
            f"capacity {a['capacity_estimate']}, {a['reason']}) oracle {o['wall_s']:.1f}s "
            f"({o['rate_429']:.1%}) naive {nv['wall_s']:.1f}s ({nv['rate_429']:.1%}) -> "
            f"{a['wall_s'] / o['wall_s']:.2f}x oracle, {a['wall_s'] / nv['wall_s']:.2f}x naive",
            flush=True,
        )
    write_results(ROOT / "bench" / "results" / "capacity.json", results)
    print(
        "\n| profile | adaptive | oracle | naive 64 | adaptive / oracle | adaptive / naive | 429 rate (adaptive "
        "/ naive) "
        "| p50 latency (adaptive / oracle / naive) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in results:
        a, o, nv = row["adaptive"], row["oracle"], row["naive"]
        print(
            f"| {PROFILES[a['profile']][0]} | {a['wall_s']:.1f} s | {o['wall_s']:.1f} s | {nv['wall_s']:.1f} s | "
            f"{a['wall_s'] / o['wall_s']:.2f}x | {a['wall_s'] / nv['wall_s']:.2f}x | "
            f"{a['rate_429']:.1%} / {nv['rate_429']:.1%} | "
            f"{a['p50_ms']:.0f} / {o['p50_ms']:.0f} / {nv['p50_ms']:.0f} ms |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
