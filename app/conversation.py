"""Whole conversations regenerated on-policy, as pure functions (stdlib only): the store's transactions, the
dataset reader and the tests share them.

A dataset conversation `u1 a1 u2 a2 … [uT]` becomes T turns. Turn k's *segment* is what the dataset says after
assistant turn k-1 and before assistant turn k (turn 1: the system and user messages before the first assistant
message; later: the user message(s) and/or the tool results that follow a(k-1)); its *recorded* answer is the
dataset's assistant message k (None for a final turn after a trailing user or tool message). Turn k's request is

    messages(1) = segment(1)
    messages(k) = messages(k-1) + [â(k-1)] + segment(k)

where â(k-1) is the model's own answer to turn k-1 (`answer_message`): none of the dataset's answers ever reaches
a request. The JSON text of messages(k) is built by appending to the JSON text of messages(k-1)
(`extend_messages`), so a conversation's prefix is byte-identical from turn to turn (providers' prompt caches hit).

Tool trajectories: when segment(k) holds the recorded tool results of a(k-1)'s calls, they are replayed only if
â(k-1) made the same calls (same count, names, and arguments as canonical JSON; `calls_differ`); the results'
`tool_call_id`s are rewritten to â's ids (in call order) so the history refers to the model's own calls. At the
first divergence the policy (`[[data.datasets]] on_tool_divergence`) ends the conversation ("stop") or replays
the recorded results with the turn marked off-policy ("replay"); a divergence with nothing to replay (the model
called tools where the dataset did not, or did not call where it did, or a different number of calls) ends it
under either policy. An answer cut at max_tokens ends it too: its history would hold an answer the model never
finished.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

DIVERGENCE_POLICIES = ("stop", "replay")
REGENERATE = ("last", "all")
HISTORY_REASONING = ("keep", "drop")
REASONING_FIELD = "reasoning_content"  # the assistant-message key chat templates read earlier reasoning from

# Why the turns after a turn are skipped (samples.error_class of the turn right after it; the turns after that one
# are `PARENT_SKIPPED`): the conversation ended there.
DIVERGED = "diverged"
PARENT_FAILED = "parent_failed"
PARENT_SKIPPED = "parent_skipped"
PARENT_TRUNCATED = "parent_truncated"
ENDED_CLASSES = (DIVERGED, PARENT_FAILED, PARENT_SKIPPED, PARENT_TRUNCATED)


class ConversationShapeError(ValueError):
    """A conversation that cannot be regenerated turn by turn; the message names the message index and why."""


@dataclass(frozen=True, slots=True)
class TurnInput:
    """One turn as the dataset holds it: the messages it adds (`segment`) and the dataset's answer (`recorded`)."""

    segment: tuple[dict[str, Any], ...]
    recorded: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class ConversationInput:
    """One dataset conversation to regenerate whole: its id, dataset, tools, turns and divergence policy."""

    conversation_id: str
    dataset: str
    tools: list[Any] | None
    turns: tuple[TurnInput, ...]
    on_tool_divergence: str = "stop"
    line: int = 0  # line number in its file (0 when not from a file)
    category: str | None = None  # the row's category column, when the dataset maps one

    def turn_id(self, k: int) -> str:
        """The sample id of turn k (1-based)."""
        return turn_sample_id(self.conversation_id, k)


def turn_sample_id(conversation_id: str, k: int) -> str:
    """`conv#k`: the sample id of a conversation's turn k (1-based), also the simulator's reference id for it."""
    return f"{conversation_id}#{k}"


# ---------------------------------------------------------------------------------------------- reading


def _roles(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(m.get("role")) for m in messages]


