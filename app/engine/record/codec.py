"""The live part of a run's record <-> JSON, for the heartbeat row an attached reader reads (app.store.heartbeat).

Only the live figures travel: an attached reader takes the counts from the store's tallies itself.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

from app.engine.record.snapshot import EndpointLive, LiveFigures, Rate, RunRecord


def snapshot_to_json(record: RunRecord | LiveFigures) -> str:
    """Compact JSON of the live figures (of a record: its `live` part; a record without one writes its state)."""
    live = record if isinstance(record, LiveFigures) else record.live
    if live is None:
        live = LiveFigures(record.state, record.state_reason)
    return json.dumps(asdict(live), separators=(",", ":"))


def live_from_json(text: str) -> LiveFigures:
    """The live figures written by `snapshot_to_json`; unknown keys (a newer writer) are ignored, missing ones
    default. Raises ValueError / TypeError / KeyError on a torn or foreign row."""
    data = json.loads(text)
    if not isinstance(data, dict) or "state" not in data:
        raise ValueError("not a heartbeat's live figures")
    return _build(LiveFigures, data)


def _build(cls: type, data: dict[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            continue
        if key == "rate" and isinstance(value, dict):
            value = _build(Rate, value)
        elif key == "endpoints":
            value = tuple(_build(EndpointLive, e) for e in value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)
