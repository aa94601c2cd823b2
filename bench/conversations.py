"""Whole conversations at a provider's capacity: the engine's scheduling of turn chains vs an oracle and a naive
client that walks each conversation in turn.

    python bench/conversations.py [--n 200] [--turns 4] [--profiles cap24 queue16] [--quick]

A synthetic set of N conversations (openai-messages, `regenerate = "all"`) is written to a temporary directory:
conversation i has between 1 and 2T-1 assistant turns (T on average, seeded), each user message 200-1,500
characters, each recorded answer a placeholder the requests never carry; the reference answers each turn
(`<conversation>#<turn>`) with the output ids of one of sample_data/reference.jsonl's answers that end without a
tool call. Every client talks to its own simulator (`app/simulator/server.py`, in its own process) that replays
that reference with a prompt cache (`cached_tokens`) and a capacity:

- `cap24`: a hidden concurrency cap of 24, 429 + Retry-After beyond it;
- `queue16`: a queueing server (SGLang/vLLM) with 16 batch slots, the rest wait in its queue, never a 429.

Each request's service time is the simulator's latency for its turn alone (`latency_by_sample`: lognormal, median
300 ms, p95 600 ms, seeded by the turn's id), so every client is given exactly the same work whatever order it
sends the turns in, and the oracle is computed from it: max(sum of the service times / capacity, the longest
conversation's turns one after the other). Clients, one after another, each in a fresh process (run at once
they fought over a 2-core machine's CPU, and every client measured its neighbours' load):

- `eaglewatch`: the engine (`app.engine.run.Run`) over a real SQLite store, reconstructing every answer's ids
  (`[run] reconstruct_workers = "auto"`), its limit adaptive from the engine's default start (concurrency_max 64);
  timed from `Run.start` to the run's end (ingest not timed, the reconstruction worker's one-off start taken out);
- `naive64`: httpx, 64 workers, each taking the next conversation in dataset order and sending its turns one
  after the other (the model's own answer appended, as eaglewatch does), a refused request retried after its
  Retry-After: what a script written around `asyncio.gather` does;
- `naive@cap`: the same at the true capacity (24 or 16): the naive client told the capacity.

Each client's result also says how busy it kept the provider (`busy_share`: the simulator's admitted requests,
at most its capacity, sampled every 10 ms, over the capacity; `busy_share_head` leaves out the last 5 % of the
run, the chains' own tail) and its CPU seconds. `--reps R` repeats the three clients R times in rotating order
and reports the median ratio with its range. Prints a line per profile and a markdown table; writes
bench/results/conversations.json. Machine load moves wall times; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "sample_data"
MODEL = "moonshotai/kimi-k2.5"
MAX = 64
MEDIAN_MS, P95_MS = 300.0, 600.0
WORDS = (
    "model token answer batch server cache prompt chain river market garden window engine signal "
    "history number planet theory letter summer music paper"
).split()

PROFILES = {
    "cap24": ("hidden concurrency cap 24", {"concurrency_cap": 24}, 24),
    "queue16": ("queueing server, 16 slots", {"batch_slots": 16}, 16),
}
CLIENTS = ("eaglewatch", "naive64", "naive@cap")


# ---- the synthetic conversations -----------------------------------------------------------------------


def plain_answers() -> list[list[int]]:
    """Output ids of sample_data's reference answers that end the turn without a tool call (a tool call would
    need recorded tool results to continue)."""
    from app.tokens.tokenizer import load_tokenizer

    tok = load_tokenizer(SAMPLE / "tokenizer")
    out = []
    for line in (SAMPLE / "reference.jsonl").read_text().splitlines():
        ids = json.loads(line)["output_ids"]
        text = tok.decode(ids)
        if "tool_call" not in text and text.endswith("<|im_end|>") and len(ids) < 1000:
            out.append(ids)
    return out


def build(folder: Path, n: int, turns: int, seed: int) -> dict[str, int]:
    """Write conversations.jsonl and reference.jsonl into `folder`; returns {conversation id: its turns}."""
    rng = random.Random(seed)
    answers = plain_answers()
    shape: dict[str, int] = {}
    with open(folder / "conversations.jsonl", "w") as convs, open(folder / "reference.jsonl", "w") as ref:
        for i in range(n):
            cid = f"bc-{i:05d}"
            k_turns = rng.randint(1, 2 * turns - 1)
            shape[cid] = k_turns
            messages = [{"role": "system", "content": "You are a helpful assistant."}]
            prompt_tokens = 10
            for k in range(1, k_turns + 1):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 220)))
                messages.append({"role": "user", "content": f"Turn {k}: {text}?"})
                ids = rng.choice(answers)
                prompt_tokens += len(text) // 4 + 8
                ref.write(
                    json.dumps(
                        {
                            "id": f"{cid}#{k}",
                            "messages": messages,
                            "output_ids": ids,
                            "meta_info": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids)},
                        }
                    )
                    + "\n"
                )
                prompt_tokens += len(ids)  # the model's answer is in every later turn's prompt
                messages.append({"role": "assistant", "content": f"The dataset says: answer {k}."})
            convs.write(json.dumps({"id": cid, "messages": messages}) + "\n")
    return shape


def oracle(shape: dict[str, int], capacity: int, seed: int) -> dict:
    """The oracle's wall time: the work at the provider's capacity, or the longest conversation's critical path."""
    from app.simulator.server import sample_latency_s

    total, longest = 0.0, 0.0
    for cid, k_turns in shape.items():
        chain = sum(sample_latency_s(seed, f"{cid}#{k}", MEDIAN_MS, P95_MS) for k in range(1, k_turns + 1))
        total += chain
        longest = max(longest, chain)
    return {
        "wall_s": max(total / capacity, longest),
        "work_s": total,
        "critical_path_s": longest,
        "requests": sum(shape.values()),
    }


