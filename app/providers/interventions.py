"""What a server says it did to a request or its answer, read at the body boundary.

OpenRouter, asked with `X-OpenRouter-Metadata: enabled` (app.providers.client), adds `openrouter_metadata` to the
final SSE chunk and to a non-streaming body (OpenRouterTeam/docs `guides/features/router-metadata.mdx`;
../shared/reference/drafter-eval-2026-12.md "Tokens the model never sampled"):

    {"requested": "<model>", "strategy": "<routing>", "attempt": 2,
     "attempts": [{"provider": "A", "status": 503}, {"provider": "B", "status": 200}],
     "pipeline": ["context_compression", {"stage": "response_healing", ...}]}

`attempt` > 1 is a fallback to another provider; each `pipeline` stage is a rewrite of the prompt or the answer
(`context_compression` drops the middle of the prompt; `response_healing` rewrites the answer's JSON). Either
means the sample's tokens are not the model's answer to the rendered prompt.

The reader is tolerant: metadata is informational, so a field of the wrong shape never fails an answer that is
otherwise sound (that would retry a good answer forever). What cannot be read is itself recorded
(`metadata_unreadable`, naming the field), since an unread report cannot prove that nothing happened. Sizes are
bounded: at most MAX_ATTEMPTS attempts and MAX_STAGES stages are read, names cut at MAX_NAME characters.
"""

from __future__ import annotations

from typing import Any

from app.records import Intervention

# the kinds this reader produces (app.engine.interventions.KINDS holds every kind)
CONTEXT_COMPRESSION = "context_compression"
RESPONSE_HEALING = "response_healing"
PROVIDER_FALLBACK = "provider_fallback"
PIPELINE_STAGE = "pipeline_stage"  # any other stage OpenRouter reports running (guardrail, server_tools, ...)
METADATA_UNREADABLE = "metadata_unreadable"

METADATA_FIELD = "openrouter_metadata"
MAX_ATTEMPTS = 32
MAX_STAGES = 32
MAX_NAME = 80
# stage names that are their own kind; any other stage is a PIPELINE_STAGE naming it
_OWN_KIND = {CONTEXT_COMPRESSION: CONTEXT_COMPRESSION, RESPONSE_HEALING: RESPONSE_HEALING}
# a stage object's name is under the first of these keys that holds a string
_STAGE_NAME_KEYS = ("stage", "name", "type", "id")


def _name(value: Any) -> str | None:
    """A short printable name, or None when `value` is not a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    return text if len(text) <= MAX_NAME else text[: MAX_NAME - 1] + "…"


def read_openrouter_metadata(value: Any, where: str) -> tuple[Intervention, ...]:
    """The interventions an `openrouter_metadata` object at `where` reports (() for None or a clean report)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        return (Intervention(METADATA_UNREADABLE, f"{where} should be an object, got {type(value).__name__}"),)
    found: list[Intervention] = []
    found.extend(_fallback(value, where))
    found.extend(_pipeline(value.get("pipeline"), f"{where}.pipeline"))
    return tuple(found)


def _fallback(meta: dict, where: str) -> list[Intervention]:
    attempt = meta.get("attempt")
    if attempt is None:
        return []
    if type(attempt) is not int or attempt < 1:
        return [
            Intervention(METADATA_UNREADABLE, f"{where}.attempt should be a positive integer, got {attempt!r}"[:200])
        ]
    if attempt == 1:
        return []
    tried: list[str] = []
    attempts = meta.get("attempts")
    if isinstance(attempts, list):
        for item in attempts[:MAX_ATTEMPTS]:
            if not isinstance(item, dict):
                continue
            provider = _name(item.get("provider")) or "?"
            status = item.get("status")
            tried.append(f"{provider} ({status})" if type(status) in (int, str) else provider)
    detail = f"OpenRouter answered on attempt {attempt}"
    if tried:
        detail += ": tried " + ", ".join(tried)
    requested = _name(meta.get("requested"))
    if requested:
        detail += f"; requested {requested}"
    return [Intervention(PROVIDER_FALLBACK, detail)]


def _pipeline(stages: Any, where: str) -> list[Intervention]:
    if stages is None:
        return []
    if not isinstance(stages, list):
        return [Intervention(METADATA_UNREADABLE, f"{where} should be a list, got {type(stages).__name__}")]
    found: list[Intervention] = []
    for i, stage in enumerate(stages[:MAX_STAGES]):
        name = _name(stage)
        if name is None and isinstance(stage, dict):
            name = next((n for n in (_name(stage.get(k)) for k in _STAGE_NAME_KEYS) if n), None)
        if name is None:
            found.append(Intervention(METADATA_UNREADABLE, f"{where}[{i}] names no stage"))
            continue
        kind = _OWN_KIND.get(name.replace("-", "_"), PIPELINE_STAGE)
        found.append(Intervention(kind, f"OpenRouter ran the {name} stage on this request"))
    return found
