"""`ChatClient`: one chat-completion attempt against an OpenAI-compatible endpoint, as a Completion.

`complete()` makes exactly one attempt (no retry: see `app.providers.retry`) and raises
`ProviderError` subclasses. The API key only ever goes into the Authorization header; error texts are
built from the status and body and scrubbed of the key in case a server echoes it.

Time and size are bounded per attempt: `timeout_s` is a deadline for the whole attempt (connect, wait, every
byte of the body), `stall_timeout_s` the longest silence between two reads of a streamed answer, and
`max_response_bytes` the largest body read (`MalformedResponse` on `body` past it). A failure before any byte
of a response came back (DNS, a refused or timed-out connect, TLS, a reset before the response head) is an
`EndpointUnreachable`: the endpoint failed, not the sample (`app.engine.health.endpoint_health`). `probe()` asks
whether the endpoint answers at all, without spending tokens.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import httpx

from app.providers.exceptions import EndpointUnreachable, MalformedResponse, ProviderError, RetryableError
from app.providers.parse import StreamAssembler, classify_status, iter_sse_events, parse_body
from app.providers.pricing import ModelPricing, base_model, pricing_from_models_entry
from app.providers.servers import ids_request_fields, server_kind
from app.providers.transport import DEFAULT_TRANSPORT, AiohttpTransport, make_timeout, make_transport
from app.providers.wire import DEFAULT_LIMITS, WireLimits, load_json
from app.records import Completion, ErrorClass

CHAT_PATH = "/chat/completions"
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
DEFAULT_STALL_TIMEOUT_S = 120.0
PROBE_TIMEOUT_S = 10.0


def _chat_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base if base.endswith(CHAT_PATH) else base + CHAT_PATH


def _transport_error_class(exc: BaseException) -> ErrorClass:
    """'timeout' when a timeout caused `exc` (through the aiohttp mapping too), else 'network'."""
    seen: BaseException | None = exc
    saw_aiohttp = False
    while seen is not None:
        if isinstance(seen, TimeoutError):
            return ErrorClass.TIMEOUT
        if type(seen).__module__.startswith("aiohttp"):
            saw_aiohttp = True
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, httpx.TimeoutException) and not saw_aiohttp:
        return ErrorClass.TIMEOUT
    return ErrorClass.NETWORK


def _root_cause(exc: BaseException) -> BaseException:
    """The first exception in `exc`'s cause chain: httpx-aiohttp re-raises every aiohttp
    ClientConnectionError (a reset, a refused connect, a server that hung up) as httpx.ConnectTimeout
    (httpx_aiohttp/transport.py EXCEPTION_MAPPING), so its own type names the wrong failure."""
    seen = exc
    while (seen.__cause__ or seen.__context__) is not None:
        seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
    return seen


def unreachable_cause(exc: BaseException) -> str | None:
    """Why no connection carried the request (dns, refused, connect_timeout, tls, connect), from the cause chain;
    None when a connection was made (a reset or a timeout after it is judged by whether a response began)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror) or type(seen).__name__ == "ClientConnectorDNSError":
            return "dns"
        if isinstance(
            seen,
            (
                ssl.SSLError,
                ssl.CertificateError,
                aiohttp.ClientConnectorSSLError,
                aiohttp.ClientConnectorCertificateError,
            ),
        ):
            return "tls"
        if isinstance(seen, ConnectionRefusedError) or getattr(seen, "errno", None) == 111:
            return "refused"
        if (
            isinstance(seen, aiohttp.ConnectionTimeoutError)
            or isinstance(seen, httpx.ConnectTimeout)
            and not _saw_aiohttp(exc)
        ):
            return "connect_timeout"
        if isinstance(seen, (aiohttp.ClientConnectorError, httpx.ConnectError)):
            return "connect"
        seen = seen.__cause__ or seen.__context__
    return None


