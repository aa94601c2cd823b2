"""Eval prompts kept out of training: exact overlap by a normalised prompt hash, near-duplicates by word n-grams.

A prompt's hash (`prompt_hash`) is `app.datasets.content_id` of its messages with each message's content
stripped and its whitespace runs collapsed to one space (nothing else changed: case and punctuation count), role
and content only, in order. A training row whose prompt hashes to an eval prompt's is left out of the export
(skip reason `eval_overlap`) unless kept (`[export] keep_eval_overlap = true`); either way it is counted.

Near-duplicates are reported, never removed: a training prompt whose word 8-grams (of its non-system messages)
hold at least half of an eval prompt's, or whose own 8-grams are at least half inside one (containment either
way, so a prompt that quotes an eval question inside a longer one is caught), is counted with a few examples.
An inverted index from n-gram to eval prompts keeps it linear in the training prompts; an n-gram shared by more
than `COMMON` eval prompts (boilerplate) is not indexed.

The eval split (`split_key`) hashes a row's opening, its messages up to and including the first user message,
normalised the same way: rows with the same prompt (or the same conversation) share their opening, so they
always land on the same side of the split.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.datasets import FORMATS, content_id, iter_prompts
from app.errors import InputError

NGRAM = 8
NEAR_THRESHOLD = 0.5
COMMON = 1000  # an n-gram in more eval prompts than this is boilerplate: not indexed
EXAMPLES = 5


def _text(content: Any) -> str:
    """A message's content as one string: a list of parts joins its text parts; other shapes as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str)]
        if len(parts) == len(content):
            return "\n".join(parts)
    return "" if content is None else json.dumps(content, sort_keys=True, ensure_ascii=False)


