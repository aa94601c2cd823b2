"""`eaglewatch simulate`: run the OpenAI-compatible provider simulator on its own until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

EXAMPLE = (
    "eaglewatch simulate sample_data/demo.toml --port 8765     # the config's simulator endpoint\n"
    "eaglewatch simulate --port 8765 --reference sample_data/reference.jsonl --tokenizer sample_data/tokenizer \\\n"
    "    --faults 429=0.05,500=0.02,keepalive=0.1 --quirks strip_whitespace --latency-median-ms 200\n"
    "eaglewatch simulate --port 8000 --personality vllm      # answer as vLLM: token_ids, prompt_token_ids\n"
    "eaglewatch simulate --port 8765 --concurrency-cap 24 --cap-changes 30:16 --rpm 3000   # a provider with capacity"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        type=Path,
        metavar="CONFIG",
        help="run config: serve its first simulator endpoint (its tokenizer, reference, pricing); "
        "the options below override it",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port to listen on; 0 picks a free one (default 8765)")
    parser.add_argument("--reference", type=Path, help="reference.jsonl with output_ids (default: built-in samples)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer directory used to turn ids into text (default: the config's, else sample_data/tokenizer)",
    )
    parser.add_argument("--faults", default=None, help="fault rates, e.g. 429=0.05,500=0.02,hang=0.01,keepalive=0.1")
    parser.add_argument("--quirks", default=None, help="server-side text steps, e.g. strip_whitespace,think_spaces")
    parser.add_argument("--latency-median-ms", type=float, default=None, help="median added latency (lognormal)")
    parser.add_argument("--latency-p95-ms", type=float, default=None, help="p95 added latency (default: = median)")
    parser.add_argument("--tokens-per-s", type=float, default=None, help="generation pacing; 0 = unpaced")
    parser.add_argument("--no-logprobs", action="store_true", help="answer logprobs: null even when asked")
    parser.add_argument("--seed", type=int, default=None, help="seed for faults and latency (default 0)")
    parser.add_argument("--model", default=None, help="model name in /v1/models (default moonshotai/kimi-k2.5)")
    parser.add_argument(
        "--api-key-env",
        default=None,
        help="environment variable holding the key clients must send (default: accept any)",
    )
    parser.add_argument("--cpu", type=int, default=None, help="pin the server process to this CPU core")
    parser.add_argument(
        "--personality",
        default=None,
        help="answer as this real server: openrouter (default), sglang, vllm, transformers-serve",
    )
    # capacity (app/simulator/capacity.py)
    parser.add_argument("--concurrency-cap", type=int, default=None, help="most requests at once; more get 429")
    parser.add_argument("--cap-changes", default=None, help="cap schedule SECONDS:CAP,..., e.g. 30:16")
    parser.add_argument("--rpm", type=float, default=None, help="requests/min quota (429 when exceeded)")
    parser.add_argument("--tpm", type=float, default=None, help="tokens/min quota (429 when exceeded)")
    parser.add_argument("--batch-slots", type=int, default=None, help="queueing server: slots; the rest wait")


def run(args: argparse.Namespace) -> int:
    from app.errors import InputError
    from app.simulator.capacity import parse_cap_changes
    from app.simulator.options import SimulatorOptions, check_options, parse_faults, parse_quirks
    from app.simulator.server import DEFAULT_MODEL, DEFAULT_PRICING, SimulatorServer

    base = SimulatorOptions()
    tokenizer, model, pricing, profile = Path("sample_data/tokenizer"), DEFAULT_MODEL, DEFAULT_PRICING, None
    if args.config is not None:
        from app.config import load_config

        config = load_config(args.config)
        endpoint = next((e for e in config.endpoints if e.simulator is not None), None)
        if endpoint is not None:
            sim = endpoint.simulator
            assert sim is not None  # the endpoint was picked for having one
            base = SimulatorOptions(
                reference=sim.reference or config.data.reference,
                latency_median_ms=sim.latency_median_ms,
                latency_p95_ms=sim.latency_p95_ms,
                tokens_per_s=sim.tokens_per_s,
                faults=dict(sim.faults),
                quirks=list(sim.quirks),
                logprobs=sim.logprobs,
                seed=sim.seed,
                personality=sim.personality,
                concurrency_cap=sim.concurrency_cap,
                cap_changes=list(sim.cap_changes),
                requests_per_min=sim.requests_per_min,
                tokens_per_min=sim.tokens_per_min,
                batch_slots=sim.batch_slots,
                extra_references=list(sim.extra_references),
                prompt_cache=sim.prompt_cache,
            )
        else:
            base = SimulatorOptions(reference=config.data.reference)
        tokenizer, model, profile = config.model.tokenizer, config.model.name, config.model.profile
        from app.providers.pricing import resolve_pricing

        pricing = resolve_pricing(model, config.pricing)[0] or DEFAULT_PRICING

    def pick(value, default):
        return default if value is None else value

    median = pick(args.latency_median_ms, base.latency_median_ms)
    options = SimulatorOptions(
        reference=pick(args.reference, base.reference),
        latency_median_ms=median,
        latency_p95_ms=pick(args.latency_p95_ms, median if args.latency_median_ms is not None else base.latency_p95_ms),
        tokens_per_s=pick(args.tokens_per_s, base.tokens_per_s),
        faults=parse_faults(args.faults) if args.faults is not None else base.faults,
        quirks=parse_quirks(args.quirks) if args.quirks is not None else base.quirks,
        logprobs=base.logprobs and not args.no_logprobs,
        seed=pick(args.seed, base.seed),
        personality=pick(args.personality, base.personality),
        concurrency_cap=pick(args.concurrency_cap, base.concurrency_cap),
        cap_changes=parse_cap_changes(args.cap_changes) if args.cap_changes is not None else base.cap_changes,
        requests_per_min=pick(args.rpm, base.requests_per_min),
        tokens_per_min=pick(args.tpm, base.tokens_per_min),
        batch_slots=pick(args.batch_slots, base.batch_slots),
        extra_references=base.extra_references,
        prompt_cache=base.prompt_cache,
    )
    args.tokenizer = pick(args.tokenizer, tokenizer)
    check_options(options)
    if not (args.tokenizer / "tokenizer.json").exists() and not (args.tokenizer / "tiktoken.model").exists():
        raise InputError(
            f"--tokenizer {args.tokenizer}: no tokenizer.json or tiktoken.model there; "
            "point it at a tokenizer directory such as sample_data/tokenizer"
        )
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise InputError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})

    async def serve() -> None:
        server = SimulatorServer(
            options,
            tokenizer_dir=args.tokenizer,
            model=args.model or model,
            host=args.host,
            port=args.port,
            api_key=api_key,
            pricing=pricing,
            profile=profile,
        )
        async with server:
            faults = ",".join(f"{k}={v:g}" for k, v in options.faults.items()) or "none"
            print(
                f"eaglewatch simulator listening on {server.base_url} "
                f"({len(server.book)} samples, personality: {options.personality}, faults: {faults}, "
                f"quirks: {','.join(options.quirks) or 'none'}); "
                "Ctrl-C stops it",
                flush=True,
            )
            try:
                await asyncio.Event().wait()
            finally:
                print(f"served: {dict(server.counters)}", file=sys.stderr, flush=True)

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0
