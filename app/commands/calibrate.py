"""`eaglewatch calibrate CONFIG`: a dry check of each endpoint's fidelity profile from a small probe set.

A run probes and learns by itself (app.engine.fidelity.verify: probes by default, the profile learned during the run);
calibrate shows beforehand, without a run, what the probes of an endpoint teach.

Sends the first `--samples` prompts of the config's datasets to every endpoint (or `--endpoint`), asking
for ground truth: server token ids (`return_token_ids`, vLLM ≥ 0.10.2, vllm/entrypoints/openai/protocol.py
ChatCompletionRequest; the simulator honours it too) and logprobs with bytes (OpenRouter providers that
offer them). Every answer with true ids is a probe: the profile (app.tokens.fidelity_profile) learns which
server-side text steps this endpoint — and each upstream provider behind it (the response's `provider`)
— applies, and the text path is measured against the true ids. Profiles are stored in the run database
and printed. Talks to the endpoints with app.providers.ChatClient directly (no engine, no run state).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import Counter
from typing import Any

from app.errors import InputError

EXAMPLE = """\
eaglewatch calibrate sample_data/demo.toml
eaglewatch calibrate run.toml --samples 40 --endpoint openrouter --json
eaglewatch calibrate run.toml --db fidelity.db   # store the profiles elsewhere than [run].database"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="run config (TOML)")
    parser.add_argument("--samples", type=int, default=24, metavar="N", help="probe prompts per endpoint (default 24)")
    parser.add_argument("--endpoint", metavar="NAME", help="only this endpoint (default: all)")
    parser.add_argument(
        "--db", metavar="PATH", help="where to store the profiles (default: the config's [run].database)"
    )
    parser.add_argument(
        "--no-token-ids",
        action="store_true",
        help="do not send return_token_ids (for a server that rejects unknown fields)",
    )
    parser.add_argument("--json", action="store_true", help="print the learned profiles as JSON")


