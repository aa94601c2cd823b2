"""The HTTP transport under the httpx API, chosen by measurement (bench/transport.py).

ChatClient keeps httpx's API (Request, Response, Timeout, exceptions) but sends through the transport
named here, straight to `handle_async_request` (the AsyncClient layer costs ~1 ms CPU per request).
"""

from __future__ import annotations

import itertools

import httpx

TRANSPORTS = ("aiohttp", "httpx", "pools")

# bench/transport.py, 2026-11-29, 2-core dev VM shared with other jobs (server pinned to core 0, client
# to core 1, 1,000 requests of ~3 KB per cell; wall rates are noisy there, client CPU per request is not):
#   client CPU ms/request      non-stream c=64  c=256   stream c=64  c=256
#   bare aiohttp (ceiling)          0.59     0.68           2.49   2.21
#   ChatClient + httpx-aiohttp      1.01     1.13           2.32   3.04   <- chosen
#   ChatClient + httpx default      3.30     5.66           3.54   5.10
#   ChatClient + 4 httpx pools      2.89     6.50           4.39   4.27
#   ChatClient + 16 httpx pools     1.99     3.63           4.86   5.11
# httpx-aiohttp costs 3-5x less CPU per request than httpx's own pool non-streaming and 1.5-1.7x less
# streaming; splitting httpx into smaller pools does not close the gap. Requests/s in the same run,
# non-streaming c=64: bare aiohttp 653, httpx-aiohttp 370 (0.57x), httpx default 73 (0.11x).
DEFAULT_TRANSPORT = "aiohttp"
DEFAULT_POOLS = 4


class ShardedTransport(httpx.AsyncBaseTransport):
    """Round-robin over several independent httpx connection pools (smaller pools, less lock contention)."""

    def __init__(self, pools: int, limits: httpx.Limits) -> None:
        per_pool = max(1, (limits.max_connections or 100) // pools)
        pool_limits = httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool)
        self._pools = [httpx.AsyncHTTPTransport(limits=pool_limits) for _ in range(pools)]
        self._next = itertools.cycle(self._pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await next(self._next).handle_async_request(request)

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


def make_transport(kind: str, max_connections: int) -> httpx.AsyncBaseTransport:
    """A transport of `kind` ("aiohttp", "httpx" or "pools[:N]") sized for `max_connections`."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    name, _, arg = kind.partition(":")
    if name == "aiohttp":
        from httpx_aiohttp import AiohttpTransport

        return AiohttpTransport(limits=limits)
    if name == "httpx":
        return httpx.AsyncHTTPTransport(limits=limits)
    if name == "pools":
        return ShardedTransport(int(arg or DEFAULT_POOLS), limits)
    raise ValueError(f"unknown transport {kind!r}: use one of aiohttp, httpx, pools[:N]")


def make_timeout(timeout_s: float) -> httpx.Timeout:
    """`timeout_s` for reads, writes and pool waits; connecting gives up after at most 10 s."""
    return httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))


def make_http_client(
    *, max_connections: int, timeout_s: float, transport: str | None = None, base_url: str = ""
) -> httpx.AsyncClient:
    """An httpx AsyncClient on the chosen transport, with `timeout_s` for reads and a 10 s connect cap."""
    return httpx.AsyncClient(
        base_url=base_url,
        transport=make_transport(transport or DEFAULT_TRANSPORT, max_connections),
        timeout=make_timeout(timeout_s),
    )
