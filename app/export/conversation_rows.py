"""A whole conversation's turns as training rows: one row per turn (the default), or one merged row per
conversation where its prefix property is proven.

Each done turn of a regenerated conversation is a stored sample whose messages are the exact request sent for it
(the model's own earlier answers in its history) and whose output ids are that turn's answer: a per-turn row is
its rendered prompt plus its output, one loss span. A merged row is the last kept turn's row with every kept
turn's output in the loss; it is written only when, for each turn k after the first, turn k's prompt ids start
with turn k-1's prompt + output ids (compared id for id), so the merged row IS each turn's row, concatenated.
Chat templates that re-render history differently break that property (Kimi K2.5 and Qwen3 drop an earlier
turn's reasoning after a later user message); such a conversation keeps its per-turn rows, counted under why
(`PER_TURN_REASONS`).

Which turns a merged row covers: the kept turns (those the export policy keeps) must be turns 1..j with no gap;
a conversation that ended early (diverged, a failed or truncated turn) merges its kept done prefix, counted
`merged_prefix`; a conversation with turns still to run keeps per-turn rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.export.policy import IDS_SOURCES
from app.export.training_rows import TrainingRow

CONVERSATION_MODES = ("per-turn", "merged")

# why a conversation was written as per-turn rows under --conversations merged
PER_TURN_REASONS: dict[str, str] = {
    "history_reasoning_dropped": "the chat template renders an earlier answer without its reasoning in a later "
    "turn's history (Kimi K2.5 and Qwen3 keep reasoning only after the last user "
    "message), so a later prompt does not start with the earlier prompt + answer ids",
    "history_retokenized": "a later turn's prompt has the same text as the earlier prompt + answer, but other ids "
    "(the answer's true ids are not the canonical encoding of its text)",
    "history_differs": "the chat template renders an earlier answer otherwise in a later turn's history (another "
    "text than the model generated), so a later prompt does not start with the earlier ids",
    "open": "the conversation still has turns to run (pending, waiting or leased): export again when the run ends",
    "turn_left_out": "the export policy left out a turn before a kept one (corrupt, suspect, ...), so no merged "
    "row can hold the later turns with every span proven",
    "merged_too_long": "the merged row is longer than --max-length (its per-turn rows are checked one by one)",
    "not_reproducible": "the format could not hold the merged row as text (its per-turn rows were tried one by one)",
}


@dataclass
class ConversationTally:
    """What an export did with whole conversations (`as_dict` goes into the manifest and `--json`)."""

    mode: str = "per-turn"
    conversations: int = 0  # conversations with at least one done turn read
    turns: int = 0  # their done turns read
    exported_turns: int = 0  # turns written, in per-turn or merged rows
    off_policy_turns: int = 0  # of those, turns whose history holds replayed recorded tool results
    merged: int = 0  # conversations written as one merged row
    merged_turns: int = 0  # turns inside merged rows
    merged_prefix: int = 0  # of `merged`, conversations that ended early: their kept done prefix merged
    none_kept: int = 0  # conversations whose every done turn the policy left out
    per_turn: Counter[str] = field(default_factory=Counter)  # merged mode: conversations kept per-turn, by reason

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready counts, every per-turn reason present (0 when none)."""
        return {
            "mode": self.mode,
            "conversations": self.conversations,
            "turns": self.turns,
            "exported_turns": self.exported_turns,
            "off_policy_turns": self.off_policy_turns,
            "merged": self.merged,
            "merged_turns": self.merged_turns,
            "merged_prefix": self.merged_prefix,
            "none_kept": self.none_kept,
            "per_turn": {key: self.per_turn.get(key, 0) for key in PER_TURN_REASONS},
        }


def prefix_break(turns: Sequence[TrainingRow]) -> int | None:
    """The index of the first turn whose prompt ids do not start with the previous turn's prompt + output ids
    (its whole row); None when every turn's does (the rows can merge)."""
    for k in range(1, len(turns)):
        before = turns[k - 1].input_ids
        if turns[k].input_ids[: len(before)] != before:
            return k
    return None


def why_not_prefix(earlier: TrainingRow, later: TrainingRow, tokenizer) -> str:
    """The PER_TURN_REASONS key for a later turn whose prompt does not extend the earlier turn's row: the answer
    had reasoning the history dropped, the same text with other ids, or another text."""
    if tokenizer.decode(later.input_ids).startswith(tokenizer.decode(earlier.input_ids)):
        return "history_retokenized"
    if _answer_had_reasoning(earlier, later):
        return "history_reasoning_dropped"
    return "history_differs"


def _answer_had_reasoning(earlier: TrainingRow, later: TrainingRow) -> bool:
    """Whether the model's answer to the earlier turn, as the later turn's request carries it, had reasoning."""
    before = getattr(earlier.source, "messages", None) or []
    after = getattr(later.source, "messages", None) or []
    if len(after) <= len(before):
        return False
    answer = after[len(before)]
    return answer.get("role") == "assistant" and bool(answer.get("reasoning_content") or answer.get("reasoning"))


def merged_row(conversation_id: str, turns: Sequence[TrainingRow]) -> TrainingRow:
    """One row for a conversation's turns (`prefix_break(turns)` must be None): the last turn's ids with every
    turn's output span in the loss; its ids source is the least certain of its turns', its verdict theirs joined
    (`exact`, or e.g. `bpe_equivalent+exact`)."""
    last = turns[-1]
    spans = tuple(t.loss_spans[-1] for t in turns)
    rank = {s: i for i, s in enumerate(IDS_SOURCES)}
    source = max((t.ids_source for t in turns), key=lambda s: rank.get(s, len(IDS_SOURCES)))
    verdict = "+".join(sorted({str(t.verdict) for t in turns}))
    return TrainingRow(
        conversation_id,
        list(last.input_ids),
        spans,
        source,
        verdict,
        last.source,
        turns[0].split_key or conversation_id,
    )


def kept_prefix(turns: Sequence[tuple[Any, str | None]]) -> tuple[list[int], bool]:
    """(indices of the kept turns, whether they are turns 1..j with no gap) for a conversation's done turns in
    turn order, each as (ExportRow, skip reason or None)."""
    kept = [i for i, (_, reason) in enumerate(turns) if reason is None]
    numbers = [turns[i][0].turn for i in kept]
    return kept, numbers == list(range(1, len(numbers) + 1))
