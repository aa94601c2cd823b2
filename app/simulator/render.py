"""Output ids -> the text an OpenAI-compatible server would return, with optional server-side quirks.

The texts come from `app.tokens.split_output`'s parser (the same "how a provider returns these ids"
the validate path uses), for the profile given (default kimi-k2.5); the ids behind reasoning and
content (for logprobs and stream chunks) come from splitting on the Kimi markers below.
Kimi K2.5 output layout (thinking mode, `<think>` in the prompt):
`{reasoning}</think>{content}[<|tool_calls_section_begin|>(<|tool_call_begin|>{id}
<|tool_call_argument_begin|>{args}<|tool_call_end|>)+<|tool_calls_section_end|>]<|im_end|>`.
A leading `<think>` (K2-Thinking) is skipped. Without `</think>`, an output that never ended (no
`<|im_end|>`) is all reasoning (truncated while thinking); one that ended is all content.

Each quirk (app.simulator.options.QUIRKS) reproduces one server step from the tokenization
reference, section 7, so reconstruction can be tested against it end to end.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from typing import Any

MARKERS = {
    "think": "<think>",
    "think_end": "</think>",
    "section": "<|tool_calls_section_begin|>",
    "section_end": "<|tool_calls_section_end|>",
    "call": "<|tool_call_begin|>",
    "arg": "<|tool_call_argument_begin|>",
    "call_end": "<|tool_call_end|>",
    "im_end": "<|im_end|>",
}
STOP_MARKERS = ("<|im_end|>", "[EOS]", "<|endoftext|>")


@dataclass(frozen=True, slots=True)
class RenderedCall:
    """A tool call as the API returns it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class RenderedOutput:
    """What the API returns for one sample: texts, calls, finish reason and the ids behind the texts."""

    reasoning: str | None
    content: str | None
    tool_calls: tuple[RenderedCall, ...]
    finish_reason: str
    reasoning_ids: tuple[int, ...]
    content_ids: tuple[int, ...]
    output_ids: tuple[int, ...]


