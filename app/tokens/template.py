"""The output layout of a profile, both ways: ids -> what a provider returns (`split_output`), and
returned fields -> the output string with markers as text (`render_output`).

Parsing works on decoded text, as real server parsers do (vLLM and SGLang parse strings), so a marker
the model spelled with ordinary tokens is seen exactly as a server would see it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from app.records import Completion, ToolCall
from app.tokens.profile import Profile
from app.tokens.tokenizer import Tokenizer

# A piece of the rendered output: (role, text). Roles: marker, template, reasoning, content,
# tool_id, tool_name, tool_args. Markers are special tokens written as text.
Piece = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ProviderView:
    """What an OpenAI-compatible server returns for some output ids (no server quirks applied).

    reasoning is None when the output has no reasoning part; finish_reason is stop | tool_calls | length.
    """

    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str

    def to_completion(self, **extra) -> Completion:
        """This view as a Completion (extra keyword fields passed through)."""
        return Completion(
            content=self.content,
            reasoning=self.reasoning,
            tool_calls=self.tool_calls,
            finish_reason=self.finish_reason,
            **extra,
        )


def split_output(ids: Sequence[int], profile: Profile, tokenizer: Tokenizer) -> ProviderView:
    """How a provider returns these output ids: reasoning, content, structured tool calls, finish reason.

    A trailing stop token (by id, never by text) is removed and gives finish_reason stop/tool_calls;
    without one the response is truncated (finish_reason "length").
    """
    stop_ids = {i for t in profile.stop_tokens if (i := tokenizer.special_id(t)) is not None}
    ids = list(ids)
    has_end = bool(ids) and ids[-1] in stop_ids
    if has_end:
        ids.pop()
    return parse_output(tokenizer.decode(ids), profile, has_end)


def parse_output(text: str, profile: Profile, has_end: bool) -> ProviderView:
    """Split decoded output text (markers as text, stop token removed) into provider fields."""
    if profile.output_prefix and text.startswith(profile.output_prefix + profile.think_open):
        text = text[len(profile.output_prefix) :]
    opened = False
    if profile.output_opens_with_think and text.startswith(profile.think_open):
        text = text[len(profile.think_open) :]
        opened = True
    reasoning: str | None
    close = text.find(profile.think_close)
    if close >= 0 and (opened or not profile.output_opens_with_think):
        reasoning = text[:close]
        rest = text[close + len(profile.think_close) :]
        if opened:
            reasoning = _cut_prefix(reasoning, profile.reasoning_prefix)
        reasoning = _cut_suffix(reasoning, profile.reasoning_suffix)
        rest = _cut_prefix(rest, profile.content_prefix)
    elif not has_end and (opened or not profile.output_opens_with_think):
        # Cut off inside the reasoning: everything generated so far is reasoning.
        reasoning = _cut_prefix(text, profile.reasoning_prefix) if opened else text
        rest = ""
    else:
        reasoning, rest = None, (profile.think_open + text if opened else text)
    content, calls = _TOOL_PARSERS[profile.tool_format](rest, profile, has_end)
    finish = ("tool_calls" if calls else "stop") if has_end else "length"
    return ProviderView(reasoning=reasoning, content=content, tool_calls=tuple(calls), finish_reason=finish)


def render_output(
    profile: Profile,
    reasoning: str | None,
    content: str | None,
    tool_calls: Sequence[ToolCall],
    finish_reason: str | None,
    close_think: bool | None = None,
) -> list[Piece]:
    """The output layout for these fields, as pieces (markers as text); inverse of `split_output`.

    reasoning None: no think part at all (content is taken verbatim, `</think>` inside it included).
    finish_reason "length": no stop token, and reasoning with nothing after it stays unclosed unless
    `close_think` is True (a response cut right after the think-close tag looks the same).
    """
    pieces: list[Piece] = []
    content = content or ""
    truncated = finish_reason == "length"
    if reasoning is not None:
        if profile.output_opens_with_think:
            if profile.output_prefix:
                pieces.append(("template", profile.output_prefix))
            pieces.append(("marker", profile.think_open))
            if profile.reasoning_prefix:
                pieces.append(("template", profile.reasoning_prefix))
        if reasoning:
            pieces.append(("reasoning", reasoning))
        unclosed = truncated and not content and not tool_calls
        if close_think if close_think is not None else not unclosed:
            if profile.reasoning_suffix:
                pieces.append(("template", profile.reasoning_suffix))
            pieces.append(("marker", profile.think_close))
            if profile.content_prefix:
                pieces.append(("template", profile.content_prefix))
    if content:
        pieces.append(("content", content))
    if tool_calls:
        pieces.extend(_TOOL_RENDERERS[profile.tool_format](tool_calls, profile, bool(content)))
    if not truncated:
        pieces.append(("marker", profile.end_token(bool(tool_calls))))
    return pieces


def pieces_text(pieces: Sequence[Piece]) -> str:
    """The rendered output string (markers as text)."""
    return "".join(t for _, t in pieces)


def kimi_tool_id(profile: Profile, call: ToolCall, index: int) -> str:
    """The id text written into the stream for `call`: the API id when it has the profile's form."""
    if call.id and call.id.strip().startswith(_id_prefix(profile.tool_id_template)):  # a raw id keeps its whitespace
        return call.id
    return profile.tool_id_template.format(name=call.name, index=index)


