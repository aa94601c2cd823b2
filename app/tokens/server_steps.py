"""The text steps each server is known to apply between the model's output ids and the API's fields.

A run's endpoint that says what it is (`server =` in its config, its simulator's personality, or what its
`GET /v1/models` and response headers tell: app.engine.fidelity.identify) starts from this table's *prior* profile
instead of from nothing; the probes then confirm or correct it per key (app.tokens.fidelity_profile, `prior`).
Where a server gives ground truth on every request (vLLM `return_token_ids`, SGLang without streaming) the prior
only covers the first moments of a run; where it gives none (transformers serve) the prior is all there is, and
the run says so ("prior only").

Each row names its source: the server's code (file and function) or, where that was read by others,
../shared/reference/tokenization.md §7 and docs/providers.md (which holds the same table for readers).

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.tokens.fidelity_profile import STRIPPED, FidelityProfile
from app.tokens.profile import Profile

# what a server gives as ground truth: "ids" (every request, when asked), "logprobs" (per-token bytes, when
# asked), "none" (text only)
GROUND_TRUTH = ("ids", "logprobs", "none")


@dataclass(frozen=True, slots=True)
class KnownStep:
    """One text step a server applies: the observation key and change it stands for, and where it is documented."""

    name: str  # a step of app.tokens.flags.STEPS
    key: str  # observation key (app.tokens.fidelity_profile.FidelityProfile)
    change: str  # the change observed at that key ("-*": strips whatever whitespace is there)
    source: str


@dataclass(frozen=True)
class ServerSteps:
    """What one server does on one path (streaming or not) for one output layout."""

    server: str
    stream: bool
    label: str  # e.g. "transformers serve, non-streaming"
    truth: str  # one of GROUND_TRUTH on this path
    steps: tuple[KnownStep, ...] = ()
    count: int | None = None  # usage.completion_tokens minus the output ids' length (None: not known)
    count_source: str = ""
    other_path: str = ""  # what the other path (streaming or not) does differently, for the operator's advice

    def observations(self) -> dict[str, dict[str, int]]:
        """The steps as prior observations (one each)."""
        out: dict[str, dict[str, int]] = {}
        for s in self.steps:
            out.setdefault(s.key, {})[s.change] = 1
        if self.count is not None:
            out["count"] = {f"{self.count:+d}": 1}
        return out


_TS = "transformers cli/serving"
_TS_TEXT = (
    f"{_TS}/chat_completion.py _non_streaming -> utils.py parse_assistant_message -> "
    "tokenizer.parse_response; utils/chat_parsing/content_parsers.py: the 'text' parser returns text.strip()"
)
_TS_EMPTY = "utils/chat_parsing/response_parser.py ResponseParser.finalize drops empty fields"
_TS_JSON = f"{_TS}/utils.py _normalize_tool_call: json.dumps(arguments) (ASCII escapes)"
_TS_STREAM = (
    f"{_TS}/utils.py DirectStreamer + ResponseParser region chunks: the raw text between the tags "
    "(the template's whitespace stays in the fields)"
)
_TS_CLOSE = (
    f"{_TS}/utils.py _RESPONSE_TEMPLATE_FALLBACKS (qwen): content close_pattern "
    r"'\s*(?:<\|im_end\|>|...)' and tool_calls open_pattern '\s*<tool_call>' swallow the whitespace before them"
)
_TS_COUNT = (
    f"{_TS}/chat_completion.py: usage.completion_tokens = len(generated_ids) (non-streaming), "
    "streamer.total_tokens (streaming): every generated token, the end token included"
)
_OR_EMPTY = (
    "OpenRouter streams send no reasoning delta for empty thinking (reasoning is a string or null, "
    "openai-compatible-apis.md B.4); seen in the demo's OpenRouter-style simulator"
)
_VLLM_QWEN3 = (
    "vllm/reasoning/qwen3_reasoning_parser.py extract_reasoning: model_output.partition('</think>'), "
    "nothing stripped (tokenization.md §7 step 3); vllm/parser/qwen3.py (0.32): only the tags are removed"
)
_VLLM_THINKLESS = (
    "vllm/parser/qwen3.py qwen3_config (vLLM 0.32): the parser starts in the REASONING state when "
    "thinking is on, so an output with no </think> is all reasoning (seen in tests/realserver)"
)
_VLLM_HERMES = (
    "vllm/tool_parsers/hermes_tool_parser.py extract_tool_calls: content = model_output[:find('<tool_call>')], "
    "the template's '\\n' before the call kept (seen in tests/realserver, streaming and not)"
)
_VLLM_HERMES_STREAM = (
    "vllm/tool_parsers/hermes_tool_parser.py _extract_content: a stream sends the whitespace before "
    "<tool_call> as content deltas ('\\n\\n'; null when not streaming; seen in tests/realserver)"
)
_VLLM_COUNT = (
    "vllm/entrypoints/openai/chat_completion/serving.py: usage.completion_tokens = len(output.token_ids), "
    "the ids return_token_ids gives, the end token included (seen in tests/realserver)"
)


def known_steps(server: str | None, stream: bool, profile: Profile) -> ServerSteps | None:
    """The table's entry for `server` on this path and output layout; None when the table has none (then only
    probes can tell what the server does)."""
    if server == "transformers-serve":
        return _transformers_serve(stream, profile)
    steps: tuple[KnownStep, ...] = ()
    if server == "openrouter":
        if stream and not profile.output_opens_with_think:
            # the prompt opens the think block: empty thinking closes it at once, and the stream says nothing
            steps = (KnownStep("empty_reasoning_dropped", "empty_reasoning", "dropped", _OR_EMPTY),)
        # the upstream providers' own steps are learned from probes, per provider
        return ServerSteps("openrouter", stream, f"OpenRouter, {_path(stream)}", "logprobs", steps)
    if server == "vllm":
        if profile.tool_format == "hermes" and profile.output_opens_with_think:
            # the qwen3 reasoning parser with the hermes tool parser (Qwen3's serving line)
            steps = (
                *_raw_regions(profile, _VLLM_QWEN3),
                KnownStep("reasoning_holds_answer", "thinkless", "reasoning", _VLLM_THINKLESS),
                KnownStep("template_whitespace_kept", "edge:content.trail@tools", "+\n", _VLLM_HERMES),
            )
            if stream and profile.content_prefix:
                steps += (
                    KnownStep(
                        "template_whitespace_kept",
                        "edge:content.blank@tools",
                        "+" + profile.content_prefix,
                        _VLLM_HERMES_STREAM,
                    ),
                )
        return ServerSteps("vllm", stream, f"vLLM, {_path(stream)}", "ids", steps, 0, _VLLM_COUNT)
    if server == "sglang":
        # older SGLang .strip()ped reasoning and content, newer does not (tokenization.md §7 step 3): the
        # version decides, so the probes do; streaming returns no ids (400 with return_token_ids, serving_chat.py)
        return ServerSteps("sglang", stream, f"SGLang, {_path(stream)}", "logprobs" if stream else "ids")
    if server == "openai":
        return ServerSteps("openai", stream, f"OpenAI-compatible, {_path(stream)}", "logprobs")
    return None


_SIM_COUNT = (
    "the built-in simulator: usage.completion_tokens is the length of the ids it replays "
    "(app/simulator/server.py _usage)"
)


def prior_profile(
    server: str | None,
    stream: bool,
    profile: Profile,
    endpoint: str,
    provider: str | None = None,
    *,
    simulated: bool = False,
) -> FidelityProfile | None:
    """The prior fidelity profile of an endpoint whose server is known (None when the table knows nothing of
    it). `simulated`: the built-in simulator answering as `server`, whose token counts are exact."""
    entry = known_steps(server, stream, profile)
    if entry is None:
        return None
    if simulated and entry.count is None:
        entry = ServerSteps(
            entry.server,
            entry.stream,
            entry.label + " (simulated)",
            entry.truth,
            entry.steps,
            0,
            _SIM_COUNT,
            entry.other_path,
        )
    return FidelityProfile(
        endpoint, provider, profile.name, 0, {}, entry.observations(), entry.label, stream, entry.server
    )


def _path(stream: bool) -> str:
    return "streaming" if stream else "non-streaming"


def _raw_regions(profile: Profile, source: str) -> tuple[KnownStep, ...]:
    """The template's whitespace around the think tags returned inside the fields (a constant to remove)."""
    out = []
    if profile.reasoning_prefix:
        out.append(KnownStep("template_whitespace_kept", "edge:reasoning.lead", "+" + profile.reasoning_prefix, source))
    if profile.reasoning_suffix:
        out.append(
            KnownStep("template_whitespace_kept", "edge:reasoning.trail", "+" + profile.reasoning_suffix, source)
        )
    if profile.reasoning_prefix + profile.reasoning_suffix:
        out.append(
            KnownStep(
                "template_whitespace_kept",
                "edge:reasoning.blank",
                "+" + profile.reasoning_prefix + profile.reasoning_suffix,
                source,
            )
        )
    if profile.content_prefix:
        out.append(KnownStep("template_whitespace_kept", "edge:content.lead", "+" + profile.content_prefix, source))
    return tuple(out)


