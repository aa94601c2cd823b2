"""The reference samples the simulator answers from, looked up by the sample id the request names, else by a
hash of the request's messages.

A reference line is SGLang-style: {"id", "messages", "output_ids", "meta_info"}. A request that names a sample
id the reference holds (`metadata.sample_id`, which eaglewatch sends to its simulators only) gets that sample's
output, so samples that share a prompt each replay their own reference; otherwise a request whose messages
(canonical JSON) match a sample's gets that sample's output (the first of several), and any other request
gets a sample picked deterministically by the hash, so the same prompt always gets the same answer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import InputError

# used when no reference file is given: plain Kimi K2.5-style outputs (reasoning, content, tools)
SYNTHETIC_OUTPUTS = (
    "The user greets me. I should answer briefly.</think>Hello! How can I help you today?<|im_end|>",
    "Two plus two is four.\nDouble-check: 2 + 2 = 4.</think>2 + 2 = **4**.<|im_end|>",
    "I need the weather, so I call the tool.</think>Let me look that up."
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>',
    "Résumé of the café menu: crème brûlée, 中文 text too.</think>Here is the menu: crème brûlée.<|im_end|>",
)


@dataclass(frozen=True, slots=True)
class ReferenceSample:
    """One sample's prompt and ground-truth output ids."""

    sample_id: str
    output_ids: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int
    category: str | None = None  # the row's `category` (a speculative simulator's acceptance by category)


def messages_key(messages: Any) -> str:
    """The lookup key of a message list: sha256 of its canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class ReferenceBook:
    """All samples, indexed by `messages_key`; `pick(messages)` never fails once loaded."""

    def __init__(self, samples: list[ReferenceSample], keys: dict[str, int]) -> None:
        if not samples:
            raise InputError("the simulator's reference has no samples; give a reference.jsonl with output_ids")
        self.samples = samples
        self._keys = keys
        self._ids: dict[str, int] = {}
        for index, sample in enumerate(samples):
            self._ids.setdefault(sample.sample_id, index)

    def __len__(self) -> int:
        return len(self.samples)

    def pick(self, messages: Any, sample_id: str | None = None) -> tuple[int, bool]:
        """(sample index, matched): the sample named `sample_id`, else the one with these messages, else one
        chosen by their hash."""
        if sample_id is not None:
            index = self._ids.get(sample_id)
            if index is not None:
                return index, True
        key = messages_key(messages)
        index = self._keys.get(key)
        if index is not None:
            return index, True
        return int(key[:12], 16) % len(self.samples), False

    @classmethod
    def load(cls, path: Path) -> ReferenceBook:
        """Read a reference.jsonl; InputError naming file:line for a bad line."""
        samples: list[ReferenceSample] = []
        keys: dict[str, int] = {}
        try:
            handle = open(path, encoding="utf-8")  # noqa: SIM115 (the with below: this except is for the open only)
        except OSError as exc:
            raise InputError(f"{path}: cannot read the simulator's reference file ({exc.strerror})") from None
        with handle:
            for lineno, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    ids = row["output_ids"]
                    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                        raise ValueError("output_ids must be a list of integers")
                    messages = row.get("messages") or []
                    meta = row.get("meta_info") or {}
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise InputError(
                        f"{path}:{lineno}: not a reference sample ({exc}); each line needs 'messages' and 'output_ids'"
                    ) from None
                index = len(samples)
                prompt_tokens = meta.get("prompt_tokens")
                if not isinstance(prompt_tokens, int):
                    prompt_tokens = max(1, len(json.dumps(messages, ensure_ascii=False)) // 4)
                cached = meta.get("cached_tokens")
                category = row.get("category")
                samples.append(
                    ReferenceSample(
                        sample_id=str(row.get("id", index)),
                        output_ids=tuple(ids),
                        prompt_tokens=prompt_tokens,
                        cached_tokens=cached if isinstance(cached, int) else 0,
                        category=category if isinstance(category, str) and category else None,
                    )
                )
                keys.setdefault(messages_key(messages), index)
                # a reference that stores the answer as the last message still matches its prompt
                if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
                    keys.setdefault(messages_key(messages[:-1]), index)
        return cls(samples, keys)

    @classmethod
    def load_all(cls, paths: list[Path]) -> ReferenceBook:
        """The samples of several reference files, in order (the first file's sample wins an id or prompt two
        files share)."""
        books = [cls.load(Path(p)) for p in paths]
        if len(books) == 1:
            return books[0]
        samples: list[ReferenceSample] = []
        keys: dict[str, int] = {}
        for book in books:
            offset = len(samples)
            samples.extend(book.samples)
            for key, index in book._keys.items():
                keys.setdefault(key, offset + index)
        return cls(samples, keys)

    @classmethod
    def synthetic(cls, tokenizer: Any) -> ReferenceBook:
        """A few built-in samples encoded with `tokenizer`, for a simulator started without a reference."""
        samples = [
            ReferenceSample(f"synthetic-{i}", tuple(tokenizer.encode(text)), 20 + 5 * i, 0)
            for i, text in enumerate(SYNTHETIC_OUTPUTS)
        ]
        return cls(samples, {})
