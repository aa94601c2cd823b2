"""Turn chat-completion bodies, SSE chunks and error responses into a `Completion` or a `ProviderError`.

Pure functions over bytes and parsed JSON (no I/O), so they are cheap to test. Every field read passes the
boundary of `app.providers.wire` (type and range; `WireLimits` carries the vocabulary size and the cost cap):
a field of the wrong type or out of range raises `MalformedResponse` naming it, never a skip. Only choice 0 is
read (eaglewatch asks for n = 1): a second choice, or a choice with another index, is a protocol error. An
answer that ends without a finish_reason (a body without one, a stream's `[DONE]` with none before it, a stream
that closed early) was cut on the wire, not by the model: it is a RetryableError of the attempt (error_class
`stream`), never a `length` finish, which means only what the server said.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Callable
from typing import Any

from app.providers import wire
from app.providers.exceptions import (
    MalformedResponse,
    ProviderError,
    RetryableError,
    RunStoppingError,
    SampleFatalError,
)
from app.providers.interventions import METADATA_FIELD, read_openrouter_metadata
from app.providers.wire import DEFAULT_LIMITS, WireLimits, count, obj, opt_list, opt_obj, opt_str
from app.records import Completion, ErrorClass, TokenLogprob, ToolCall, Usage, http_error_class

# ---------------------------------------------------------------------------------------------------
# usage, logprobs, ids


def parse_usage(raw: Any, field: str = "usage", limits: WireLimits = DEFAULT_LIMITS) -> Usage:
    """Usage counts and cost from an OpenAI/OpenRouter `usage` object (null counts read as 0).

    OpenRouter (openrouter.ai/docs/use-cases/usage-accounting; openai-compatible-apis.md B.5): `cost` is what
    OpenRouter charged; with a bring-your-own-key request (`is_byok: true`) that is only its fee and the
    provider bills `cost_details.upstream_inference_cost` to the user's own key, so both are counted. A cost
    that is NaN, infinite, negative or past `limits.max_cost_usd` is not used: `Usage.cost_problem` says why.
    """
    if raw is None:
        return Usage()
    raw = obj(raw, field)
    completion_details = opt_obj(raw.get("completion_tokens_details"), f"{field}.completion_tokens_details") or {}
    prompt_details = opt_obj(raw.get("prompt_tokens_details"), f"{field}.prompt_tokens_details") or {}
    cost, problem = wire.cost(raw.get("cost"), f"{field}.cost", limits)
    if raw.get("is_byok") is True:
        details = opt_obj(raw.get("cost_details"), f"{field}.cost_details") or {}
        upstream, upstream_problem = wire.cost(
            details.get("upstream_inference_cost"), f"{field}.cost_details.upstream_inference_cost", limits
        )
        if upstream_problem is not None:
            cost, problem = None, problem or upstream_problem
        elif upstream is not None and problem is None:
            cost, problem = wire.cost((cost or 0.0) + upstream, f"{field}.cost + upstream_inference_cost", limits)
    # SGLang puts reasoning_tokens at the top of usage (protocol.py UsageInfo), OpenAI under the details
    reasoning = completion_details.get("reasoning_tokens")
    where = f"{field}.completion_tokens_details.reasoning_tokens"
    if reasoning is None:
        reasoning, where = raw.get("reasoning_tokens"), f"{field}.reasoning_tokens"
    return Usage(
        prompt_tokens=count(raw.get("prompt_tokens"), f"{field}.prompt_tokens"),
        completion_tokens=count(raw.get("completion_tokens"), f"{field}.completion_tokens"),
        reasoning_tokens=count(reasoning, where),
        cached_tokens=count(prompt_details.get("cached_tokens"), f"{field}.prompt_tokens_details.cached_tokens"),
        cost_usd=cost,
        cost_problem=problem,
    )


def parse_logprob_list(raw: Any, field: str) -> list[TokenLogprob]:
    """A `logprobs.content`-style list into TokenLogprob records (bytes kept when present; a logprob must be
    finite: vLLM sends -9999.0 for -inf, `ChatCompletionLogProb.logprob`)."""
    if raw is None:
        return []
    if type(raw) is not list:
        raise MalformedResponse(field, f"should be a list, got {wire.kind_of(raw)}")
    out = []
    for i, item in enumerate(raw):
        if type(item) is not dict:
            raise MalformedResponse(f"{field}[{i}]", f"should be an object, got {wire.kind_of(item)}")
        token = item.get("token")
        if type(token) is not str:
            raise MalformedResponse(f"{field}[{i}].token", f"should be a string, got {wire.kind_of(token)}")
        raw_bytes = item.get("bytes")
        byte_tuple = wire.byte_values(raw_bytes, f"{field}[{i}].bytes") if raw_bytes is not None else None
        logprob = item.get("logprob")
        if type(logprob) is not float:
            logprob = wire.finite(logprob, f"{field}[{i}].logprob")
        elif logprob != logprob or logprob in (float("inf"), float("-inf")):
            raise MalformedResponse(f"{field}[{i}].logprob", f"is {logprob!r}, not a finite number")
        out.append(TokenLogprob(token=token, bytes=byte_tuple, logprob=logprob))
    return out


def _details_text(details: Any, field: str) -> str:
    """Reasoning text carried only in `reasoning_details` (OpenRouter, openai-compatible-apis.md B.4):
    `reasoning.text` items' `text`, `reasoning.summary` items' `summary`; `reasoning.encrypted` has none."""
    details = opt_list(details, field) or []
    parts = []
    for i, item in enumerate(details):
        item = obj(item, f"{field}[{i}]")
        kind = opt_str(item.get("type"), f"{field}[{i}].type") or "reasoning.text"
        key = "text" if kind == "reasoning.text" else "summary" if kind == "reasoning.summary" else None
        if key is not None:
            text = opt_str(item.get(key), f"{field}[{i}].{key}")
            if text:
                parts.append(text)
    return "".join(parts)


def _server_ids(choice: dict, field: str, limits: WireLimits) -> list[int] | None:
    """Server output ids of one choice, where the servers really put them.

    - vLLM: `choices[].token_ids` with `return_token_ids: true` (full ids non-streaming, the chunk's delta ids
      streaming): vllm/entrypoints/openai/chat_completion/protocol.py ChatCompletionResponseChoice /
      ChatCompletionResponseStreamChoice.
    - SGLang chat: `choices[].token_ids` with `return_token_ids: true`, non-streaming only (serving_chat.py
      rejects it with stream=true): python/sglang/srt/entrypoints/openai/protocol.py ChatCompletionResponseChoice.
      SGLang's chat API has no `output_ids` (that is the native /generate shape) and ignores unknown fields.
    """
    ids = choice.get("token_ids")
    if ids is None:
        return None
    return wire.ids(ids, f"{field}.token_ids", limits)


def _prompt_ids(holder: dict, field: str, limits: WireLimits) -> list[int] | None:
    """`prompt_token_ids` of a body, chunk or choice: vLLM puts it on the response (and the first stream
    chunk, chat_completion/protocol.py ChatCompletionResponse / ChatCompletionStreamResponse); SGLang on the
    choice with `return_prompt_token_ids: true` (protocol.py ChatCompletionResponseChoice, non-streaming)."""
    ids = holder.get("prompt_token_ids")
    if ids is None:
        return None
    return wire.ids(ids, f"{field}.prompt_token_ids", limits)


def _choice_index(choice: dict, field: str) -> None:
    """Only choice 0 is ours: every server names it (`index: int` in vLLM's and SGLang's choice models) and a
    missing index is taken as 0; any other index is a protocol error (eaglewatch asks for n = 1)."""
    index = choice.get("index")
    if index is not None and (type(index) is not int or index != 0):
        raise MalformedResponse(
            f"{field}.index",
            f"is {wire.shown(index)}; eaglewatch asks for one choice (n = 1), so only index 0 may come back",
        )


def _provider_error_in_body(error: Any, where: str) -> RetryableError:
    # OpenRouter: {"code", "message", "metadata"}; transformers serve streams `{"error": "<text>"}`
    # (transformers cli/serving/chat_completion.py sse_gen, _StreamError)
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    if not isinstance(message, str):
        message = None
    return RetryableError(
        f"the provider failed during generation ({where}): {message[:300] if message else 'no message'}",
        error_class=ErrorClass.STREAM,
    )


def _check_finish(finish: str | None, error: Any, where: str) -> None:
    if error is not None or finish == "error":
        raise _provider_error_in_body(error, where)
    if finish == "abort":  # SGLang: the request was aborted server-side (protocol.py finish_reason "abort")
        raise RetryableError(
            f"the server aborted the request ({where}: finish_reason abort)", error_class=ErrorClass.STREAM
        )
    if finish == "content_filter":
        raise SampleFatalError("the provider's content filter stopped this sample", error_class=ErrorClass.FILTERED)


def _tool_call(call: Any, where: str, position: int) -> ToolCall:
    call = obj(call, where)
    function = obj(call.get("function"), f"{where}.function")
    index = call.get("index")
    return ToolCall(
        id=opt_str(call.get("id"), f"{where}.id") or "",
        name=opt_str(function.get("name"), f"{where}.function.name") or "",
        arguments=opt_str(function.get("arguments"), f"{where}.function.arguments") or "",
        index=wire.index(index, f"{where}.index") if index is not None else position,
        type=opt_str(call.get("type"), f"{where}.type") or "function",
    )


# ---------------------------------------------------------------------------------------------------
# non-streaming


def parse_body(
    text: bytes | str, *, total_s: float, ttft_s: float | None = None, limits: WireLimits = DEFAULT_LIMITS
) -> Completion:
    """A non-streaming 200 body (leading keep-alive whitespace allowed) into a Completion, through the boundary."""
    body, replaced = wire.load_json(text, "body")
    body = obj(body, "body")
    if body.get("error") is not None and not body.get("choices"):
        code = body["error"].get("code") if isinstance(body["error"], dict) else None
        status = code if type(code) is int and 400 <= code < 600 else 200
        raise classify_status(status, {}, body)  # an error envelope under HTTP 200: judge it by its code
    usage = parse_usage(body.get("usage"), "usage", limits)
    try:
        return _completion_of(body, usage, replaced, total_s, ttft_s, limits)
    except ProviderError as exc:
        # the usage part was sound: what it reports was spent on this attempt
        exc.cost_usd, exc.usage = usage.cost_usd or 0.0, usage
        raise


def _completion_of(
    body: dict, usage: Usage, replaced: bool, total_s: float, ttft_s: float | None, limits: WireLimits
) -> Completion:
    choices = body.get("choices")
    if type(choices) is not list or not choices:
        raise MalformedResponse(
            "choices", f"should be a non-empty list, got {wire.kind_of(choices) if choices != [] else 'an empty list'}"
        )
    if len(choices) > 1:
        raise MalformedResponse("choices", f"holds {len(choices)} choices; eaglewatch asks for one (n = 1)")
    choice = obj(choices[0], "choices[0]")
    _choice_index(choice, "choices[0]")
    message = obj(choice.get("message"), "choices[0].message")
    finish = opt_str(choice.get("finish_reason"), "choices[0].finish_reason")
    _check_finish(finish, choice.get("error"), "choices[0].error")

    content = opt_str(message.get("content"), "choices[0].message.content") or ""
    # reasoning: OpenRouter and vLLM `reasoning` (vllm/entrypoints/openai/chat_completion/protocol.py
    # ChatMessage.reasoning); SGLang `reasoning_content` (python/sglang/srt/entrypoints/openai/protocol.py
    # ChatMessage) and transformers serve (transformers cli/serving/chat_completion.py _build_completion);
    # OpenRouter also `reasoning_details[]` (openai-compatible-apis.md B.4)
    reasoning = opt_str(message.get("reasoning"), "choices[0].message.reasoning")
    if reasoning is None:
        reasoning = opt_str(message.get("reasoning_content"), "choices[0].message.reasoning_content")
    if reasoning is None and message.get("reasoning_details") is not None:
        reasoning = _details_text(message["reasoning_details"], "choices[0].message.reasoning_details") or None

    # tool calls: the OpenAI shape on every server; transformers serve makes ids `{request_id}_tool_call_{i}`
    # and json.dumps the arguments (cli/serving/utils.py _normalize_tool_call), vLLM/SGLang parsers per model
    raw_calls = opt_list(message.get("tool_calls"), "choices[0].message.tool_calls") or []
    if len(raw_calls) > wire.MAX_TOOL_CALLS:
        raise MalformedResponse("choices[0].message.tool_calls", f"holds {len(raw_calls)} calls")
    tool_calls = [_tool_call(call, f"choices[0].message.tool_calls[{i}]", i) for i, call in enumerate(raw_calls)]

    content_lp = reasoning_lp = None
    logprobs = opt_obj(choice.get("logprobs"), "choices[0].logprobs")
    if logprobs is not None:
        if logprobs.get("content") is not None:
            content_lp = tuple(parse_logprob_list(logprobs["content"], "choices[0].logprobs.content"))
        for name in ("reasoning", "reasoning_content"):
            if logprobs.get(name) is not None:
                reasoning_lp = tuple(parse_logprob_list(logprobs[name], f"choices[0].logprobs.{name}"))

    ids = _server_ids(choice, "choices[0]", limits)
    prompt_ids = _prompt_ids(choice, "choices[0]", limits)
    if prompt_ids is None:
        prompt_ids = _prompt_ids(body, "body", limits)
    flags = (wire.TEXT_REPLACED,) if replaced else ()
    if finish is None:
        exc = RetryableError(
            "the body ended without a finish_reason (choices[0].finish_reason is missing): "
            "the wire cut the answer; asking again",
            error_class="stream",
        )
        exc.usage = usage  # a billed attempt stays billed
        exc.cost_usd = usage.cost_usd or 0.0
        raise exc
    return Completion(
        content=content,
        reasoning=reasoning,
        tool_calls=tuple(tool_calls),
        finish_reason=finish,
        usage=usage,
        content_logprobs=content_lp,
        reasoning_logprobs=reasoning_lp,
        token_ids=tuple(ids) if ids is not None else None,
        prompt_token_ids=tuple(prompt_ids) if prompt_ids is not None else None,
        ttft_s=ttft_s,
        total_s=total_s,
        provider=opt_str(body.get("provider"), "provider"),
        model=opt_str(body.get("model"), "model"),
        generation_id=opt_str(body.get("id"), "id"),
        raw=body,
        wire_flags=flags,
        interventions=read_openrouter_metadata(body.get(METADATA_FIELD), METADATA_FIELD),
    )


# ---------------------------------------------------------------------------------------------------
# streaming


class StreamAssembler:
    """Collects SSE `data:` payloads of one streamed completion; `finish_completion()` gives the Completion.

    Content and reasoning deltas are concatenated; tool calls are assembled by `index` with argument
    strings concatenated exactly as sent; usage comes from the final chunk (empty `choices`). An
    `error` chunk or `finish_reason: "error"` raises RetryableError (error_class "stream"); a field of the
    wrong type or range raises MalformedResponse naming the chunk and the field.
    """

    def __init__(
        self, started: float, on_first_token: Callable[[], None] | None = None, limits: WireLimits = DEFAULT_LIMITS
    ) -> None:
        self._started = started
        self._on_first_token = on_first_token
        self._limits = limits
        self.ttft_s: float | None = None
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._details: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._content_lp: list[TokenLogprob] | None = None
        self._reasoning_lp: list[TokenLogprob] | None = None
        # every `logprobs.content` item in stream order, and whether any came with a delta that printed no content
        # (vLLM: reasoning and tool-call deltas, and an empty delta for each tag it does not print): then they are
        # every output token's, in order, as `logprobs.content` is without streaming
        self._every_lp: list[TokenLogprob] = []
        self._lp_beyond_content = False
        self._reasoning_key_lp = False  # reasoning logprobs under their own key (OpenRouter, the simulator)
        self._ids: list[int] | None = None
        self._prompt_ids: list[int] | None = None
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.provider: str | None = None
        self.model: str | None = None
        self.generation_id: str | None = None
        self.done = False
        self.interventions: tuple = ()  # what an `openrouter_metadata` chunk reported (the final one's)
        self.replaced = False  # some text was not valid Unicode and was replaced (wire.TEXT_REPLACED)
        self.chunks: list[dict] = []

    def feed(self, data: bytes | str) -> None:
        """One event's data (already joined across `data:` lines).

        A stream ends with `[DONE]` (OpenRouter, vLLM, SGLang) or with the finish chunk alone (transformers
        serve sends no [DONE]; its usage rides on that chunk: cli/serving/chat_completion.py sse_gen).
        """
        if data == b"[DONE]" or data == "[DONE]":
            self.done = True
            return
        n = len(self.chunks)
        try:
            chunk, replaced = wire.load_json(data, f"stream chunk {n}")
        except MalformedResponse as exc:
            text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
            if text.lstrip().startswith('{"error"'):
                # transformers serve formats its error chunk with an f-string: a message holding a quote
                # is not JSON (cli/serving/chat_completion.py sse_gen); keep its text as the error
                self._fail(text.strip()[:300], f"stream chunk {n}.error")
            self._charge(exc)
            raise
        if type(chunk) is not dict:
            self._charge(MalformedResponse(f"stream chunk {n}", f"should be an object, got {wire.kind_of(chunk)}"))
        self.replaced = self.replaced or replaced
        self.chunks.append(chunk)
        try:
            self._feed_chunk(chunk, n)
        except MalformedResponse as exc:
            self._charge(exc)

    def _feed_chunk(self, chunk: dict, n: int) -> None:
        if n == 0:
            self.generation_id = opt_str(chunk.get("id"), f"stream chunk {n}.id")
            self.provider = opt_str(chunk.get("provider"), f"stream chunk {n}.provider")
            self.model = opt_str(chunk.get("model"), f"stream chunk {n}.model")
        if chunk.get("usage") is not None:
            self.usage = parse_usage(chunk["usage"], f"stream chunk {n}.usage", self._limits)
        if self._prompt_ids is None and chunk.get("prompt_token_ids") is not None:
            self._prompt_ids = _prompt_ids(chunk, f"stream chunk {n}", self._limits)
        if chunk.get(METADATA_FIELD) is not None:  # OpenRouter: on the final chunk
            self.interventions = read_openrouter_metadata(chunk[METADATA_FIELD], f"stream chunk {n}.{METADATA_FIELD}")
        if chunk.get("error") is not None:
            self._fail(chunk["error"], f"stream chunk {n}.error")
        choices = opt_list(chunk.get("choices"), f"stream chunk {n}.choices")
        if not choices:
            return
        if len(choices) > 1:
            raise MalformedResponse(
                f"stream chunk {n}.choices", f"holds {len(choices)} choices; eaglewatch asks for one (n = 1)"
            )
        choice = obj(choices[0], f"stream chunk {n}.choices[0]")
        _choice_index(choice, f"stream chunk {n}.choices[0]")
        self._feed_choice(choice, chunk, n)

    def reported_cost(self) -> float:
        """The cost a usage chunk reported so far (0.0 when none did)."""
        return float(self.usage.cost_usd) if self.usage is not None and self.usage.cost_usd else 0.0

    def _charge(self, exc: ProviderError) -> None:
        """Raise `exc` carrying what the stream's usage reported so far (a billed attempt stays billed)."""
        exc.cost_usd, exc.usage = self.reported_cost(), self.usage
        raise exc

    def _fail(self, error: Any, where: str) -> None:
        self._charge(_provider_error_in_body(error, where))

    def _feed_choice(self, choice: dict, chunk: dict, n: int) -> None:
        where = f"stream chunk {n}.choices[0]"
        delta = opt_obj(choice.get("delta"), f"{where}.delta")
        got_token = False
        content = reasoning = None
        if delta is not None:
            content = opt_str(delta.get("content"), f"{where}.delta.content")
            if content:
                self._content.append(content)
                got_token = True
            reasoning = delta.get("reasoning")
            if reasoning is None:
                reasoning = opt_str(delta.get("reasoning_content"), f"{where}.delta.reasoning_content")
            else:
                reasoning = opt_str(reasoning, f"{where}.delta.reasoning")
            if reasoning:
                self._reasoning.append(reasoning)
                got_token = True
            details = delta.get("reasoning_details")
            if details is not None:
                text = _details_text(details, f"{where}.delta.reasoning_details")
                if text and not self._reasoning:
                    self._details.append(text)
            calls = opt_list(delta.get("tool_calls"), f"{where}.delta.tool_calls")
            if calls:
                for i, call in enumerate(calls):
                    self._feed_call(obj(call, f"{where}.delta.tool_calls[{i}]"), f"{where}.delta.tool_calls[{i}]")
                got_token = True
        logprobs = opt_obj(choice.get("logprobs"), f"{where}.logprobs")
        if logprobs is not None:
            if logprobs.get("content") is not None:
                items = parse_logprob_list(logprobs["content"], f"{where}.logprobs.content")
                self._every_lp.extend(items)
                if items and not content:
                    self._lp_beyond_content = True
                # vLLM puts the logprobs of reasoning tokens under `content` in reasoning deltas
                if reasoning and not content:
                    self._reasoning_lp = (self._reasoning_lp or []) + items
                else:
                    self._content_lp = (self._content_lp or []) + items
            for name in ("reasoning", "reasoning_content"):
                if logprobs.get(name) is not None:
                    items = parse_logprob_list(logprobs[name], f"{where}.logprobs.{name}")
                    self._reasoning_lp = (self._reasoning_lp or []) + items
                    self._reasoning_key_lp = True
        ids = _server_ids(choice, where, self._limits)
        if ids is not None:
            self._ids = (self._ids or []) + ids
        if self._prompt_ids is None and choice.get("prompt_token_ids") is not None:
            self._prompt_ids = _prompt_ids(choice, where, self._limits)
        if got_token and self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self._started
            if self._on_first_token is not None:
                self._on_first_token()
        finish = opt_str(choice.get("finish_reason"), f"{where}.finish_reason")
        if finish == "error" or choice.get("error") is not None:
            self._fail(choice.get("error") or chunk.get("error"), f"{where}.error")
        if finish is not None:
            self.finish = finish

    def _logprobs(self) -> dict[str, tuple[TokenLogprob, ...] | None]:
        """The Completion's logprob fields. A stream whose `logprobs.content` also came with deltas that printed no
        content (vLLM) gives every output token's there, tags included: kept whole and in order as content
        logprobs (the shape of vLLM's non-streamed answer), not cut into reasoning and content, which would lose
        where the tags go."""
        if self._lp_beyond_content and not self._reasoning_key_lp:
            return {"content_logprobs": tuple(self._every_lp), "reasoning_logprobs": None}
        return {
            "content_logprobs": tuple(self._content_lp) if self._content_lp is not None else None,
            "reasoning_logprobs": tuple(self._reasoning_lp) if self._reasoning_lp is not None else None,
        }

    def _feed_call(self, call: dict, where: str) -> None:
        index = wire.index(call.get("index"), f"{where}.index")
        slot = self._calls.get(index)
        if slot is None:
            if len(self._calls) >= wire.MAX_TOOL_CALLS:
                raise MalformedResponse(where, f"opens more than {wire.MAX_TOOL_CALLS} tool calls")
            slot = self._calls[index] = {"id": "", "name": "", "arguments": [], "type": "function"}
        call_id = opt_str(call.get("id"), f"{where}.id")
        if call_id:
            slot["id"] = call_id
        kind = opt_str(call.get("type"), f"{where}.type")
        if kind:
            slot["type"] = kind
        function = opt_obj(call.get("function"), f"{where}.function") or {}
        name = opt_str(function.get("name"), f"{where}.function.name")
        if name:
            slot["name"] = name
        args = opt_str(function.get("arguments"), f"{where}.function.arguments")
        if args:
            slot["arguments"].append(args)

    def finish_completion(self, total_s: float) -> Completion:
        """The assembled Completion; raises RetryableError (error_class `stream`) when the stream ended without
        a finish_reason, whether it broke off or said [DONE] early: the wire cut it, not the model."""
        flags: tuple[str, ...] = (wire.TEXT_REPLACED,) if self.replaced else ()
        finish = self.finish
        if finish is None:
            ending = "[DONE]" if self.done else "the connection closing"
            exc = RetryableError(
                f"the stream ended after {len(self.chunks)} chunks by {ending} without a finish_reason: "
                "the wire cut the answer; asking again",
                error_class=ErrorClass.STREAM,
            )
            self._charge(exc)  # a usage chunk with a cost was billed, finished or not
        try:
            _check_finish(finish, None, "stream")
        except ProviderError as exc:
            self._charge(exc)
        reasoning = "".join(self._reasoning) if self._reasoning else ("".join(self._details) or None)
        calls = tuple(
            ToolCall(id=s["id"], name=s["name"], arguments="".join(s["arguments"]), index=i, type=s["type"])
            for i, s in sorted(self._calls.items())
        )
        return Completion(
            content="".join(self._content),
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason=finish,
            usage=self.usage or Usage(),
            **self._logprobs(),
            token_ids=tuple(self._ids) if self._ids is not None else None,
            prompt_token_ids=tuple(self._prompt_ids) if self._prompt_ids is not None else None,
            ttft_s=self.ttft_s,
            total_s=total_s,
            provider=self.provider,
            model=self.model,
            generation_id=self.generation_id,
            raw=self.chunks,
            wire_flags=flags,
            interventions=self.interventions,
        )


