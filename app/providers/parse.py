"""Turn chat-completion bodies, SSE chunks and error responses into a `Completion` or a `ProviderError`.

Pure functions over parsed JSON (no I/O), so they are cheap to test. Bodies are read defensively: a
field of the wrong type raises `RetryableError(error_class="malformed")` naming the field.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Callable
from typing import Any

from app.providers.exceptions import ProviderError, RetryableError, RunStoppingError, SampleFatalError
from app.records import Completion, TokenLogprob, ToolCall, Usage

# ---------------------------------------------------------------------------------------------------
# small typed readers


def _malformed(field: str, detail: str) -> RetryableError:
    return RetryableError(f"the provider sent a malformed response: {field} {detail}", error_class="malformed")


def _obj(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise _malformed(field, f"should be an object, got {type(value).__name__}")
    return value


def _opt_str(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _malformed(field, f"should be a string or null, got {type(value).__name__}")


def _opt_int(value: Any, field: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _malformed(field, f"should be a number, got {type(value).__name__}")
    return int(value)


def _opt_float(value: Any, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _malformed(field, f"should be a number, got {type(value).__name__}")
    return float(value)


def _int_list(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _malformed(field, "should be a list of integers")
    return value


def parse_usage(raw: Any, field: str = "usage") -> Usage:
    """Usage counts and cost from an OpenAI/OpenRouter `usage` object (missing counts read as 0).

    OpenRouter (openrouter.ai/docs/use-cases/usage-accounting; openai-compatible-apis.md B.5): `cost` is what
    OpenRouter charged; with a bring-your-own-key request (`is_byok: true`) that is only its fee and the
    provider bills `cost_details.upstream_inference_cost` to the user's own key, so both are counted.
    """
    if raw is None:
        return Usage()
    raw = _obj(raw, field)
    completion_details = raw.get("completion_tokens_details") or {}
    prompt_details = raw.get("prompt_tokens_details") or {}
    _obj(completion_details, f"{field}.completion_tokens_details")
    _obj(prompt_details, f"{field}.prompt_tokens_details")
    cost = _opt_float(raw.get("cost"), f"{field}.cost")
    if raw.get("is_byok") is True:
        details = _obj(raw.get("cost_details") or {}, f"{field}.cost_details")
        upstream = _opt_float(details.get("upstream_inference_cost"), f"{field}.cost_details.upstream_inference_cost")
        if upstream is not None:
            cost = (cost or 0.0) + upstream
    # SGLang puts reasoning_tokens at the top of usage (protocol.py UsageInfo), OpenAI under the details
    reasoning = completion_details.get("reasoning_tokens")
    if reasoning is None:
        reasoning = raw.get("reasoning_tokens")
    return Usage(
        prompt_tokens=_opt_int(raw.get("prompt_tokens"), f"{field}.prompt_tokens"),
        completion_tokens=_opt_int(raw.get("completion_tokens"), f"{field}.completion_tokens"),
        reasoning_tokens=_opt_int(reasoning, f"{field}.completion_tokens_details.reasoning_tokens"),
        cached_tokens=_opt_int(prompt_details.get("cached_tokens"), f"{field}.prompt_tokens_details.cached_tokens"),
        cost_usd=cost,
    )


def parse_logprob_list(raw: Any, field: str) -> list[TokenLogprob]:
    """A `logprobs.content`-style list into TokenLogprob records (bytes kept when present)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _malformed(field, "should be a list")
    out = []
    for i, item in enumerate(raw):
        item = _obj(item, f"{field}[{i}]")
        token = item.get("token")
        if not isinstance(token, str):
            raise _malformed(f"{field}[{i}].token", "should be a string")
        raw_bytes = item.get("bytes")
        byte_tuple = tuple(_int_list(raw_bytes, f"{field}[{i}].bytes")) if raw_bytes is not None else None
        logprob = _opt_float(item.get("logprob"), f"{field}[{i}].logprob")
        out.append(TokenLogprob(token=token, bytes=byte_tuple, logprob=logprob if logprob is not None else 0.0))
    return out