def normalised(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The messages as (role, content) with each content stripped and its whitespace runs collapsed."""
    return [{"role": str(m.get("role")), "content": " ".join(_text(m.get("content")).split())} for m in messages]


def prompt_hash(messages: Sequence[dict[str, Any]]) -> str:
    """The overlap hash of a prompt: `content_id` of its normalised role + content sequence."""
    return content_id(normalised(messages), None)


def split_key(messages: Sequence[dict[str, Any]]) -> str:
    """What the eval split hashes: the prompt hash of the messages up to and including the first user message
    (all of them when none is a user's), so equal prompts and a conversation's turns share one key."""
    end = next((i + 1 for i, m in enumerate(messages) if m.get("role") == "user"), len(messages))
    return prompt_hash(messages[:end])


def _grams(messages: Sequence[dict[str, Any]]) -> frozenset[int]:
    """The word n-grams of the non-system messages (fewer words than NGRAM: the whole sequence as one)."""
    words = " ".join(_text(m.get("content")) for m in messages if m.get("role") not in ("system", "developer")).split()
    if not words:
        return frozenset()
    if len(words) < NGRAM:
        return frozenset({hash(tuple(words))})
    return frozenset(map(hash, zip(*(words[i:] for i in range(NGRAM)))))


def sniff_format(path: Path) -> str:
    """The dataset format of a JSONL file from its first object's keys (app.datasets.FORMATS)."""
    try:
        with path.open("rb") as fh:
            first = next((line for line in fh if line.strip()), b"")
    except OSError as exc:
        raise InputError(
            f"{path}: eval prompts cannot be read ({exc.strerror or exc}); check [export] eval_prompts "
            "or --eval-prompts"
        ) from None
    try:
        obj = json.loads(first) if first else {}
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:1:{exc.colno}: not JSON ({exc.msg}); eval prompts are JSONL in one of {', '.join(FORMATS)}"
        ) from None
    if isinstance(obj, dict) and "messages" in obj:
        return "openai-messages"
    conv = obj.get("conversations") if isinstance(obj, dict) else None
    if isinstance(conv, list) and conv and isinstance(conv[0], dict):
        return "sharegpt" if "from" in conv[0] else "specforge-conversations"
    raise InputError(
        f"{path}:1: eval prompts need a 'messages' or 'conversations' list per line (one of {', '.join(FORMATS)})"
    )


@dataclass(frozen=True)
class EvalPrompt:
    """One eval prompt: where it came from and its id (the file's, or a content hash)."""

    file: str
    sample_id: str


@dataclass
class OverlapTally:
    """What the export found against the eval prompts (the report's and manifest's `eval_overlap`)."""

    files: list[str]
    eval_prompts: int
    kept: bool
    exact: int = 0
    near: int = 0
    exact_examples: list[dict[str, str]] = field(default_factory=list)
    near_examples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the files, counts, whether exact matches were kept, and a few examples of each."""
        return {
            "files": self.files,
            "eval_prompts": self.eval_prompts,
            "exact": self.exact,
            "removed": 0 if self.kept else self.exact,
            "kept": self.kept,
            "near_duplicates": self.near,
            "near_threshold": NEAR_THRESHOLD,
            "ngram": NGRAM,
            "exact_examples": self.exact_examples,
            "near_examples": self.near_examples,
        }


class EvalOverlap:
    """The eval prompts indexed by hash and by n-gram; `exact` and `near` test one training prompt."""

    def __init__(
        self, prompts: Iterable[tuple[EvalPrompt, Sequence[dict[str, Any]]]], files: list[str], keep: bool = False
    ) -> None:
        self.by_hash: dict[str, EvalPrompt] = {}
        self.prompts: list[EvalPrompt] = []
        self.sizes: list[int] = []
        index: dict[int, list[int]] = {}
        for prompt, messages in prompts:
            self.by_hash.setdefault(prompt_hash(messages), prompt)
            n = len(self.prompts)
            self.prompts.append(prompt)
            grams = _grams(messages)
            self.sizes.append(len(grams))
            for g in grams:
                index.setdefault(g, []).append(n)
        self.index = {g: ids for g, ids in index.items() if len(ids) <= COMMON}
        self.tally = OverlapTally(files, len(self.prompts), keep)

    @classmethod
    def load(cls, paths: Sequence[Path], keep: bool = False) -> EvalOverlap:
        """Read eval prompt files in any dataset format (sniffed per file); a bad line fails with its file:line."""

        def read() -> Iterable[tuple[EvalPrompt, Sequence[dict[str, Any]]]]:
            for path in paths:
                path = Path(path)
                for sample in iter_prompts(path, sniff_format(path)):
                    yield EvalPrompt(str(path), sample.sample_id), sample.messages

        return cls(read(), [str(p) for p in paths], keep)

    def exact(self, messages: Sequence[dict[str, Any]]) -> EvalPrompt | None:
        """The eval prompt this prompt equals after normalisation, or None."""
        return self.by_hash.get(prompt_hash(messages))

    def near(self, messages: Sequence[dict[str, Any]]) -> tuple[EvalPrompt, float] | None:
        """The eval prompt sharing the most n-grams with this one when the containment either way reaches
        NEAR_THRESHOLD, with that containment, or None."""
        grams = _grams(messages)
        if not grams:
            return None
        hits: Counter[int] = Counter()
        for g in grams:
            hits.update(self.index.get(g, ()))
        best: tuple[int, float] | None = None
        for n, shared in hits.items():
            score = shared / min(len(grams), self.sizes[n])
            if score >= NEAR_THRESHOLD and (best is None or score > best[1]):
                best = (n, score)
        return None if best is None else (self.prompts[best[0]], round(best[1], 3))

    def check(self, sample_id: str, messages: Sequence[dict[str, Any]]) -> bool:
        """Count this training prompt against the eval prompts; True when it equals one and is to be left out."""
        match = self.exact(messages)
        if match is not None:
            self.tally.exact += 1
            if len(self.tally.exact_examples) < EXAMPLES:
                self.tally.exact_examples.append(
                    {"sample_id": sample_id, "eval_id": match.sample_id, "eval_file": match.file}
                )
            return not self.tally.kept
        near = self.near(messages)
        if near is not None:
            self.tally.near += 1
            if len(self.tally.near_examples) < EXAMPLES:
                self.tally.near_examples.append(
                    {
                        "sample_id": sample_id,
                        "eval_id": near[0].sample_id,
                        "eval_file": near[0].file,
                        "containment": near[1],
                    }
                )
        return False


def overlap_line(tally: dict[str, Any]) -> str:
    """The export summary's sentence about the eval prompts."""
    what = "kept (keep_eval_overlap)" if tally["kept"] else "left out"
    near = ", ".join(f"{e['sample_id']} ~ {e['eval_id']} ({e['containment']:.2f})" for e in tally["near_examples"])
    return (
        f"eval prompts: {tally['eval_prompts']} from {len(tally['files'])} file(s); {tally['exact']} training "
        f"prompt(s) equal one, {what}; {tally['near_duplicates']} near-duplicate(s) (word {tally['ngram']}-gram "
        f"containment >= {tally['near_threshold']}) reported, not removed" + (f": {near}" if near else "")
    )