def split_turns(messages: Sequence[Mapping[str, Any]], key: str = "messages") -> tuple[TurnInput, ...]:
    """The turns of a dataset conversation (module doc); ConversationShapeError naming `key[i]` when it has no user
    message before its first assistant turn, two assistant messages in a row, tool results that answer no tool
    call, or tool calls whose results do not follow."""
    turns: list[TurnInput] = []
    segment: list[dict[str, Any]] = []
    seg_start = 0
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            if not segment:
                seg_start = i
            segment.append(dict(m))
            continue
        if not turns and "user" not in _roles(segment):
            raise ConversationShapeError(f"{key}[{i}] is an assistant turn with no user message before it")
        if not segment:
            raise ConversationShapeError(
                f"{key}[{i}] follows another assistant message; a turn needs the user "
                "message or the tool results it answers"
            )
        _check_segment(segment, turns[-1].recorded if turns else None, key, seg_start)
        _check_calls(m, key, i)
        turns.append(TurnInput(tuple(segment), dict(m)))
        segment = []
    if segment:
        if not turns and "user" not in _roles(segment):
            raise ConversationShapeError(f"{key!r} holds no user message")
        _check_segment(segment, turns[-1].recorded if turns else None, key, seg_start)
        turns.append(TurnInput(tuple(segment), None))
    if not turns:
        raise ConversationShapeError(f"{key!r} holds no turn to regenerate")
    return tuple(turns)


def _check_calls(message: Mapping[str, Any], key: str, i: int) -> None:
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise ConversationShapeError(f"{key}[{i}].tool_calls must be a list")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ConversationShapeError(
                f"{key}[{i}].tool_calls[{j}] must be an object with function.name and function.arguments"
            )


def _check_segment(segment: list[dict[str, Any]], before: dict[str, Any] | None, key: str, start: int) -> None:
    calls = (before or {}).get("tool_calls") or []
    tools = [j for j, m in enumerate(segment) if m.get("role") == "tool"]
    if tools and not calls:
        raise ConversationShapeError(
            f"{key}[{start + tools[0]}] is a tool result, but the assistant message before it has no tool_calls; "
            "regenerating whole conversations needs structured tool calls (openai-messages)"
        )
    if calls and (not tools or tools[0] != 0):
        raise ConversationShapeError(
            f"{key}[{start}] should be the tool results of the {len(calls)} tool call(s) before it; "
            "a conversation continues after tool calls only with their results"
        )


# ---------------------------------------------------------------------------------------------- the model's answer


def answer_message(
    content: str | None,
    reasoning: str | None,
    tool_calls: Sequence[Any],
    history_reasoning: str = "keep",
    *,
    turn: int = 0,
) -> dict[str, Any]:
    """The assistant message a later turn's request carries for the model's own answer.

    `tool_calls` are records with `id`, `name` and `arguments` (app.records.ToolCall), sent as returned (a call
    without an id gets `call_<turn>_<i>`, since a tool result must name it). The reasoning goes in
    `reasoning_content` when `history_reasoning` is "keep": the chat template then renders it or not, as it does
    for history (Kimi K2.5 and Qwen3 keep it only inside the running tool-call chain: after the last plain
    assistant turn, after the last user query); "drop" never sends it (a template that never renders it).
    """
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if history_reasoning == "keep" and reasoning:
        message[REASONING_FIELD] = reasoning
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id or f"call_{turn}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(tool_calls)
        ]
    return message


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as canonical JSON (sorted keys, no spaces); a string that is not JSON stays as it is."""
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            return arguments
    else:
        value = arguments
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _call_parts(call: Mapping[str, Any]) -> tuple[str, str, str]:
    """(id, name, canonical arguments) of an OpenAI-style tool call dict (`function` nested or flat)."""
    nested = call.get("function")
    fn = nested if isinstance(nested, Mapping) else call
    return str(call.get("id") or ""), str(fn.get("name") or ""), canonical_arguments(fn.get("arguments", ""))


def calls_differ(answer_calls: Sequence[Mapping[str, Any]], recorded_calls: Sequence[Mapping[str, Any]]) -> str | None:
    """Where the model's tool calls first differ from the recorded ones (count, name, canonical arguments), as a
    phrase; None when they match."""
    if len(answer_calls) != len(recorded_calls):
        return f"{len(answer_calls)} tool call(s) where the dataset made {len(recorded_calls)}"
    for i, (a, r) in enumerate(zip(answer_calls, recorded_calls)):
        _, a_name, a_args = _call_parts(a)
        _, r_name, r_args = _call_parts(r)
        if a_name != r_name:
            return f"tool call {i} is {a_name!r} where the dataset called {r_name!r}"
        if a_args != r_args:
            return f"tool call {i} ({a_name}) has arguments {a_args[:80]} where the dataset had {r_args[:80]}"
    return None


def rewrite_tool_ids(
    segment: Sequence[Mapping[str, Any]],
    recorded_calls: Sequence[Mapping[str, Any]],
    answer_calls: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The segment with each tool result's `tool_call_id` set to the model's call it answers: the recorded call
    with that id (else the j-th tool result answers the j-th call), mapped by position to the model's calls.
    Other keys keep their order."""
    by_recorded = {_call_parts(r)[0]: i for i, r in enumerate(recorded_calls) if _call_parts(r)[0]}
    ids = [_call_parts(a)[0] for a in answer_calls]
    out: list[dict[str, Any]] = []
    j = 0
    for m in segment:
        if m.get("role") != "tool":
            out.append(dict(m))
            continue
        i = by_recorded.get(str(m.get("tool_call_id") or ""), j)
        j += 1
        new = dict(m)
        if i < len(ids):
            new["tool_call_id"] = ids[i]
        out.append(new)
    return out


