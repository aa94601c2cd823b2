"""A raw-prompt client: the prompt's text sent to `/v1/completions` without any chat template.

What an evaluation through a plain completions prompt does (a common shortcut that inflates acceptance: the
drafter sees text it was not trained on): the messages' contents joined by blank lines, no roles, no special
tokens. Non-streaming only; vLLM is asked for `return_token_ids`, so the answer carries the prompt ids the
server fed the model and the template guard (app.eval.template) can name the difference. Same `complete`
signature as `ChatClient`, so the eval engine drives it unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from app.providers.exceptions import EndpointUnreachable, MalformedResponse
from app.providers.parse import classify_status, parse_usage
from app.records import Completion

COMPLETIONS_PATH = "/completions"


def raw_prompt(messages: list[dict]) -> str:
    """The messages' text contents joined by blank lines: the prompt with no template at all."""
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "\n\n".join(parts)


def _ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(type(i) is int and i >= 0 for i in value):
        return tuple(value)
    return None


class RawCompletionClient:
    """`complete(messages, ...)` through `/v1/completions` with the raw prompt text (see the module docstring)."""

    def __init__(self, endpoint: Any, api_key: str | None) -> None:
        self.endpoint_name = getattr(endpoint, "name", None) or "endpoint"
        self.url = str(endpoint.base_url).rstrip("/") + COMPLETIONS_PATH
        headers = {"Content-Type": "application/json", "User-Agent": "eaglewatch"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(headers=headers, timeout=float(getattr(endpoint, "timeout_s", 1800.0)))
        self._extra = dict(getattr(endpoint, "extra", None) or {})

    async def complete(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        model: str,
        extra: dict | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> Completion:
        """One non-streamed attempt; a Completion, else a ProviderError subclass (as `ChatClient.complete`)."""
        body: dict[str, Any] = {**self._extra, **(extra or {})}
        body.pop("chat_template_kwargs", None)  # no template here
        body.update(model=model, prompt=raw_prompt(messages), stream=False, return_token_ids=True)
        started = time.perf_counter()
        try:
            response = await self._client.post(self.url, content=json.dumps(body).encode())
        except httpx.TransportError as exc:
            raise EndpointUnreachable(f"{self.endpoint_name}: {self.url} cannot be reached ({exc})") from None
        total_s = time.perf_counter() - started
        try:
            parsed = response.json()
        except ValueError:
            parsed = None
        if response.status_code != 200:
            raise classify_status(response.status_code, response.headers, parsed)
        choices = parsed.get("choices") if isinstance(parsed, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise MalformedResponse("choices", "is missing or empty in a /v1/completions answer")
        choice = choices[0]
        text = choice.get("text")
        if not isinstance(text, str):
            raise MalformedResponse("choices[0].text", "is not a string")
        return Completion(
            content=text,
            finish_reason=choice.get("finish_reason"),
            usage=parse_usage(parsed.get("usage"), "usage"),
            token_ids=_ids(choice.get("token_ids")),
            prompt_token_ids=_ids(parsed.get("prompt_token_ids")) or _ids(choice.get("prompt_token_ids")),
            total_s=total_s,
            model=parsed.get("model"),
            raw=parsed,
        )

    async def aclose(self) -> None:
        await self._client.aclose()
