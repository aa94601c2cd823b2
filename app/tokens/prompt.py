"""Prompt text for a conversation without a Jinja chat template: the profile's own renderer.

The real Kimi K2.5 tokenizer files ship `tiktoken.model` and a `tokenizer_config.json` without a
`chat_template`, so `eaglewatch export` cannot ask transformers for the prompt. This module renders the
same text the model's server would feed it, with special tokens written as text (encode it once with
special tokens allowed). Pure and synchronous, like the rest of `app.tokens`.

Sources followed (public code, read through the project's search index; nothing here is copied):

- Kimi K2.5 chat template: the K2.5-derived `chat_template.jinja` in `paswans05/kite1.0` (tool declaration
  `<|im_system|>tool_declare<|im_middle|>{tools_ts_str}<|im_end|>`, compact-JSON fallback, roles
  `<|im_user|>` / `<|im_assistant|>` / `<|im_system|>` with `name or role`, tool results
  `## Return of {tool_call_id}\\n{content}`, history/suffix split at the last assistant turn without tool calls,
  `<think></think>` for history turns, `thinking` / `preserve_thinking`, generation prompt
  `<|im_assistant|>assistant<|im_middle|><think>`); the colleague's sample template in
  `sample_data/tokenizer/tokenizer_config.json` has the same structure with JSON tool declarations.
- `tools_ts_str`: Moonshot's `tool_declaration_ts.py` (`encode_tools_to_typescript_style`), as vendored in
  `thinking-machines-lab/tinker-cookbook` `tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py`, and
  `tokenization_kimi.py` `apply_chat_template`, which deep-sorts the tools' keys first and falls back to the
  template's JSON declaration when the conversion fails. tinker-cookbook `renderers/kimi_k25.py` /
  `kimi_k2.py` confirm the layout (`<think>` prefill, empty think in history, `name or role` headers).
- Qwen3: the official Qwen3 `tokenizer_config.json` chat template (ChatML, `<tools>` JSON lines in the system
  turn, `<think>\\n…\\n</think>\\n\\n` kept only after the last user query, `<tool_response>` user turns,
  `enable_thinking=false` appending `<think>\\n\\n</think>\\n\\n`), as reproduced in reference
  `tokenization.md` §2.

Deliberate choices where the templates are ambiguous: a history tool call without an `id` gets
`functions.{name}:{n}` with n counting tool calls across the conversation (what the model emitted; the
template would print an empty id); reasoning is read as `reasoning_content or reasoning` (the real K2.5
template prefers `reasoning` when both keys are present); no default system message is inserted (K2-Thinking's
template adds one, the K2.5-derived template does not).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from app.errors import InputError
from app.records import ToolCall
from app.tokens.profile import Profile, get_profile
from app.tokens.template import pieces_text, render_output

__all__ = ["PROMPT_RENDERERS", "encode_tools_typescript", "render_conversation", "render_prompt"]


def render_prompt(
    profile_name: str | Profile,
    messages: Sequence[dict],
    tools: Sequence[dict] | None = None,
    *,
    add_generation_prompt: bool = True,
    thinking: bool = True,
    preserve_thinking: bool = False,
) -> str:
    """The prompt text (special tokens as text) the profile's chat template gives for `messages` and `tools`.

    Raises InputError for a profile without a renderer (see PROMPT_RENDERERS) or a malformed message.
    """
    name = profile_name.name if isinstance(profile_name, Profile) else profile_name
    render = _RENDERERS.get(name)
    if render is None:
        get_profile(name)  # an unknown name gets the profile registry's own sentence
        raise InputError(
            f"profile {name!r} has no built-in prompt renderer (built in: {', '.join(PROMPT_RENDERERS)}); "
            "put the model's chat_template.jinja in the tokenizer directory or pass --chat-template FILE"
        )
    msgs = _checked_messages(messages)
    return render(msgs, list(tools) if tools else None, add_generation_prompt, thinking, preserve_thinking)


def render_conversation(
    profile_name: str | Profile,
    messages: Sequence[dict],
    tools: Sequence[dict] | None = None,
    *,
    thinking: bool = True,
    preserve_thinking: bool = False,
) -> str:
    """The prompt for every turn but the last, plus the last (assistant) turn in the model's output layout.

    `render_prompt(p, messages[:-1], tools) + output == render_conversation(p, messages, tools)`, where output is
    what the model generated: for K2.5 `REASONING</think>CONTENT<|tool_calls_section_begin|>…<|im_end|>`.
    The last turn's `reasoning_content` (or `reasoning`) "" gives an empty think part, a missing one none.
    """
    profile = profile_name if isinstance(profile_name, Profile) else get_profile(profile_name)
    msgs = _checked_messages(messages)
    if not msgs or msgs[-1]["role"] != "assistant":
        raise InputError(
            f"render_conversation: the last message must be the assistant turn to render as output "
            f"(got {msgs[-1]['role'] if msgs else 'no messages'!r}); use render_prompt for a prompt alone"
        )
    prompt = render_prompt(
        profile, msgs[:-1], tools, add_generation_prompt=True, thinking=thinking, preserve_thinking=preserve_thinking
    )
    return prompt + _output_text(profile, msgs[-1], len(msgs) - 1, thinking)


def encode_tools_typescript(tools: Sequence[dict] | None) -> str:
    """Kimi K2.5's `tools_ts_str` for OpenAI-style tools (`{"type": "function", "function": {...}}`).

    Byte-for-byte what Moonshot's `encode_tools_to_typescript_style` gives for the same (already key-sorted)
    list; "" when no function tools. Raises ValueError for a schema the reference encoder rejects.
    """
    functions = [
        _ts_function(tool["function"])
        for tool in tools or ()
        if tool.get("type") == "function" and tool.get("function")
    ]
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"


# ------------------------------------------------------------------------------------------ messages


def _checked_messages(messages: Sequence[dict]) -> list[dict]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InputError(
            f"messages must be a list of {{'role': ..., 'content': ...}} objects, got {type(messages).__name__}"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InputError(f"messages[{i}]: expected an object with a string 'role', got {str(m)[:80]!r}")
    return list(messages)


def _content_text(message: dict, where: str) -> str:
    """A message's text: a string, None (""), or a list of {"type": "text", "text": ...} parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise InputError(
                    f"{where}.content[{j}]: only text parts can be rendered without the model's chat template "
                    f"(got type {kind!r}); drop media parts or export with --chat-template"
                )
            out.append(part["text"])
        return "".join(out)
    raise InputError(f"{where}.content: expected a string, null or a list of text parts, got {type(content).__name__}")


