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
from collections.abc import Iterable, Sequence
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
        "histogram": histogram,
    }


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
                "message": f"{endpoint}: {answered} answers carried no acceptance figures; {VLLM_HINT}",
            }
        )
    mean = fig["mean_acceptance_length"]
    if mean is not None and fig["requests"] >= ev.dead_after and mean <= ev.dead_below:
        out.append(
            {
                "verdict": "dead drafter",
                "message": f"{endpoint}: mean acceptance length {mean:.3f} over {fig['requests']} requests (at or "
                f"below {ev.dead_below}): the drafter is dead. Likely causes: {DEAD_CAUSES}",
            }
        )
    if part["loops"]:
        with_loops = part["figures_with_loops"]["mean_acceptance_length"]
        out.append(
            {
                "verdict": "repetition loops",
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


def eval_report(
    rows: Sequence[EvalRequestRow], ev: EvalSection, *, drafter_endpoints: Sequence[str], baseline: str | None
) -> dict[str, Any]:
    """The whole report of an eval run as JSON-ready data."""
    by_endpoint: dict[str, list[EvalRequestRow]] = defaultdict(list)
    failed: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.error is not None:
            failed[r.endpoint] += 1
        else:
            by_endpoint[r.endpoint].append(r)
    base = _perf(by_endpoint.get(baseline, [])) if baseline else None
    endpoints: dict[str, Any] = {}
    all_verdicts: list[dict[str, str]] = []
    drafted_rows: list[EvalRequestRow] = []
    for name in drafter_endpoints:
        got = by_endpoint.get(name, [])
        drafted_rows += got
        part = _part(got, ev)
        categories: dict[str, list[EvalRequestRow]] = defaultdict(list)
        for r in got:
            categories[r.category or "(none)"].append(r)
        perf = _perf(got)
        speedup = None
        if base and base["tokens_per_s"] and perf["tokens_per_s"]:
            speedup = round(perf["tokens_per_s"] / base["tokens_per_s"], 3)
        found = verdicts(name, part, len(got), ev) + template_verdicts(name, got)
        all_verdicts += found
        endpoints[name] = {
            "answered": len(got),
            "failed": failed.get(name, 0),
            "no_acceptance": sum(1 for r in got if r.spec_source is None),
            **part,
            "by_category": {
                c: acceptance_figures([r for r in rs if not r.loop], resamples=ev.bootstrap, seed=ev.seed)
                for c, rs in sorted(categories.items())
            },
            "performance": perf,
            "speedup_vs_baseline": speedup,
            "verdicts": found,
        }
    overall = _part(drafted_rows, ev)
    return {
        "drafter": ev.drafter,
        "sampling": {"temperature": ev.temperature, "top_p": ev.top_p, "top_k": ev.top_k, "max_tokens": ev.max_tokens},
        "num_draft_tokens": ev.num_draft_tokens,
        "weighting": "mean_acceptance_length is request-weighted; token_weighted_acceptance_length weights by steps",
        "overall": overall,
        "endpoints": endpoints,
        "baseline": None
        if baseline is None
        else {"endpoint": baseline, "answered": len(by_endpoint.get(baseline, [])), "performance": base},
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


def render_text(report: dict[str, Any]) -> str:
    """The report as lines for a terminal."""
    lines = [f"drafter {report['drafter']}  ({report['weighting']})"]

    def fig_line(label: str, fig: dict[str, Any]) -> str:
        if fig["mean_acceptance_length"] is None:
            return f"  {label}: no acceptance figures"
        ci = fig["mean_acceptance_length_ci95"]
        ci_text = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        pos = " ".join(f"{p:.3f}" for p in fig["per_position_acceptance"] if p is not None)
        return (
            f"  {label}: acceptance length {fig['mean_acceptance_length']:.3f}{ci_text} request-weighted, "
            f"{fig['token_weighted_acceptance_length']:.3f} token-weighted over {fig['requests']} requests; "
            f"per position {pos}; histogram {fig['histogram']}"
        )

    for name, ep in report["endpoints"].items():
        perf = ep["performance"]
        lines.append(
            f"{name}: {ep['answered']} answered, {ep['failed']} failed, {ep['loops']} loops, "
            f"{ep['no_acceptance']} without acceptance; {perf['tokens_per_s']} tok/s, TTFT {perf['ttft_ms']} ms, "
            f"ITL {perf['itl_ms']} ms"
            + (f", speedup {ep['speedup_vs_baseline']}x" if ep["speedup_vs_baseline"] else "")
        )
        lines.append(fig_line("without loops", ep["figures"]))
        if ep["loops"]:
            lines.append(fig_line("with loops", ep["figures_with_loops"]))
        for cat, fig in ep["by_category"].items():
            lines.append(fig_line(f"category {cat}", fig))
    if report["baseline"]:
        b = report["baseline"]
        lines.append(f"baseline {b['endpoint']}: {b['answered']} answered, {b['performance']['tokens_per_s']} tok/s")
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
