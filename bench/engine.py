"""Engine throughput against the zero-latency simulator, side by side with request-only baselines.

    python bench/engine.py [--n 2000] [--concurrency 64 256] [--rss-samples 20000] [--skip-curator] [--reps 1]
    python bench/engine.py --ratios      # the two client-path ratios only (about 1.5 min): c=64, both modes,
                                         # aiohttp / engine / engine+tokens interleaved 3 times, --n 1000
    python bench/engine.py --ratios --reconstruct-workers 0   # the whole path with reconstructions in threads (as
    before)

One run measures, for each concurrency and for non-streaming and streaming: completed responses/s and
client CPU per request of the engine (request + parse + store, one transaction per result) and of three
clients that only do the requests: a bare aiohttp client (the practical ceiling of a Python client), the
official `openai` SDK (asyncio.gather) and Curator (`bespokelabs-curator`, non-streaming only, its rate
limiter raised; it runs from its own venv, `CURATOR_PYTHON`, default /tmp/curator-venv/bin/python, since
its pins clash with ours). The server runs in its own process pinned to core 0, each client in a fresh
process pinned to core 1; the server's own ceiling is its CPU time per request. Peak RSS of an engine run
over `--rss-samples` samples is measured too. With `--reps R` each (mode, concurrency) runs its clients R
times in rotating order (aiohttp, engine, engine+tokens, then engine, engine+tokens, aiohttp, ...), so a
load swing on a shared machine hits every client alike; the ratios are the medians of the per-repetition
ratios (engine / aiohttp, whole path / engine), printed with their range. Writes bench/results/engine.json
and prints markdown. The whole path (engine+tokens) reconstructs through the engine's own path (verify's
EndpointReconstructor in the Run's ReconstructionPool, `--reconstruct-workers` = `[run] reconstruct_workers`); its
client CPU is the
engine's process plus its reconstruction worker processes, whose one-off start is reported apart and not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "sample_data"
MODEL = "moonshotai/kimi-k2.5"
CURATOR_PYTHON = os.environ.get("CURATOR_PYTHON", "/tmp/curator-venv/bin/python")


def _pin(core: int) -> None:
    try:
        if os.cpu_count() and os.cpu_count() > core:
            os.sched_setaffinity(0, {core})
    except (AttributeError, OSError):
        pass


def prompts(n: int) -> list[list[dict]]:
    """n distinct prompts of about 3 KB each (request body size)."""
    return list(iter_prompts(n))


def iter_prompts(n: int):
    """The same prompts one at a time (the engine ingests from this, so the bench holds none in memory)."""
    base = [json.loads(line)["messages"] for line in (SAMPLE / "prompts.openai.jsonl").read_text().splitlines()]
    # plain system/user/assistant text turns only, so every client (Curator included) accepts them
    base = [
        m
        for m in base
        if all(
            t.get("role") in ("system", "user", "assistant")
            and isinstance(t.get("content"), str)
            and not t.get("tool_calls")
            for t in m
        )
        and m[-1]["role"] == "user"
    ]
    pad = ("lorem ipsum dolor sit amet " * 120)[:2800]
    for i in range(n):
        m = base[i % len(base)]
        yield [*m[:-1], {"role": "user", "content": f"{i} {pad} {m[-1]['content']}"}]


# ---- server -----------------------------------------------------------------------------------------


async def _serve() -> None:
    from app.simulator.options import SimulatorOptions
    from app.simulator.server import SimulatorServer

    sim = SimulatorServer(
        SimulatorOptions(), tokenizer_dir=SAMPLE / "tokenizer", reference=SAMPLE / "reference.jsonl", model=MODEL
    )
    await sim.start()
    print(sim.base_url, flush=True)
    while True:
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        if line.strip() == "stats":
            t = os.times()
            print(json.dumps({"cpu_s": t.user + t.system, "served": sim._served}), flush=True)


# ---- clients (each in its own process) ----------------------------------------------------------------


async def _bare_aiohttp(url: str, msgs: list, conc: int, stream: bool) -> int:
    import aiohttp

    sem = asyncio.Semaphore(conc)
    ok = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as session:

        async def one(m):
            nonlocal ok
            body = {"model": MODEL, "messages": m, "max_tokens": 4096, "stream": stream}
            async with sem, session.post(url + "/chat/completions", json=body) as resp:
                if not stream:
                    data = json.loads(await resp.read())
                    ok += bool(data["choices"][0]["message"])
                    return
                async for line in resp.content:
                    if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                        json.loads(line[6:])
                ok += 1

        await asyncio.gather(*(one(m) for m in msgs))
    return ok


async def _openai_sdk(url: str, msgs: list, conc: int, stream: bool) -> int:
    import httpx
    from openai import AsyncOpenAI

    client = AsyncOpenAI(
        base_url=url,
        api_key="bench",
        max_retries=0,
        http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=conc), timeout=60),
    )
    sem = asyncio.Semaphore(conc)
    ok = 0

    async def one(m):
        nonlocal ok
        async with sem:
            if not stream:
                r = await client.chat.completions.create(model=MODEL, messages=m, max_tokens=4096)
                ok += bool(r.choices)
                return
            s = await client.chat.completions.create(model=MODEL, messages=m, max_tokens=4096, stream=True)
            async for _ in s:
                pass
            ok += 1

    await asyncio.gather(*(one(m) for m in msgs))
    await client.close()
    return ok


async def _engine(
    url: str, msgs, conc: int, stream: bool, db_dir: str, reconstruct: bool = False, reconstruct_workers: str = "auto"
) -> int:
    import app.providers.client  # noqa: F401  (imported before timing, like the baselines' libraries)
    from app.config import parse_config
    from app.engine.fidelity.pool import build_reconstructor
    from app.engine.run import Run
    from app.store.run_store import RunStore
    from app.store.store_records import SampleInput

    cfg = parse_config(
        {
            "run": {
                "name": "bench",
                "database": str(Path(db_dir) / "bench.db"),
                "reconstruct_workers": reconstruct_workers
                if reconstruct_workers == "auto"
                else int(reconstruct_workers),
            },
            "data": {"datasets": [{"path": str(SAMPLE / "prompts.openai.jsonl")}]},
            "model": {"name": MODEL, "tokenizer": str(SAMPLE / "tokenizer")},
            "endpoints": [{"name": "sim", "base_url": url, "max_concurrency": conc, "timeout_s": 60}],
            "generation": {"max_tokens": 4096, "stream": stream},
            "limits": {"concurrency_initial": conc, "concurrency_min": conc, "concurrency_max": conc},
        }
    )
    store = await RunStore.open(cfg.run.database)
    run_id = await store.ensure_run("bench", cfg.redacted())
    await store.ingest(run_id, (SampleInput(f"s{i}", "bench", m) for i, m in enumerate(msgs)))
    global _T0, _C0, _POOL
    # the engine's own reconstruction path: open_endpoint_reconstructor wraps this in verify's EndpointReconstructor and
    # the Run's
    # ReconstructionPool runs it (threads or worker processes, [run] reconstruct_workers), as in a real run
    run = Run(cfg, store, reconstructor=build_reconstructor(cfg) if reconstruct else None)
    _T0, _C0 = time.perf_counter(), time.process_time()  # ingest is not timed
    await run.start()
    _POOL = run.reconstruction_pool
    if _POOL is not None and _POOL.workers:
        # the workers' start (once per run: interpreter, imports, tokenizer) is reported apart, like ingest
        _T0 += _POOL.start_s
    await run.wait()
    done = run.snapshot().done
    await run.close()
    await store.close()
    return done


_T0 = _C0 = 0.0
_POOL = None
# the Run's app.engine.fidelity.pool.ReconstructionPool: reconstruction CPU (threads or workers), workers' CPU


def client_main(args: argparse.Namespace) -> None:
    _pin(1)
    msgs = iter_prompts(args.n) if args.client.startswith("engine") else prompts(args.n)
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    global _T0, _C0
    _T0, _C0 = time.perf_counter(), time.process_time()
    if args.client == "aiohttp":
        ok = asyncio.run(_bare_aiohttp(args.url, msgs, args.conc, args.stream))
    elif args.client == "openai":
        ok = asyncio.run(_openai_sdk(args.url, msgs, args.conc, args.stream))
    else:
        with tempfile.TemporaryDirectory() as d:
            ok = asyncio.run(
                _engine(
                    args.url, msgs, args.conc, args.stream, d, args.client == "engine+tokens", args.reconstruct_workers
                )
            )
    wall, cpu = time.perf_counter() - _T0, time.process_time() - _C0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    p = _POOL
    # cpu_s: the engine's process plus its reconstruction workers (after their start), so CPU per request is the
    # whole path's wherever it ran; tokens_cpu_s: the reconstructions themselves, in threads or in the workers
    print(
        json.dumps(
            {
                "ok": ok,
                "wall_s": wall,
                "cpu_s": cpu + (p.worker_cpu_s if p else 0.0),
                "parent_cpu_s": cpu,
                "rss_mb": rss_mb,
                "rss_start_mb": rss_start,
                "tokens_cpu_s": p.cpu_s if p else None,
                "reconstruct_workers": p.workers if p else None,
                "worker_start_s": p.start_s if p else None,
                "worker_start_cpu_s": p.start_cpu_s if p else None,
                "reconstruct_broken": p.broken if p else None,
            }
        )
    )


CURATOR_SCRIPT = r"""
import json, os, sys, time
os.environ["TELEMETRY_ENABLED"] = "false"
os.environ["CURATOR_DISABLE_CACHE"] = "1"
os.sched_setaffinity(0, {1}) if os.cpu_count() > 1 else None
url, n, conc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
msgs = json.loads(sys.stdin.read())
from bespokelabs import curator
from bespokelabs.curator.request_processor.online import openai_online_request_processor as oorp
class _Chars:  # tiktoken's cl100k file cannot be downloaded offline; Curator only uses it to estimate tokens
    def encode(self, text, **kw): return [0] * (len(text) // 4 + 1)
oorp.OpenAIOnlineRequestProcessor.get_token_encoding = lambda self: _Chars()
class Gen(curator.LLM):
    def prompt(self, row): return row["messages"]
    def parse(self, row, response): return {"r": response}
llm = Gen(model_name="moonshotai/kimi-k2.5", backend="openai", generation_params={"max_tokens": 4096},
          backend_params={"base_url": url, "api_key": "bench", "max_requests_per_minute": 10**9,
                          "max_tokens_per_minute": 10**12, "max_concurrent_requests": conc,
                          "require_all_responses": False, "max_retries": 0})
t0, c0 = time.perf_counter(), time.process_time()
out = llm([{"messages": m} for m in msgs])
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
try:
    ok = len(out.dataset)
except Exception:
    ok = n
print(json.dumps({"ok": ok, "wall_s": wall, "cpu_s": cpu}))
"""


def run_curator(url: str, n: int, conc: int) -> dict | str:
    if not Path(CURATOR_PYTHON).exists():
        return (
            f"Curator skipped: no interpreter at {CURATOR_PYTHON} (pip install bespokelabs-curator into a venv there)"
        )
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "HOME": home, "CURATOR_CACHE_DIR": home}
        try:
            p = subprocess.run(
                [CURATOR_PYTHON, "-c", CURATOR_SCRIPT, url, str(n), str(conc)],
                input=json.dumps(prompts(n)),
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
            )
        except subprocess.TimeoutExpired:
            return "Curator skipped: it did not finish within 600 s"
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return "Curator skipped: it failed offline: " + (p.stderr.strip().splitlines() or ["?"])[-1][:200]
    return json.loads(lines[-1])


def run_client(kind: str, url: str, n: int, conc: int, stream: bool, reconstruct_workers: str = "auto") -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--as-client",
        kind,
        "--url",
        url,
        "--n",
        str(n),
        "--conc",
        str(conc),
        "--reconstruct-workers",
        reconstruct_workers,
    ]
    if stream:
        cmd.append("--stream")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"{kind} client failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="requests per measurement")
    ap.add_argument("--n-sdk", type=int, default=500, help="requests per measurement of the (slow) openai SDK")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rss-samples", type=int, default=20000, help="samples in the peak-RSS run (0: skip)")
    ap.add_argument("--skip-curator", action="store_true")
    ap.add_argument("--reps", type=int, default=1, help="interleaved repetitions per (mode, concurrency)")
    ap.add_argument(
        "--ratios",
        action="store_true",
        help="only the client-path ratios: --clients aiohttp engine engine+tokens --concurrency 64 "
        "--reps 3 --n 1000 --rss-samples 0 --skip-curator",
    )
    ap.add_argument(
        "--clients",
        nargs="+",
        default=["aiohttp", "engine", "engine+tokens", "openai"],
        help="engine+tokens is the whole path: request, parse, reconstruct (sample tokenizer), store",
    )
    ap.add_argument(
        "--reconstruct-workers",
        default="auto",
        help="[run] reconstruct_workers of the engine+tokens client: auto, 0 (threads) or N processes",
    )
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--as-client", dest="client", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--conc", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ratios:
        args.clients, args.concurrency, args.skip_curator = ["aiohttp", "engine", "engine+tokens"], [64], True
        args.reps, args.rss_samples = max(args.reps, 3), 0
        if "--n" not in sys.argv:
            args.n = 1000
    if args.serve:
        _pin(0)
        asyncio.run(_serve())
        return
    if args.client:
        client_main(args)
        return

    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    url = server.stdout.readline().strip()

    def server_stats() -> dict:
        server.stdin.write("stats\n")
        server.stdin.flush()
        return json.loads(server.stdout.readline())

    results: list[dict] = []
    notes: list[str] = []
    try:
        run_client("aiohttp", url, 200, 64, False)  # warm up the server's render cache
        for stream in (False, True):
            for conc in args.concurrency:
                kinds = list(args.clients)
                if not stream and not args.skip_curator:
                    kinds.append("curator")
                order = []
                for rep in range(max(1, args.reps)):  # rotate the order so no client always runs first
                    order += [(rep, kinds[(i + rep) % len(kinds)]) for i in range(len(kinds))]
                for rep, kind in order:
                    before = server_stats()
                    if kind == "curator":
                        r = run_curator(url, args.n, conc)
                        if isinstance(r, str):
                            notes.append(r)
                            continue
                    else:
                        r = run_client(
                            kind,
                            url,
                            args.n_sdk if kind == "openai" else args.n,
                            conc,
                            stream,
                            args.reconstruct_workers,
                        )
                    after = server_stats()
                    served = max(1, after["served"] - before["served"])
                    row = {
                        "client": kind,
                        "stream": stream,
                        "concurrency": conc,
                        "rep": rep,
                        "ok": r["ok"],
                        "req_s": r["ok"] / r["wall_s"],
                        "client_cpu_ms": 1000 * r["cpu_s"] / max(1, r["ok"]),
                        "server_cpu_ms": 1000 * (after["cpu_s"] - before["cpu_s"]) / served,
                        "rss_mb": r.get("rss_mb"),
                        "parent_cpu_ms": 1000 * r["parent_cpu_s"] / max(1, r["ok"]) if "parent_cpu_s" in r else None,
                        "reconstruct_workers": r.get("reconstruct_workers"),
                        "worker_start_s": r.get("worker_start_s"),
                        "worker_start_cpu_s": r.get("worker_start_cpu_s"),
                        "reconstruct_broken": r.get("reconstruct_broken"),
                        "tokens_cpu_share": (r["tokens_cpu_s"] / r["cpu_s"]) if r.get("tokens_cpu_s") else None,
                    }
                    row["server_ceiling_req_s"] = 1000 / row["server_cpu_ms"] if row["server_cpu_ms"] else None
                    results.append(row)
                    print(
                        f"{kind:>8} stream={stream!s:5} c={conc:<4} {row['req_s']:8.0f} req/s "
                        f"client {row['client_cpu_ms']:.2f} ms/req  server ceiling "
                        f"{row['server_ceiling_req_s'] or 0:.0f} req/s",
                        file=sys.stderr,
                    )
        rss = None
        if args.rss_samples:
            r = run_client("engine", url, args.rss_samples, 256, False)
            rss = {"samples": args.rss_samples, "peak_rss_mb": r["rss_mb"], "req_s": r["ok"] / r["wall_s"]}
            small = run_client("engine", url, max(1000, args.rss_samples // 10), 256, False)
            rss["small_samples"] = max(1000, args.rss_samples // 10)
            rss["small_peak_rss_mb"] = small["rss_mb"]
    finally:
        server.stdin.close()
        server.terminate()
        server.wait()

    def rows_of(kind, stream, conc):
        return [r for r in results if (r["client"], r["stream"], r["concurrency"]) == (kind, stream, conc)]

    def rate(kind, stream, conc):
        rates = sorted(r["req_s"] for r in rows_of(kind, stream, conc))
        return rates[len(rates) // 2] if rates else None

    def ratios(kind, base, stream, conc):
        """Per-repetition ratios kind / base (same repetition: the same moment's load), sorted."""
        by_rep = {r["rep"]: r["req_s"] for r in rows_of(base, stream, conc)}
        return sorted(r["req_s"] / by_rep[r["rep"]] for r in rows_of(kind, stream, conc) if by_rep.get(r["rep"]))

    def ratio_text(kind, base, stream, conc):
        xs = ratios(kind, base, stream, conc)
        if not xs:
            return "-"
        med = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
        return f"{med:.2f}x" + (f" ({xs[0]:.2f}-{xs[-1]:.2f}, {len(xs)} reps)" if len(xs) > 1 else "")

    lines = [
        "| mode | concurrency | engine req/s | bare aiohttp | engine / aiohttp | openai SDK | Curator | engine / "
        "Curator "
        "| engine client CPU ms/req | server ceiling req/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for stream in (False, True):
        for conc in args.concurrency:
            e, a, o, c = (rate(k, stream, conc) for k in ("engine", "aiohttp", "openai", "curator"))
            erows = sorted(rows_of("engine", stream, conc), key=lambda r: r["req_s"])
            erow = erows[len(erows) // 2] if erows else None
            fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
            ratio = lambda x, y: "-" if x is None or not y else f"{x / y:.2f}x"  # noqa: E731
            cpu = "-" if erow is None else f"{erow['client_cpu_ms']:.2f}"
            ceiling = "-" if erow is None or not erow["server_ceiling_req_s"] else f"{erow['server_ceiling_req_s']:.0f}"
            mode = "stream" if stream else "non-stream"
            lines.append(
                f"| {mode} | {conc} | {fmt(e)} | {fmt(a)} | {ratio_text('engine', 'aiohttp', stream, conc)} | "
                f"{fmt(o)} | {fmt(c)} | "
                f"{ratio(e, c)} | {cpu} | {ceiling} |"
            )
    table = "\n".join(lines)
    whole = sorted({(r["stream"], r["concurrency"]) for r in results if r["client"] == "engine+tokens"})
    if whole:
        table += "\n\nWhole path (request + parse + reconstruction with the sample tokenizer + store):"
        for stream, conc in whole:
            shares = sorted(
                r["tokens_cpu_share"]
                for r in rows_of("engine+tokens", stream, conc)
                if r["tokens_cpu_share"] is not None
            )
            table += (
                f"\n- {'stream' if stream else 'non-stream'} c={conc}: {rate('engine+tokens', stream, conc):.0f} req/s"
            )
            if rows_of("engine", stream, conc):
                table += f" ({ratio_text('engine+tokens', 'engine', stream, conc)} the engine without reconstruction)"
            table += f", reconstruction {100 * shares[len(shares) // 2]:.0f}% of client CPU" if shares else ""
            wrows = sorted(rows_of("engine+tokens", stream, conc), key=lambda r: r["req_s"])
            w = wrows[len(wrows) // 2]
            table += f", client CPU {w['client_cpu_ms']:.2f} ms/req"
            if w.get("reconstruct_workers"):
                table += (
                    f" (engine process {w['parent_cpu_ms']:.2f}, the rest in {w['reconstruct_workers']} reconstruct "
                    f"worker process(es), started in {w['worker_start_s']:.2f} s / "
                    f"{w['worker_start_cpu_s']:.2f} s CPU once per run, not timed)"
                )
            elif w.get("reconstruct_workers") == 0:
                table += " (reconstructions in threads of the engine's process)"
            broken = [r["reconstruct_broken"] for r in wrows if r.get("reconstruct_broken")]
            table += f"; a reconstruction worker died: {broken[0]}" if broken else ""
    if rss:
        table += (
            f"\n\nPeak RSS of an engine run (concurrency 256, non-streaming): {rss['peak_rss_mb']:.0f} MB over "
            f"{rss['samples']:,} samples, {rss['small_peak_rss_mb']:.0f} MB over {rss['small_samples']:,} "
            "(the peak is reached while ingesting, in 5,000-sample chunks; the engine's own heap is bounded)"
        )
    for note in dict.fromkeys(notes):
        table += f"\n\n{note}"
    print(table)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine.json").write_text(
        json.dumps({"rows": results, "rss": rss, "notes": notes, "cpus": os.cpu_count(), "n": args.n}, indent=2)
    )


if __name__ == "__main__":
    main()