def iter_sse_events(buffer: bytearray, data: bytes) -> list[bytes]:
    """Append `data` to `buffer`; return the complete events' data (bytes: the JSON reader decodes and checks
    them, `wire.load_json`), comments skipped.

    Lines starting with ':' are SSE comments (`: OPENROUTER PROCESSING`); several `data:` lines in
    one event are joined with '\\n'; other fields (event:, id:, retry:) are ignored; CRLF is accepted.
    """
    if b"\r" in data or buffer[-1:] == b"\r":
        buffer += data
        normalised = bytes(buffer).replace(b"\r\n", b"\n")
        if normalised.endswith(b"\r"):  # maybe the first half of a CRLF split across reads
            normalised = normalised[:-1].replace(b"\r", b"\n") + b"\r"
        else:
            normalised = normalised.replace(b"\r", b"\n")
        buffer[:] = normalised
    else:
        buffer += data
    end = buffer.rfind(b"\n\n")
    if end == -1:
        return []
    block = bytes(buffer[:end])
    del buffer[: end + 2]
    events: list[bytes] = []
    lines: list[bytes] = []
    for line in block.split(b"\n"):
        if not line:
            if lines:
                events.append(b"\n".join(lines))
                lines = []
        elif line.startswith(b"data:"):
            lines.append(line[6:] if line[5:6] == b" " else line[5:])
    if lines:
        events.append(b"\n".join(lines))
    return events


