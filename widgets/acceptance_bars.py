"""Acceptance bars: one bar per draft position, the share of steps that accepted it, in plain text."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

BLOCKS = " ▏▎▍▌▋▊▉█"


def bar_cells(share: float, width: int) -> str:
    """A bar `width` cells wide filled to `share` (0..1) in eighths of a cell."""
    share = min(max(share, 0.0), 1.0)
    eighths = int(round(share * width * 8))
    full, part = divmod(eighths, 8)
    text = "█" * full + (BLOCKS[part] if part and full < width else "")
    return text + " " * (width - len(text))


def acceptance_lines(shares: Sequence[float], width: int, rows: int) -> list[Text]:
    """At most `rows` lines `p1 ████▌    62%` of at most `width` cells; when the positions outnumber the rows the
    last line says how many more there are (never a position cut in half)."""
    if not shares:
        return [Text("no per-position figures yet", style="dim")]
    shown = list(shares) if len(shares) <= rows else list(shares[: max(rows - 1, 0)])
    label_w = len(f"p{len(shares)}")
    bar_w = max(width - label_w - 6, 1)
    out: list[Text] = []
    for k, share in enumerate(shown):
        line = Text(no_wrap=True)
        line.append(f"p{k + 1}".ljust(label_w) + " ", style="bold")
        line.append(bar_cells(share, bar_w), style="green")
        line.append(f"{100 * share:4.0f}%")
        out.append(line)
    if len(shown) < len(shares):
        rest = shares[len(shown) :]
        out.append(Text(f"p{len(shown) + 1}-p{len(shares)}: " + " ".join(f"{100 * s:.0f}%" for s in rest)))
    return out