def _transformers_serve(stream: bool, profile: Profile) -> ServerSteps | None:
    # its response parser exists for the Qwen (Hermes tool calls, <think> emitted by the model) and Gemma 4
    # layouts only; for the others it streams the raw decode, which no profile here describes
    if profile.tool_format != "hermes" or not profile.output_opens_with_think:
        return None
    label = f"transformers serve, {_path(stream)}"
    json_step = KnownStep("json_reserialised", "json", "default", _TS_JSON)
    if stream:
        steps = (
            *_raw_regions(profile, _TS_STREAM),
            KnownStep("strip_whitespace", "edge:content.trail", STRIPPED, _TS_CLOSE),
            KnownStep("strip_whitespace", "edge:content.trail@tools", STRIPPED, _TS_CLOSE),
            KnownStep("strip_whitespace", "edge:content.blank", STRIPPED, _TS_CLOSE),
            KnownStep("strip_whitespace", "edge:content.blank@tools", STRIPPED, _TS_CLOSE),
            json_step,
        )
        other = (
            "non-streaming, it also strips the edges of reasoning and content, which text cannot undo "
            "(the stream keeps them)"
        )
    else:
        edges = (
            "reasoning.lead",
            "reasoning.trail",
            "reasoning.trail@cut",
            "content.lead",
            "content.lead@noreason",
            "content.trail",
            "content.trail@tools",
            "content.trail@cut",
            "content.blank",
            "content.blank@tools",
            "content.blank@noreason",
            "content.blank@noreason@tools",
        )
        steps = (
            *(KnownStep("strip_whitespace", "edge:" + e, STRIPPED, _TS_TEXT) for e in edges),
            KnownStep("empty_reasoning_dropped", "empty_reasoning", "dropped", _TS_EMPTY),
            json_step,
        )
        other = (
            "streaming, it returns the raw text between the tags (only the whitespace right before the end "
            "token or a tool call is lost), so far fewer samples are ambiguous: set [generation] stream = true"
        )
    return ServerSteps("transformers-serve", stream, label, "none", steps, 0, _TS_COUNT, other)
