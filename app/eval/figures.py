"""The eval report's figures and guards, pure functions of the stored requests (`EvalRequestRow`).

- acceptance length of one request = 1 + accepted draft tokens / draft steps (the token each step emits itself
  plus the drafts it accepted); the run's mean is request-weighted (every request counts once: long answers do
  not dominate), with the token-weighted one beside it (1 + Σ accepted / Σ steps, what the server counters give);
- per-position acceptance: the share of steps that accepted draft position k; the histogram: steps by how many
  drafts they accepted (index k = k accepted);
- 95 % intervals: a seeded percentile bootstrap over requests (the same rows and seed give the same interval);
- repetition loops (`is_loop`): an output whose tail repeats one cycle of period ≤ 64 over at least
  `loop_min_repeat` tokens and `loop_share` of the output; a loop accepts nearly every draft and flatters a
  drafter, so loops are left out of the figures and the figures with them are shown beside;
- verdicts, each a named sentence: `dead drafter` (acceptance length at or below `dead_below` after `dead_after`
  requests, with the likely causes), `repetition loops`, `no acceptance` (an endpoint that reported none),
  `template mismatch` (a warning: the server's prompt ids differ from the run's own rendering, app.eval.template);
- counter windows (`counter_windows_report`): Prometheus counter deltas of a server, labelled as server-wide and
  never mixed with the per-request figures.
Requests without acceptance figures are never averaged in as zero: they are counted apart.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from app.config import EvalSection
from app.eval.acceptance import VLLM_HINT
from app.store.rows import EvalRequestRow

MAX_LOOP_PERIOD = 64
DEAD_CAUSES = (
    "the server runs the draft under the wrong method (e.g. eagle vs eagle3), the draft vocabulary (d2t/t2d) does "
    "not map to the target's, the checkpoint config (aux hidden-state layers, target hidden size, norm) does not "
    "match the target, or the drafter is untrained"
)


def is_loop(ids: Sequence[int], *, min_repeat: int = 8, share: float = 0.5) -> bool:
    """Whether `ids` ends in a repeated cycle (period ≤ 64) repeating over ≥ `min_repeat` tokens and covering ≥
    `share` of the output (the first pass of the cycle included)."""
    n = len(ids)
    for period in range(1, min(MAX_LOOP_PERIOD, n // 2) + 1):
        run = 0
        i = n - 1
        while i - period >= 0 and ids[i] == ids[i - period]:
            run += 1
            i -= 1
        if run >= min_repeat and (run + period) >= share * n:
            return True
    return False


def _length(row: EvalRequestRow) -> float | None:
    if row.steps is None or row.accepted is None or row.steps == 0:
        return None
    return 1.0 + row.accepted / row.steps


def _token_weighted(rows: Sequence[EvalRequestRow]) -> float | None:
    steps = sum(r.steps or 0 for r in rows)
    return 1.0 + sum(r.accepted or 0 for r in rows) / steps if steps else None


def _ci(values: Sequence[Any], stat: Any, *, resamples: int, seed: int) -> list[float] | None:
    n = len(values)
    if n < 2:
        return None
    rng = random.Random(seed)
    stats = sorted(stat([values[i] for i in rng.choices(range(n), k=n)]) for _ in range(resamples))
    lo, hi = stats[int(0.025 * (resamples - 1))], stats[int(0.975 * (resamples - 1))]
    return [round(lo, 4), round(hi, 4)]


def acceptance_figures(rows: Sequence[EvalRequestRow], *, resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The acceptance figures of requests that carry them (others are ignored: the caller counts them apart)."""
    measured = [r for r in rows if _length(r) is not None]
    lengths = [_length(r) for r in measured]
    steps = sum(r.steps or 0 for r in measured)
    width = max((len(r.per_position or ()) for r in measured), default=0)
    per_position = [0] * width
    for r in measured:
        for k, count in enumerate(r.per_position or ()):
            per_position[k] += count
    histogram = [steps - per_position[0]] if width else []
    histogram += [per_position[k - 1] - per_position[k] for k in range(1, width)] + (
        [per_position[-1]] if width else []
    )
    drafted = [r.drafted for r in measured]
    conditional, eal = expected_length(per_position, steps)
    return {
        "requests": len(measured),
        "mean_acceptance_length": round(sum(lengths) / len(lengths), 4) if lengths else None,  # type: ignore[arg-type]
        "mean_acceptance_length_ci95": _ci(lengths, lambda v: sum(v) / len(v), resamples=resamples, seed=seed),
        "token_weighted_acceptance_length": None if not steps else round(_token_weighted(measured) or 0.0, 4),
        "token_weighted_ci95": _ci(measured, lambda v: _token_weighted(v) or 1.0, resamples=resamples, seed=seed + 1),
        "accepted_tokens": sum(r.accepted or 0 for r in measured),
        "draft_tokens": None if any(d is None for d in drafted) else sum(d or 0 for d in drafted),
        "steps": steps,
        "per_position_acceptance": [round(c / steps, 4) if steps else None for c in per_position],
        "conditional_acceptance": conditional,
        "expected_acceptance_length": eal,
        "histogram": histogram,
    }