def _details_text(details: Any, field: str) -> str:
    """Reasoning text carried only in `reasoning_details` (reasoning.text / reasoning.summary items)."""
    if not isinstance(details, list):
        raise _malformed(field, "should be a list")
    parts = []
    for item in details:
        if isinstance(item, dict):
            text = item.get("text") if item.get("type", "reasoning.text") == "reasoning.text" else item.get("summary")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def _server_ids(choice: dict, field: str) -> list[int] | None:
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
    return _int_list(ids, f"{field}.token_ids")


def _prompt_ids(holder: dict, field: str) -> list[int] | None:
    """`prompt_token_ids` of a body, chunk or choice: vLLM puts it on the response (and the first stream
    chunk, chat_completion/protocol.py ChatCompletionResponse / ChatCompletionStreamResponse); SGLang on the
    choice with `return_prompt_token_ids: true` (protocol.py ChatCompletionResponseChoice, non-streaming)."""
    ids = holder.get("prompt_token_ids")
    if ids is None:
        return None
    return _int_list(ids, f"{field}.prompt_token_ids")


def _provider_error_in_body(error: Any, where: str) -> RetryableError:
    # OpenRouter: {"code", "message", "metadata"}; transformers serve streams `{"error": "<text>"}`
    # (transformers cli/serving/chat_completion.py sse_gen, _StreamError)
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    return RetryableError(
        f"the provider failed during generation ({where}): {message or 'no message'}", error_class="stream"
    )


def _check_finish(finish: str | None, error: Any, where: str) -> None:
    if error is not None or finish == "error":
        raise _provider_error_in_body(error, where)
    if finish == "content_filter":
        raise SampleFatalError("the provider's content filter stopped this sample", error_class="filtered")


# ---------------------------------------------------------------------------------------------------
# non-streaming


def parse_body(text: bytes | str, *, total_s: float, ttft_s: float | None = None) -> Completion:
    """A non-streaming 200 body (leading keep-alive whitespace allowed) into a Completion."""
    try:
        body = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _malformed("body", f"is not JSON ({exc.__class__.__name__}: {exc})") from None
    body = _obj(body, "body")
    if body.get("error") is not None and not body.get("choices"):
        code = body["error"].get("code") if isinstance(body["error"], dict) else None
        status = code if isinstance(code, int) and 400 <= code < 600 else 200
        raise classify_status(status, {}, body)  # an error envelope under HTTP 200: judge it by its code
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _malformed("choices", "should be a non-empty list")
    choice = _obj(choices[0], "choices[0]")
    message = _obj(choice.get("message"), "choices[0].message")
    finish = _opt_str(choice.get("finish_reason"), "choices[0].finish_reason")
    _check_finish(finish, choice.get("error"), "choices[0].error")

    content = _opt_str(message.get("content"), "choices[0].message.content") or ""
    # reasoning: OpenRouter and vLLM `reasoning` (vllm/entrypoints/openai/chat_completion/protocol.py
    # ChatMessage.reasoning); SGLang `reasoning_content` (python/sglang/srt/entrypoints/openai/protocol.py
    # ChatMessage) and transformers serve (transformers cli/serving/chat_completion.py _build_completion);
    # OpenRouter also `reasoning_details[]` (openai-compatible-apis.md B.4)
    reasoning = _opt_str(message.get("reasoning"), "choices[0].message.reasoning")
    if reasoning is None:
        reasoning = _opt_str(message.get("reasoning_content"), "choices[0].message.reasoning_content")
    if reasoning is None and message.get("reasoning_details"):
        reasoning = _details_text(message["reasoning_details"], "choices[0].message.reasoning_details") or None

    # tool calls: the OpenAI shape on every server; transformers serve makes ids `{request_id}_tool_call_{i}`
    # and json.dumps the arguments (cli/serving/utils.py _normalize_tool_call), vLLM/SGLang parsers per model
    tool_calls = []
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _malformed("choices[0].message.tool_calls", "should be a list")
    for i, call in enumerate(raw_calls):
        where = f"choices[0].message.tool_calls[{i}]"
        call = _obj(call, where)
        function = _obj(call.get("function"), f"{where}.function")
        tool_calls.append(
            ToolCall(
                id=_opt_str(call.get("id"), f"{where}.id") or "",
                name=_opt_str(function.get("name"), f"{where}.function.name") or "",
                arguments=_opt_str(function.get("arguments"), f"{where}.function.arguments") or "",
                index=_opt_int(call.get("index", i), f"{where}.index"),
                type=_opt_str(call.get("type"), f"{where}.type") or "function",
            )
        )

    content_lp = reasoning_lp = None
    logprobs = choice.get("logprobs")
    if logprobs is not None:
        logprobs = _obj(logprobs, "choices[0].logprobs")
        if logprobs.get("content") is not None:
            content_lp = tuple(parse_logprob_list(logprobs["content"], "choices[0].logprobs.content"))
        for name in ("reasoning", "reasoning_content"):
            if logprobs.get(name) is not None:
                reasoning_lp = tuple(parse_logprob_list(logprobs[name], f"choices[0].logprobs.{name}"))

    ids = _server_ids(choice, "choices[0]")
    prompt_ids = _prompt_ids(choice, "choices[0]")
    if prompt_ids is None:
        prompt_ids = _prompt_ids(body, "body")
    return Completion(
        content=content,
        reasoning=reasoning,
        tool_calls=tuple(tool_calls),
        finish_reason=finish,
        usage=parse_usage(body.get("usage")),
        content_logprobs=content_lp,
        reasoning_logprobs=reasoning_lp,
        token_ids=tuple(ids) if ids is not None else None,
        prompt_token_ids=tuple(prompt_ids) if prompt_ids is not None else None,
        ttft_s=ttft_s,
        total_s=total_s,
        provider=_opt_str(body.get("provider"), "provider"),
        model=_opt_str(body.get("model"), "model"),
        generation_id=_opt_str(body.get("id"), "id"),
        raw=body,
    )


