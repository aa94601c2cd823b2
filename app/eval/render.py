"""The eval report as Markdown and as an SVG picture, both written by hand from the report's JSON-ready data.

The picture has, per drafter endpoint, three panels side by side: mean acceptance length by category (a bar per
category with its 95 % interval), acceptance per draft position (a bar per position), and the histogram of steps
by drafts accepted (as shares). Its scales are fixed (acceptance length from 1 to 1 + the draft tokens, rates and
shares from 0 to 1), so pictures of two runs or two drafters are comparable side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

WIDTH, HEIGHT = 960, 340
ROW_H = 290  # one more drafter endpoint adds a row of panels
PANEL_W, PANEL_H = 280, 200
TOP, LEFT = 60, 40
BAR = "#4c78a8"
WHISKER = "#222222"


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ci(ci: list[float] | None) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "—"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown document: figures per endpoint and category, speedup, A/B, verdicts."""
    lines = [
        f"# Eval of {_cell(report['drafter'])} (run {_cell(report.get('run', ''))})",
        "",
        f"{report['weighting']}. Sampling: "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in report["sampling"].items())
        + f"; {report['num_draft_tokens']} draft tokens.",
        "",
        "## Acceptance",
        "",
        "| endpoint | category | requests | mean AL | 95 % CI | token-weighted | EAL | per position |",
        "|---|---|---:|---:|---|---:|---:|---|",
    ]

    def row(endpoint: str, category: str, fig: dict[str, Any]) -> str:
        pos = " ".join(_fmt(p) for p in fig["per_position_acceptance"])
        return (
            f"| {_cell(endpoint)} | {_cell(category)} | {fig['requests']} | {_fmt(fig['mean_acceptance_length'])} | "
            f"{_ci(fig['mean_acceptance_length_ci95'])} | {_fmt(fig['token_weighted_acceptance_length'])} | "
            f"{_fmt(fig.get('expected_acceptance_length'))} | {pos} |"
        )

    for name, ep in report["endpoints"].items():
        lines.append(row(name, "all", ep["figures"]))
        if ep["loops"]:
            lines.append(row(name, "all, loops included", ep["figures_with_loops"]))
        for cat, fig in ep["by_category"].items():
            lines.append(row(name, cat, fig))
    lines += [
        "",
        "## Speed",
        "",
        "| endpoint | tok/s | TTFT ms | ITL ms | speedup | 95 % CI | pairs |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, ep in report["endpoints"].items():
        perf, sp = ep["performance"], ep.get("speedup") or {}
        lines.append(
            f"| {_cell(name)} | {_fmt(perf['tokens_per_s'])} | {_fmt(perf['ttft_ms'])} | {_fmt(perf['itl_ms'])} | "
            f"{_fmt(sp.get('speedup'))} | {_ci(sp.get('speedup_ci95'))} | {_fmt(sp.get('pairs'))} |"
        )
    if report.get("baseline"):
        b = report["baseline"]
        perf = b["performance"]
        lines.append(
            f"| {_cell(b['endpoint'])} (baseline) | {_fmt(perf['tokens_per_s'])} | {_fmt(perf['ttft_ms'])} | "
            f"{_fmt(perf['itl_ms'])} | 1 | — | — |"
        )
    comparisons = list(report.get("ab", [])) + ([report["against"]] if report.get("against") else [])
    if comparisons:
        lines += [
            "",
            "## A/B",
            "",
            "| A | B | mean A | mean B | B − A | 95 % CI | paired |",
            "|---|---|---:|---:|---:|---|---|",
        ]
        for ab in comparisons:
            lines.append(
                f"| {_cell(ab['a'])} | {_cell(ab['b'])} | {_fmt(ab['mean_a'])} | {_fmt(ab['mean_b'])} | "
                f"{_fmt(ab['difference'])} | {_ci(ab['difference_ci95'])} | "
                f"{'yes, ' + str(ab['pairs']) + ' prompts' if ab['paired'] else 'no'} |"
            )
    lines += ["", "## Verdicts", ""]
    if not report["verdicts"]:
        lines.append("None.")
    for v in report["verdicts"]:
        lines.append(f"- **{_cell(v['verdict'])}** ({v.get('level', 'warning')}): {_cell(v['message'])}")
    gate = report.get("gate")
    if gate:
        lines += ["", "## Gate", ""]
        failures = gate.get("failures") or []
        lines += [f"- failed: {_cell(f)}" for f in failures] or ["Passed."]
    return "\n".join(lines) + "\n"


def _text(x: float, y: float, text: str, *, size: int = 11, anchor: str = "middle", weight: str = "normal") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}">'
        f"{escape(text)}</text>"
    )