def expected_length(per_position: Sequence[int], steps: int) -> tuple[list[float | None], float | None]:
    """The conditional acceptance rate per draft position (a_k: of the steps that accepted position k-1, the
    share that accepted k) and the expected acceptance length EAL = 1 + sum_k prod_{j<=k} a_j built from them
    (speculators' offline proxy), shown beside the measured mean."""
    if not steps:
        return [], None
    rates: list[float | None] = []
    before = steps
    product, eal = 1.0, 1.0
    for count in per_position:
        rate = count / before if before else 0.0
        rates.append(round(rate, 4) if before else None)
        product *= rate
        eal += product
        before = count
    return rates, round(eal, 4)


def _perf(rows: Sequence[EvalRequestRow]) -> dict[str, Any]:
    def mean(values: Iterable[float | None]) -> float | None:
        got = [v for v in values if v is not None]
        return round(sum(got) / len(got), 3) if got else None

    return {
        "tokens_per_s": mean(r.tokens_per_s for r in rows),
        "ttft_ms": mean(r.ttft_ms for r in rows),
        "itl_ms": mean(r.itl_ms for r in rows),
        "output_tokens": sum(r.completion_tokens for r in rows),
    }


def _part(rows: Sequence[EvalRequestRow], ev: EvalSection) -> dict[str, Any]:
    kept = [r for r in rows if not r.loop]
    return {
        "figures": acceptance_figures(kept, resamples=ev.bootstrap, seed=ev.seed),
        "figures_with_loops": acceptance_figures(rows, resamples=ev.bootstrap, seed=ev.seed),
        "loops": len(rows) - len(kept),
    }


def verdicts(endpoint: str, part: dict[str, Any], answered: int, ev: EvalSection) -> list[dict[str, str]]:
    """The guards' named verdicts for one drafter endpoint's figures (`answered`: its successful requests)."""
    out: list[dict[str, str]] = []
    fig = part["figures"]
    if answered and fig["requests"] == 0 and part["figures_with_loops"]["requests"] == 0:
        out.append(
            {
                "verdict": "no acceptance",
                "level": "error",
                "message": f"{endpoint}: {answered} answers carried no acceptance figures; {VLLM_HINT}",
            }
        )
    mean = fig["mean_acceptance_length"]
    if mean is not None and fig["requests"] >= ev.dead_after and mean <= ev.dead_below:
        out.append(
            {
                "verdict": "dead drafter",
                "level": "error",
                "message": f"{endpoint}: mean acceptance length {mean:.3f} over {fig['requests']} requests (at or "
                f"below {ev.dead_below}): the drafter is dead. Likely causes: {DEAD_CAUSES}",
            }
        )
    if part["loops"]:
        with_loops = part["figures_with_loops"]["mean_acceptance_length"]
        out.append(
            {
                "verdict": "repetition loops",
                "level": "warning",
                "message": f"{endpoint}: {part['loops']} outputs caught in a repetition loop were left out "
                f"(mean acceptance length {mean} without them, {with_loops} with them)",
            }
        )
    return out


def template_verdicts(endpoint: str, rows: Sequence[EvalRequestRow]) -> list[dict[str, str]]:
    """`template mismatch` (a warning) when the server's prompt ids of any request differ from the run's own
    rendering of its messages, naming the first differing token of the first such request."""
    from app.eval.template import describe_finding

    differ = [r for r in rows if r.template is not None]
    if not differ:
        return []
    checked = sum(1 for r in rows if r.prompt_ids is not None)
    return [
        {
            "verdict": "template mismatch",
            "level": "warning",
            "message": f"{endpoint}: the server's prompt ids differ from the run's own chat-template rendering in "
            f"{len(differ)} of {checked} requests; first {describe_finding(differ[0].template or {})}. The drafter "
            "is measured on prompts it was not trained on: its figures do not stand for the template the data "
            "uses (serve with the model's chat template, through /v1/chat/completions)",
        }
    ]


