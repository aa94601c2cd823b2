"""What server each endpoint is, so its known text steps (app.tokens.server_steps) and its ground truth apply.

In order: the endpoint's `server =`; its simulator's personality; the host (openrouter.ai); what its
`GET /models` answer and headers say (app.providers.servers.server_from_models). A server that says nothing
stays unknown: its text reconstructions are *unverified* until probes, a trusted twin or `server =` tell more.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from app.config import Endpoint as EndpointConfig
    from app.engine.capacity.endpoints import Endpoint

IDENTIFY_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Identity:
    """An endpoint's server kind (None: unknown) and how it was found ("config", "personality", "host",
    "GET /models", or why it could not be)."""

    kind: str | None
    how: str


async def identify(endpoints: Sequence[Endpoint]) -> list[Identity]:
    """The Identity of each live endpoint (app.engine.capacity.endpoints.Endpoint), asking `GET /models` only of
    endpoints whose config does not say and whose client the engine built."""
    from app.providers.servers import server_kind

    async def one(ep: Endpoint) -> Identity:
        cfg = ep.config
        if getattr(cfg, "server", None):
            return Identity(str(cfg.server), "config")
        kind = server_kind(cfg)
        if kind:
            return Identity(kind, "personality")
        base = getattr(cfg, "base_url", None)
        if not base or not getattr(ep, "owned", True):
            return Identity(None, "not asked (no base_url of its own)")
        if (urlsplit(base).hostname or "").endswith("openrouter.ai"):
            return Identity("openrouter", "host")
        return await _ask_models(cfg, base)

    return list(await asyncio.gather(*(one(ep) for ep in endpoints)))


async def _ask_models(cfg: EndpointConfig, base_url: str) -> Identity:
    import httpx

    from app.engine.capacity.endpoints import _api_key
    from app.providers.servers import server_from_models

    headers = {}
    try:
        key = _api_key(cfg)
    except Exception:
        key = None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        async with httpx.AsyncClient(timeout=IDENTIFY_TIMEOUT_S) as client:
            response = await client.get(base_url.rstrip("/") + "/models", headers=headers)
        if response.status_code != 200:
            return Identity(None, f"GET /models answered {response.status_code}")
        kind = server_from_models(json.loads(response.content), dict(response.headers))
    except (httpx.HTTPError, ValueError) as exc:
        return Identity(None, f"GET /models failed ({type(exc).__name__})")
    return Identity(kind, "GET /models" if kind else "GET /models did not say")