# ---------------------------------------------------------------------------------------------- the next turn


def dumps(value: Any) -> str:
    """Compact JSON text (the store's `messages` format: no spaces, UTF-8 kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def extend_messages(messages_json: str, added: Sequence[Mapping[str, Any]]) -> str:
    """The JSON text of a message list with `added` appended, starting with `messages_json` minus its closing
    bracket, byte for byte (a conversation's prefix never changes from turn to turn)."""
    head = messages_json.rstrip()
    if not head.endswith("]"):
        raise ValueError("messages JSON must be a list")
    if not added:
        return head
    body = ",".join(dumps(m) for m in added)
    inner = head[:-1].rstrip()
    sep = "" if inner.endswith("[") else ","
    return f"{inner}{sep}{body}]"


StepKind = Literal["ready", "ended"]


@dataclass(frozen=True, slots=True)
class NextTurn:
    """What a parent turn's stored answer makes of the turn after it.

    kind "ready": the child's request is `messages_json` (off-policy when `off_policy`); "ended": the conversation
    ends at the child, skipped with `error_class` (one of ENDED_CLASSES) because of `reason`."""

    kind: StepKind
    messages_json: str | None = None
    off_policy: bool = False
    error_class: str | None = None
    reason: str = ""


def next_turn(
    parent_messages_json: str,
    answer: Mapping[str, Any],
    recorded: Mapping[str, Any] | None,
    segment: Sequence[Mapping[str, Any]],
    *,
    policy: str = "stop",
    parent_off_policy: bool = False,
    truncated: bool = False,
) -> NextTurn:
    """The child turn's request, or why the conversation ends there (module doc). `answer` is the parent's
    `answer_message`, `recorded` the dataset's answer to the parent turn, `segment` the child's own messages."""
    if truncated:
        return NextTurn(
            "ended",
            error_class=PARENT_TRUNCATED,
            reason="the answer before it was cut at max_tokens (finish_reason length)",
        )
    answer_calls = list(answer.get("tool_calls") or ())
    recorded_calls = list((recorded or {}).get("tool_calls") or ())
    replays = any(m.get("role") == "tool" for m in segment)
    off = parent_off_policy
    if not replays:
        if answer_calls:
            return NextTurn(
                "ended",
                error_class=DIVERGED,
                reason=(
                    f"the model called {', '.join(_call_parts(c)[1] for c in answer_calls)} where the dataset answered "
                    "without tool calls; its calls have no results to replay"
                ),
            )
        added = [dict(answer), *(dict(m) for m in segment)]
        return NextTurn("ready", extend_messages(parent_messages_json, added), off)
    difference = calls_differ(answer_calls, recorded_calls)
    if difference is not None:
        if policy != "replay" or len(answer_calls) != len(recorded_calls):
            return NextTurn("ended", error_class=DIVERGED, reason=difference)
        off = True
    results = rewrite_tool_ids(segment, recorded_calls, answer_calls)
    return NextTurn(
        "ready", extend_messages(parent_messages_json, [dict(answer), *results]), off, reason=difference or ""
    )


def conversation_content_id(messages: Sequence[Any], tools: Sequence[Any] | None) -> str:
    """A stable id for a conversation line that has none: a hash of all its messages and tools ("c-" + 16 hex)."""
    blob = json.dumps(
        {"messages": list(messages), "tools": tools}, sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return "c-" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
