"""A server's speculative-decoding counters on its Prometheus `/metrics` (vLLM's names), read and differenced.

vLLM counts server-wide: `vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total` and `..._num_accepted_tokens_per_pos_total{position="k"}` (summed here over their
other labels). An endpoint whose answers carry no per-request figures can still be measured by the deltas of
these counters around a window of the run (what speculators' `evaluate.py` does per subset); such figures count
every request the server served in the window, eaglewatch's or not, so they are reported apart, never mixed with
per-request figures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

_LINE = re.compile(r"^(vllm:spec_decode_num_\w+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+|NaN)$")
_POSITION = re.compile(r'position="(\d+)"')


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """The counters at one scrape (`per_position[k]`: accepted tokens at draft position k)."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]

    def minus(self, before: SpecCounters) -> SpecCounters:
        """The deltas since `before` (a position `before` lacked counts from zero)."""
        width = max(len(self.per_position), len(before.per_position))
        pos = [
            (self.per_position[k] if k < len(self.per_position) else 0)
            - (before.per_position[k] if k < len(before.per_position) else 0)
            for k in range(width)
        ]
        return SpecCounters(
            self.drafts - before.drafts, self.draft_tokens - before.draft_tokens, self.accepted - before.accepted,
            tuple(pos),
        )  # fmt: skip


def parse_counters(text: str) -> SpecCounters | None:
    """The spec-decode counters in a Prometheus text page, or None when it has none (drafting off, or no vLLM)."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m is None:
            continue
        name, labels, value = m.group(1).removeprefix("vllm:spec_decode_num_"), m.group(2) or "", m.group(3)
        number = 0.0 if value == "NaN" else float(value)
        if name == "accepted_tokens_per_pos":
            pos = _POSITION.search(labels)
            if pos is not None:
                per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0.0) + number
        else:
            totals[name] = totals.get(name, 0.0) + number
    if "drafts" not in totals:
        return None
    width = max(per_pos, default=-1) + 1
    return SpecCounters(
        int(totals.get("drafts", 0)),
        int(totals.get("draft_tokens", 0)),
        int(totals.get("accepted_tokens", 0)),
        tuple(int(per_pos.get(k, 0)) for k in range(width)),
    )


def metrics_url(base_url: str) -> str:
    """`/metrics` beside an OpenAI base URL (`http://h:p/v1` -> `http://h:p/metrics`)."""
    return base_url.rstrip("/").removesuffix("/v1") + "/metrics"


async def scrape(client: httpx.AsyncClient, base_url: str) -> SpecCounters | None:
    """The counters of the server at `base_url`, or None when /metrics is missing, fails, or has none."""
    try:
        response = await client.get(metrics_url(base_url), timeout=10.0)
    except (httpx.HTTPError, OSError):
        return None
    if response.status_code != 200:
        return None
    return parse_counters(response.text)