def sim_options(profile: str, folder: Path, seed: int):
    from app.simulator.options import SimulatorOptions

    return SimulatorOptions(
        reference=folder / "reference.jsonl",
        latency_median_ms=MEDIAN_MS,
        latency_p95_ms=P95_MS,
        seed=seed,
        prompt_cache=True,
        logprobs=False,
        **PROFILES[profile][1],
    )


class Occupancy:
    """The simulator's busy slots (requests admitted and running, at most its capacity), sampled every 10 ms: the
    share of the capacity a client kept busy."""

    def __init__(self, sim, capacity: int) -> None:
        self._sim, self._capacity = sim, capacity
        self.samples: list[tuple[float, int]] = []
        self._task = None

    async def _loop(self) -> None:
        t0 = time.perf_counter()
        while True:
            busy = min(self._sim.capacity.model.active, self._capacity)
            self.samples.append((time.perf_counter() - t0, busy))
            await asyncio.sleep(0.01)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    def stop(self) -> dict:
        self._task.cancel()
        busy = [b for _, b in self.samples]
        # the share of the capacity in use until the last 5 % of samples (the tail is the chains' own)
        head = busy[: max(1, int(len(busy) * 0.95))]
        return {
            "busy_share": sum(busy) / max(1, len(busy)) / self._capacity,
            "busy_share_head": sum(head) / max(1, len(head)) / self._capacity,
            "trace": [(round(t, 2), b) for t, b in self.samples[::50]],
        }


# ---- the provider, in its own process ------------------------------------------------------------------


