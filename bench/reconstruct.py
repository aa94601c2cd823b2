"""How fast is token-id reconstruction? Tokens/s against the bare tokenizer, and align time for 32k tokens.

Measured in the same run, over --repeat rounds; in each round the baseline runs right before each path, and a
path's ratio is the median over the rounds of (baseline time / path time) in that round, with its quartiles (CPU
time of this process; a shared machine's slow and fast spells hit both halves of a pair alike, where the best
of each measured apart lets one lucky round of either decide). Tokens/s are from each path's best round.
  - bare encode: the tokenizer library itself (tiktoken `Encoding.encode(allowed_special="all")` or
    `tokenizers.Tokenizer.encode`) on each sample's full output string (markers as text) — what a caller
    of the library would run; eaglewatch's tiktoken backend gets the same ids faster (specials found in
    Python, the text between them through `encode_ordinary`), so a ratio above 1 is possible;
  - canonical: `Reconstructor.process(completion, reference_ids)` over the same samples (render, encode,
    compare); also without a reference (render, encode, round-trip check);
  - logprobs: the same completions carrying per-token logprob bytes for reasoning and content;
  - learned repairs: the completions as a quirky server returns them (think_spaces + json_reserialised,
    the simulator's renderer), reconstructed without a reference through a fidelity profile learned from
    every 4th sample (production: the learned inverses, one encode); the run prints how many samples the
    inverses changed and how many are benign with and without the profile (it is no no-op);
  - default path: the engine's EndpointReconstructor with a learned profile resting on a server prior whose token count
  is
    known, 5 % of the answers probes with logprobs (measured and learned from), every text reconstruction checked
    against usage.completion_tokens; and over a stripping server's prior (the per-sample count proof of each
    strip edge);
  - unrepairable 32k: one 32k-token sample (reasoning, content, a tool call) whose reference differs
    in the middle, through the reference-assisted repair search (`assisted=True`), against a bare
    decode + encode of that sample (target <= 3x); also the old search that encodes every variant;
  - align: `align(ref, rec)` for a 32k-token pair with 64 injected non-canonical splits, and for two
    unrelated 32k-token sequences (the worst case).
Ratios are the bare-encode baseline's time over the path's (tokens/s over tokens/s; target: canonical, learned
repairs and the default path >= 0.8x; align < 0.5 s).
Results go to bench/results/reconstruct.json.

    python bench/reconstruct.py [--tokenizer sample_data/tokenizer] [--repeat 25]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.libnoise import silence_library_noise  # noqa: E402

silence_library_noise()


class Paired:
    """A path timed against the baseline: `ratio` is the median of baseline time / path time over rounds (each
    round times the baseline right before the path), `low` / `high` its quartiles, `best` the path's fastest
    round and `base` the baseline's fastest, in seconds."""

    def __init__(self, ratios: list[float], best: float, base: float) -> None:
        import statistics

        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        self.ratio, self.low, self.high = statistics.median(ratios), q[0], q[2]
        self.best, self.base = best, base

    def __str__(self) -> str:
        return f"{self.ratio:.2f}x ({self.low:.2f}-{self.high:.2f}x)"


def paired(repeat: int, base, fns: dict, reset=lambda: None) -> dict[str, Paired]:
    """Each fn timed `repeat` times, each time right after a run of `base` (see Paired); `reset` runs before each
    timed call, untimed."""
    ratios: dict[str, list[float]] = {k: [] for k in fns}
    best = dict.fromkeys(fns, float("inf"))
    base_best = float("inf")
    for _ in range(repeat):
        for name, fn in fns.items():
            reset()
            t = time.process_time()
            base()
            tb = time.process_time() - t
            t = time.process_time()
            fn()
            tf = time.process_time() - t
            ratios[name].append(tb / tf)
            best[name], base_best = min(best[name], tf), min(base_best, tb)
    return {k: Paired(ratios[k], best[k], base_best) for k in fns}


