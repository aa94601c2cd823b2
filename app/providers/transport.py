"""The HTTP transport under the httpx API, chosen by measurement (bench/transport.py).

ChatClient keeps httpx's API (Request, Response, Timeout, exceptions) but sends through the transport
named here, straight to `handle_async_request` (the AsyncClient layer costs ~1 ms CPU per request).
"""

from __future__ import annotations

import itertools

import httpx
from httpx_aiohttp import AiohttpTransport

TRANSPORTS = ("aiohttp", "httpx", "pools")

# bench/transport.py, 2026-11-29, on the 2-core dev VM shared with other jobs (server pinned to core 0,
# client to core 1, 1,500 requests of ~3 KB per cell, minimal loopback aiohttp server):
#                               non-streaming c=64     c=256          streaming c=64      c=256
#                               req/s (x)  CPU ms      req/s (x)  CPU   req/s (x)  CPU     req/s (x)  CPU
#   bare aiohttp (baseline)     1174 1.00  0.35        1024 1.00  0.43  210 1.00   2.01    218 1.00   1.81
#   ChatClient + httpx-aiohttp  1028 0.88  0.60         780 0.76  0.76  223 1.06   1.87    279 1.28   1.58  <- chosen
#   ChatClient + httpx default   297 0.25  2.18         103 0.10  4.05  102 0.49   3.99     96 0.44   4.60
#   ChatClient + 4 httpx pools   184 0.16  2.96          79 0.08  4.94  135 0.64   3.80     67 0.31   5.43
#   ChatClient + 16 httpx pools  271 0.23  2.09         148 0.14  2.91  124 0.59   2.98    135 0.62   3.76
# (CPU = client CPU ms per request, time.process_time of the client process.) httpx-aiohttp costs 3.5-5x
# less client CPU than httpx's own pool non-streaming and 2-3x less streaming; smaller httpx pools narrow
# the gap only slightly. Two earlier runs under heavier load ranked the transports the same way.
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
        return AiohttpTransport(limits=limits)
    if name == "httpx":
        return httpx.AsyncHTTPTransport(limits=limits)
    if name == "pools":
        return ShardedTransport(int(arg or DEFAULT_POOLS), limits)
    raise ValueError(f"unknown transport {kind!r}: use one of aiohttp, httpx, pools[:N]")


def make_timeout(timeout_s: float, read_s: float | None = None) -> httpx.Timeout:
    """`timeout_s` for writes and pool waits, `read_s` (default `timeout_s`) between reads; connecting gives up
    after at most 10 s. The attempt's whole deadline is the client's own (`ChatClient.complete`)."""
    return httpx.Timeout(timeout_s, read=timeout_s if read_s is None else read_s, connect=min(10.0, timeout_s))
