"""Template profiles: how one model family lays out its output tokens, as data.

A profile is one JSON file in `app/tokens/profiles/` (a new model family is one new file plus, only
if its tool-call layout is new, one parser in `app.tokens.template`). Fields are documented on
`Profile`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from app.errors import InputError

if TYPE_CHECKING:
    from app.tokens.tokenizer import Tokenizer

PROFILE_DIR = Path(__file__).parent / "profiles"
TOOL_FORMATS = ("kimi", "hermes", "deepseek-v3.1", "glm-4.5")
HISTORY_REASONING = ("keep", "drop")


@dataclass(frozen=True)
class Profile:
    """One model family's output layout.

    end_of_turn: the stop token after a plain answer; end_after_tool_calls: the one after tool calls
    (None: same). output_opens_with_think: the model emits `think_open` itself (else it ends the prompt).
    output_prefix / reasoning_prefix / reasoning_suffix / content_prefix: template whitespace around the
    think tags. tool_format: one of TOOL_FORMATS; tool_markers: its marker strings by role.
    tool_id_in_stream: the tool-call id is part of the token stream (Kimi). audit_tokens: marker text ->
    the id in the model's real tokenizer (None where unverified), checked when `vocab_size` matches.
    history_reasoning: how a whole conversation's later requests carry the model's earlier reasoning (one of
    HISTORY_REASONING): "keep" sends it with each earlier answer (`reasoning_content`) and leaves it to the chat
    template, which renders it where the model saw it (Kimi K2.5 and Qwen3: only inside the running tool-call
    chain, after the last plain assistant turn or user query; `<think></think>` or nothing before); "drop" never
    sends it (a template that renders no earlier reasoning at all).
    """

    name: str
    description: str
    end_of_turn: str
    stop_tokens: tuple[str, ...]
    think_open: str
    think_close: str
    output_opens_with_think: bool
    tool_format: str
    tool_markers: dict[str, str]
    tool_id_in_stream: bool
    tool_id_template: str
    end_after_tool_calls: str | None = None
    output_prefix: str = ""
    reasoning_prefix: str = ""
    reasoning_suffix: str = ""
    content_prefix: str = ""
    reasoning_fields: tuple[str, ...] = ("reasoning_content", "reasoning")
    truncation: str = ""
    tokenizer_kind: str = "hf"
    pretokenizer_pattern: str | None = None
    vocab_size: int | None = None
    audit_tokens: dict[str, int | None] = field(default_factory=dict)
    history_reasoning: str = "keep"

    def __hash__(self) -> int:  # dict fields: hash by name (profiles are registered by name)
        return hash(self.name)

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker string the output layout uses (think tags, tool markers, stop tokens)."""
        seen = dict.fromkeys(
            (
                self.think_open,
                self.think_close,
                *self.tool_markers.values(),
                self.end_of_turn,
                self.end_after_tool_calls or self.end_of_turn,
                *self.stop_tokens,
            )
        )
        return tuple(seen)

    def end_token(self, has_tool_calls: bool) -> str:
        """The stop token that closes a finished response."""
        return (self.end_after_tool_calls or self.end_of_turn) if has_tool_calls else self.end_of_turn

    def marker_ids(self, tokenizer: Tokenizer) -> dict[str, int]:
        """Marker text -> id in `tokenizer`; raises InputError naming the first marker it lacks."""
        out: dict[str, int] = {}
        required = (self.think_close, self.end_of_turn, self.end_token(True), *self.tool_markers.values())
        for text in self.markers:
            i = tokenizer.special_id(text)
            if i is None:
                if text in required:
                    raise InputError(
                        f"tokenizer {tokenizer.path} has no special token {text!r}, which profile {self.name} needs; "
                        f"check that --profile matches the model (profiles: {', '.join(PROFILES)})"
                    )
                continue
            out[text] = i
        return out


def _load(path: Path) -> Profile:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read the profile ({exc})") from None
    known = set(Profile.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InputError(f"{path}: unknown profile field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    try:
        raw["stop_tokens"] = tuple(raw["stop_tokens"])
        raw["reasoning_fields"] = tuple(raw.get("reasoning_fields", ()))
        profile = Profile(**raw)
    except (KeyError, TypeError) as exc:
        raise InputError(f"{path}: missing or wrong profile field ({exc})") from None
    if profile.tool_format not in TOOL_FORMATS:
        raise InputError(f"{path}: tool_format {profile.tool_format!r} is not one of {', '.join(TOOL_FORMATS)}")
    if profile.history_reasoning not in HISTORY_REASONING:
        raise InputError(
            f"{path}: history_reasoning {profile.history_reasoning!r} is not one of {', '.join(HISTORY_REASONING)}"
        )
    return profile


_PROFILES: dict[str, Profile] = {p.stem: _load(p) for p in sorted(PROFILE_DIR.glob("*.json"))}
PROFILES: tuple[str, ...] = tuple(_PROFILES)


def get_profile(name: str) -> Profile:
    """The profile called `name`; InputError listing the known names otherwise."""
    try:
        return _PROFILES[name]
    except KeyError:
        raise InputError(f"unknown profile {name!r}; known profiles: {', '.join(PROFILES)}") from None