def best_of(repeat: int, fns: dict) -> dict[str, float]:
    """The fastest of `repeat` timed calls of each fn, in seconds; rounds interleave the fns so that noise
    from a shared machine hits all of them alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.process_time()  # CPU time of this process: other work on a shared machine counts less
            fn()
            best[name] = min(best[name], time.process_time() - t)
    return best


def main() -> int:
    from app.records import TokenLogprob
    from app.tokens import Reconstructor, align, get_profile, load_tokenizer, pieces_text, render_output, split_output

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default=str(ROOT / "sample_data" / "tokenizer"))
    ap.add_argument("--reference", default=str(ROOT / "sample_data" / "reference.jsonl"))
    ap.add_argument("--profile", default="kimi-k2.5")
    ap.add_argument("--repeat", type=int, default=25)
    args = ap.parse_args()

    profile = get_profile(args.profile)
    tok = load_tokenizer(args.tokenizer, profile.pretokenizer_pattern)
    rec = Reconstructor(profile, tok)
    refs = [json.loads(line)["output_ids"] for line in Path(args.reference).read_text().splitlines() if line.strip()]
    sample_dir = ROOT / "sample_data" / "tokenizer"
    if (
        Path(args.reference).resolve() == (ROOT / "sample_data" / "reference.jsonl").resolve()
        and Path(args.tokenizer).resolve() != sample_dir.resolve()
    ):
        # The sample ids belong to the sample tokenizer: carry the same texts over to this tokenizer.
        sample = load_tokenizer(sample_dir)
        refs = [tok.encode(sample.decode(ids)) for ids in refs]
    views = [split_output(ids, profile, tok) for ids in refs]
    completions = [v.to_completion() for v in views]
    texts = [pieces_text(render_output(profile, v.reasoning, v.content, v.tool_calls, v.finish_reason)) for v in views]
    n_tokens = sum(len(r) for r in refs)

    def lp(ids):
        return tuple(TokenLogprob(tok.decode([i]), tuple(tok.token_bytes(i)), -0.1) for i in ids)

    think_close = tok.special_id(profile.think_close)
    lp_completions = []
    for c, ids in zip(completions, refs):
        if think_close in ids:
            k = ids.index(think_close)
            reasoning_ids = ids[:k]
            content_ids = [i for i in ids[k + 1 :] if not tok.is_special(i)]
        else:
            reasoning_ids, content_ids = [], [i for i in ids if not tok.is_special(i)]
        lp_completions.append(replace(c, reasoning_logprobs=lp(reasoning_ids), content_logprobs=lp(content_ids)))

    if tok.kind == "tiktoken":  # the library itself, as a caller would use it
        bare = lambda: [tok.encoding.encode(t, allowed_special="all") for t in texts]  # noqa: E731
    else:
        bare = lambda: [tok.backend.encode(t, add_special_tokens=False).ids for t in texts]  # noqa: E731
    # the tokenizer keeps the ids of short runs it has encoded (tool-call ids recur across a run's samples); every
    # round here passes over the same samples, so each timed pass starts without them, as a run's first pass does
    short_runs = getattr(tok, "_short_runs", {})
    res = paired(
        args.repeat,
        bare,
        reset=short_runs.clear,
        fns={
            "canonical": lambda: [rec.process(c, r) for c, r in zip(completions, refs)],
            "unchecked": lambda: [rec.process(c, None) for c in completions],
            "logprobs": lambda: [rec.process(c, r) for c, r in zip(lp_completions, refs)],
        },
    )

    # learned repairs: a quirky server's text, a profile learned from probes, no reference
    from app.records import Completion, ToolCall
    from app.simulator.render import OutputRenderer
    from app.tokens.fidelity_profile import learn

    quirks = frozenset({"think_spaces", "json_reserialised"})
    renderer = OutputRenderer(tok, profile)

    def served(ids):
        o = renderer.render(tuple(ids), quirks, 0)
        calls = tuple(ToolCall(c.id, c.name, c.arguments, i) for i, c in enumerate(o.tool_calls))
        return Completion(
            content=o.content or "", reasoning=o.reasoning, tool_calls=calls, finish_reason=o.finish_reason
        )

    quirky = [served(ids) for ids in refs]
    fp = learn([(c, ids) for c, ids in list(zip(quirky, refs))[::4]], profile, tok, endpoint="bench")
    learned = Reconstructor(profile, tok, fp)
    learned_ok = sum(
        learned.process(c, r)[1].category in ("exact", "bpe_equivalent", "truncated") for c, r in zip(quirky, refs)
    )
    # what production did to these samples: the learned inverses it applied (a no-op profile would show 0)
    learned_repaired = sum(learned.process(c)[0].repair is not None for c in quirky)
    plain_ok = sum(
        rec.process(c, r)[1].category in ("exact", "bpe_equivalent", "truncated") for c, r in zip(quirky, refs)
    )
    res.update(
        paired(
            args.repeat,
            bare,
            reset=short_runs.clear,
            fns={
                "learned": lambda: [learned.process(c) for c in quirky],
                "learned_ref": lambda: [learned.process(c, r) for c, r in zip(quirky, refs)],
            },
        )
    )

    # the engine's default path: the EndpointReconstructor (a learned profile resting on a server prior with a known
    # token
    # count), 5 % of the answers probes carrying logprobs (their text path measured, their steps learned), every
    # text reconstruction checked against usage.completion_tokens; and the same over a stripping server's prior (the
    # per-sample count proof of each strip edge)
    from app.engine.fidelity.verify import EndpointReconstructor
    from app.records import Usage
    from app.tokens.fidelity_profile import STRIPPED, with_prior
    from app.tokens.fidelity_profile import FidelityProfile as FP

    counted = [replace(c, usage=Usage(completion_tokens=len(r))) for c, r in zip(quirky, refs)]
    probe_lp = {k: lp_completions[k] for k in range(0, len(refs), 20)}
    probes = [
        replace(counted[k], reasoning_logprobs=c.reasoning_logprobs, content_logprobs=c.content_logprobs)
        for k, c in probe_lp.items()
    ]
    prior = FP("bench", None, profile.name, 0, {}, {"count": {"+0": 1}}, "bench server", False, "openai")
    default = EndpointReconstructor(rec, [with_prior(replace(fp, provider=None), prior)])
    stripping = FP(
        "bench",
        None,
        profile.name,
        0,
        {},
        {"count": {"+0": 1}, "edge:content.trail": {STRIPPED: 1}, "edge:reasoning.lead": {STRIPPED: 1}},
        "stripping",
        False,
        "openai",
    )
    strip_reconstructor = EndpointReconstructor(rec, [stripping])
    plain_counted = [replace(c, usage=Usage(completion_tokens=len(r))) for c, r in zip(completions, refs)]

    def default_path(endpoint_reconstructor, items):
        for k, c in enumerate(items):
            if k in probe_lp:
                endpoint_reconstructor.reconstruct(probes[k // 20], None, (), None, endpoint="bench", measure=True)
            else:
                endpoint_reconstructor.reconstruct(c, None, (), None, endpoint="bench", measure=False)

    res.update(
        paired(
            args.repeat,
            bare,
            reset=short_runs.clear,
            fns={
                "default": lambda: default_path(default, counted),
                "stripping": lambda: default_path(strip_reconstructor, plain_counted),
            },
        )
    )
    default_flags: dict[str, int] = {}
    for c in counted:
        for f in default.reconstruct(c, None, (), None, endpoint="bench", measure=False).reconstruction.flags:
            default_flags[f] = default_flags.get(f, 0) + 1

    # the worst case: a 32k-token sample no repair can fix, through the reference-assisted search
    body_ids = [i for ids in refs for i in ids if not tok.is_special(i)]
    while len(body_ids) < 16_000:
        body_ids += body_ids
    reasoning_text = tok.decode(body_ids[:15_000])
    content_text = tok.decode(body_ids[15_000:31_000])
    call = (
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": 1}'
        "<|tool_call_end|><|tool_calls_section_end|>"
        if profile.name == "kimi-k2.5"
        else ""
    )
    big_text = f"{reasoning_text}{profile.think_close}{content_text}{call}{profile.end_of_turn}"
    big_ref = tok.encode(big_text)
    mid = len(content_text) // 2
    wrong = (
        f"{reasoning_text}{profile.think_close}{content_text[:mid]}XYZZY{content_text[mid:]}{call}{profile.end_of_turn}"
    )
    big_view = split_output(tok.encode(wrong), profile, tok).to_completion()  # the text lost nothing repairable
    old_search = Reconstructor(profile, tok)
    old_search.search_by_text = False
    bare_big = (
        (lambda: tok.encoding.encode(big_text, allowed_special="all"))
        if tok.kind == "tiktoken"
        else (lambda: tok.backend.encode(big_text, add_special_tokens=False).ids)
    )
    big_res = paired(
        args.repeat,
        lambda: (tok.decode(big_ref), bare_big()),
        reset=short_runs.clear,
        fns={
            "assisted": lambda: rec.process(big_view, big_ref, assisted=True),
            "production": lambda: rec.process(big_view, big_ref),
            "old": lambda: old_search.process(big_view, big_ref, assisted=True),
        },
    )
    t_big_bare = big_res["assisted"].base
    # these read as "times the bare decode + encode" (the inverse of the ratios above)
    x_assisted, x_prod, x_old = (1 / big_res[k].ratio for k in ("assisted", "production", "old"))
    t_big_assisted, t_big_prod, t_big_old = (big_res[k].best for k in ("assisted", "production", "old"))
    big_verdict = rec.process(big_view, big_ref, assisted=True)[1].category
    strategies = {}
    for c, r in zip(lp_completions, refs):
        s = rec.process(c, r)[0].strategy
        strategies[s] = strategies.get(s, 0) + 1

    # A 32k-token pair: the reference set concatenated, and a copy with 64 non-canonical splits.
    big: list[int] = []
    while len(big) < 32_000:
        for ids in refs:
            big.extend(ids)
    big = big[:32_000]
    rng = random.Random(0)
    split = list(big)
    done = 0
    for k in sorted(rng.sample(range(len(big)), 2000), reverse=True):
        data = tok.token_bytes(split[k])
        if tok.is_special(split[k]) or len(data) < 2:
            continue
        left, right = tok.id_of_bytes(data[:1]), tok.id_of_bytes(data[1:])
        if left is not None and right is not None:
            split[k : k + 1] = [left, right]
            done += 1
            if done == 64:
                break
    other = [rng.randrange(tok.vocab_size - 300) for _ in range(32_000)]
    from app.tokens.align import _TOKEN_CACHE

    def cold(a, b):
        _TOKEN_CACHE.pop(tok, None)  # measure with no display tokens cached, as for a first view
        return align(a, b, tok)

    times = best_of(args.repeat, {"align": lambda: cold(big, split), "worst": lambda: cold(big, other)})
    t_align, t_align_worst = times["align"], times["worst"]

    t_bare = min(r.base for r in res.values())
    rows = [
        ("canonical + compare", "canonical"),
        ("canonical, unchecked + round-trip", "unchecked"),
        ("logprobs + compare", "logprobs"),
        ("learned repairs, unchecked", "learned"),
        ("learned repairs + compare", "learned_ref"),
        ("default path (5 % probes, count check)", "default"),
        ("default path, stripping server", "stripping"),
    ]
    print(
        f"reconstruction over {len(refs)} samples, {n_tokens} tokens, tokenizer {tok.path} ({tok.kind}); "
        f"{args.repeat} paired rounds"
    )
    print(f"{'path':<40} {'tokens/s':>12}  vs bare (median of rounds, quartiles)")
    print(f"{'bare encode (baseline)':<40} {n_tokens / t_bare:>12,.0f}  1.00x")
    for name, key in rows:
        print(f"{name:<40} {n_tokens / res[key].best:>12,.0f}  {res[key]}")
    print(f"align 32k pair, {done} splits: {t_align * 1000:.0f} ms; unrelated 32k pair: {t_align_worst * 1000:.0f} ms")
    print(f"logprob run strategies: {strategies}")
    print(
        f"learned repairs ({', '.join(sorted(quirks))}; profile from {fp.probes} probes): "
        f"{learned_ok}/{len(refs)} benign against the reference (without the profile: {plain_ok}); "
        f"learned inverses applied to {learned_repaired}/{len(refs)} samples"
    )
    print(f"default path flags on the quirky answers (learned profile, count check): {default_flags or 'none'}")
    print(
        f"unrepairable {len(big_ref)}-token sample ({big_verdict}): bare decode+encode {t_big_bare * 1000:.1f} ms; "
        f"assisted search {t_big_assisted * 1000:.1f} ms ({x_assisted:.2f}x); "
        f"production {t_big_prod * 1000:.1f} ms ({x_prod:.2f}x); "
        f"old encode-every-variant search {t_big_old * 1000:.1f} ms ({x_old:.2f}x)"
    )

    def stats(key: str) -> dict:
        r = res[key]
        return {
            f"{key}_tokens_per_s": n_tokens / r.best,
            f"{key}_ratio": r.ratio,
            f"{key}_ratio_quartiles": [r.low, r.high],
        }

    result = {
        "tokenizer": str(tok.path),
        "kind": tok.kind,
        "samples": len(refs),
        "tokens": n_tokens,
        "rounds": args.repeat,
        "bare_tokens_per_s": n_tokens / t_bare,
        **{k: v for _, key in rows for k, v in stats(key).items()},
        "align_32k_s": t_align,
        "align_32k_unrelated_s": t_align_worst,
        "learned_benign": learned_ok,
        "learned_benign_without_profile": plain_ok,
        "learned_repaired": learned_repaired,
        "default_flags": default_flags,
        "unrepairable_32k_tokens": len(big_ref),
        "unrepairable_bare_s": t_big_bare,
        "unrepairable_assisted_s": t_big_assisted,
        "unrepairable_assisted_ratio": x_assisted,
        "unrepairable_production_ratio": x_prod,
        "unrepairable_old_search_ratio": x_old,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "reconstruct.json").write_text(json.dumps(result, indent=1) + "\n")
    print()
    print(
        "| reconstruction (tokenizer) | canonical vs bare encode | learned repairs vs bare | default path vs bare | "
        "logprobs vs bare | unrepairable 32k vs bare decode+encode | align 32k (64 splits / unrelated) |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {tok.kind} {Path(tok.path).name} | {res['canonical']} | {res['learned']} | {res['default']} | "
        f"{res['logprobs']} | {x_assisted:.2f}x (was {x_old:.1f}x) | {t_align * 1000:.0f} ms / "
        f"{t_align_worst * 1000:.0f} ms |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