@functools.lru_cache(maxsize=16)
def _id_prefix(template: str) -> str:
    return template.split("{", 1)[0]


def _cut_prefix(s: str, prefix: str) -> str:
    return s[len(prefix) :] if prefix and s.startswith(prefix) else s


def _cut_suffix(s: str, suffix: str) -> str:
    return s[: -len(suffix)] if suffix and s.endswith(suffix) else s


# --- Kimi: <|tool_calls_section_begin|>(<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>)*
#     <|tool_calls_section_end|>


_KIMI_NAME = re.compile(r"(?:functions\.)?(.+?)(?::\d+)?", re.S)


@functools.lru_cache(maxsize=64)
def _between(*parts: str) -> re.Pattern[str]:
    """The compiled pattern `parts[0](.*?)parts[1](.*?)...` (markers escaped, DOTALL): one per profile's markers,
    compiled once (parsing runs per reconstructed sample)."""
    return re.compile("(.*?)".join(map(re.escape, parts)), re.S)


@functools.lru_cache(maxsize=4096)  # stream ids recur across a run's answers (functions.get_weather:0)
def _kimi_name(tool_id: str) -> str:
    m = _KIMI_NAME.fullmatch(tool_id.strip())  # " functions.f:7 " names f
    return m.group(1) if m else tool_id


def _parse_kimi(rest: str, profile: Profile, has_end: bool) -> tuple[str, list[ToolCall]]:
    m = profile.tool_markers
    start = rest.find(m["section_begin"])
    if start < 0:
        return rest, []
    end = rest.find(m["section_end"], start)
    if end < 0:
        # Cut off inside the section: a server returns the raw text; keep it whole as content.
        return rest, []
    section = rest[start + len(m["section_begin"]) : end]
    pattern = _between(m["call_begin"], m["argument_begin"], m["call_end"])
    calls = [
        ToolCall(id=tid, name=_kimi_name(tid), arguments=args, index=i)
        for i, (tid, args) in enumerate(pattern.findall(section))
    ]
    return rest[:start], calls


def tool_calls_read_back(profile: Profile, calls: Sequence[ToolCall]) -> bool | None:
    """Whether the parser gives back each call's name and arguments from its rendering, where no run of the
    rendered text spells a marker: known for Kimi (the arguments are their run verbatim, the name is read from
    the id written into the stream); None for formats that re-serialise or re-read JSON (decide by parsing)."""
    if profile.tool_format != "kimi":
        return None
    return kimi_stream_ids(profile, calls)[1]