def _panel(
    x0: float,
    title: str,
    bars: Sequence[tuple[str, float | None, list[float] | None]],
    lo: float,
    hi: float,
    ticks: list[float],
    top: float = TOP,
) -> list[str]:
    """One bar panel at (x0, top): `bars` are (label, value, interval or None) on a fixed scale lo..hi."""
    out = [_text(x0 + PANEL_W / 2, top - 20, title, size=13, weight="bold")]
    y_of = lambda v: top + PANEL_H - (min(max(v, lo), hi) - lo) / (hi - lo) * PANEL_H  # noqa: E731
    out.append(f'<line x1="{x0}" y1="{top}" x2="{x0}" y2="{top + PANEL_H}" stroke="#888"/>')
    out.append(f'<line x1="{x0}" y1="{top + PANEL_H}" x2="{x0 + PANEL_W}" y2="{top + PANEL_H}" stroke="#888"/>')
    for t in ticks:
        y = y_of(t)
        out.append(f'<line x1="{x0 - 4}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(_text(x0 - 6, y + 4, f"{t:g}", size=10, anchor="end"))
    if not bars:
        out.append(_text(x0 + PANEL_W / 2, top + PANEL_H / 2, "no figures", size=11))
        return out
    slot = PANEL_W / len(bars)
    width = min(slot * 0.7, 48)
    for i, (label, value, ci) in enumerate(bars):
        cx = x0 + slot * (i + 0.5)
        if value is not None:
            y = y_of(value)
            out.append(
                f'<rect x="{cx - width / 2:.1f}" y="{y:.1f}" width="{width:.1f}" height="{top + PANEL_H - y:.1f}" '
                f'fill="{BAR}"><title>{escape(label)}: {value:.3f}</title></rect>'
            )
            above = min(y, y_of(ci[1])) if ci else y  # the label clears the interval's whisker
            out.append(_text(cx, above - 4, f"{value:.2f}", size=10))
        if ci:
            y1, y2 = y_of(ci[0]), y_of(ci[1])
            out.append(f'<line x1="{cx:.1f}" y1="{y1:.1f}" x2="{cx:.1f}" y2="{y2:.1f}" stroke="{WHISKER}"/>')
            for y in (y1, y2):
                out.append(f'<line x1="{cx - 5:.1f}" y1="{y:.1f}" x2="{cx + 5:.1f}" y2="{y:.1f}" stroke="{WHISKER}"/>')
        out.append(_text(cx, top + PANEL_H + 14, label[:12], size=10))
    return out


def _figure_rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(label, figures, figures by category) per drafter endpoint; the overall ones when there is none."""
    rows = [(f"endpoint {name}", ep["figures"], ep["by_category"]) for name, ep in report["endpoints"].items()]
    return rows or [("all endpoints", report["overall"]["figures"], report["overall"].get("by_category", {}))]


def render_svg(report: dict[str, Any]) -> str:
    """The picture of the report: per drafter endpoint (loops left out) a row of three panels on fixed scales."""
    rows = _figure_rows(report)
    height = HEIGHT + (len(rows) - 1) * ROW_H
    k = max([int(report.get("num_draft_tokens") or 1)] + [len(fig["per_position_acceptance"]) for _, fig, _ in rows])
    step = 0.5 if k <= 4 else 1.0
    al_ticks = [1 + step * i for i in range(int(k / step) + 1)]
    rate_ticks = [0.0, 0.25, 0.5, 0.75, 1.0]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        _text(WIDTH / 2, 18, f"{report['drafter']} · run {report.get('run', '')}", size=14, weight="bold"),
    ]
    for n, (label, fig, by_category) in enumerate(rows):
        top = TOP + 20 + n * ROW_H
        parts.append(_text(LEFT, top - 42, f"{label} · {fig['requests']} requests", size=12, anchor="start"))
        categories = [("all", fig["mean_acceptance_length"], fig["mean_acceptance_length_ci95"])]
        categories += [
            (c, f["mean_acceptance_length"], f["mean_acceptance_length_ci95"]) for c, f in by_category.items()
        ]
        positions = [(f"pos {i + 1}", p, None) for i, p in enumerate(fig["per_position_acceptance"])]
        steps = sum(fig["histogram"])
        histogram = [(str(i), c / steps if steps else None, None) for i, c in enumerate(fig["histogram"])]
        parts += _panel(LEFT, "acceptance length by category", categories, 1.0, 1.0 + k, al_ticks, top)
        parts += _panel(LEFT + 320, "acceptance per draft position", positions, 0.0, 1.0, rate_ticks, top)
        parts += _panel(LEFT + 640, "steps by drafts accepted (share)", histogram, 0.0, 1.0, rate_ticks, top)
    verdicts = ", ".join(v["verdict"] for v in report["verdicts"]) or "none"
    parts.append(_text(WIDTH / 2, height - 12, f"verdicts: {verdicts}", size=11))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