# ---------------------------------------------------------------------------------------------------
# errors


def parse_retry_after(headers: Any, body: Any = None, *, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms`, `Retry-After` (seconds or HTTP date) or `error.availability`."""
    value = headers.get("retry-after-ms") if headers is not None else None
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after") if headers is not None else None
    if value:
        value = value.strip()
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(0.0, when.timestamp() - (now if now is not None else time.time()))
    if isinstance(body, dict):
        error = body.get("error")
        availability = error.get("availability") if isinstance(error, dict) else None
        if isinstance(availability, dict) and isinstance(availability.get("retry_after"), (int, float)):
            return max(0.0, float(availability["retry_after"]))
    return None


def _error_fields(body: Any) -> tuple[str, str | None, dict]:
    """(message, error_type, error object) of an error body in any of the servers' shapes:
    OpenRouter / vLLM `{"error": {"message", ...}}`; SGLang's ErrorResponse `{"object": "error", "message",
    "type", "code"}` (python/sglang/srt/entrypoints/openai/protocol.py); FastAPI's `{"detail": ...}`
    (transformers serve's HTTPException, e.g. 422 "Unexpected fields in the request")."""
    if isinstance(body, dict) and not isinstance(body.get("error"), dict):
        text = body.get("message") if body.get("object") == "error" else body.get("detail")
        if text is not None:
            return (text if isinstance(text, str) else json.dumps(text))[:1000], None, {}
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return "", None, {}
    error = body["error"]
    message = error.get("message") if isinstance(error.get("message"), str) else ""
    metadata = error.get("metadata") if isinstance(error.get("metadata"), dict) else {}
    error_type = error.get("error_type") or metadata.get("error_type")
    return message, error_type if isinstance(error_type, str) else None, error


def classify_status(status: int, headers: Any, body: Any) -> ProviderError:
    """The ProviderError for an HTTP error status (and its JSON body, if it parsed)."""
    message, error_type, error = _error_fields(body)
    detail = f": {message[:300]}" if message else ""
    retry_after = parse_retry_after(headers, body)
    availability = error.get("availability") if isinstance(error, dict) else None
    if isinstance(availability, dict) and availability.get("retryable") is True:
        return RetryableError(
            f"HTTP {status}, provider temporarily unavailable{detail}",
            error_class=ErrorClass.RATE_LIMITED if status == 429 else ErrorClass.SERVER,
            status=status,
            retry_after_s=retry_after,
        )
    if status == 429:
        return RetryableError(
            f"HTTP 429 rate limited{detail}",
            error_class=ErrorClass.RATE_LIMITED,
            status=status,
            retry_after_s=retry_after,
        )
    if status in (408, 409):
        return RetryableError(
            f"HTTP {status}{detail}", error_class=http_error_class(status), status=status, retry_after_s=retry_after
        )
    if status >= 500:
        return RetryableError(
            f"HTTP {status} from the provider{detail}",
            error_class=ErrorClass.SERVER,
            status=status,
            retry_after_s=retry_after,
        )
    if status == 401:
        return RunStoppingError(
            f"HTTP 401: the API key was refused{detail}; check the key in the endpoint's api_key_env variable",
            error_class=ErrorClass.AUTH,
            status=status,
        )
    if status == 402:
        return RunStoppingError(
            f"HTTP 402: out of credits{detail}; add credits or raise the key's limit, then resume the run",
            error_class=ErrorClass.CREDITS,
            status=status,
        )
    if status == 403:
        moderation = error_type in ("content_policy_violation", "refusal") or (
            isinstance(error, dict) and isinstance(error.get("metadata"), dict) and "flagged_input" in error["metadata"]
        )
        if moderation:
            return SampleFatalError(
                f"HTTP 403: the provider's moderation blocked this sample{detail}",
                error_class=ErrorClass.FILTERED,
                status=status,
            )
        return RunStoppingError(
            f"HTTP 403: forbidden{detail}; check the key's permissions", error_class=ErrorClass.FORBIDDEN, status=status
        )
    if status == 404:
        return RunStoppingError(
            f"HTTP 404: no such model or endpoint{detail}; check the model name and base_url",
            error_class=ErrorClass.NOT_FOUND,
            status=status,
        )
    if status == 200:
        return RetryableError(
            f"the provider returned an error under HTTP 200{detail}",
            error_class=ErrorClass.STREAM,
            status=status,
            retry_after_s=retry_after,
        )
    return SampleFatalError(
        f"HTTP {status}: the provider rejected this request{detail}",
        error_class=http_error_class(status),
        status=status,
    )