def kimi_stream_ids(profile: Profile, calls: Sequence[ToolCall]) -> tuple[list[str], bool]:
    """The id text written into the stream for each call (`kimi_tool_id`) and whether each call's name is the one
    its id spells (a Kimi parser reads the name from the id: `tool_calls_read_back`)."""
    ids = [kimi_tool_id(profile, c, i) for i, c in enumerate(calls)]
    return ids, all(_kimi_name(t) == c.name for t, c in zip(ids, calls))


def _render_kimi(calls: Sequence[ToolCall], profile: Profile, has_content: bool) -> list[Piece]:
    m = profile.tool_markers
    out: list[Piece] = [("marker", m["section_begin"])]
    for i, call in enumerate(calls):
        out += [
            ("marker", m["call_begin"]),
            ("tool_id", kimi_tool_id(profile, call, i)),
            ("marker", m["argument_begin"]),
            ("tool_args", call.arguments),
            ("marker", m["call_end"]),
        ]
    out.append(("marker", m["section_end"]))
    return out


# --- Hermes (Qwen3): ["\n"]<tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>

_HERMES_BODY = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": (.*)\}', re.S)


def _parse_hermes(rest: str, profile: Profile, has_end: bool) -> tuple[str, list[ToolCall]]:
    m = profile.tool_markers
    start = rest.find(m["call_begin"])
    if start < 0:
        return rest, []
    pattern = re.compile(re.escape(m["call_begin"]) + r"\n(.*?)\n" + re.escape(m["call_end"]), re.S)
    calls: list[ToolCall] = []
    for i, body in enumerate(pattern.findall(rest[start:])):
        hit = _HERMES_BODY.fullmatch(body)
        if hit:
            name, args = json.loads(hit.group(1)), hit.group(2)
        else:
            try:
                obj = json.loads(body)
                name, args = str(obj.get("name", "")), json.dumps(obj.get("arguments", {}), ensure_ascii=False)
            except (json.JSONDecodeError, AttributeError):
                return rest, []
        calls.append(
            ToolCall(id=profile.tool_id_template.format(name=name, index=i), name=name, arguments=args, index=i)
        )
    if not calls:
        return rest, []
    content = rest[:start]
    return (content[:-1] if content.endswith("\n") else content), calls


def _render_hermes(calls: Sequence[ToolCall], profile: Profile, has_content: bool) -> list[Piece]:
    m = profile.tool_markers
    out: list[Piece] = []
    for i, call in enumerate(calls):
        if has_content or i:
            out.append(("template", "\n"))
        out += [
            ("marker", m["call_begin"]),
            ("template", '\n{"name": ' + json.dumps(call.name, ensure_ascii=False) + ', "arguments": '),
            ("tool_args", call.arguments),
            ("template", "}\n"),
            ("marker", m["call_end"]),
        ]
    return out


# --- DeepSeek V3.1:
# <｜tool▁calls▁begin｜>(<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>)*<｜tool▁calls▁end｜>


def _parse_deepseek(rest: str, profile: Profile, has_end: bool) -> tuple[str, list[ToolCall]]:
    m = profile.tool_markers
    start = rest.find(m["section_begin"])
    if start < 0:
        return rest, []
    end = rest.find(m["section_end"], start)
    if end < 0:
        return rest, []
    pattern = _between(m["call_begin"], m["separator"], m["call_end"])
    section = rest[start + len(m["section_begin"]) : end]
    calls = [
        ToolCall(id=profile.tool_id_template.format(name=name, index=i), name=name, arguments=args, index=i)
        for i, (name, args) in enumerate(pattern.findall(section))
    ]
    return rest[:start], calls


