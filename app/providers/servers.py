"""What each OpenAI-compatible server kind is asked for, so its token ids come back where it can give them.

`ids_request_fields(server, stream)` is merged into every request body before the endpoint's own `extra`
(which can still override it). Facts, from each server's source (docs/providers.md has the full table):

- vLLM: `return_token_ids: true` gives `choices[].token_ids` (the chunk's delta ids when streaming) and
  `prompt_token_ids` (on the response; on the first chunk when streaming).
  vllm/entrypoints/openai/chat_completion/protocol.py (ChatCompletionRequest.return_token_ids).
- SGLang chat: `return_token_ids` and `return_prompt_token_ids` give `choices[].token_ids` and
  `choices[].prompt_token_ids`, but only without streaming: serving_chat.py answers 400 ("... is not
  supported with streaming") when either is sent with `stream: true`, so a streaming request asks for
  neither. python/sglang/srt/entrypoints/openai/protocol.py (ChatCompletionRequest, ChatCompletionResponseChoice),
  python/sglang/srt/entrypoints/openai/serving_chat.py.
- OpenRouter, transformers serve, plain OpenAI: no token ids on the chat API; nothing is asked.
  transformers serve validates the body against its own params class and rejects unknown fields
  (transformers cli/serving/chat_completion.py `_validate_request`), so nothing extra may be sent there.
"""

from __future__ import annotations

SERVER_KINDS = ("openrouter", "sglang", "vllm", "transformers-serve", "openai")


def ids_request_fields(server: str | None, stream: bool) -> dict:
    """Request fields that ask `server` for output and prompt token ids ({} where it offers none)."""
    if server == "vllm":
        return {"return_token_ids": True}
    if server == "sglang" and not stream:
        return {"return_token_ids": True, "return_prompt_token_ids": True}
    return {}


def server_kind(endpoint: object) -> str | None:
    """The endpoint's server kind: `server` when set, else its simulator's personality, else None."""
    kind = getattr(endpoint, "server", None)
    if kind:
        return str(kind)
    simulator = getattr(endpoint, "simulator", None)
    personality = getattr(simulator, "personality", None) if simulator is not None else None
    return str(personality) if personality else None


def server_from_models(body: object, headers: dict[str, str] | None = None) -> str | None:
    """The server kind an endpoint's `GET /models` answer says it is (None when it does not say). Read from what
    each server writes about itself:

    - vLLM: every entry `owned_by: "vllm"` (vllm/entrypoints/openai/engine/protocol.py, ModelCard);
    - SGLang: `owned_by: "sglang"` (python/sglang/srt/entrypoints/openai/protocol.py, ModelCard);
    - transformers serve: entries with a `status: {"value": "loaded" | "unloaded"}` object, which is not an
      OpenAI field (transformers cli/serving/model_manager.py list_models), and the `x-request-id` header its
      middleware puts on every answer (cli/serving/server.py request_id_middleware);
    - OpenRouter: entries with `pricing` and `architecture` (openrouter.ai/docs, `GET /api/v1/models`).
    """
    data = body.get("data") if isinstance(body, dict) else None
    entries = [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []
    owners = {str(e.get("owned_by") or "") for e in entries}
    if "vllm" in owners:
        return "vllm"
    if "sglang" in owners:
        return "sglang"
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    if (
        entries
        and all(isinstance(e.get("status"), dict) and "value" in e["status"] for e in entries)
        and "x-request-id" in lowered
    ):
        return "transformers-serve"
    if entries and all("pricing" in e and "architecture" in e for e in entries):
        return "openrouter"
    return None