def _saw_aiohttp(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__module__.startswith("aiohttp"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def describe_transport_error(exc: BaseException) -> str:
    """A short sentence naming what really failed (reset, refused, closed, timed out), from the cause chain."""
    root = _root_cause(exc)
    errno = getattr(root, "errno", None)
    cause = unreachable_cause(exc)
    if cause == "dns":
        return f"the host name could not be resolved ({root})"
    if cause == "tls":
        return f"the TLS handshake failed ({type(root).__name__}: {root})"
    if cause == "connect_timeout":
        return "connecting timed out"
    if isinstance(root, ConnectionResetError) or errno == 104:
        return "the connection was reset by the server"
    if isinstance(root, ConnectionRefusedError) or errno == 111:
        return "the connection was refused"
    if isinstance(root, aiohttp.ServerDisconnectedError) or isinstance(exc, httpx.RemoteProtocolError):
        return "the server closed the connection without a response"
    if isinstance(root, TimeoutError) or _transport_error_class(exc) == ErrorClass.TIMEOUT:
        return "the request timed out"
    detail = str(root) or type(root).__name__
    return f"the request failed ({type(root).__name__}: {detail})"


class ChatClient:
    """Client for one endpoint. `endpoint` needs `base_url`, `timeout_s`, `max_concurrency`, `extra`
    (and optionally `name`, `stall_timeout_s`, `max_response_bytes`); `generation` needs `max_tokens`,
    `temperature`, `top_p`, `stream`, `logprobs`, `top_logprobs`; `limits` is what bodies are checked against
    (app.providers.wire). Use as `async with ChatClient(...) as client:` or call `aclose()`.
    """

    def __init__(
        self,
        endpoint: Any,
        generation: Any,
        api_key: str | None,
        *,
        base_url: str | None = None,
        transport: str | httpx.AsyncBaseTransport | None = None,
        limits: WireLimits = DEFAULT_LIMITS,
    ) -> None:
        self.endpoint = endpoint
        self.limits = limits
        self.generation = generation
        self.endpoint_name = getattr(endpoint, "name", None) or "endpoint"
        self.server = server_kind(endpoint)  # which ids to ask for (app.providers.servers)
        self._key = api_key or None
        url = base_url or getattr(endpoint, "base_url", None)
        if not url:
            raise ValueError(f"endpoint {self.endpoint_name!r} has no base_url (start its simulator first)")
        self.url = _chat_url(str(url))
        self._url = httpx.URL(self.url)  # parsed once: httpx's URL parsing is a large share of per-request CPU
        headers = {
            "Host": self._url.netloc.decode(),
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "eaglewatch",
        }
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        if self.server == "openrouter":  # routing metadata (fallback, compression, healing) on the final chunk
            headers["X-OpenRouter-Metadata"] = "enabled"
        # built once: httpx normalises every header of a plain dict on each request
        self._headers = httpx.Headers(headers)
        self._stream_headers = httpx.Headers(dict(headers, Accept="text/event-stream"))
        timeout_s = float(getattr(endpoint, "timeout_s", None) or 1800.0)
        self.timeout_s = timeout_s
        self.stall_timeout_s = min(
            timeout_s, float(getattr(endpoint, "stall_timeout_s", None) or DEFAULT_STALL_TIMEOUT_S)
        )
        self.max_response_bytes = int(getattr(endpoint, "max_response_bytes", None) or DEFAULT_MAX_RESPONSE_BYTES)
        if isinstance(transport, httpx.AsyncBaseTransport):
            self._transport, self._owns_transport = transport, False
        else:
            connections = int(getattr(endpoint, "max_concurrency", None) or 256)
            self._transport, self._owns_transport = make_transport(transport or DEFAULT_TRANSPORT, connections), True
        # Requests go straight to the transport (httpx's public transport API): the AsyncClient layer
        # adds cookies, auth, redirects and event hooks we never use, at ~1 ms of CPU per request.
        timeout = make_timeout(timeout_s, self.stall_timeout_s)
        self._timeout = {"timeout": timeout.as_dict()}
        # On the default transport (httpx-aiohttp) chat requests go to its aiohttp session directly: the
        # httpx Request/Response/Headers wrappers around each call were ~20 % of the engine's event-loop
        # CPU (py-spy, bench/engine.py non-streaming c=64). The same session, limits and timeouts as
        # httpx_aiohttp/transport.py's handle_async_request (sock_connect=connect, sock_read=read,
        # connect=pool); aiohttp's errors are mapped in `complete` as before. A non-streamed answer's head comes
        # only once it is generated, so there the silence allowed before it is the whole deadline; a stream's
        # head comes at once and each event after it within `stall_timeout_s`.
        self._direct = isinstance(self._transport, AiohttpTransport)
        self._aio_timeout = aiohttp.ClientTimeout(
            sock_connect=timeout.connect, sock_read=timeout_s, connect=timeout.pool
        )
        self._aio_stream_timeout = aiohttp.ClientTimeout(
            sock_connect=timeout.connect, sock_read=timeout.read, connect=timeout.pool
        )
        self._aio_headers = {k: v for k, v in headers.items() if k != "Host"}
        self._aio_stream_headers = dict(self._aio_headers, Accept="text/event-stream")

    def __repr__(self) -> str:
        return f"ChatClient({self.endpoint_name!r}, {self.url!r}, key={'set' if self._key else 'none'})"

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (when this client created it)."""
        if self._owns_transport:
            await self._transport.aclose()

    def build_request(
        self, messages: list[dict], tools: list[dict] | None = None, *, model: str, extra: dict | None = None
    ) -> dict:
        """The JSON body: model, messages, tools, sampling and logprob options, then endpoint and call extras."""
        gen = self.generation
        stream = bool(getattr(gen, "stream", False))
        body: dict[str, Any] = {"model": model, "messages": messages}
        if tools:
            body["tools"] = tools
        for name in ("max_tokens", "temperature", "top_p"):
            value = getattr(gen, name, None)
            if value is not None:
                body[name] = value
        if stream:
            body["stream"] = True
            # OpenAI/OpenRouter/vLLM/SGLang: the usage chunk before [DONE]; transformers serve accepts the
            # field and puts usage on its finish chunk (cli/serving/chat_completion.py sse_gen)
            body["stream_options"] = {"include_usage": True}
        if getattr(gen, "logprobs", False):
            body["logprobs"] = True
            top = getattr(gen, "top_logprobs", None)
            if top:
                body["top_logprobs"] = top
        body.update(ids_request_fields(self.server, stream))
        if self.server == "openrouter" and not getattr(self.endpoint, "allow_prompt_transforms", False):
            body["transforms"] = []  # no context compression: the prompt stays the one rendered (message-transforms)
        for more in (getattr(self.endpoint, "extra", None), extra):
            if more:
                body.update(more)
        return body

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "[api key]") if self._key and self._key in text else text

    async def complete(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        model: str,
        extra: dict | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> Completion:
        """One attempt; a Completion on success (check `.truncated`), else a ProviderError subclass.
        `on_first_token`: called once when a streamed answer's first token arrives (the ETA counts from it)."""
        body = self.build_request(messages, tools, model=model, extra=extra)
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        started = time.perf_counter()
        head = _Head()
        deadline = asyncio.timeout(self.timeout_s)
        try:
            # the attempt's deadline: connect, the wait for the answer and every byte of it
            async with deadline:
                if self._direct:
                    if body.get("stream"):
                        return await self._stream_direct(content, started, on_first_token, head)
                    return await self._plain_direct(content, started, head)
                if body.get("stream"):
                    return await self._stream(content, started, on_first_token, head)
                return await self._plain(content, started, head)
        except ProviderError as exc:
            scrubbed = self._scrub(str(exc))
            if scrubbed != str(exc):
                exc.args = (scrubbed,)
            exc.answered = head.seen
            raise
        except (httpx.TransportError, OSError, TimeoutError, aiohttp.ClientError) as exc:
            # OSError / aiohttp errors: anything a transport lets through unmapped
            if deadline.expired():
                error = RetryableError(
                    f"{self.endpoint_name}: the attempt passed its deadline (timeout_s = "
                    f"{self.timeout_s:g} s) after {time.perf_counter() - started:.1f} s",
                    error_class=ErrorClass.TIMEOUT,
                )
            else:
                error = self._transport_failure(exc, head.seen)
            error.answered = head.seen
            raise error from None

    def _transport_failure(self, exc: BaseException, head_seen: bool) -> RetryableError:
        """The error for a transport failure: unreachable when no response began, else a timeout or a network
        error of this attempt."""
        detail = self._scrub(describe_transport_error(exc))
        cause = unreachable_cause(exc)
        if (
            not head_seen
            and cause is None
            and isinstance(_root_cause(exc), (ConnectionResetError, aiohttp.ServerDisconnectedError))
        ):
            cause = "reset"
        if not head_seen and cause is not None:
            return EndpointUnreachable(f"{self.endpoint_name} ({self.url}): {detail}", cause=cause)
        return RetryableError(f"{self.endpoint_name}: {detail}", error_class=_transport_error_class(exc))

    def _request(self, content: bytes, headers: httpx.Headers) -> httpx.Request:
        return httpx.Request("POST", self._url, headers=headers, content=content, extensions=self._timeout)

    async def _plain(self, content: bytes, started: float, head: _Head) -> Completion:
        response = await self._transport.handle_async_request(self._request(content, self._headers))
        head.seen = True
        try:
            data = await self._read_capped(response.aiter_bytes(), _content_length(response.headers))
        finally:
            await response.aclose()
        total = time.perf_counter() - started
        if response.status_code != 200:
            raise self._status_error(response.status_code, response.headers, data)
        completion = parse_body(data, total_s=total, limits=self.limits)
        return self._with_header_id(completion, response.headers)

    async def _read_capped(self, chunks: AsyncIterator[bytes], length: int | None) -> bytes:
        """A whole body, refused as soon as it is known to pass `max_response_bytes`."""
        cap = self.max_response_bytes
        if length is not None and length > cap:
            raise MalformedResponse("body", f"is {length} bytes, over max_response_bytes ({cap})")
        parts: list[bytes] = []
        size = 0
        async for data in chunks:
            size += len(data)
            if size > cap:
                raise MalformedResponse("body", f"passed max_response_bytes ({cap}) while being read")
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _read_events(
        self, chunks: AsyncIterator[bytes], started: float, on_first_token: Callable[[], None] | None = None
    ) -> StreamAssembler:
        """Feed the SSE events of `chunks` to an assembler, reading to the end (so the connection goes back to
        the pool); a transport error mid-stream is a RetryableError naming how far the stream got."""
        assembler = StreamAssembler(started, on_first_token, self.limits)
        buffer = bytearray()
        cap, size = self.max_response_bytes, 0
        try:
            async for data in chunks:
                if assembler.done:
                    continue
                size += len(data)
                if size > cap:
                    exc = MalformedResponse(
                        "body", f"passed max_response_bytes ({cap}) after {len(assembler.chunks)} stream chunks"
                    )
                    exc.cost_usd, exc.usage = assembler.reported_cost(), assembler.usage
                    raise exc
                for event in iter_sse_events(buffer, data):
                    assembler.feed(event)
                    if assembler.done:
                        break
        except (httpx.TransportError, OSError, TimeoutError, aiohttp.ClientError) as exc:
            kind = ErrorClass.TIMEOUT if _transport_error_class(exc) == ErrorClass.TIMEOUT else ErrorClass.STREAM
            how = describe_transport_error(exc)
            if kind == "timeout":
                how = f"no byte for stall_timeout_s = {self.stall_timeout_s:g} s"
            error = RetryableError(
                f"{self.endpoint_name}: the stream broke after {len(assembler.chunks)} chunks ({how})", error_class=kind
            )
            error.cost_usd, error.usage = assembler.reported_cost(), assembler.usage
            raise error from None
        return assembler

    def _session(self) -> aiohttp.ClientSession:
        """The transport's aiohttp session, made on first use (inside the loop), as its own requests do."""
        transport = self._transport
        assert isinstance(transport, AiohttpTransport)  # only the direct paths (self._direct) call this
        if not isinstance(transport.client, aiohttp.ClientSession):
            transport.client = transport.get_client()
        return transport.client

    def _post(self, content: bytes, headers: dict[str, str], timeout: aiohttp.ClientTimeout):
        return self._session().post(
            self.url, data=content, headers=headers, timeout=timeout, allow_redirects=False, compress=False
        )

    async def _plain_direct(self, content: bytes, started: float, head: _Head) -> Completion:
        async with self._post(content, self._aio_headers, self._aio_timeout) as response:
            head.seen = True
            length = response.content_length
            if length is not None and length <= self.max_response_bytes:
                data = await response.read()
            else:
                data = await self._read_capped(response.content.iter_any(), length)
        total = time.perf_counter() - started
        if response.status != 200:
            raise self._status_error(response.status, response.headers, data)
        return self._with_header_id(parse_body(data, total_s=total, limits=self.limits), response.headers)

    async def _stream_direct(
        self, content: bytes, started: float, on_first_token: Callable[[], None] | None, head: _Head
    ) -> Completion:
        async with self._post(content, self._aio_stream_headers, self._aio_stream_timeout) as response:
            head.seen = True
            if response.status != 200:
                raise self._status_error(
                    response.status,
                    response.headers,
                    await self._read_capped(response.content.iter_any(), response.content_length),
                )
            assembler = await self._read_events(response.content.iter_any(), started, on_first_token)
            completion = assembler.finish_completion(time.perf_counter() - started)
            return self._with_header_id(completion, response.headers)

    async def _stream(
        self, content: bytes, started: float, on_first_token: Callable[[], None] | None, head: _Head
    ) -> Completion:
        response = await self._transport.handle_async_request(self._request(content, self._stream_headers))
        head.seen = True
        try:
            if response.status_code != 200:
                raise self._status_error(
                    response.status_code,
                    response.headers,
                    await self._read_capped(response.aiter_bytes(), _content_length(response.headers)),
                )
            assembler = await self._read_events(response.aiter_bytes(), started, on_first_token)
            completion = assembler.finish_completion(time.perf_counter() - started)
            return self._with_header_id(completion, response.headers)
        finally:
            await response.aclose()

    async def fetch_pricing(self, model: str) -> ModelPricing | None:
        """List prices of `model` from the endpoint's `GET /models` (None when not listed or not served).

        A variant (`vendor/model:floor`) not listed itself takes its base model's entry; OpenRouter's
        `/api/v1/models` lists `pricing` as decimal strings in USD per token (openai-compatible-apis.md B.12).
        """
        url = self._url.copy_with(path=self._url.path[: -len(CHAT_PATH)] + "/models")
        headers = {k: v for k, v in self._headers.items() if k.lower() != "content-type"}
        request = httpx.Request("GET", url, headers=headers, extensions=self._timeout)
        try:
            response = await self._transport.handle_async_request(request)
            try:
                data = await response.aread()
            finally:
                await response.aclose()
            if response.status_code != 200:
                return None
            listing, _ = load_json(data, "GET /models")
            items = listing.get("data") if isinstance(listing, dict) else None
            entries = {e.get("id"): e for e in items if isinstance(e, dict)} if isinstance(items, list) else {}
            for name in (model, base_model(model)):
                entry = entries.get(name)
                if entry is not None and isinstance(entry.get("pricing"), dict):
                    return pricing_from_models_entry(entry)
        except (httpx.TransportError, ProviderError, ValueError, AttributeError, TypeError):
            return None
        return None

    async def probe(self) -> str | None:
        """Whether the endpoint answers at all: None when any HTTP response came back from `GET .../models` (a 404
        counts: something listens there), else a sentence saying what failed. No tokens are spent."""
        url = self._url.copy_with(path=self._url.path[: -len(CHAT_PATH)] + "/models")
        headers = {k: v for k, v in self._headers.items() if k.lower() != "content-type"}
        timeout = make_timeout(PROBE_TIMEOUT_S)
        request = httpx.Request("GET", url, headers=headers, extensions={"timeout": timeout.as_dict()})
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                response = await self._transport.handle_async_request(request)
                await response.aclose()
        except (httpx.TransportError, OSError, TimeoutError, aiohttp.ClientError) as exc:
            return self._scrub(describe_transport_error(exc))
        return None

    @staticmethod
    def _with_header_id(completion: Completion, headers: Any) -> Completion:
        if completion.generation_id is None and headers.get("x-generation-id"):
            from dataclasses import replace

            return replace(completion, generation_id=headers["x-generation-id"])
        return completion

    def _status_error(self, status: int, headers: Any, data: bytes) -> ProviderError:
        try:
            body = load_json(data, "error body")[0] if data.strip() else None
        except ProviderError:
            body = None
        error = classify_status(status, headers, body)
        error.args = (f"{self.endpoint_name}: {self._scrub(str(error))}",)
        return error


class _Head:
    """Whether a response head came back during one attempt (what tells an unreachable endpoint from a failed
    answer)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False


def _content_length(headers: Any) -> int | None:
    value = headers.get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