# ---------------------------------------------------------------------------------------------------
# streaming


class StreamAssembler:
    """Collects SSE `data:` payloads of one streamed completion; `finish()` gives the Completion.

    Content and reasoning deltas are concatenated; tool calls are assembled by `index` with argument
    strings concatenated exactly as sent; usage comes from the final chunk (empty `choices`). An
    `error` chunk or `finish_reason: "error"` raises RetryableError (error_class "stream").
    """

    def __init__(self, started: float, on_first_token: Callable[[], None] | None = None) -> None:
        self._started = started
        self._on_first_token = on_first_token
        self.ttft_s: float | None = None
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._details: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._content_lp: list[TokenLogprob] | None = None
        self._reasoning_lp: list[TokenLogprob] | None = None
        self._ids: list[int] | None = None
        self._prompt_ids: list[int] | None = None
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.provider: str | None = None
        self.model: str | None = None
        self.generation_id: str | None = None
        self.done = False
        self.chunks: list[dict] = []

    def feed(self, data: str) -> None:
        """One event's data (already joined across `data:` lines).

        A stream ends with `[DONE]` (OpenRouter, vLLM, SGLang) or with the finish chunk alone (transformers
        serve sends no [DONE]; its usage rides on that chunk: cli/serving/chat_completion.py sse_gen).
        """
        if data == "[DONE]":
            self.done = True
            return
        n = len(self.chunks)
        try:
            chunk = json.loads(data)
        except ValueError:
            if data.lstrip().startswith('{"error"'):
                # transformers serve formats its error chunk with an f-string: a message holding a quote
                # is not JSON (cli/serving/chat_completion.py sse_gen); keep its text as the error
                self._fail(data.strip()[:300], f"stream chunk {n}.error")
            raise _malformed(f"stream chunk {n}", "is not JSON") from None
        if type(chunk) is not dict:
            raise _malformed(f"stream chunk {n}", f"should be an object, got {type(chunk).__name__}")
        self.chunks.append(chunk)
        if n == 0:
            self.generation_id = _opt_str(chunk.get("id"), f"stream chunk {n}.id")
            self.provider = _opt_str(chunk.get("provider"), f"stream chunk {n}.provider")
            self.model = _opt_str(chunk.get("model"), f"stream chunk {n}.model")
        if chunk.get("usage") is not None:
            self.usage = parse_usage(chunk["usage"], f"stream chunk {n}.usage")
        if self._prompt_ids is None and chunk.get("prompt_token_ids") is not None:
            self._prompt_ids = _prompt_ids(chunk, f"stream chunk {n}")
        if chunk.get("error") is not None:
            self._fail(chunk["error"], f"stream chunk {n}.error")
        choices = chunk.get("choices")
        if not choices:
            return
        if type(choices) is not list:
            raise _malformed(f"stream chunk {n}.choices", "should be a list")
        for choice in choices:
            if type(choice) is not dict:
                raise _malformed(f"stream chunk {n}.choices[]", "should be an object")
            self._feed_choice(choice, chunk, n)

    def reported_cost(self) -> float:
        """The cost a usage chunk reported so far (0.0 when none did)."""
        return float(self.usage.cost_usd) if self.usage is not None and self.usage.cost_usd else 0.0

    def _fail(self, error: Any, where: str) -> None:
        exc = _provider_error_in_body(error, where)
        exc.cost_usd = self.reported_cost()
        raise exc

    def _feed_choice(self, choice: dict, chunk: dict, n: int) -> None:
        delta = choice.get("delta")
        got_token = False
        content = reasoning = None
        if delta:
            if type(delta) is not dict:
                raise _malformed(f"stream chunk {n}.choices[0].delta", "should be an object")
            content = delta.get("content")
            if content:
                if type(content) is not str:
                    raise _malformed(f"stream chunk {n}.choices[0].delta.content", "should be a string")
                self._content.append(content)
                got_token = True
            reasoning = delta.get("reasoning")
            if reasoning is None:
                reasoning = delta.get("reasoning_content")
            if reasoning:
                if type(reasoning) is not str:
                    raise _malformed(f"stream chunk {n}.choices[0].delta.reasoning", "should be a string")
                self._reasoning.append(reasoning)
                got_token = True
            details = delta.get("reasoning_details")
            if details and not self._reasoning:
                self._details.append(_details_text(details, f"stream chunk {n}.choices[0].delta.reasoning_details"))
            calls = delta.get("tool_calls")
            if calls:
                where = f"stream chunk {n}.choices[0]"
                if type(calls) is not list:
                    raise _malformed(f"{where}.delta.tool_calls", "should be a list")
                for call in calls:
                    self._feed_call(_obj(call, f"{where}.delta.tool_calls[]"), where)
                got_token = True
        logprobs = choice.get("logprobs")
        if logprobs is not None:
            where = f"stream chunk {n}.choices[0].logprobs"
            logprobs = _obj(logprobs, where)
            if logprobs.get("content") is not None:
                items = parse_logprob_list(logprobs["content"], f"{where}.content")
                # vLLM puts the logprobs of reasoning tokens under `content` in reasoning deltas
                if reasoning and not content:
                    self._reasoning_lp = (self._reasoning_lp or []) + items
                else:
                    self._content_lp = (self._content_lp or []) + items
            for name in ("reasoning", "reasoning_content"):
                if logprobs.get(name) is not None:
                    items = parse_logprob_list(logprobs[name], f"{where}.{name}")
                    self._reasoning_lp = (self._reasoning_lp or []) + items
        ids = _server_ids(choice, f"stream chunk {n}.choices[0]")
        if ids is not None:
            self._ids = (self._ids or []) + ids
        if self._prompt_ids is None and choice.get("prompt_token_ids") is not None:
            self._prompt_ids = _prompt_ids(choice, f"stream chunk {n}.choices[0]")
        if got_token and self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self._started
            if self._on_first_token is not None:
                self._on_first_token()
        finish = choice.get("finish_reason")
        if finish is not None or "error" in choice:
            finish = _opt_str(finish, f"stream chunk {n}.choices[0].finish_reason")
            if finish == "error" or choice.get("error") is not None:
                self._fail(choice.get("error") or chunk.get("error"), f"stream chunk {n}.choices[0].error")
            if finish is not None:
                self.finish = finish

    def _feed_call(self, call: dict, where: str) -> None:
        index = _opt_int(call.get("index"), f"{where}.delta.tool_calls[].index")
        slot = self._calls.setdefault(index, {"id": "", "name": "", "arguments": [], "type": "function"})
        if call.get("id"):
            slot["id"] = _opt_str(call["id"], f"{where}.delta.tool_calls[{index}].id")
        if call.get("type"):
            slot["type"] = _opt_str(call["type"], f"{where}.delta.tool_calls[{index}].type")
        function = call.get("function") or {}
        function = _obj(function, f"{where}.delta.tool_calls[{index}].function")
        if function.get("name"):
            slot["name"] = _opt_str(function["name"], f"{where}.delta.tool_calls[{index}].function.name")
        args = _opt_str(function.get("arguments"), f"{where}.delta.tool_calls[{index}].function.arguments")
        if args:
            slot["arguments"].append(args)

    def finish_completion(self, total_s: float) -> Completion:
        """The assembled Completion; raises RetryableError when the stream ended early."""
        if not self.done and self.finish is None:
            exc = RetryableError(
                f"the stream ended after {len(self.chunks)} chunks without a finish_reason or [DONE]",
                error_class="stream",
            )
            exc.cost_usd = self.reported_cost()  # a usage chunk with a cost was billed, finished or not
            raise exc
        _check_finish(self.finish, None, "stream")
        reasoning = "".join(self._reasoning) if self._reasoning else ("".join(self._details) or None)
        calls = tuple(
            ToolCall(id=s["id"], name=s["name"], arguments="".join(s["arguments"]), index=i, type=s["type"])
            for i, s in sorted(self._calls.items())
        )
        return Completion(
            content="".join(self._content),
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason=self.finish,
            usage=self.usage or Usage(),
            content_logprobs=tuple(self._content_lp) if self._content_lp is not None else None,
            reasoning_logprobs=tuple(self._reasoning_lp) if self._reasoning_lp is not None else None,
            token_ids=tuple(self._ids) if self._ids is not None else None,
            prompt_token_ids=tuple(self._prompt_ids) if self._prompt_ids is not None else None,
            ttft_s=self.ttft_s,
            total_s=total_s,
            provider=self.provider,
            model=self.model,
            generation_id=self.generation_id,
            raw=self.chunks,
        )