def _reasoning_text(message: dict) -> str:
    value = message.get("reasoning_content") or message.get("reasoning") or ""
    return value if isinstance(value, str) else str(value)


def _call_fields(call: Any, where: str) -> tuple[str | None, str, Any]:
    """(id, name, arguments) of an OpenAI-style tool call."""
    if not isinstance(call, dict):
        raise InputError(f"{where}: a tool call must be an object with 'function': {{'name', 'arguments'}}")
    nested = call.get("function")
    fn = nested if isinstance(nested, dict) else call
    name = fn.get("name")
    if not isinstance(name, str):
        raise InputError(f"{where}: the tool call has no function name")
    call_id = call.get("id")
    return (call_id if isinstance(call_id, str) and call_id else None), name, fn.get("arguments", "")


def _json_arguments(arguments: Any) -> str:
    """Arguments as the templates print them: a string verbatim, anything else through HF's `tojson`."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _output_text(profile: Profile, message: dict, index: int, thinking: bool) -> str:
    where = f"messages[{index}]"
    calls = []
    for k, call in enumerate(message.get("tool_calls") or ()):
        call_id, name, arguments = _call_fields(call, f"{where}.tool_calls[{k}]")
        calls.append(ToolCall(id=call_id or "", name=name, arguments=_json_arguments(arguments), index=k))
    reasoning = None
    if thinking:  # None (no key) renders no think part at all; "" renders an empty one (K2.5: a bare </think>)
        reasoning = next((v for k in profile.reasoning_fields if isinstance(v := message.get(k), str)), None)
    pieces = render_output(profile, reasoning, _content_text(message, where), calls, "tool_calls" if calls else "stop")
    return pieces_text(pieces)


# --------------------------------------------------------------------------------------- Kimi K2.5


def _deep_sorted(value: Any) -> Any:
    """Every mapping's keys sorted, recursively (tokenization_kimi.apply_chat_template does this to tools)."""
    if isinstance(value, dict):
        return {k: _deep_sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_deep_sorted(v) for v in value]
    return value


