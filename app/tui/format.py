"""Number and time formatting for the monitor (pure functions, no Textual)."""

from __future__ import annotations

import time

from app.engine.money.budget import usd as _usd


def duration(seconds: float | None) -> str:
    """`1h02m03s`-style duration, or "-" when unknown."""
    if seconds is None or seconds < 0:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def money(usd: float | None) -> str:
    """Dollars with cents (or four decimals under a dollar), "-" when unknown, never NaN or inf
    (`app.engine.money.budget.usd`, the one money format of every face)."""
    return _usd(usd)


def ms(value: float | None) -> str:
    """Milliseconds as `123 ms` / `1.2 s`, "-" when unknown."""
    if value is None:
        return "-"
    return f"{value / 1000:.1f} s" if value >= 1000 else f"{value:.0f} ms"


def short_ms(value: float | None) -> str:
    """`310ms` / `6.4s` / `12s` / `4m10s`: at most 5 cells, for compact tiles ("-" when unknown)."""
    if value is None:
        return "-"
    if value < 1000:
        return f"{value:.0f}ms"
    if value < 10_000:
        return f"{value / 1000:.1f}s"
    if value < 100_000:
        return f"{value / 1000:.0f}s"
    return duration(value / 1000)


def count(n: int) -> str:
    """`999` / `1.2k` / `12k` / `123k` / `1.2M`: a count rounded to at most 4 cells, for a tile line that does not
    fit with the exact number (`9,999`)."""
    # rounded down, so no count rounds up into a fifth cell (9,999 is 9.9k, not 10.0k)
    if n < 1_000:
        return str(n)
    if n < 10_000:
        return f"{n // 100 / 10:.1f}k"
    if n < 1_000_000:
        return f"{n // 1000}k"
    if n < 10_000_000:
        return f"{n // 100_000 / 10:.1f}M"
    return f"{n // 1_000_000}M"


def percent(part: int, whole: int) -> str:
    """`12.3%` of whole, "-" when whole is zero."""
    return f"{100 * part / whole:.1f}%" if whole else "-"


def bar(fraction: float, width: int) -> str:
    """A text bar of `width` cells filled to `fraction` (clamped to 0..1)."""
    fraction = min(max(fraction, 0.0), 1.0)
    full = int(round(fraction * width))
    return "█" * full + "░" * (width - full)


def clock(ts: float | None) -> str:
    """A unix time as UTC `HH:MM:SS` (UTC, so screenshots do not depend on the machine's zone)."""
    if ts is None:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.gmtime(ts))