def counter_windows_report(windows: Sequence[Any]) -> dict[str, Any]:
    """Per endpoint, the figures of its Prometheus counter windows (`app.store.eval_ops.EvalWindow`): server-wide
    deltas, labelled as such and never mixed with the per-request figures."""
    by_endpoint: dict[str, list[Any]] = defaultdict(list)
    for w in windows:
        by_endpoint[w.endpoint].append(w)
    out: dict[str, Any] = {}
    for name, ws in by_endpoint.items():
        drafts = sum(w.drafts for w in ws)
        width = max((len(w.per_position) for w in ws), default=0)
        per_pos = [sum(w.per_position[k] for w in ws if k < len(w.per_position)) for k in range(width)]
        out[name] = {
            "source": "prometheus counter deltas (server-wide, every request the server served in the windows)",
            "windows": len(ws),
            "requests": sum(w.requests for w in ws),
            "drafts": drafts,
            "draft_tokens": sum(w.draft_tokens for w in ws),
            "accepted_tokens": sum(w.accepted for w in ws),
            "acceptance_length": round(1 + sum(w.accepted for w in ws) / drafts, 4) if drafts else None,
            "per_position_acceptance": [round(c / drafts, 4) if drafts else None for c in per_pos],
        }
    return out


def _by_category(rows: Sequence[EvalRequestRow], ev: EvalSection) -> dict[str, Any]:
    categories: dict[str, list[EvalRequestRow]] = defaultdict(list)
    for r in rows:
        if not r.loop:
            categories[r.category or "(none)"].append(r)
    return {c: acceptance_figures(rs, resamples=ev.bootstrap, seed=ev.seed) for c, rs in sorted(categories.items())}


def _bootstrap_pairs(
    pairs: Sequence[tuple[float, float]], stat: Any, *, resamples: int, seed: int
) -> list[float] | None:
    return _ci(list(pairs), stat, resamples=resamples, seed=seed)


def paired_speedup(
    drafted: Sequence[EvalRequestRow], baseline: Sequence[EvalRequestRow], *, resamples: int, seed: int
) -> dict[str, Any] | None:
    """tokens/s of the drafter endpoint over the baseline's on the same prompts (paired by sample): the ratio of
    the mean tokens/s over the pairs, with a bootstrap interval over the pairs; None without two pairs."""
    base = {r.sample_pk: r.tokens_per_s for r in baseline if r.tokens_per_s}
    pairs = [(r.tokens_per_s, base[r.sample_pk]) for r in drafted if r.tokens_per_s and r.sample_pk in base]
    if not pairs:
        return None

    def ratio(ps: Sequence[tuple[float, float]]) -> float:
        return sum(p[0] for p in ps) / sum(p[1] for p in ps)

    return {
        "speedup": round(ratio(pairs), 3),
        "speedup_ci95": _bootstrap_pairs(pairs, ratio, resamples=resamples, seed=seed),
        "pairs": len(pairs),
        "tokens_per_s": round(sum(p[0] for p in pairs) / len(pairs), 3),
        "baseline_tokens_per_s": round(sum(p[1] for p in pairs) / len(pairs), 3),
    }


def _lengths_by_key(rows: Sequence[EvalRequestRow], key: Any) -> dict[Any, float]:
    """Each pairing key's mean acceptance length (loops and requests without figures left out)."""
    got: dict[Any, list[float]] = defaultdict(list)
    for r in rows:
        length = _length(r)
        if length is not None and not r.loop:
            got[key(r)].append(length)
    return {k: sum(v) / len(v) for k, v in got.items()}


