"""app.conversation: a dataset conversation split into turns, the model's own answers in the history, tool calls
matched on canonical JSON, and what a divergence does under each policy."""

from __future__ import annotations

import json

import pytest

from app.conversation import (
    DIVERGED,
    PARENT_TRUNCATED,
    ConversationShapeError,
    answer_message,
    calls_differ,
    canonical_arguments,
    extend_messages,
    next_turn,
    rewrite_tool_ids,
    split_turns,
)
from app.records import ToolCall


def call(call_id: str, name: str, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


AGENT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("functions.get_weather:0", "get_weather", '{"city": "Paris"}')],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
    {"role": "assistant", "content": "Sunny."},
    {"role": "user", "content": "And tomorrow?"},
]


def test_turns_are_the_assistant_answers_plus_a_trailing_user_turn():
    turns = split_turns(AGENT)
    assert [len(t.segment) for t in turns] == [2, 1, 1]
    assert [t.segment[0]["role"] for t in turns] == ["system", "tool", "user"]
    assert turns[0].recorded["tool_calls"][0]["function"]["name"] == "get_weather"
    assert turns[1].recorded == {"role": "assistant", "content": "Sunny."}
    assert turns[2].recorded is None  # the final turn is generated with nothing recorded


def test_a_conversation_ending_with_an_assistant_turn_has_one_turn_per_answer():
    assert len(split_turns(AGENT[:5])) == 2


@pytest.mark.parametrize(
    ("messages", "why"),
    [
        (
            [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}],
            "messages[1] is an assistant turn with no user message before it",
        ),
        (
            [
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"},
                {"role": "assistant", "content": "b"},
            ],
            "messages[2] follows another assistant message",
        ),
        (
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "r"}],
            "messages[2] is a tool result, but the assistant message before it has no tool_calls",
        ),
        (AGENT[:3] + [{"role": "user", "content": "?"}], "messages[3] should be the tool results of the 1 tool call"),
        (
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]}],
            "messages[1].tool_calls[0] must be an object with function.name",
        ),
    ],
)
def test_shapes_that_cannot_be_regenerated_are_named_by_message(messages, why):
    with pytest.raises(ConversationShapeError) as err:
        split_turns(messages)
    assert why in str(err.value)


def test_the_answer_message_keeps_reasoning_for_the_template_unless_the_profile_drops_it():
    calls = (ToolCall("functions.f:0", "f", '{"a":1}'),)
    kept = answer_message("", "plan", calls, "keep")
    assert kept == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "plan",
        "tool_calls": [call("functions.f:0", "f", '{"a":1}')],
    }
    assert "reasoning_content" not in answer_message("hi", "plan", (), "drop")
    assert answer_message(None, None, (ToolCall("", "f", "{}"),), turn=3)["tool_calls"][0]["id"] == "call_3_0"


def test_arguments_compare_as_canonical_json_and_raw_text_when_not_json():
    assert (
        canonical_arguments('{"b": 1, "a": [1, 2]}')
        == canonical_arguments({"a": [1, 2], "b": 1})
        == '{"a":[1,2],"b":1}'
    )
    assert canonical_arguments("not json") == "not json"
    assert calls_differ([call("x", "f", '{"a": 1}')], [call("y", "f", '{"a":1}')]) is None
    assert "arguments" in calls_differ([call("x", "f", '{"a": 2}')], [call("y", "f", '{"a":1}')])
    assert "'g' where the dataset called 'f'" in calls_differ([call("x", "g", "{}")], [call("y", "f", "{}")])
    assert "2 tool call(s) where the dataset made 1" in calls_differ([call("x", "f", "{}")] * 2, [call("y", "f", "{}")])


def test_extending_keeps_the_parents_json_text_as_a_byte_prefix():
    parent = '[{"role":"user","content":"caf\u00e9 \\"q\\""}]'
    child = extend_messages(parent, [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "n"}])
    assert child.startswith(parent[:-1])
    assert json.loads(child)[1:] == [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "n"}]
    assert extend_messages("[]", [{"role": "user", "content": "a"}]) == '[{"role":"user","content":"a"}]'


def test_tool_results_are_rewritten_to_the_models_call_ids():
    recorded = [call("r0", "f", "{}"), call("r1", "g", "{}")]
    answer = [call("functions.f:0", "f", "{}"), call("functions.g:1", "g", "{}")]
    segment = [
        {"role": "tool", "tool_call_id": "r1", "content": "G"},
        {"role": "tool", "tool_call_id": "r0", "content": "F"},
    ]
    out = rewrite_tool_ids(segment, recorded, answer)
    assert [m["tool_call_id"] for m in out] == ["functions.g:1", "functions.f:0"]
    assert list(out[0]) == ["role", "tool_call_id", "content"]  # key order kept


def _turn2(answer, policy="stop", truncated=False):
    turns = split_turns(AGENT)
    parent = json.dumps(list(turns[0].segment), separators=(",", ":"))
    return parent, next_turn(parent, answer, turns[0].recorded, turns[1].segment, policy=policy, truncated=truncated)


def test_a_matching_call_replays_the_recorded_result_on_policy():
    answer = answer_message("", "look", (ToolCall("functions.get_weather:0", "get_weather", '{"city":"Paris"}'),))
    parent, step = _turn2(answer)
    assert step.kind == "ready" and not step.off_policy
    messages = json.loads(step.messages_json)
    assert step.messages_json.startswith(parent[:-1])
    assert messages[2] == answer and messages[3]["tool_call_id"] == "functions.get_weather:0"
    assert split_turns(AGENT)[0].recorded not in messages  # the dataset's answer never reaches a request


def test_a_divergent_call_stops_the_conversation_or_replays_off_policy():
    answer = answer_message("", None, (ToolCall("functions.get_weather:0", "get_weather", '{"city":"Lyon"}'),))
    _, stop = _turn2(answer, "stop")
    assert stop.kind == "ended" and stop.error_class == DIVERGED and "Lyon" in stop.reason
    _, replay = _turn2(answer, "replay")
    assert replay.kind == "ready" and replay.off_policy
    assert json.loads(replay.messages_json)[3]["content"] == "sunny"


def test_divergences_with_nothing_to_replay_stop_under_either_policy():
    no_call = answer_message("It is sunny.", None, ())
    for policy in ("stop", "replay"):
        assert _turn2(no_call, policy)[1].error_class == DIVERGED
    turns = split_turns(AGENT)
    parent = '[{"role":"user","content":"x"}]'
    extra = answer_message("", None, (ToolCall("c", "get_weather", "{}"),))
    step = next_turn(parent, extra, turns[1].recorded, turns[2].segment, policy="replay")
    assert step.error_class == DIVERGED and "no results to replay" in step.reason


def test_an_answer_cut_at_max_tokens_ends_the_conversation():
    _, step = _turn2(answer_message("Sun", None, ()), truncated=True)
    assert step.kind == "ended" and step.error_class == PARENT_TRUNCATED


def test_off_policy_is_inherited_by_later_turns():
    turns = split_turns(AGENT)
    step = next_turn(
        '[{"role":"user","content":"x"}]',
        answer_message("Sunny.", None, ()),
        turns[1].recorded,
        turns[2].segment,
        parent_off_policy=True,
    )
    assert step.kind == "ready" and step.off_policy
