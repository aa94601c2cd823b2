"""Server personalities: what each real OpenAI-compatible server does to the same output ids.

The simulator's quirks are single text steps; a personality is a whole server: the field names it answers
with, where its ids live, which text steps it applies streaming and not, how it re-serialises tool arguments,
how it names tool ids, how it ends a stream and how it fails. Each fact names its source; docs/providers.md
has the same table for readers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Personality:
    """One server's wire behaviour (see the module docstring)."""

    name: str
    reasoning_field: str = "reasoning"  # message / delta field holding reasoning text
    reasoning_details: bool = False  # OpenRouter's reasoning_details array beside it
    provider_field: bool = False  # OpenRouter's top-level `provider`
    ids: str = "none"  # none | vllm (token_ids + prompt_token_ids, streaming too) | sglang (non-streaming only)
    plain_quirks: frozenset[str] = frozenset()  # text steps on the non-streaming path
    stream_quirks: frozenset[str] = frozenset()  # text steps on the streaming path
    tool_id: str | None = None  # None: the model's id; else a template with {gen} and {index}
    tool_args_at_once: bool = False  # a tool call arrives in one delta with its whole arguments
    finish_tool_calls: bool = False  # finish_reason "tool_calls" when the output has tool calls
    done_marker: bool = True  # `data: [DONE]` ends a stream
    usage_on_finish_chunk: bool = False  # usage rides on the finish chunk instead of its own chunk
    cost: bool = False  # usage.cost (OpenRouter only)
    logprobs: bool = True  # returns logprobs when asked
    error_chunk: str = "openrouter"  # openrouter: {"error": {...}, choices: [...]}; text: {"error": "<msg>"}
    openai_fields_only: bool = False  # 422 on request fields outside the OpenAI chat schema
    stream_rejects: frozenset[str] = frozenset()  # request fields answered with 400 when stream is true
    non_json_tool_region: int | None = None  # the HTTP status a tool-call region that is not JSON gets (None: parsed)
    null_content: bool = True  # no content -> `content: null` (OpenRouter); False: `content: ""`
    lean_deltas: bool = False  # each delta holds only its own field (role only on the first chunk)
    json_formats: frozenset[str] = (
        frozenset()
    )  # tool formats whose parser json.dumps the arguments again (non-streaming)
    vllm_wire: bool = False  # vLLM's own body and chunk fields (null keys, a chunk per token, every token's logprobs)
    # vLLM's `thinking_token_budget`: at that many reasoning tokens the server forces the think-close token and the
    # answer goes on (an ordinary finish_reason); nothing in the response says so
    thinking_budget: bool = False
    router_metadata: bool = False  # OpenRouter's `openrouter_metadata` when asked (X-OpenRouter-Metadata: enabled)


PERSONALITIES = {
    # OpenRouter: reasoning + reasoning_details, provider, usage.cost, [DONE] (openai-compatible-apis.md B.4-B.8).
    "openrouter": Personality(
        "openrouter", reasoning_details=True, provider_field=True, cost=True, router_metadata=True
    ),
    # vLLM: ChatMessage.reasoning, choices[].token_ids and prompt_token_ids with return_token_ids (deltas and
    # first chunk when streaming): vllm/entrypoints/openai/chat_completion/protocol.py; finish "tool_calls".
    # Its hermes and glm4_moe tool parsers re-serialise arguments with json.dumps(..., ensure_ascii=False)
    # (tokenization.md §7 step 6); the kimi_k2 parser keeps the model's text.
    # Checked field by field against vLLM 0.32 in tests/realserver/test_vllm.py (docs/providers.md lists what is
    # left): the template's whitespace stays in the fields and its qwen3 parser returns an answer with no think
    # block as reasoning; streamed arguments are the model's text; the rest of its wire is `vllm_wire`.
    "vllm": Personality(
        "vllm",
        ids="vllm",
        finish_tool_calls=True,
        json_formats=frozenset({"hermes", "glm-4.5"}),
        plain_quirks=frozenset({"raw_regions", "reasoning_first", "tool_separator_kept"}),
        stream_quirks=frozenset({"raw_regions", "reasoning_first", "tool_separator_kept"}),
        lean_deltas=True,
        vllm_wire=True,
        thinking_budget=True,
    ),
    # SGLang: ChatMessage.reasoning_content; token_ids / prompt_token_ids only non-streaming, 400 when asked
    # with stream=true: python/sglang/srt/entrypoints/openai/protocol.py, serving_chat.py.
    "sglang": Personality(
        "sglang",
        reasoning_field="reasoning_content",
        ids="sglang",
        finish_tool_calls=True,
        stream_rejects=frozenset({"return_token_ids", "return_prompt_token_ids", "return_meta_info"}),
    ),
    # transformers serve (transformers 5.x cli/serving/chat_completion.py + utils.py, checked against the real
    # server in tests/realserver): reasoning_content; non-streaming parses the whole decode with the response
    # template, which strips content and reasoning, drops an empty reasoning and re-serialises arguments with
    # json.dumps (ASCII escapes); streaming sends the raw regions, a tool call in one delta, ids
    # `{request_id}_tool_call_{i}`, usage in a last chunk of its own (with stream_options.include_usage; it rode
    # on the finish chunk before 5.25) and no [DONE]; 422 on unknown request fields; no logprobs; a stream error is
    # `data: {"error": "<msg>"}` formatted by hand; a tool-call region that is not JSON raises a ValueError, which
    # 5.25's server answers with HTTP 400 (cli/serving/server.py `_bad_request_handler`; a 500 before).
    "transformers-serve": Personality(
        "transformers-serve",
        reasoning_field="reasoning_content",
        plain_quirks=frozenset({"strip_whitespace", "json_dumps", "empty_reasoning_none"}),
        stream_quirks=frozenset({"raw_regions", "blank_content_dropped"}),
        tool_id="{gen}_tool_call_{index}",
        tool_args_at_once=True,
        finish_tool_calls=True,
        done_marker=False,
        logprobs=False,
        error_chunk="text",
        openai_fields_only=True,
        non_json_tool_region=400,
        null_content=False,
        lean_deltas=True,
    ),
}
PERSONALITY_NAMES = tuple(PERSONALITIES)

# request fields of the OpenAI chat-completions schema (what a strict server accepts)
OPENAI_CHAT_FIELDS = frozenset(
    {
        "messages",
        "model",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "reasoning_effort",
        "response_format",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "web_search_options",
        "chat_template_kwargs",
        "generation_config",
    }
)


def get_personality(name: str | None) -> Personality:
    """The named personality (default openrouter); KeyError names the choices."""
    try:
        return PERSONALITIES[name or "openrouter"]
    except KeyError:
        raise KeyError(f"unknown simulator personality {name!r}; use one of {', '.join(PERSONALITY_NAMES)}") from None
