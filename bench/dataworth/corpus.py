"""The prompts, the dataset's own (off-policy) answers and the target's training answers of the data-worth bench.

The target is tests/realserver/tiny_qwen3.py's two-layer Qwen3 (head_dim 32, its tokenizer and chat template),
trained here on answers in the Qwen3 layout (`<think>\\n…\\n</think>\\n\\n…<|im_end|>`) whose words are drawn at
random per training example: the model learns a distribution over phrasings, so its greedy answer to an unseen
prompt is structured (the layout, the prompt's nouns echoed) but not a memorised string, which keeps a drafter's
acceptance mid-range. The dataset's own answers come from another "model" (other wording, no think block): the
off-policy arm. Everything is seeded; nothing is downloaded.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

ANIMALS = ["fox", "cat", "dog", "owl", "bear", "wolf", "horse", "goat", "duck", "mouse"]
CITIES = ["Paris", "Beijing", "Oslo", "Rome", "Cairo", "Lima", "Tokyo", "Berlin", "Madrid", "Quito"]
ADJECTIVES = ["quick", "lazy", "brown", "quiet", "happy", "small", "old", "brave", "calm", "kind"]
VERBS = ["runs", "walks", "sleeps", "jumps", "waits", "sings", "eats", "hides"]
TIMES = ["day", "night", "morning", "evening", "week", "summer", "winter"]
FOLLOW_UPS = ["And in {city}?", "Why is that?", "Tell me more.", "What about the {animal}?"]


@dataclass(frozen=True)
class Prompt:
    """One dataset row: its id, the user turns, and the dataset's own answer to each (another model's)."""

    id: str
    users: tuple[str, ...]
    originals: tuple[str, ...]


def _user(rng: random.Random) -> tuple[str, dict[str, object]]:
    kind = rng.randrange(4)
    slots: dict[str, object] = {
        "animal": rng.choice(ANIMALS),
        "city": rng.choice(CITIES),
        "city2": rng.choice(CITIES),
        "a": rng.randrange(2, 50),
        "b": rng.randrange(2, 50),
        "kind": kind,
    }
    text = [
        "Tell me about the {animal} in {city}.",
        "What is {a} plus {b}?",
        "Describe a walk from {city} to {city2}.",
        "List three things a {animal} in {city} likes.",
    ][kind].format(**slots)
    return text, slots


def target_answer(slots: dict[str, object], rng: random.Random) -> str:
    """An answer in the target's own style (what it is trained on): a think block, then content, words drawn."""
    s = dict(slots, adj=rng.choice(ADJECTIVES), adj2=rng.choice(ADJECTIVES), verb=rng.choice(VERBS))
    s |= {"time": rng.choice(TIMES), "sum": int(slots["a"]) + int(slots["b"])}  # type: ignore[call-overload]
    think, content = [
        (
            "The user asks about the {animal} in {city}. I describe it briefly.",
            "The {animal} in {city} is {adj} and {adj2}. It {verb} every {time}.",
        ),
        ("{a} plus {b} is {sum}.", "{a} + {b} = {sum}."),
        (
            "A walk from {city} to {city2}. I tell it as a short story.",
            "You leave {city} in the {time} and walk to {city2}. The road is {adj} and {adj2}.",
        ),
        (
            "Three things a {animal} in {city} likes. I list them.",
            "A {animal} in {city} likes the {time}, a {adj} friend and a {adj2} home.",
        ),
    ][int(slots["kind"])]  # type: ignore[call-overload]
    return f"<think>\n{think.format(**s)}\n</think>\n\n{content.format(**s)}"


def original_answer(slots: dict[str, object], rng: random.Random) -> str:
    """The dataset's own answer (another model's wording, no think block): what the off-policy arm trains on."""
    s = dict(slots, adj=rng.choice(ADJECTIVES), sum=int(slots["a"]) + int(slots["b"]))  # type: ignore[call-overload]
    return [
        "Sure! In {city}, the {animal} is usually {adj}. Hope this helps.",
        "The answer is {sum}. Let me know if you need more.",
        "Sure! Start in {city}, then head to {city2}. It is a {adj} trip.",
        "Sure! In {city}, a {animal} likes food, sleep and play. Hope this helps.",
    ][int(slots["kind"])].format(**s)  # type: ignore[call-overload]


def _follow_up(rng: random.Random, slots: dict[str, object]) -> tuple[str, dict[str, object]]:
    city, animal = rng.choice(CITIES), rng.choice(ANIMALS)
    text = rng.choice(FOLLOW_UPS).format(city=city, animal=animal)
    return text, dict(slots, kind=0, city=city, animal=animal)


def prompts(n: int, conversations: int, seed: int, prefix: str, exclude: frozenset[str] = frozenset()) -> list[Prompt]:
    """`n` single-turn rows and `conversations` two-turn rows, drawn with `seed`; no two share their user turns and
    none opens with a user turn in `exclude` (the held-out prompts stay unseen)."""
    rng = random.Random(seed)
    rows: list[Prompt] = []
    seen: set[tuple[str, ...]] = set()
    while len(rows) < n + conversations:
        user, slots = _user(rng)
        users, originals = [user], [original_answer(slots, rng)]
        if len(rows) >= n:
            follow, slots2 = _follow_up(rng, slots)
            users.append(follow)
            originals.append(original_answer(slots2, rng))
        if user in exclude or tuple(users) in seen:
            continue
        seen.add(tuple(users))
        rows.append(Prompt(f"{prefix}-{len(rows)}", tuple(users), tuple(originals)))
    return rows


def messages_of(p: Prompt, *, with_last_answer: bool) -> list[dict[str, str]]:
    """The row's conversation: user and original assistant turns, the last answer kept or left off."""
    out: list[dict[str, str]] = []
    for i, (u, a) in enumerate(zip(p.users, p.originals, strict=True)):
        out.append({"role": "user", "content": u})
        if with_last_answer or i < len(p.users) - 1:
            out.append({"role": "assistant", "content": a})
    return out


def write_dataset(rows: list[Prompt], path: Path, *, with_answers: bool) -> None:
    """openai-messages JSONL: with the original answers (for regenerate = "all" / the off-policy arm) or without
    the trailing one (single-turn prompts, held-out eval prompts)."""
    with open(path, "w", encoding="utf-8") as out:
        for p in rows:
            out.write(json.dumps({"id": p.id, "messages": messages_of(p, with_last_answer=with_answers)}) + "\n")


def target_cases(n: int, seed: int) -> list[tuple[list[dict[str, str]], None, str]]:
    """(messages, tools, output) training cases of the target, tiny_qwen3.build's shape: single turns and second
    turns after one of its own answers."""
    rng = random.Random(seed)
    cases = []
    for k in range(n):
        user, slots = _user(rng)
        answer = target_answer(slots, rng)
        if k % 5 == 4:  # a second turn: the first answer in context as the template renders history
            follow, slots2 = _follow_up(rng, slots)
            content = answer.split("</think>\n\n", 1)[1]
            messages = [
                {"role": "user", "content": user},
                {"role": "assistant", "content": content},
                {"role": "user", "content": follow},
            ]
            cases.append((messages, None, target_answer(slots2, rng) + "<|im_end|>"))
        else:
            cases.append(([{"role": "user", "content": user}], None, answer + "<|im_end|>"))
    return cases