def _kimi_tool_declaration(tools: list[dict]) -> str:
    tools = _deep_sorted(tools)
    try:
        declaration = encode_tools_typescript(tools)
    except (ValueError, KeyError, TypeError, AttributeError):
        declaration = ""  # as tokenization_kimi: a schema the encoder rejects falls back to JSON
    if not declaration:
        declaration = json.dumps(tools, ensure_ascii=False, separators=(",", ":"))
    return f"<|im_system|>tool_declare<|im_middle|>{declaration}<|im_end|>"


def _render_kimi(
    messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool, thinking: bool, preserve_thinking: bool
) -> str:
    last_plain = -1
    if not preserve_thinking:
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] == "assistant" and not messages[i].get("tool_calls"):
                last_plain = i
                break
    out: list[str] = []
    if tools:
        out.append(_kimi_tool_declaration(tools))
    calls_seen = 0
    for i, m in enumerate(messages):
        role, where = m["role"], f"messages[{i}]"
        label = m.get("name") or role
        if role == "user":
            out.append(f"<|im_user|>{label}<|im_middle|>")
        elif role == "assistant":
            out.append(f"<|im_assistant|>{label}<|im_middle|>")
        else:
            out.append(f"<|im_system|>{label}<|im_middle|>")
        if role == "assistant":
            history = i <= last_plain or (not thinking and not preserve_thinking)
            out.append("<think></think>" if history else f"<think>{_reasoning_text(m)}</think>")
            out.append(_content_text(m, where))
            if m.get("tool_calls"):
                out.append("<|tool_calls_section_begin|>")
                for k, call in enumerate(m["tool_calls"]):
                    call_id, name, arguments = _call_fields(call, f"{where}.tool_calls[{k}]")
                    call_id = call_id or f"functions.{name}:{calls_seen}"
                    calls_seen += 1
                    out.append(
                        f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>"
                        f"{_json_arguments(arguments)}<|tool_call_end|>"
                    )
                out.append("<|tool_calls_section_end|>")
        elif role == "tool":
            out.append(f"## Return of {m.get('tool_call_id') or ''}\n{_content_text(m, where)}")
        else:
            out.append(_content_text(m, where))
        out.append("<|im_end|>")
    if add_generation_prompt:
        out.append("<|im_assistant|>assistant<|im_middle|>" + ("<think>" if thinking else "<think></think>"))
    return "".join(out)


# ------------------------------------------------------- tools_ts_str (Moonshot tool_declaration_ts.py)

_TS_INDENT = "  "
_TS_FIELD_DELIMITER = ",\n"
_UNION_NAMES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}


def _ts_comment(text: str, indent: str = "") -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