class OutputRenderer:
    """Splits output ids by the Kimi markers of `tokenizer` (an app.tokens Tokenizer) and renders text."""

    def __init__(self, tokenizer: Any, profile: Any = None) -> None:
        from app.tokens import get_profile

        self.tokenizer = tokenizer
        if profile is None or isinstance(profile, str):
            profile = get_profile(profile or "kimi-k2.5")
        self.profile = profile
        self.profile_stops = {i for t in self.profile.stop_tokens if (i := tokenizer.special_id(t)) is not None}
        self.ids = {name: tokenizer.special_id(text) for name, text in MARKERS.items()}
        self.stops = {i for i in (tokenizer.special_id(t) for t in STOP_MARKERS) if i is not None}

    # -- splitting ------------------------------------------------------------------------------

    def _split(self, ids: tuple[int, ...]):
        """(leading <think>, </think> present, reasoning ids, content ids, tool section follows content)."""
        m = self.ids
        start = 1 if ids and ids[0] == m["think"] else 0
        ended = any(i in self.stops for i in ids)
        end_think = _find(ids, m["think_end"], start)
        reasoning_ids: tuple[int, ...]
        rest: tuple[int, ...]
        if end_think is None:
            if ended:
                reasoning_ids, rest, had_think = (), ids[start:], False
            else:
                reasoning_ids, rest, had_think = ids[start:], (), False
        else:
            reasoning_ids, rest, had_think = ids[start:end_think], ids[end_think + 1 :], True
        content_end = len(rest)
        for k, token in enumerate(rest):
            if token == m["section"] or token in self.stops:
                content_end = k
                break
        content_ids = rest[:content_end]
        section_follows = content_end < len(rest) and rest[content_end] == m["section"]
        return start > 0, had_think, reasoning_ids, content_ids, section_follows

    # -- text -----------------------------------------------------------------------------------

    def _text(self, ids: tuple[int, ...], per_token: bool) -> str:
        if per_token:  # an incremental detokenizer that emits each token's text on its own
            return "".join(self.tokenizer.decode([i]) for i in ids)
        return self.tokenizer.decode(list(ids))

    def render(self, output_ids: tuple[int, ...], quirks: frozenset[str] = frozenset(), history_calls: int = 0):
        """The RenderedOutput of `output_ids` with the given quirks applied."""
        from app.tokens import parse_output

        lead_think, had_think, r_ids, c_ids, section_follows = self._split(output_ids)
        per_token = "replacement_char" in quirks
        ids = list(output_ids)
        ended = bool(ids) and ids[-1] in self.profile_stops
        if ended:
            ids.pop()
        profile = self.profile
        if "raw_regions" in quirks:  # the template whitespace stays in the fields (transformers serve streaming)
            from dataclasses import replace

            profile = replace(profile, reasoning_prefix="", reasoning_suffix="", content_prefix="")
        view = parse_output(self._text(tuple(ids), per_token), profile, ended)
        mismatch = view.content and self.tokenizer.decode(list(c_ids)) != view.content
        if mismatch and not view.tool_calls and not per_token:
            # the parser kept text the marker split cut off (e.g. a tool section cut by max_tokens stays
            # in content): the content's ids are then everything after the reasoning
            after = len(r_ids) + (1 if had_think else 0) + (1 if lead_think else 0)
            c_ids = tuple(ids[after:])
        reasoning: str | None = view.reasoning
        content: str = view.content
        if "tool_separator_kept" in quirks and view.tool_calls and profile.tool_format == "hermes":
            # vLLM's hermes parser: content is all the text before the first call, the template's "\n" included
            head = self._text(tuple(ids), per_token)
            head = head.split(profile.think_close, 1)[-1] if view.reasoning is not None else head
            content = head.split(profile.tool_markers["call_begin"], 1)[0]
        if (
            "reasoning_first" in quirks
            and reasoning is None
            and profile.output_opens_with_think
            and self.ids.get("think_end") not in output_ids
            and content
        ):
            # vLLM's qwen3 parser starts inside reasoning: with no think-close tag the whole answer is reasoning
            reasoning, r_ids, c_ids = content, c_ids, ()
            content = ""
        if "blank_content_dropped" in quirks and view.tool_calls and not content.strip():
            content = ""  # transformers serve streams no whitespace-only content before a tool call
        if "think_spaces" in quirks:
            if reasoning is not None:
                reasoning = (" " if lead_think else "") + reasoning + (" " if had_think else "")
            if had_think:
                content = " " + content
            if section_follows:
                content = content + " "
        if "strip_whitespace" in quirks:
            reasoning = reasoning.strip() if reasoning is not None else None
            content = content.strip()
        if "empty_reasoning_none" in quirks and not reasoning:
            reasoning = None
        if "no_content" in quirks:
            content = content.replace("(no content)", "")
        no_content = "no_content" in quirks and not content.strip()
        rendered_calls = []
        for index, call in enumerate(view.tool_calls):
            call_id, arguments = call.id, call.arguments
            if "tool_whitespace" in quirks:
                call_id, arguments = call_id.strip(), arguments.strip()
            # the parser's name: Kimi's comes from its `functions.NAME:IDX` id (whitespace around it ignored),
            # Hermes/Qwen3's from the call's JSON "name" (its id is synthesised, not in the token stream)
            name = call.name
            if "json_reserialised" in quirks or "json_dumps" in quirks:
                try:
                    arguments = json.dumps(json.loads(arguments), ensure_ascii="json_dumps" in quirks)
                except ValueError:
                    pass
            if "tool_ids_reindexed" in quirks:
                call_id = self.profile.tool_id_template.format(name=name, index=history_calls + index)
            rendered_calls.append(RenderedCall(id=call_id, name=name, arguments=arguments))
        finish = view.finish_reason
        # without content the field is null; with finish "length" too (reasoning used the whole budget: OpenRouter
        # returns content null)
        return RenderedOutput(
            reasoning=reasoning,
            content=None if no_content or (finish == "length" and not content) else content,
            tool_calls=tuple(rendered_calls),
            finish_reason=finish,
            reasoning_ids=tuple(r_ids),
            content_ids=tuple(c_ids),
            output_ids=tuple(output_ids),
        )

    # -- logprobs -------------------------------------------------------------------------------

    def logprob_entries(self, ids: tuple[int, ...], top: int = 0) -> list[dict]:
        """OpenAI-shaped logprob items for `ids`: per-token text (U+FFFD for partial UTF-8), bytes, logprob."""
        out = []
        for token_id in ids:
            raw = self.tokenizer.token_bytes(token_id)
            item: dict[str, Any] = {
                "token": raw.decode("utf-8", "replace"),
                "logprob": _fake_logprob(token_id),
                "bytes": list(raw),
            }
            if top:
                item["top_logprobs"] = [{"token": item["token"], "logprob": item["logprob"], "bytes": item["bytes"]}]
            out.append(item)
        return out


def _find(ids: tuple[int, ...], token: int | None, start: int) -> int | None:
    if token is None:
        return None
    for k in range(start, len(ids)):
        if ids[k] == token:
            return k
    return None


def _fake_logprob(token_id: int) -> float:
    return -round(((token_id * 2654435761) % 1000) / 400.0, 4)


def text_pieces(text: str, ids: tuple[int, ...], tokenizer: Any, per_chunk: int) -> list[tuple[str, tuple[int, ...]]]:
    """Cut `text` into stream pieces aligned with groups of `per_chunk` ids (incomplete UTF-8 held back).

    The pieces always concatenate to `text` exactly, whatever quirks changed it; each carries the ids
    of its group (for per-chunk logprobs and token ids).
    """
    if not ids:
        return [(text, ())] if text else []
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    cuts: list[tuple[int, tuple[int, ...]]] = []
    done = 0
    per_chunk = max(1, per_chunk)
    for g in range(0, len(ids), per_chunk):
        group = ids[g : g + per_chunk]
        done += len(decoder.decode(b"".join(tokenizer.token_bytes(i) for i in group)))
        cuts.append((done, group))
    pieces = []
    previous = 0
    for n, (end, group) in enumerate(cuts):
        end = len(text) if n == len(cuts) - 1 else min(max(end, previous), len(text))
        pieces.append((text[previous:end], group))
        previous = end
    return pieces