def iter_sse_events(buffer: bytearray, data: bytes) -> list[str]:
    """Append `data` to `buffer`; return the complete events' data strings, comments skipped.

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
    events: list[str] = []
    lines: list[bytes] = []
    for line in block.split(b"\n"):
        if not line:
            if lines:
                events.append(b"\n".join(lines).decode("utf-8", "replace"))
                lines = []
        elif line.startswith(b"data:"):
            lines.append(line[6:] if line[5:6] == b" " else line[5:])
    if lines:
        events.append(b"\n".join(lines).decode("utf-8", "replace"))
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
        return RetryableError(f"HTTP {status}, provider temporarily unavailable{detail}", error_class=str(status)
                              if status == 429 else "5xx", status=status, retry_after_s=retry_after)
    if status == 429:
        return RetryableError(f"HTTP 429 rate limited{detail}", error_class="429", status=status,
                              retry_after_s=retry_after)
    if status in (408, 409):
        return RetryableError(f"HTTP {status}{detail}", error_class=str(status), status=status,
                              retry_after_s=retry_after)
    if status >= 500:
        return RetryableError(f"HTTP {status} from the provider{detail}", error_class="5xx", status=status,
                              retry_after_s=retry_after)
    if status == 401:
        return RunStoppingError(f"HTTP 401: the API key was refused{detail}; check the key in the "
                                "endpoint's api_key_env variable", error_class="auth", status=status)
    if status == 402:
        return RunStoppingError(f"HTTP 402: out of credits{detail}; add credits or raise the key's limit, "
                                "then resume the run", error_class="credits", status=status)
    if status == 403:
        moderation = error_type in ("content_policy_violation", "refusal") or (
            isinstance(error, dict) and isinstance(error.get("metadata"), dict) and "flagged_input" in error["metadata"]
        )
        if moderation:
            return SampleFatalError(f"HTTP 403: the provider's moderation blocked this sample{detail}",
                                    error_class="filtered", status=status)
        return RunStoppingError(f"HTTP 403: forbidden{detail}; check the key's permissions",
                                error_class="forbidden", status=status)
    if status == 404:
        return RunStoppingError(f"HTTP 404: no such model or endpoint{detail}; check the model name and "
                                "base_url", error_class="not_found", status=status)
    if status == 200:
        return RetryableError(f"the provider returned an error under HTTP 200{detail}", error_class="stream",
                              status=status, retry_after_s=retry_after)
    return SampleFatalError(f"HTTP {status}: the provider rejected this request{detail}",
                            error_class=str(status), status=status)
