"""MetricsSnapshot <-> JSON, for the heartbeat row an attached viewer reads (app.store.heartbeat)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

from app.engine.snapshot import EndpointSnapshot, FidelitySnapshot, MetricsSnapshot, Rate


def snapshot_to_json(snapshot: MetricsSnapshot) -> str:
    """Compact JSON of every field (tuples become lists)."""
    return json.dumps(asdict(snapshot), separators=(",", ":"))


def snapshot_from_json(text: str) -> MetricsSnapshot:
    """The snapshot written by `snapshot_to_json`; unknown keys (a newer writer) are ignored, missing ones default."""
    data = json.loads(text)
    return _build(MetricsSnapshot, data)


def _build(cls: type, data: dict[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            continue
        if key == "rate" and isinstance(value, dict):
            value = _build(Rate, value)
        elif key == "endpoints":
            value = tuple(_build(EndpointSnapshot, e) for e in value)
        elif key == "fidelity":
            value = tuple(_build(FidelitySnapshot, e) for e in value)
        elif key in ("errors_by_class", "verdicts", "strategies", "prompt_checks"):
            value = tuple((str(k), int(n)) for k, n in value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)
