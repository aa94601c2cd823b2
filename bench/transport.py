"""Which HTTP transport should ChatClient use? Completed requests/s and client CPU per request.

Runs a minimal aiohttp server (fixed ~3 KB chat-completion body, or the same text as an SSE stream) in
its own process pinned to core 0, and each client pinned to core 1, then sends N requests at each
concurrency through:
  - ChatClient on httpx's default transport (one pool),
  - ChatClient on the httpx-aiohttp transport,
  - ChatClient on several smaller httpx pools (round-robin),
  - a bare aiohttp client (post + read + json.loads / SSE split) — the practical ceiling, the baseline.
Ratios are against bare aiohttp measured in the same run. Client CPU per request is
time.process_time() of the client process (the server runs elsewhere).

    python bench/transport.py [--requests 2000] [--concurrency 64 256] [--stream both|no|yes]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONTENT = ("The quick brown fox jumps over the lazy dog. " * 56)[:2500]
REASONING = "Let me think about the answer step by step. " * 6


def _bodies() -> tuple[bytes, bytes]:
    usage = {
        "prompt_tokens": 120,
        "completion_tokens": 600,
        "total_tokens": 720,
        "cost": 0.0015,
        "completion_tokens_details": {"reasoning_tokens": 60},
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    plain = {
        "id": "gen-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "provider": "bench",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": CONTENT, "reasoning": REASONING},
            }
        ],
        "usage": usage,
    }
    head = {"id": "gen-bench", "object": "chat.completion.chunk", "created": 0, "model": "m", "provider": "bench"}
    events = []
    for k in range(0, len(REASONING), 24):
        events.append(dict(head, choices=[{"index": 0, "delta": {"reasoning": REASONING[k : k + 24]}}]))
    for k in range(0, len(CONTENT), 24):
        events.append(dict(head, choices=[{"index": 0, "delta": {"content": CONTENT[k : k + 24]}}]))
    events.append(dict(head, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    events.append(dict(head, choices=[], usage=usage))
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return json.dumps(plain).encode(), sse


def _pin(core: int) -> bool:
    if hasattr(os, "sched_setaffinity") and core < os.cpu_count():
        os.sched_setaffinity(0, {core})
        return True
    return False


def _serve_simulator(port_out, cpu_out, stop) -> None:  # runs in the server process
    _pin(0)
    from app.simulator import SimulatorOptions, SimulatorServer

    async def main() -> None:
        reference = ROOT / "sample_data" / "reference.jsonl"
        async with SimulatorServer(
            SimulatorOptions(),
            tokenizer_dir=ROOT / "sample_data" / "tokenizer",
            reference=reference if reference.exists() else None,
        ) as sim:
            port_out.put(sim.port)
            while not stop.is_set():
                await asyncio.sleep(0.05)
                cpu_out.value = time.process_time()

    asyncio.run(main())


def _serve(port_out, cpu_out, stop) -> None:  # runs in the server process
    _pin(0)
    from aiohttp import web

    plain, sse = _bodies()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream":true' in body:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(sse)
            await response.write_eof()
            return response
        return web.Response(body=plain, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        port_out.put(site._server.sockets[0].getsockname()[1])
        while not stop.is_set():
            await asyncio.sleep(0.05)
            cpu_out.value = time.process_time()
        await runner.cleanup()

    asyncio.run(main())


class _Endpoint:
    def __init__(self, url: str, concurrency: int) -> None:
        self.name, self.base_url, self.timeout_s, self.max_concurrency, self.extra = "bench", url, 60.0, concurrency, {}


class _Generation:
    def __init__(self, stream: bool) -> None:
        self.max_tokens, self.temperature, self.top_p, self.stream = 1024, 0.6, None, stream
        self.logprobs, self.top_logprobs = False, 0


MESSAGES = [{"role": "user", "content": "Tell me about foxes and dogs, at length please. " * 4}]


async def _drive(n: int, concurrency: int, one) -> None:
    queue = iter(range(n))

    async def worker() -> None:
        for _ in queue:
            await one()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _run_chatclient(url: str, transport: str, n: int, concurrency: int, stream: bool) -> None:
    from app.providers.client import ChatClient

    client = ChatClient(_Endpoint(url, concurrency), _Generation(stream), "bench-key", transport=transport)
    async with client:
        await client.complete(MESSAGES, model="m")  # warm one connection
        await _drive(n, concurrency, lambda: client.complete(MESSAGES, model="m"))


async def _run_bare_aiohttp(url: str, n: int, concurrency: int, stream: bool) -> None:
    import aiohttp

    payload = (
        json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": 1024, "stream": stream})
        .replace(", ", ",")
        .replace(": ", ":")
        .encode()
    )
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench-key"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def one() -> None:
            async with session.post(url + "/chat/completions", data=payload, headers=headers) as response:
                if stream:
                    async for line in response.content:
                        if line.startswith(b"data: ") and line[6:12] != b"[DONE]":
                            json.loads(line[6:])
                else:
                    json.loads(await response.read())

        await one()
        await _drive(n, concurrency, one)


def _client_run(kind: str, url: str, n: int, concurrency: int, stream: bool, out) -> None:  # client process
    _pin(1)
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    if kind == "bare aiohttp":
        asyncio.run(_run_bare_aiohttp(url, n, concurrency, stream))
    else:
        asyncio.run(_run_chatclient(url, kind.split(" ", 1)[1], n, concurrency, stream))
    out.put((time.perf_counter() - started_wall, time.process_time() - started_cpu))


CLIENTS = ["bare aiohttp", "ChatClient aiohttp", "ChatClient httpx", "ChatClient pools:4", "ChatClient pools:16"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--stream", choices=["no", "yes", "both"], default="both")
    parser.add_argument(
        "--server",
        choices=["minimal", "simulator"],
        default="minimal",
        help="minimal: fixed 3 KB bodies (default); simulator: the eaglewatch simulator, unpaced",
    )
    parser.add_argument("--clients", nargs="+", default=CLIENTS, help=f"subset of: {', '.join(CLIENTS)}")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    port_q, cpu, stop = ctx.Queue(), ctx.Value("d", 0.0), ctx.Event()
    target = _serve if args.server == "minimal" else _serve_simulator
    server = ctx.Process(target=target, args=(port_q, cpu, stop), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port_q.get(timeout=30)}/v1"
    modes = {"no": [False], "yes": [True], "both": [False, True]}[args.stream]
    rows = []
    try:
        for stream in modes:
            for concurrency in args.concurrency:
                for kind in args.clients:
                    out = ctx.Queue()
                    server_cpu0 = cpu.value
                    proc = ctx.Process(target=_client_run, args=(kind, url, args.requests, concurrency, stream, out))
                    proc.start()
                    wall, client_cpu = out.get(timeout=600)
                    proc.join()
                    time.sleep(0.1)
                    n = args.requests + 1
                    rows.append(
                        {
                            "client": kind,
                            "stream": stream,
                            "concurrency": concurrency,
                            "req_s": args.requests / wall,
                            "client_cpu_ms": 1000 * client_cpu / n,
                            "server_cpu_ms": 1000 * (cpu.value - server_cpu0) / n,
                            "server": args.server,
                        }
                    )
                    print(
                        f"  {kind:22s} stream={stream!s:5s} c={concurrency:<4d} {rows[-1]['req_s']:8.0f} req/s "
                        f"{rows[-1]['client_cpu_ms']:6.2f} ms CPU/req",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        stop.set()
        server.join(timeout=5)

    base = {(r["stream"], r["concurrency"]): r for r in rows if r["client"] == "bare aiohttp"}
    for r in rows:
        b = base[(r["stream"], r["concurrency"])]
        r["ratio_vs_bare_aiohttp"] = r["req_s"] / b["req_s"]
        # CPU per request is steadier than wall rates on a shared machine: bare CPU / this CPU
        r["cpu_ratio_vs_bare_aiohttp"] = b["client_cpu_ms"] / r["client_cpu_ms"]
    pinned = hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2
    print(
        f"\nTransport benchmark ({args.server} server): {args.requests} requests of ~3 KB per cell, loopback, "
        f"server pinned to core 0 and client to core 1: {pinned} "
        f"({os.cpu_count()} CPUs, Python {platform.python_version()})"
    )
    print(
        "| client | stream | concurrency | req/s | x bare aiohttp | client CPU ms/req | CPU efficiency x bare "
        "| server CPU ms/req |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['client']} | {'yes' if r['stream'] else 'no'} | {r['concurrency']} | {r['req_s']:.0f} | "
            f"{r['ratio_vs_bare_aiohttp']:.2f} | {r['client_cpu_ms']:.2f} | {r['cpu_ratio_vs_bare_aiohttp']:.2f} | "
            f"{r['server_cpu_ms']:.2f} |"
        )
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"requests": args.requests, "pinned": pinned, "server": args.server, "rows": rows}
    name = "transport" if args.server == "minimal" else "transport-simulator"
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2))
    best = max(
        (r for r in rows if r["client"] != "bare aiohttp" and not r["stream"]),
        key=lambda r: r["ratio_vs_bare_aiohttp"],
        default=None,
    )
    if best:
        print(
            f"\ndocs/performance.md row: | transport | {best['client']} | {best['req_s']:.0f} req/s non-streaming at "
            f"c={best['concurrency']} | {best['ratio_vs_bare_aiohttp']:.2f}x bare aiohttp | "
            f"{best['client_cpu_ms']:.2f} ms client CPU/req |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
