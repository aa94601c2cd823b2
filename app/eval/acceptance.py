"""The server's acceptance figures of one answer, read as the server gave them.

vLLM (`--per-request-spec-decode-metrics summary|detailed`): `metrics.speculative_decoding` on the body, or on the
last chunk of a stream, with `num_accepted_draft_tokens`, `num_draft_tokens`, `num_spec_steps`, `num_spec_tokens`,
`acceptance_histogram` (index k = steps that accepted k draft tokens) and, when detailed, `per_step_accepted`.
SGLang (`return_meta_info`): `meta_info.spec_accept_token_num`, `spec_verify_ct`, `spec_accept_histogram`.

The count of steps that accepted draft position k (0-based) is the number of steps that accepted more than k draft
tokens: read from `per_step_accepted` when given, else from the histogram. An answer without figures gives None:
an endpoint that reports no acceptance is named, never averaged in as zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VLLM_HINT = (
    "start vLLM with --speculative-config (the drafter) and --per-request-spec-decode-metrics summary (or "
    "detailed); SGLang: a speculative algorithm and return_meta_info in the endpoint's extra"
)


@dataclass(frozen=True, slots=True)
class SpecFigures:
    """One answer's acceptance as its server reported it. `per_position[k]`: steps that accepted draft position k."""

    source: str  # vllm | sglang
    spec: dict[str, Any]
    accepted: int
    steps: int
    drafted: int | None
    per_position: tuple[int, ...] | None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _per_position(
    steps: Sequence[Any] | None, histogram: Sequence[Any] | None, k: int | None
) -> tuple[int, ...] | None:
    if isinstance(steps, list) and all(_int(n) is not None for n in steps):
        width = k or max(steps, default=0)
        return tuple(sum(1 for n in steps if n > j) for j in range(width))
    if isinstance(histogram, list) and all(_int(n) is not None for n in histogram) and histogram:
        width = k or len(histogram) - 1
        return tuple(sum(histogram[j + 1 :]) for j in range(width))
    return None


def _vllm(spec: Mapping[str, Any]) -> SpecFigures | None:
    accepted, steps = _int(spec.get("num_accepted_draft_tokens")), _int(spec.get("num_spec_steps"))
    if accepted is None or steps is None:
        return None
    k = _int(spec.get("num_spec_tokens"))
    per_position = _per_position(spec.get("per_step_accepted"), spec.get("acceptance_histogram"), k)
    return SpecFigures("vllm", dict(spec), accepted, steps, _int(spec.get("num_draft_tokens")), per_position)


def _sglang(meta: Mapping[str, Any]) -> SpecFigures | None:
    accepted, steps = _int(meta.get("spec_accept_token_num")), _int(meta.get("spec_verify_ct"))
    if accepted is None or steps is None:
        return None
    spec = {k: v for k, v in meta.items() if str(k).startswith("spec_")}
    return SpecFigures(
        "sglang", spec, accepted, steps, None, _per_position(None, meta.get("spec_accept_histogram"), None)
    )


def _from_object(body: Any) -> SpecFigures | None:
    if not isinstance(body, Mapping):
        return None
    metrics = body.get("metrics")
    if isinstance(metrics, Mapping) and isinstance(metrics.get("speculative_decoding"), Mapping):
        return _vllm(metrics["speculative_decoding"])
    places = [body.get("meta_info")] + [c.get("meta_info") for c in body.get("choices") or () if isinstance(c, Mapping)]
    for meta in places:
        if isinstance(meta, Mapping) and "spec_verify_ct" in meta:
            return _sglang(meta)
    return None


def spec_figures(raw: Any) -> SpecFigures | None:
    """The figures of an answer's raw body (a dict) or stream (a list of chunk dicts; the last that has them)."""
    if isinstance(raw, list):
        for chunk in reversed(raw):
            found = _from_object(chunk)
            if found is not None:
                return found
        return None
    return _from_object(raw)