class _Defs:
    """$defs seen while walking one function's parameters, and whether `$ref: "#"` (the root) was used."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}
        self.self_ref = False

    def resolve(self, ref: str) -> str:
        if ref == "#":
            self.self_ref = True
            return "parameters"
        if ref.startswith("#/$defs/"):
            name = ref.split("/")[-1]
            if name not in self.schemas:
                raise ValueError(f"Reference not found: {ref}")
            return name
        raise ValueError(f"Unsupported reference format: {ref}")


class _TsType:
    """One parsed JSON-schema node: how it prints (`text(indent)`) and the comment lines above it."""

    def __init__(self, schema: Any, kind: str, constraint_keys: Sequence[str] = ()) -> None:
        schema = schema if isinstance(schema, dict) else {}
        self.kind = kind
        self.description = schema.get("description", "")
        self.constraints = {k: v for k, v in schema.items() if k in constraint_keys}
        self.text: Callable[[str], str] = lambda indent: kind

    def docstring(self, indent: str) -> str:
        lines = []
        if self.description:
            lines.append(_ts_comment(self.description, indent))
        if self.constraints:
            lines.append(indent + "// " + ", ".join(f"{k}: {v}" for k, v in sorted(self.constraints.items())))
        return "".join(line + "\n" for line in lines)


class _TsField:
    def __init__(self, name: str, type_: _TsType, optional: bool, default: Any) -> None:
        self.name, self.type, self.optional, self.default = name, type_, optional, default

    def text(self, indent: str) -> str:
        comments = self.type.docstring(indent)
        if self.default is not None:
            default = self.default
            numeric = isinstance(default, (int, float, bool))
            shown = repr(default) if numeric else json.dumps(default, ensure_ascii=False)
            comments += f"{indent}// Default: {shown}\n"
        return f"{comments}{indent}{self.name}{'?' if self.optional else ''}: {self.type.text(indent)}"


def _ts_object(schema: dict, defs: _Defs | None) -> tuple[_TsType, list[_TsField]]:
    node = _TsType(schema, "object")
    fields: list[_TsField] = []
    extra: Any = None
    if schema:
        if "$defs" in schema and defs is not None and schema["$defs"]:
            defs.schemas.update(schema["$defs"])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            extra = _ts_parse(extra, defs)
        if "properties" in schema:
            required = set(schema.get("required", []))
            fields = [
                _TsField(
                    name,
                    _ts_parse(prop, defs),
                    name not in required,
                    prop.get("default") if isinstance(prop, dict) else None,
                )
                for name, prop in schema["properties"].items()
            ]

    def text(indent: str) -> str:
        ordered = sorted((f for f in fields if not f.optional), key=lambda f: f.name)
        ordered += sorted((f for f in fields if f.optional), key=lambda f: f.name)
        parts = [f.text(indent + _TS_INDENT) for f in ordered]
        if extra is not None:
            if extra is True:
                shown = "any"
            elif extra is False:
                shown = "never"
            elif isinstance(extra, _TsType):
                shown = extra.text(indent + _TS_INDENT)
            else:
                raise ValueError(f"Unknown additionalProperties: {extra}")
            parts.append(f"{indent + _TS_INDENT}[k: string]: {shown}")
        if not parts:
            return "{}"
        return "{\n" + _TS_FIELD_DELIMITER.join(parts) + "\n" + indent + "}"

    node.text = text
    return node, fields


def _ts_enum(schema: dict) -> _TsType:
    values = schema["enum"]
    if "type" in schema:
        declared = schema["type"]
        if isinstance(declared, list):
            if len(declared) == 1:
                declared = declared[0]
            elif len(declared) == 2 and "null" in declared:
                declared = declared[0] if declared[0] != "null" else declared[1]
            else:
                raise ValueError(f"Enum type {declared} is not supported")
        checks = {
            "string": lambda v: isinstance(v, str),
            "number": lambda v: isinstance(v, (int, float)),
            "integer": lambda v: isinstance(v, int),
            "boolean": lambda v: isinstance(v, bool),
        }
        check = checks.get(declared)
        for value in values:
            if value is not None and check is not None and not check(value):
                raise ValueError(f"Enum value {value} is not a {declared}")
    node = _TsType(schema, "enum")
    node.text = lambda indent: " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in values)
    return node


def _ts_parse(schema: Any, defs: _Defs | None) -> _TsType:
    if isinstance(schema, bool):
        return _TsType({}, "any" if schema else "null")
    if not isinstance(schema, dict):
        raise ValueError(f"Invalid JSON Schema object: {schema}")
    if "$ref" in schema and defs is not None:
        node = _TsType(schema, "ref")
        name = defs.resolve(schema["$ref"])
        node.text = lambda indent: name
        return node
    if "anyOf" in schema:
        options = [_ts_parse(s, defs) for s in schema["anyOf"]]
        node = _TsType(schema, "anyOf")
        node.text = lambda indent: " | ".join(o.text(indent) for o in options)
        return node
    if "enum" in schema:
        return _ts_enum(schema)
    if "type" in schema:
        declared = schema["type"]
        if isinstance(declared, list):
            names = [_UNION_NAMES[t] for t in declared]
            node = _TsType(schema, "union")
            node.text = lambda indent: " | ".join(names)
            return node
        if declared == "object":
            return _ts_object(schema, defs)[0]
        if declared == "array":
            return _ts_array(schema, defs)
        keys = {
            "string": ("maxLength", "minLength", "pattern"),
            "number": ("maximum", "minimum"),
            "integer": ("maximum", "minimum"),
        }.get(declared, ())
        node = _TsType(schema, declared, keys)
        node.text = lambda indent: "number" if declared == "integer" else declared
        return node
    if schema == {}:
        return _TsType({}, "any")
    raise ValueError(f"Invalid JSON Schema object: {schema}")


def _ts_array(schema: dict, defs: _Defs | None) -> _TsType:
    item = _ts_parse(schema["items"], defs) if schema.get("items") else _TsType({}, "any")
    node = _TsType(schema, "array", ("minItems", "maxItems"))

    def text(indent: str) -> str:
        doc = item.docstring(indent + _TS_INDENT)
        if doc:
            return "Array<\n" + doc + indent + _TS_INDENT + item.text(indent + _TS_INDENT) + "\n" + indent + ">"
        return f"Array<{item.text(indent)}>"

    node.text = text
    return node


def _ts_function(function: dict) -> str:
    defs = _Defs()
    root, fields = _ts_object(function.get("parameters") or {}, defs)
    interfaces = []
    self_ref = defs.self_ref  # as the reference: a "#" ref seen only inside $defs does not make a root interface
    if self_ref:
        body = _TS_FIELD_DELIMITER.join(f.text(_TS_INDENT) for f in fields)
        interfaces.append("interface parameters {" + (f"\n{body}\n" if body else "") + "}")
    for name, schema in list(defs.schemas.items()):
        described = schema.get("description", "")  # a non-object $defs entry fails, as in the reference
        prefix = _ts_comment(described) + "\n" if described else ""
        interfaces.append(f"{prefix}interface {name} {_ts_parse(schema, defs).text('')}")
    name = function.get("name", "function")
    signature = f"type {name} = (_: {'parameters' if self_ref else root.text('')}) => any;"
    description = function.get("description")
    parts = ["\n".join(interfaces), _ts_comment(description) if description else "", signature]
    return "\n".join(p for p in parts if p)


# --------------------------------------------------------------------------------------------- Qwen3


def _render_qwen3(
    messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool, thinking: bool, preserve_thinking: bool
) -> str:
    """Qwen3's ChatML template; `thinking` is its `enable_thinking` (preserve_thinking has no Qwen3 meaning)."""
    NL = "\n"
    out: list[str] = []
    texts = [_content_text(m, f"messages[{i}]") for i, m in enumerate(messages)]
    first_is_system = bool(messages) and messages[0]["role"] == "system"
    if tools:
        out.append("<|im_start|>system\n")
        if first_is_system:
            out.append(texts[0] + "\n\n")
        out.append(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        )
        for tool in tools:
            out.append("\n" + json.dumps(tool, ensure_ascii=False))
        out.append(
            "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
            '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        )
    elif first_is_system:
        out.append(f"<|im_start|>system\n{texts[0]}<|im_end|>\n")
    last_query = len(messages) - 1
    for i in range(len(messages) - 1, -1, -1):
        t = texts[i]
        if messages[i]["role"] == "user" and not (t.startswith("<tool_response>") and t.endswith("</tool_response>")):
            last_query = i
            break
    for i, m in enumerate(messages):
        role, text = m["role"], texts[i]
        last = i == len(messages) - 1
        if role == "user" or (role == "system" and i > 0):
            out.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
        elif role == "assistant":
            content = text
            reasoning = m.get("reasoning_content")
            if reasoning is None:
                reasoning = ""
                if "</think>" in content:
                    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                    content = content.split("</think>")[-1].lstrip("\n")
            if i > last_query and (last or reasoning):
                out.append(f"<|im_start|>{role}\n<think>\n{reasoning.strip(NL)}\n</think>\n\n{content.lstrip(NL)}")
            else:
                out.append(f"<|im_start|>{role}\n{content}")
            for k, call in enumerate(m.get("tool_calls") or ()):
                _, name, arguments = _call_fields(call, f"messages[{i}].tool_calls[{k}]")
                if k or content:
                    out.append("\n")
                body = f'{{"name": "{name}", "arguments": {_json_arguments(arguments)}}}'
                out.append(f"<tool_call>\n{body}\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{text}\n</tool_response>")
            if last or messages[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if not thinking:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


_RENDERERS: dict[str, Callable[[list[dict], list[dict] | None, bool, bool, bool], str]] = {
    "kimi-k2.5": _render_kimi,
    "qwen3": _render_qwen3,
}
PROMPT_RENDERERS: tuple[str, ...] = tuple(_RENDERERS)