def _render_deepseek(calls: Sequence[ToolCall], profile: Profile, has_content: bool) -> list[Piece]:
    m = profile.tool_markers
    out: list[Piece] = [("marker", m["section_begin"])]
    for call in calls:
        out += [
            ("marker", m["call_begin"]),
            ("tool_name", call.name),
            ("marker", m["separator"]),
            ("tool_args", call.arguments),
            ("marker", m["call_end"]),
        ]
    out.append(("marker", m["section_end"]))
    return out


# --- GLM-4.5: \n<tool_call>NAME\n(<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n)*</tool_call>


def _parse_glm(rest: str, profile: Profile, has_end: bool) -> tuple[str, list[ToolCall]]:
    m = profile.tool_markers
    start = rest.find(m["call_begin"])
    if start < 0:
        return rest, []
    call_re = _between(m["call_begin"], m["call_end"])
    pair_re = re.compile(
        re.escape(m["key_begin"])
        + "(.*?)"
        + re.escape(m["key_end"])
        + r"\s*"
        + re.escape(m["value_begin"])
        + "(.*?)"
        + re.escape(m["value_end"]),
        re.S,
    )
    calls: list[ToolCall] = []
    for i, body in enumerate(call_re.findall(rest[start:])):
        name = body.split("\n", 1)[0].split(m["key_begin"], 1)[0].strip()
        args: dict = {}
        for key, value in pair_re.findall(body):
            try:
                args[key.strip()] = json.loads(value)
            except json.JSONDecodeError:
                args[key.strip()] = value
        calls.append(
            ToolCall(
                id=profile.tool_id_template.format(name=name, index=i),
                name=name,
                arguments=json.dumps(args, ensure_ascii=False),
                index=i,
            )
        )
    content = rest[:start]
    return (content[:-1] if content.endswith("\n") else content), calls


def _render_glm(calls: Sequence[ToolCall], profile: Profile, has_content: bool) -> list[Piece]:
    m = profile.tool_markers
    out: list[Piece] = []
    for call in calls:
        out += [("template", "\n"), ("marker", m["call_begin"]), ("tool_name", call.name), ("template", "\n")]
        try:
            pairs = json.loads(call.arguments, object_pairs_hook=_Pairs) if call.arguments.strip() else _Pairs()
        except json.JSONDecodeError:
            pairs = None
        if not isinstance(pairs, _Pairs):
            out.append(("tool_args", call.arguments))
        else:
            for key, value in pairs:
                text = value if isinstance(value, str) else json.dumps(_pairs_to_obj(value), ensure_ascii=False)
                out += [
                    ("marker", m["key_begin"]),
                    ("tool_args", key),
                    ("marker", m["key_end"]),
                    ("template", "\n"),
                    ("marker", m["value_begin"]),
                    ("tool_args", text),
                    ("marker", m["value_end"]),
                    ("template", "\n"),
                ]
        out.append(("marker", m["call_end"]))
    return out


class _Pairs(list):
    """A JSON object kept as ordered (key, value) pairs."""


def _pairs_to_obj(value):
    if isinstance(value, _Pairs):
        return {k: _pairs_to_obj(v) for k, v in value}
    if isinstance(value, list):
        return [_pairs_to_obj(v) for v in value]
    return value


_TOOL_PARSERS = {"kimi": _parse_kimi, "hermes": _parse_hermes, "deepseek-v3.1": _parse_deepseek, "glm-4.5": _parse_glm}
_TOOL_RENDERERS = {
    "kimi": _render_kimi,
    "hermes": _render_hermes,
    "deepseek-v3.1": _render_deepseek,
    "glm-4.5": _render_glm,
}


@dataclass(frozen=True, slots=True)
class Fields:
    """The returned fields a reconstruction starts from (a repair yields changed copies)."""

    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    close_think: bool | None = None  # None: the layout decides (see render_output)

    @classmethod
    def of(cls, c: Completion) -> Fields:
        return cls(c.reasoning, c.content or "", tuple(c.tool_calls), c.finish_reason)