async def serve(profile: str, folder: Path, seed: int) -> None:
    """The provider: the simulator with its capacity and the occupancy sampler, in a process of its own (a real
    provider's CPU is not the client's). Prints its base URL, serves until stdin closes, then prints its counters
    and occupancy as one JSON line."""
    from app.simulator.server import SimulatorServer

    sim = SimulatorServer(
        sim_options(profile, folder, seed), tokenizer_dir=SAMPLE / "tokenizer", model=MODEL, latency_by_sample=True
    )
    await sim.start()
    occupancy = Occupancy(sim, PROFILES[profile][2])
    print(json.dumps({"base_url": sim.base_url}), flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # "start": the client's clock starts
    occupancy.start()
    await asyncio.to_thread(sys.stdin.readline)  # "stop" (or stdin closed): the client is done
    busy = occupancy.stop()
    counters = dict(sim.counters)
    await sim.close()
    print(json.dumps({"counters": counters, **busy}), flush=True)


class Provider:
    """The client's handle on the provider process (`serve`): its base URL, `start()` when the clock starts,
    `stop()` for its counters and occupancy."""

    def __init__(self, profile: str, folder: Path, seed: int) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", profile, "--folder", str(folder), "--seed", str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.base_url = json.loads(self._proc.stdout.readline())["base_url"]

    def start(self) -> None:
        self._proc.stdin.write("start\n")
        self._proc.stdin.flush()

    def stop(self) -> dict:
        self._proc.stdin.write("stop\n")
        self._proc.stdin.flush()
        out = json.loads(self._proc.stdout.readline())
        self._proc.wait(timeout=30)
        return out


# ---- eaglewatch ---------------------------------------------------------------------------------------


async def run_engine(profile: str, folder: Path, seed: int) -> dict:
    """The engine against the provider process."""
    from app.config import parse_config
    from app.engine.fidelity.pool import build_reconstructor
    from app.engine.run import Run
    from app.engine.work.config_ingest import ingest_config
    from app.providers.client import ChatClient
    from app.providers.wire import WireLimits
    from app.store.queries import run_counts
    from app.store.run_store import RunStore

    db = folder / f"engine-{profile}.db"
    for stale in folder.glob(f"engine-{profile}.db*"):  # a fresh run each time
        stale.unlink()
    cfg = parse_config(
        {
            "run": {"name": "cbench", "database": str(db), "output_dir": str(folder / "out")},
            "data": {
                "datasets": [
                    {"path": str(folder / "conversations.jsonl"), "format": "openai-messages", "regenerate": "all"}
                ],
                "reference": str(folder / "reference.jsonl"),
            },
            "model": {"name": MODEL, "tokenizer": str(SAMPLE / "tokenizer")},
            # a simulator endpoint (the engine names each turn's reference sample to it); its client is pointed at
            # the provider process
            "endpoints": [
                {"name": "sim", "simulator": {"prompt_cache": True}, "timeout_s": 60.0, "max_concurrency": MAX}
            ],
            "generation": {"max_tokens": 8192, "stream": False},
            "limits": {"concurrency_max": MAX},
            "pricing": {MODEL: {"prompt_per_m": 0.6, "completion_per_m": 2.5, "cached_prompt_per_m": 0.15}},
        },
        base_dir=folder,
    )
    provider = Provider(profile, folder, seed)
    ep = cfg.endpoints[0].model_copy(update={"base_url": provider.base_url, "simulator": None, "server": "openrouter"})
    client = ChatClient(ep, cfg.generation, None, limits=WireLimits(max_cost_usd=cfg.limits.max_response_cost_usd))
    store = await RunStore.open(db)
    served: dict = {}
    try:
        await ingest_config(store, cfg)
        run = Run(cfg, store, reconstructor=build_reconstructor(cfg), clients={"sim": client})
        t0 = time.perf_counter()
        await run.start()
        provider.start()
        pool = run.reconstruction_pool
        if pool is not None and pool.workers:
            t0 += pool.start_s  # the worker's one-off start, like ingest, is not the scheduling's
        await run.wait()
        wall = time.perf_counter() - t0
        served = provider.stop()
        final_limit = run.endpoints[0].limit.limit
        await run.close()
        counts = await store.read(lambda conn: run_counts(conn, 1))
        cached, prompt, spent = await store.read(
            lambda conn: conn.execute(
                "SELECT TOTAL(cached_tokens), TOTAL(prompt_tokens), TOTAL(cost_usd) FROM responses"
            ).fetchone()
        )
    finally:
        await store.close()
        await client.aclose()
        if not served:
            provider.stop()
    conv = counts.conversations
    sim_counters = served.pop("counters")
    return {
        "wall_s": wall,
        "requests": sum(sim_counters.values()),
        "ok": sim_counters.get("ok", 0),
        "429": sum(v for k, v in sim_counters.items() if k.startswith("429")),
        "turns_done": counts.conversations.turns.get("done", 0),
        "conversations_done": conv.done,
        "conversations_ended_early": conv.total - conv.done,
        "cached_share": cached / prompt if prompt else 0.0,
        "spent_usd": spent,
        "final_limit": final_limit,
        "cpu_s": time.process_time(),
        **served,
    }


# ---- the naive client ---------------------------------------------------------------------------------


async def run_naive(profile: str, folder: Path, seed: int, workers: int) -> dict:
    """`workers` tasks, each walking the next conversation's turns in order (module doc)."""
    import httpx

    from app.conversation import answer_message, extend_messages, split_turns, turn_sample_id
    from app.providers.parse import parse_retry_after

    conversations = [json.loads(line) for line in (folder / "conversations.jsonl").read_text().splitlines()]
    provider = Provider(profile, folder, seed)
    stats = {"requests": 0, "429": 0, "turns_done": 0, "cached": 0, "prompt": 0}
    nxt = 0

    class _Tool:  # app.conversation.answer_message reads id / name / arguments
        def __init__(self, call: dict) -> None:
            self.id, self.name, self.arguments = call.get("id"), call["function"]["name"], call["function"]["arguments"]

    async def walk(http: httpx.AsyncClient) -> None:
        nonlocal nxt
        while nxt < len(conversations):
            conv = conversations[nxt]
            nxt += 1
            turns = split_turns(conv["messages"])
            messages_json = "[]"
            answer = None
            for k, turn in enumerate(turns, 1):
                added = ([answer] if answer is not None else []) + [dict(m) for m in turn.segment]
                messages_json = extend_messages(messages_json, added)
                body = (
                    '{{"model":"{}","max_tokens":8192,"metadata":{{"sample_id":"{}"}},"messages":{}}}'.format(
                        MODEL, turn_sample_id(conv["id"], k), messages_json
                    )
                ).encode()
                while True:
                    stats["requests"] += 1
                    resp = await http.post(
                        "/chat/completions", content=body, headers={"Content-Type": "application/json"}
                    )
                    if resp.status_code == 200:
                        break
                    if resp.status_code == 429:
                        stats["429"] += 1
                    wait = parse_retry_after(resp.headers) if resp.status_code in (429, 503) else 0.5
                    await asyncio.sleep(wait if wait is not None else 1.0)
                data = resp.json()
                msg = data["choices"][0]["message"]
                usage = data.get("usage") or {}
                stats["prompt"] += usage.get("prompt_tokens", 0)
                stats["cached"] += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                stats["turns_done"] += 1
                answer = answer_message(
                    msg.get("content"), msg.get("reasoning"), [_Tool(c) for c in msg.get("tool_calls") or ()], turn=k
                )

    busy: dict = {}
    try:
        limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        async with httpx.AsyncClient(base_url=provider.base_url, limits=limits, timeout=120.0) as http:
            provider.start()
            t0 = time.perf_counter()
            await asyncio.gather(*(walk(http) for _ in range(workers)))
            wall = time.perf_counter() - t0
            busy = provider.stop()
    finally:
        if not busy:
            provider.stop()
    busy.pop("counters", None)
    return {
        "wall_s": wall,
        "requests": stats["requests"],
        "429": stats["429"],
        "turns_done": stats["turns_done"],
        "cached_share": stats["cached"] / stats["prompt"] if stats["prompt"] else 0.0,
        "workers": workers,
        "cpu_s": time.process_time(),
        **busy,
    }


# ---- the run --------------------------------------------------------------------------------------------


def one(args: argparse.Namespace) -> dict:
    profile, client = args.one
    folder = Path(args.folder)
    if client == "eaglewatch":
        out = asyncio.run(run_engine(profile, folder, args.seed))
    else:
        workers = MAX if client == "naive64" else PROFILES[profile][2]
        out = asyncio.run(run_naive(profile, folder, args.seed, workers))
    return {"profile": profile, "client": client, **out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200, help="conversations (default 200)")
    parser.add_argument(
        "--turns",
        type=int,
        default=4,
        help="assistant turns per conversation on average (each has 1 to 2T-1; default 4)",
    )
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reps", type=int, default=1, help="repetitions of the three clients (rotating order)")
    parser.add_argument("--quick", action="store_true", help="a small run: 40 conversations of 3 turns on average")
    parser.add_argument("--one", nargs=2, metavar=("PROFILE", "CLIENT"), help=argparse.SUPPRESS)
    parser.add_argument("--serve", metavar="PROFILE", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, Path(args.folder), args.seed))
        return 0
    if args.one:
        print(json.dumps(one(args)))
        return 0
    if args.quick:
        args.n, args.turns = 40, 3
    results = []
    with tempfile.TemporaryDirectory(prefix="eaglewatch-cbench-") as tmp:
        folder = Path(tmp)
        shape = build(folder, args.n, args.turns, args.seed)
        for profile in args.profiles:
            reps: list[dict] = []
            for r in range(args.reps):
                order = CLIENTS[r % len(CLIENTS) :] + CLIENTS[: r % len(CLIENTS)]
                rep = {}
                for c in order:
                    out = subprocess.run(
                        [sys.executable, __file__, "--one", profile, c, "--folder", tmp, "--seed", str(args.seed)],
                        stdout=subprocess.PIPE,
                        text=True,
                        check=True,
                    )
                    rep[c] = json.loads(out.stdout.strip().splitlines()[-1])
                    rep[c].pop("trace", None)
                reps.append(rep)
            o = oracle(shape, PROFILES[profile][2], args.seed)
            ratios = {c: sorted(rep["eaglewatch"]["wall_s"] / rep[c]["wall_s"] for rep in reps) for c in CLIENTS[1:]}
            to_oracle = sorted(rep["eaglewatch"]["wall_s"] / o["wall_s"] for rep in reps)
            row = {
                "profile": profile,
                "oracle": o,
                "reps": reps,
                "to_oracle": to_oracle,
                "ratios": ratios,
                "settings": {
                    "n": args.n,
                    "turns": args.turns,
                    "seed": args.seed,
                    "median_ms": MEDIAN_MS,
                    "p95_ms": P95_MS,
                    "reps": args.reps,
                    "time": time.time(),
                },
            }
            results.append(row)
            for rep in reps:
                e = rep["eaglewatch"]
                print(
                    f"{profile}: eaglewatch {e['wall_s']:.1f}s ({e['turns_done']}/{o['requests']} turns, "
                    f"{e['429']} 429s, busy {e['busy_share_head']:.0%}, cached {e['cached_share']:.0%} of prompt "
                    f"tokens) oracle {o['wall_s']:.1f}s (work {o['work_s']:.0f} slot-s, critical path "
                    f"{o['critical_path_s']:.1f}s) "
                    + " ".join(
                        f"{c} {rep[c]['wall_s']:.1f}s ({rep[c]['429']} 429s, busy {rep[c]['busy_share_head']:.0%})"
                        for c in CLIENTS[1:]
                    )
                    + f" -> {e['wall_s'] / o['wall_s']:.2f}x oracle, "
                    + ", ".join(f"{e['wall_s'] / rep[c]['wall_s']:.2f}x {c}" for c in CLIENTS[1:]),
                    flush=True,
                )
    out = ROOT / "bench" / "results" / "conversations.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"results": results}, indent=1))

    def span(values: list[float]) -> str:
        mid = statistics.median(values)
        return f"{mid:.2f}x" + (f" ({values[0]:.2f}-{values[-1]:.2f}x)" if len(values) > 1 else "")

    print(
        "\n| profile | eaglewatch | oracle | naive 64 | naive at capacity | eaglewatch / oracle | "
        "eaglewatch / naive 64 | eaglewatch / naive at capacity | 429s (eaglewatch / naive 64) | provider busy "
        "(eaglewatch / naive at capacity) | cached prompt share |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in results:
        o = row["oracle"]
        walls = {c: statistics.median(rep[c]["wall_s"] for rep in row["reps"]) for c in CLIENTS}
        last = row["reps"][-1]
        print(
            f"| {PROFILES[row['profile']][0]} | {walls['eaglewatch']:.1f} s | {o['wall_s']:.1f} s | "
            f"{walls['naive64']:.1f} s | {walls['naive@cap']:.1f} s | {span(row['to_oracle'])} | "
            f"{span(row['ratios']['naive64'])} | {span(row['ratios']['naive@cap'])} | "
            f"{last['eaglewatch']['429']} / {last['naive64']['429']} | "
            f"{last['eaglewatch']['busy_share_head']:.0%} / {last['naive@cap']['busy_share_head']:.0%} | "
            f"{last['eaglewatch']['cached_share']:.0%} / {last['naive64']['cached_share']:.0%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