def run(args: argparse.Namespace) -> int:
    from app.config import load_config

    if args.samples <= 0:
        raise InputError(f"--samples {args.samples}: at least one probe prompt is needed")
    config = load_config(args.config)
    endpoints = [e for e in config.endpoints if args.endpoint in (None, e.name)]
    if not endpoints:
        names = ", ".join(e.name for e in config.endpoints)
        raise InputError(f"{args.config}: no endpoint named {args.endpoint!r}; endpoints: {names}")
    results = asyncio.run(_calibrate(config, endpoints, args))
    db = args.db or str(config.run.database)
    from app.store.profile_store import save_profile

    for r in results:
        if r["profile"] is not None:
            save_profile(db, r["profile"], r["tokenizer"])
    if args.json:
        json.dump([_as_json(r) for r in results], sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        for r in results:
            _print(r)
        print(f"stored {sum(r['profile'] is not None for r in results)} profile(s) in {db}", file=sys.stderr)
    return 0 if any(r["profile"] is not None for r in results) else 1


async def _calibrate(config: Any, endpoints: list, args: argparse.Namespace) -> list[dict]:
    from app.datasets import iter_dataset
    from app.tokens import Reconstructor, get_profile, load_tokenizer

    profile = get_profile(config.model.profile)
    tokenizer = load_tokenizer(config.model.tokenizer, profile.pretokenizer_pattern)
    prompts = []
    for ds in config.data.datasets:
        for sample in iter_dataset(ds):
            prompts.append(sample)
            if len(prompts) >= args.samples:
                break
        if len(prompts) >= args.samples:
            break
    if not prompts:
        raise InputError(f"{args.config}: the datasets hold no prompts to probe with")
    plain = Reconstructor(profile, tokenizer)
    out = []
    for ep in endpoints:
        answers, errors = await _probe(config, ep, prompts, args)
        out.extend(_learn(ep.name, answers, errors, plain, profile, tokenizer, bool(config.generation.stream)))
    return out


async def _probe(config: Any, ep: Any, prompts: list, args: argparse.Namespace) -> tuple[list, Counter]:
    from app.errors import EaglewatchError
    from app.providers.client import ChatClient

    server = None
    if ep.simulator is not None:
        from app.simulator.server import SimulatorServer

        server = SimulatorServer(
            ep.simulator,
            tokenizer_dir=config.model.tokenizer,
            reference=ep.simulator.reference or config.data.reference,
            model=config.model.name,
            profile=config.model.profile,
        )
        await server.start()
        ep = ep.model_copy(update={"base_url": server.base_url, "simulator": None})
    key = os.environ.get(ep.api_key_env) if ep.api_key_env else None
    if ep.api_key_env and not key:
        raise InputError(
            f"endpoint {ep.name!r}: the environment variable {ep.api_key_env} named by api_key_env is "
            "not set or empty; export it before calibrating"
        )
    generation = config.generation.model_copy(update={"logprobs": True})
    extra = None if args.no_token_ids else {"return_token_ids": True}
    answers: list[Any] = []
    errors: Counter[str] = Counter()
    simulated = server is not None
    try:
        async with ChatClient(ep, generation, key) as client:
            limit = asyncio.Semaphore(max(1, min(8, ep.max_concurrency)))

            async def one(sample):
                body: dict[str, Any] = dict(extra or {})
                if simulated:  # the simulator replays the sample asked for
                    from app.simulator.server import SAMPLE_FIELD

                    body[SAMPLE_FIELD[0]] = {SAMPLE_FIELD[1]: sample.sample_id}
                async with limit:
                    try:
                        return await client.complete(
                            sample.messages, sample.tools, model=config.model.name, extra=body or None
                        )
                    except EaglewatchError as exc:
                        errors[type(exc).__name__] += 1
                        return None

            answers = [a for a in await asyncio.gather(*(one(s) for s in prompts)) if a is not None]
    finally:
        if server is not None:
            await server.close()
    return answers, errors


def _learn(
    endpoint: str, answers: list, errors: Counter, plain, profile, tokenizer, stream: bool | None = None
) -> list[dict]:
    """Per upstream provider: the probes with true ids, the learned profile, the measured text path. Probes
    whose logprobs left tool calls to the text teach nothing of tool calls (app.tokens.fidelity_profile.learn)."""
    from dataclasses import replace

    from app.records import CORRUPT_VERDICTS
    from app.tokens import Reconstructor
    from app.tokens.fidelity_profile import learn, merge
    from app.tokens.flags import is_suspect

    groups: dict[str | None, list] = {}
    unverified: Counter = Counter()
    for c in answers:
        truth = plain.truth_of(c)
        if truth is not None:
            groups.setdefault(c.provider, []).append((c, truth[0], truth[2]))
        else:
            unverified[c.provider] += 1
    results = []
    for provider in sorted(set(groups) | set(unverified), key=lambda p: p or ""):
        probes = [(c, ids) for c, ids, _ in groups.get(provider, [])]
        fp = None
        for c, ids, whole in groups.get(provider, []):
            one = learn(
                [(c, ids)], profile, tokenizer, endpoint=endpoint, provider=provider, stream=stream, whole=whole
            )
            fp = one if fp is None else merge(fp, one)
        measured: Counter = Counter()
        wrong_kept = 0
        if fp is not None:
            rec = Reconstructor(profile, tokenizer, fp)
            for c, ids in probes:
                # the text path alone, as production runs it on a sample without ids; the true ids judge
                text_only = replace(c, token_ids=None, content_logprobs=None, reasoning_logprobs=None)
                out, verdict = rec.process(text_only, ids)
                measured[verdict.category] += 1
                wrong_kept += verdict.category in CORRUPT_VERDICTS and not is_suspect(out.flags)
        results.append(
            {
                "endpoint": endpoint,
                "provider": provider,
                "profile": fp,
                "tokenizer": tokenizer.fingerprint,
                "verified": len(probes),
                "unverified": unverified[provider],
                "errors": dict(errors),
                "measured": dict(measured),
                "wrong_kept": wrong_kept,
            }
        )
    if not results:
        results.append(
            {
                "endpoint": endpoint,
                "provider": None,
                "profile": None,
                "tokenizer": tokenizer.fingerprint,
                "verified": 0,
                "unverified": 0,
                "errors": dict(errors),
                "measured": {},
                "wrong_kept": 0,
            }
        )
    return results


def _as_json(r: dict) -> dict:
    fp = r["profile"]
    return {
        "endpoint": r["endpoint"],
        "provider": r["provider"],
        "verified": r["verified"],
        "unverified": r["unverified"],
        "errors": r["errors"],
        "measured": r["measured"],
        "wrong_kept": r["wrong_kept"],
        "steps": [
            {
                "name": s.name,
                "where": s.where,
                "inverse": s.inverse,
                "invertible": s.invertible,
                "seen": s.seen,
                "of": s.of,
            }
            for s in (fp.steps() if fp else ())
        ],
        "uninvertible": list(fp.uninvertible()) if fp else [],
        "unexplained": fp.unexplained() if fp else {},
    }


def _print(r: dict) -> None:
    out = sys.stdout
    who = r["endpoint"] + (f" / provider {r['provider']}" if r["provider"] else "")
    out.write(f"{who}: {r['verified']} probe(s) with true ids, {r['unverified']} without")
    if r["errors"]:
        out.write(" (failed: " + ", ".join(f"{k} {v}" for k, v in sorted(r["errors"].items())) + ")")
    out.write("\n")
    fp = r["profile"]
    if fp is None:
        out.write(
            "  no profile: the endpoint returned no server ids or logprobs with bytes; its samples stay unverified\n"
        )
        return
    steps = fp.steps()
    if not steps:
        out.write("  no server-side text steps seen: text is reconstructed as returned\n")
    for s in steps:
        state = "invertible" if s.invertible else "NOT invertible: its samples are flagged"
        out.write(f"  {s.name:<26} {s.where:<22} {s.inverse}  [{state}; {s.seen}/{s.of}]\n")
    for name, n in sorted(fp.unexplained().items()):
        out.write(f"  unexplained differences in {name}: {n} probe(s)\n")
    if r["measured"]:
        out.write(
            "  text path vs true ids (with this profile): "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["measured"].items()))
            + f"; corrupt and not flagged: {r['wrong_kept']}\n"
        )
