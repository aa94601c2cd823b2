"""Building a run's endpoints: each one's client, adaptive limit and metrics; built-in simulators started.

`open_endpoints` turns the config's `[[endpoints]]` into live `Endpoint`s (a simulator endpoint gets its
server started on loopback first; an `api_key_env` is read here, never stored) and `close_endpoints` undoes
it. The run's configured concurrency min/initial/max are a total that each endpoint gets its weight's share of.
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from app.config import Endpoint as EndpointConfig
from app.config import RunConfig, url_secret_problem
from app.engine.capacity.limiter import AdaptiveLimit
from app.engine.record.metrics import EndpointMetrics
from app.errors import InputError
from app.records import Completion


class CompletionClient(Protocol):
    """What the engine needs of a client: one chat completion per call (`app.providers.client.ChatClient`)."""

    async def complete(
        self,
        messages: list[dict],
        tools: list | None = None,
        *,
        model: str,
        extra: dict | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> Completion: ...


class Closable(Protocol):
    async def close(self) -> None: ...


@dataclass
class Endpoint:
    """What the engine keeps per endpoint: its config, client, limit and metrics."""

    config: EndpointConfig
    client: CompletionClient
    limit: AdaptiveLimit
    metrics: EndpointMetrics
    owned: bool = True  # the engine built the client (and closes it); False for a client the caller passed

    @property
    def name(self) -> str:
        return self.config.name


@dataclass
class Endpoints:
    """The run's live endpoints and the simulators started for them."""

    items: list[Endpoint] = field(default_factory=list)
    simulators: list[Closable] = field(default_factory=list)


def share_limits(config: RunConfig) -> list[AdaptiveLimit]:
    """One AdaptiveLimit per endpoint: the configured min/initial/max split by weight (each at least 1)."""
    lim = config.limits
    total_w = sum(e.weight for e in config.endpoints)
    out = []
    for ep in config.endpoints:
        share = ep.weight / total_w
        maximum = max(1, min(ep.max_concurrency, math.ceil(lim.concurrency_max * share)))
        minimum = min(max(1, math.floor(lim.concurrency_min * share)), maximum)
        # no concurrency_initial: start at the maximum, as a fixed-concurrency client does (a hidden cap below
        # it costs one refusal per excess request, once; starting lower costs round trips of slow start)
        start = lim.concurrency_max if lim.concurrency_initial is None else lim.concurrency_initial
        initial = min(maximum, max(minimum, round(start * share)))
        out.append(AdaptiveLimit(initial, minimum, maximum))
    return out


def check_base_url(ep: EndpointConfig) -> None:
    """Refuse a base_url the client cannot use safely: credentials in it (`user:key@host`, `?api-key=...`) would
    reach logs and the database with the URL, so the key belongs in `api_key_env`. The config refuses them at
    load (`app.config.url_secret_problem`); this holds for an endpoint built in code too."""
    if ep.base_url is None:
        return
    try:
        urlsplit(ep.base_url).port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise InputError(
            f"endpoint {ep.name!r}: base_url is not a valid URL ({exc}); fix [[endpoints]] base_url"
        ) from None
    problem = url_secret_problem(ep.base_url)
    if problem is not None:
        raise InputError(f"endpoint {ep.name!r}: base_url {problem}")