def ab_compare(
    a: Sequence[EvalRequestRow],
    b: Sequence[EvalRequestRow],
    *,
    names: tuple[str, str],
    key_a: Any = None,
    key_b: Any = None,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Drafter B against drafter A: the difference of mean acceptance length (B − A, request-weighted, loops
    left out) with a bootstrap interval, paired by prompt (`key_a`/`key_b` give a row's prompt; default its
    sample) where at least two prompts are in both, else the two sets resampled apart."""
    la = _lengths_by_key(a, key_a or (lambda r: r.sample_pk))
    lb = _lengths_by_key(b, key_b or (lambda r: r.sample_pk))
    common = sorted(set(la) & set(lb), key=str)
    out: dict[str, Any] = {
        "a": names[0],
        "b": names[1],
        "requests_a": len(la),
        "requests_b": len(lb),
        "mean_a": round(sum(la.values()) / len(la), 4) if la else None,
        "mean_b": round(sum(lb.values()) / len(lb), 4) if lb else None,
        "paired": len(common) >= 2,
        "pairs": len(common),
        "difference": None,
        "difference_ci95": None,
    }
    if len(common) >= 2:
        diffs = [lb[k] - la[k] for k in common]
        out["difference"] = round(sum(diffs) / len(diffs), 4)
        out["difference_ci95"] = _ci(diffs, lambda v: sum(v) / len(v), resamples=resamples, seed=seed)
    elif la and lb:
        va, vb = list(la.values()), list(lb.values())
        out["difference"] = round(sum(vb) / len(vb) - sum(va) / len(va), 4)
        if len(va) >= 2 and len(vb) >= 2:
            rng = random.Random(seed)
            stats = sorted(
                sum(rng.choices(vb, k=len(vb))) / len(vb) - sum(rng.choices(va, k=len(va))) / len(va)
                for _ in range(resamples)
            )
            out["difference_ci95"] = [
                round(stats[int(0.025 * (resamples - 1))], 4),
                round(stats[int(0.975 * (resamples - 1))], 4),
            ]
    return out


def eval_report(
    rows: Sequence[EvalRequestRow],
    ev: EvalSection,
    *,
    drafter_endpoints: Sequence[str],
    baseline: str | None,
    excluded: Collection[int] = (),
) -> dict[str, Any]:
    """The whole report of an eval run as JSON-ready data; the samples in `excluded` (eval prompts also in the
    training data) are left out of every figure and counted."""
    by_endpoint: dict[str, list[EvalRequestRow]] = defaultdict(list)
    failed: dict[str, int] = defaultdict(int)
    left_out = 0
    for r in rows:
        if r.sample_pk in excluded:
            left_out += r.error is None
        elif r.error is not None:
            failed[r.endpoint] += 1
        else:
            by_endpoint[r.endpoint].append(r)
    base_rows = by_endpoint.get(baseline, []) if baseline else []
    base = _perf(base_rows) if baseline else None
    endpoints: dict[str, Any] = {}
    all_verdicts: list[dict[str, str]] = []
    drafted_rows: list[EvalRequestRow] = []
    for name in drafter_endpoints:
        got = by_endpoint.get(name, [])
        drafted_rows += got
        part = _part(got, ev)
        perf = _perf(got)
        paired = paired_speedup(got, base_rows, resamples=ev.bootstrap, seed=ev.seed) if base_rows else None
        found = verdicts(name, part, len(got), ev) + template_verdicts(name, got)
        all_verdicts += found
        endpoints[name] = {
            "answered": len(got),
            "failed": failed.get(name, 0),
            "no_acceptance": sum(1 for r in got if r.spec_source is None),
            **part,
            "by_category": _by_category(got, ev),
            "performance": perf,
            "speedup_vs_baseline": None if paired is None else paired["speedup"],
            "speedup": paired,
            "verdicts": found,
        }
    overall = {**_part(drafted_rows, ev), "by_category": _by_category(drafted_rows, ev)}
    ab = [
        ab_compare(
            by_endpoint.get(drafter_endpoints[0], []),
            by_endpoint.get(other, []),
            names=(drafter_endpoints[0], other),
            resamples=ev.bootstrap,
            seed=ev.seed,
        )
        for other in drafter_endpoints[1:]
    ]
    return {
        "drafter": ev.drafter,
        "sampling": {
            "temperature": ev.temperature,
            "top_p": ev.top_p,
            "top_k": ev.top_k,
            "max_tokens": ev.max_tokens,
            "thinking": ev.thinking,
        },
        "num_draft_tokens": ev.num_draft_tokens,
        "weighting": "mean_acceptance_length is request-weighted; token_weighted_acceptance_length weights by steps",
        "overlap_excluded": left_out,
        "overall": overall,
        "endpoints": endpoints,
        "ab": ab,
        "baseline": None
        if baseline is None
        else {"endpoint": baseline, "answered": len(base_rows), "performance": base},
        "verdicts": all_verdicts,
    }


def gate(report: dict[str, Any], min_acceptance: float) -> str | None:
    """Why the report fails `--min-acceptance` (the overall request-weighted mean, loops left out), or None."""
    mean = report["overall"]["figures"]["mean_acceptance_length"]
    if mean is None:
        return f"no request carried acceptance figures, so --min-acceptance {min_acceptance} cannot pass"
    if mean < min_acceptance:
        return f"mean acceptance length {mean:.3f} is below --min-acceptance {min_acceptance}"
    return None


def gates(report: dict[str, Any], thresholds: dict[str, float]) -> list[str]:
    """Every gate the report fails, one sentence each naming it: `thresholds` maps a category to its minimum
    mean acceptance length ("*": the whole run, `gate`); a category with no measured request fails its gate."""
    failures: list[str] = []
    for category, minimum in thresholds.items():
        if category == "*":
            failure = gate(report, minimum)
            if failure is not None:
                failures.append(failure)
            continue
        fig = report["overall"]["by_category"].get(category)
        mean = None if fig is None else fig["mean_acceptance_length"]
        if mean is None:
            failures.append(
                f"category {category!r}: no request carried acceptance figures, so --min-acceptance "
                f"{category}={minimum} cannot pass"
            )
        elif mean < minimum:
            failures.append(
                f"category {category!r}: mean acceptance length {mean:.3f} is below --min-acceptance "
                f"{category}={minimum}"
            )
    return failures


def _speedup_text(speedup: dict[str, Any] | None) -> str:
    if not speedup:
        return ""
    ci = speedup["speedup_ci95"]
    return (
        f", speedup {speedup['speedup']}x"
        + (f" [{ci[0]}, {ci[1]}]" if ci else "")
        + f" over {speedup['pairs']} prompts"
    )


def ab_text(ab: dict[str, Any]) -> str:
    """One A/B comparison as a line."""
    if ab["difference"] is None:
        return f"A/B {ab['b']} vs {ab['a']}: not comparable (no acceptance figures on one side)"
    ci = ab["difference_ci95"]
    how = f"paired over {ab['pairs']} prompts" if ab["paired"] else "unpaired"
    return (
        f"A/B {ab['b']} vs {ab['a']}: mean acceptance length {ab['mean_b']:.3f} vs {ab['mean_a']:.3f}, "
        f"difference {ab['difference']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "") + f" ({how})"
    )


def render_text(report: dict[str, Any]) -> str:
    """The report as lines for a terminal."""
    lines = [f"drafter {report['drafter']}  ({report['weighting']})"]

    def fig_line(label: str, fig: dict[str, Any]) -> str:
        if fig["mean_acceptance_length"] is None:
            return f"  {label}: no acceptance figures"
        ci = fig["mean_acceptance_length_ci95"]
        ci_text = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        pos = " ".join(f"{p:.3f}" for p in fig["per_position_acceptance"] if p is not None)
        eal = fig.get("expected_acceptance_length")
        return (
            f"  {label}: acceptance length {fig['mean_acceptance_length']:.3f}{ci_text} request-weighted, "
            f"{fig['token_weighted_acceptance_length']:.3f} token-weighted over {fig['requests']} requests"
            + (f", EAL {eal:.3f} from per-position rates" if eal is not None else "")
            + f"; per position {pos}; histogram {fig['histogram']}"
        )

    for name, ep in report["endpoints"].items():
        perf = ep["performance"]
        lines.append(
            f"{name}: {ep['answered']} answered, {ep['failed']} failed, {ep['loops']} loops, "
            f"{ep['no_acceptance']} without acceptance; {perf['tokens_per_s']} tok/s, TTFT {perf['ttft_ms']} ms, "
            f"ITL {perf['itl_ms']} ms" + _speedup_text(ep.get("speedup"))
        )
        lines.append(fig_line("without loops", ep["figures"]))
        if ep["loops"]:
            lines.append(fig_line("with loops", ep["figures_with_loops"]))
        for cat, fig in ep["by_category"].items():
            lines.append(fig_line(f"category {cat}", fig))
    if report["baseline"]:
        b = report["baseline"]
        lines.append(f"baseline {b['endpoint']}: {b['answered']} answered, {b['performance']['tokens_per_s']} tok/s")
    if report.get("overlap_excluded"):
        lines.append(f"{report['overlap_excluded']} answers to prompts also in the training data left out")
    for ab in report.get("ab", []):
        lines.append(ab_text(ab))
    for name, cw in (report.get("counter_windows") or {}).items():
        pos = " ".join(f"{p:.3f}" for p in cw["per_position_acceptance"] if p is not None)
        length = "n/a" if cw["acceptance_length"] is None else f"{cw['acceptance_length']:.3f}"
        lines.append(
            f"{name} (server counters, not per request): acceptance length {length} token-weighted over "
            f"{cw['drafts']} draft steps in {cw['windows']} windows; per position {pos}"
        )
    for v in report["verdicts"]:
        lines.append(f"VERDICT {v['verdict']}: {v['message']}")
    return "\n".join(lines)