async def open_endpoints(
    config: RunConfig,
    *,
    started: float,
    clients: Mapping[str, CompletionClient] | None = None,
    on_event: Callable[[str, str, str], Awaitable[None]] | None = None,
    vocab_size: int | None = None,
) -> Endpoints:
    """Start each endpoint's simulator (if any) and client; `clients` replaces the client of the endpoints it
    names (tests, benchmarks). Response bodies are checked against `vocab_size` (ids) and the config's
    `limits.max_response_cost_usd` (app.providers.wire). Raises InputError for a missing key or a bad base_url;
    on any error whatever was started is closed again."""
    from app.providers.client import ChatClient
    from app.providers.wire import WireLimits

    limits = WireLimits(vocab_size=vocab_size, max_cost_usd=config.limits.max_response_cost_usd)

    given = clients or {}
    out = Endpoints()
    try:
        for ep, limit in zip(config.endpoints, share_limits(config), strict=True):
            metrics = EndpointMetrics(ep.name, started)
            if ep.name in given:
                out.items.append(Endpoint(ep, given[ep.name], limit, metrics, owned=False))
                continue
            if ep.simulator is not None:
                server = await _start_simulator(config, ep)
                out.simulators.append(server)
                # the client asks for ids as the personality's server would be asked (app.providers.servers)
                ep = ep.model_copy(
                    update={
                        "base_url": server.base_url,
                        "simulator": None,
                        "server": ep.server or ep.simulator.personality,
                    }
                )
                if on_event is not None:
                    await on_event("info", "endpoint", f"{ep.name}: built-in simulator listening on {server.base_url}")
            check_base_url(ep)
            client = ChatClient(ep, config.generation, _api_key(ep), limits=limits)
            out.items.append(Endpoint(ep, client, limit, metrics))
    except BaseException:
        await close_endpoints(out)
        raise
    return out


async def _start_simulator(config: RunConfig, ep: EndpointConfig):
    from app.providers.pricing import resolve_pricing
    from app.simulator.server import SimulatorServer

    sim = ep.simulator
    assert sim is not None  # called for simulated endpoints only
    kwargs = {}
    pricing, _ = resolve_pricing(config.model.name, config.pricing)  # a variant bills at its base model's price
    if pricing is not None:
        kwargs["pricing"] = pricing
    server = SimulatorServer(
        sim,
        tokenizer_dir=config.model.tokenizer,
        reference=sim.reference or config.data.reference,
        model=config.model.name,
        profile=config.model.profile,
        **kwargs,
    )
    await server.start()
    return server


def _api_key(ep: EndpointConfig) -> str | None:
    if not ep.api_key_env:
        return None
    key = os.environ.get(ep.api_key_env)
    if not key:
        raise InputError(
            f"endpoint {ep.name!r}: the environment variable {ep.api_key_env} named by api_key_env is "
            "not set or empty; export it before starting the run"
        )
    return key


async def close_endpoints(endpoints: Endpoints) -> None:
    """Close the clients the engine built and stop the simulators; errors while closing are ignored."""
    for ep in endpoints.items:
        aclose = getattr(ep.client, "aclose", None)
        if ep.owned and aclose is not None:
            try:
                await aclose()
            except Exception:
                pass
    for server in endpoints.simulators:
        try:
            await server.close()
        except Exception:
            pass
    endpoints.simulators = []


def total_limit(endpoints: Sequence[Endpoint]) -> int:
    """The run's in-flight limit now: the sum of its endpoints' limits."""
    return sum(ep.limit.limit for ep in endpoints)


def set_total_limit(endpoints: list[Endpoint], limit: int) -> int:
    """Spread an operator's total in-flight limit over the endpoints by weight (each clamped to its min/max);
    return the new total."""
    return sum(
        ep.limit.set_limit(n) for ep, n in zip(endpoints, split_by_weight(limit, [e.config.weight for e in endpoints]))
    )


def split_by_weight(total: int, weights: list[float]) -> list[int]:
    """`total` split by weight, each at least 1, summing to max(total, len(weights)) (largest remainders)."""
    n = len(weights)
    if n == 0:
        return []
    spare = max(total, n) - n
    total_w = sum(weights) or 1.0
    exact = [spare * w / total_w for w in weights]
    parts = [1 + math.floor(x) for x in exact]
    for i in sorted(range(n), key=lambda i: exact[i] - math.floor(exact[i]), reverse=True)[
        : spare - sum(p - 1 for p in parts)
    ]:
        parts[i] += 1
    return parts
