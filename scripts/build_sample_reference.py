#!/usr/bin/env python3
"""Build the SGLang-style reference file and the prompt datasets in `sample_data/` with the sample tokenizer.

Writes (deterministically, from a seeded RNG):
- `reference.jsonl`: one sample per line, `{"id", "messages", "tools"?, "output_ids", "meta_info":
  {"finish_reason": {"type": "stop"|"length"}, "prompt_tokens", "completion_tokens"}}`. The output ids follow
  the Kimi K2.5 thinking-mode format: `REASONING</think>CONTENT[<|tool_calls_section_begin|>...
  <|tool_calls_section_end|>]<|im_end|>` (`<think>` closes the prompt, so it is not in the output).
- `reference_cases.json`: `{sample_id: {"kinds": [...], "non_canonical_position"?: int}}` — which sample
  exercises what (see KINDS), and for a non-canonical sample the index in `output_ids` where one canonical
  token was replaced by two tokens whose bytes concatenate to it.
- `prompts.openai.jsonl` (every reference id), `prompts.sharegpt.jsonl` and `prompts.specforge.jsonl`
  (a small subset each, without tools) for the same sample ids.

Run `scripts/build_sample_tokenizer.py` first. Usage: python scripts/build_sample_reference.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_sample_tokenizer as corpus  # noqa: E402  (the seeded text generators live there)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "sample_data"
SEED = 4242
N_SAMPLES = 300

KINDS = {
    "short": "a short reasoning and a short answer",
    "long_reasoning": "reasoning of a few thousand tokens",
    "code": "the answer holds a fenced code block",
    "json": "the answer holds JSON",
    "cjk": "Chinese/Japanese text in the prompt and the output",
    "emoji": "emoji in the output",
    "tool_calls": "the output ends with a tool-call section",
    "multi_tool_calls": "two or more tool calls in one section",
    "multi_turn": "the prompt holds earlier assistant tool calls and tool results (tool ids keep counting)",
    "no_content_placeholder": "Kimi's '(no content)' placeholder before the tool calls",
    "empty_content": "nothing between </think> and the tool section or <|im_end|>",
    "no_reasoning": "the output starts with </think>",
    "whitespace_edges": "reasoning or content with leading/trailing whitespace or newlines",
    "truncated": "finish_reason length: cut mid-stream, no <|im_end|>",
    "non_canonical": "one token replaced by two whose bytes concatenate to it (same text, different ids)",
}

TOOLS = {
    "get_weather": {
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
    "search": {
        "description": "Search the web and return the top results.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
    "read_file": {
        "description": "Read a text file from the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    "run_python": {
        "description": "Run a Python snippet and return its stdout.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
    "lookup_price": {
        "description": "Look up the price of a product.",
        "parameters": {
            "type": "object",
            "properties": {"product": {"type": "string"}, "currency": {"type": "string"}},
            "required": ["product"],
        },
    },
}

CITIES = ["Beijing", "Paris", "Lagos", "Lima", "Oslo", "Tokyo", "北京", "上海", "São Paulo", "Zürich"]
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are Kimi, an AI assistant created by Moonshot AI.",
    "Answer briefly and precisely.",
    "You are a careful coding assistant. Think step by step.",
]


def tool_schema(name: str) -> dict:
    """An OpenAI `tools` entry for one of TOOLS."""
    return {"type": "function", "function": {"name": name, **TOOLS[name]}}


def tool_arguments(rng: random.Random, name: str) -> dict:
    """Plausible arguments for a tool call."""
    if name == "get_weather":
        args = {"city": rng.choice(CITIES)}
        if rng.random() < 0.4:
            args["unit"] = rng.choice(["c", "f"])
        return args
    if name == "search":
        return {"query": " ".join(corpus.word(rng) for _ in range(rng.randint(2, 5))), "limit": rng.randint(1, 10)}
    if name == "read_file":
        return {"path": f"src/{rng.choice(corpus.PY_NAMES)}.py"}
    if name == "run_python":
        return {"code": f"print(sum(range({rng.randint(2, 500)})))"}
    return {"product": corpus.word(rng), "currency": rng.choice(["USD", "EUR", "CNY"])}


class SampleWriter:
    """Builds one sample at a time from the tokenizer and a seeded RNG."""

    def __init__(self, tokenizer_dir: Path, seed: int = SEED) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.rng = random.Random(seed)
        self.vocab = self.tok.get_vocab()
        self.id_bytes = {
            i: self._bytes_of(t) for t, i in self.vocab.items() if not t.startswith(("<|", "[", "<think", "</think"))
        }
        self.bytes_id = {b: i for i, b in self.id_bytes.items()}
        self.im_end = self.vocab["<|im_end|>"]
        self.specials = {self.vocab[c] for c, _ in corpus.ADDED_TOKENS}
        self.template = _load_template(tokenizer_dir)

    @staticmethod
    def _bytes_of(token: str) -> bytes:
        return bytes(_BYTE_DECODER[ch] for ch in token)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    # ---- prompts -------------------------------------------------------------------------------

    def question(self, kinds: set[str]) -> str:
        rng = self.rng
        if "code" in kinds:
            return (
                f"Write a Python function that can {corpus.word(rng)} the {corpus.word(rng)} of a list. "
                f"{corpus.sentence(rng, 4, 10)}"
            )
        if "json" in kinds:
            return f"Return a JSON object describing a {corpus.word(rng)} with {rng.randint(2, 5)} fields."
        if "cjk" in kinds:
            return f"请用中文回答：{corpus.cjk_text(rng, rng.randint(8, 30))}"
        if "long_reasoning" in kinds:
            return f"Solve this carefully and explain: {corpus.prose(rng, rng.randint(2, 4))}"
        return rng.choice(
            [
                f"Explain {corpus.word(rng)} {corpus.word(rng)} in simple terms.",
                f"What is the difference between {corpus.word(rng)} and {corpus.word(rng)}?",
                f"Summarize: {corpus.prose(rng, rng.randint(1, 3))}",
                corpus.sentence(rng, 5, 14).rstrip(".!:") + "?",
            ]
        )

    def prompt(self, kinds: set[str], tool_names: list[str]) -> tuple[list[dict], int]:
        """The prompt messages and the number of tool calls already in them (the next tool id index)."""
        rng = self.rng
        messages: list[dict] = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        messages.append({"role": "user", "content": self.question(kinds)})
        calls_so_far = 0
        if "multi_turn" in kinds:
            for _ in range(rng.randint(1, 2)):
                calls = []
                for name in rng.sample(tool_names, k=min(len(tool_names), rng.randint(1, 2))):
                    calls.append(
                        {
                            "id": f"functions.{name}:{calls_so_far}",
                            "type": "function",
                            "function": {"name": name, "arguments": _compact(tool_arguments(rng, name))},
                        }
                    )
                    calls_so_far += 1
                messages.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "reasoning_content": corpus.prose(rng, rng.randint(1, 2)),
                        "tool_calls": calls,
                    }
                )
                for call in calls:
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call["id"],
                            "name": call["function"]["name"],
                            "content": corpus.json_text(rng),
                        }
                    )
        return messages, calls_so_far

    # ---- outputs -------------------------------------------------------------------------------

    def reasoning(self, kinds: set[str]) -> str:
        rng = self.rng
        if "no_reasoning" in kinds:
            return ""
        if "long_reasoning" in kinds:
            text = corpus.prose(rng, rng.randint(130, 300))
        else:
            text = corpus.prose(rng, rng.randint(1, 6))
        if "cjk" in kinds and rng.random() < 0.5:
            text += "\n" + corpus.cjk_text(rng, rng.randint(10, 40))
        if "whitespace_edges" in kinds and rng.random() < 0.5:
            text = rng.choice(["\n", " ", "\n\n"]) + text + rng.choice(["\n", "\n\n", "  "])
        return text

    def content(self, kinds: set[str]) -> str:
        rng = self.rng
        if "empty_content" in kinds:
            return ""
        if "no_content_placeholder" in kinds:
            return "(no content)"
        if "tool_calls" in kinds:
            return rng.choice(["", "Let me check that.", "I'll look it up.", corpus.sentence(rng, 4, 9)])
        parts = [corpus.prose(rng, rng.randint(1, 4))]
        if "code" in kinds:
            parts.append("```python\n" + corpus.python_code(rng) + "```")
            if rng.random() < 0.3:
                parts.append("```js\n" + corpus.js_code(rng) + "```")
        if "json" in kinds:
            parts.append("```json\n" + corpus.json_text(rng) + "\n```")
        if "cjk" in kinds:
            parts.append(corpus.cjk_text(rng, rng.randint(15, 80)))
        if "emoji" in kinds:
            parts.append(corpus.emoji_text(rng))
        text = "\n\n".join(parts)
        if "whitespace_edges" in kinds:
            text = rng.choice(["\n\n", "\n", " "]) + text + rng.choice(["\n", "\n\n", " "])
        return text

    def tool_section(self, kinds: set[str], tool_names: list[str], first_index: int) -> tuple[str, list[dict]]:
        rng = self.rng
        if "tool_calls" not in kinds:
            return "", []
        n = rng.randint(2, 3) if "multi_tool_calls" in kinds else 1
        calls = []
        text = "<|tool_calls_section_begin|>"
        for k in range(n):
            name = rng.choice(tool_names)
            args = _compact(tool_arguments(rng, name))
            call_id = f"functions.{name}:{first_index + k}"
            calls.append({"id": call_id, "name": name, "arguments": args})
            text += f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
        return text + "<|tool_calls_section_end|>", calls

    # ---- samples -------------------------------------------------------------------------------

    def choose_kinds(self, index: int) -> set[str]:
        rng = self.rng
        kinds: set[str] = set()
        r = rng.random()
        if index % 25 == 3:
            kinds.add("long_reasoning")
        elif r < 0.30:
            kinds.add("tool_calls")
            if rng.random() < 0.4:
                kinds.add("multi_tool_calls")
            if rng.random() < 0.35:
                kinds.add("multi_turn")
            if rng.random() < 0.12:
                kinds.add("no_content_placeholder")
            elif rng.random() < 0.25:
                kinds.add("empty_content")
        elif r < 0.42:
            kinds.add("code")
        elif r < 0.50:
            kinds.add("json")
        elif r < 0.60:
            kinds.add("cjk")
        elif r < 0.66:
            kinds.add("emoji")
        elif r < 0.70:
            kinds.add("empty_content")
        else:
            kinds.add("short")
        if rng.random() < 0.06:
            kinds.add("no_reasoning")
        if "tool_calls" not in kinds and rng.random() < 0.08:
            kinds.add("emoji")
        if rng.random() < 0.06:
            kinds.add("whitespace_edges")
        if rng.random() < 0.07:
            kinds.add("truncated")
        elif rng.random() < 0.035:
            kinds.add("non_canonical")
        return kinds

    def sample(self, index: int) -> tuple[dict, dict]:
        """One reference record and its cases entry."""
        rng = self.rng
        sample_id = f"sample-{index:04d}"
        kinds = self.choose_kinds(index)
        tool_names: list[str] = []
        if "tool_calls" in kinds:
            tool_names = rng.sample(sorted(TOOLS), k=rng.randint(1, 3))
        messages, calls_so_far = self.prompt(kinds, tool_names)
        reasoning = self.reasoning(kinds)
        content = self.content(kinds)
        section, _ = self.tool_section(kinds, tool_names, calls_so_far)
        output_ids = self.encode(f"{reasoning}</think>{content}{section}<|im_end|>")
        case: dict = {}
        finish = "stop"
        if "truncated" in kinds:
            output_ids = self.truncate(output_ids)
            finish = "length"
        elif "non_canonical" in kinds:
            output_ids, position = self.split_one_token(output_ids)
            case["non_canonical_position"] = position
        record: dict = {"id": sample_id, "messages": messages}
        if tool_names:
            record["tools"] = [tool_schema(n) for n in tool_names]
        record["output_ids"] = output_ids
        record["meta_info"] = {
            "finish_reason": {"type": finish},
            "prompt_tokens": len(self.render_prompt(messages, record.get("tools"))),
            "completion_tokens": len(output_ids),
        }
        return record, {"kinds": sorted(kinds), **case}

    def truncate(self, ids: list[int]) -> list[int]:
        """Cut the ids mid-stream at a point whose prefix decodes cleanly and is still canonical."""
        lo = max(1, len(ids) // 4)
        for _ in range(200):
            cut = self.rng.randint(lo, len(ids) - 2)
            prefix = ids[:cut]
            text = self.decode(prefix)
            if "\ufffd" not in text and self.encode(text) == prefix:
                return prefix
        raise SystemExit("could not find a clean truncation point")

    def split_one_token(self, ids: list[int]) -> tuple[list[int], int]:
        """Replace one multi-byte text token by two tokens with the same bytes; return ids and position."""
        positions = [i for i, t in enumerate(ids) if t not in self.specials and len(self.id_bytes.get(t, b"")) >= 2]
        self.rng.shuffle(positions)
        for pos in positions:
            raw = self.id_bytes[ids[pos]]
            splits = [k for k in range(1, len(raw)) if raw[:k] in self.bytes_id and raw[k:] in self.bytes_id]
            if not splits:
                continue
            k = self.rng.choice(splits)
            new = ids[:pos] + [self.bytes_id[raw[:k]], self.bytes_id[raw[k:]]] + ids[pos + 1 :]
            if self.decode(new) == self.decode(ids) and self.encode(self.decode(new)) != new:
                return new, pos
        raise SystemExit("no token could be split")

    def render_prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """Prompt ids as the chat template renders them (generation prompt included)."""
        text = self.template.render(messages=messages, tools=tools, add_generation_prompt=True)
        return self.encode(text)


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _byte_decoder() -> dict[str, int]:
    # GPT-2's bytes_to_unicode, inverted: maps each byte-level character back to its byte.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_DECODER = _byte_decoder()


def _load_template(tokenizer_dir: Path):
    """The tokenizer's chat template compiled the way transformers compiles it (same filters and flags)."""
    import jinja2
    from jinja2.ext import loopcontrols

    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    return env.from_string(config["chat_template"])


def sharegpt(record: dict) -> dict:
    """The prompt of a tool-free record in ShareGPT form."""
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    return {
        "id": record["id"],
        "conversations": [{"from": names[m["role"]], "value": m["content"]} for m in record["messages"]],
    }


def specforge(record: dict) -> dict:
    """The prompt of a tool-free record in SpecForge conversations form."""
    return {
        "id": record["id"],
        "conversations": [{"role": m["role"], "content": m["content"]} for m in record["messages"]],
    }


def jsonl(rows: list[dict]) -> str:
    """JSON lines, compact, UTF-8 as is."""
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)


def build(out: Path, tokenizer_dir: Path) -> list[Path]:
    """Write the reference, its cases and the three prompt files into `out`; return the paths."""
    writer = SampleWriter(tokenizer_dir)
    records, cases = [], {}
    for i in range(N_SAMPLES):
        record, case = writer.sample(i)
        records.append(record)
        cases[record["id"]] = case
    out.mkdir(parents=True, exist_ok=True)

    plain = [r for r in records if "tools" not in r and all(m["role"] in ("system", "user") for m in r["messages"])]
    files = {
        "reference.jsonl": jsonl(records),
        "reference_cases.json": json.dumps({"kinds": KINDS, "samples": cases}, indent=1, ensure_ascii=False) + "\n",
        "prompts.openai.jsonl": jsonl([{k: r[k] for k in ("id", "messages", "tools") if k in r} for r in records]),
        "prompts.sharegpt.jsonl": jsonl([sharegpt(r) for r in plain[:24]]),
        "prompts.specforge.jsonl": jsonl([specforge(r) for r in plain[24:48]]),
    }
    return corpus.write_files(out, files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_OUT / "tokenizer", help="sample tokenizer directory")
    args = parser.parse_args(argv)
    for path in build(args.out, args.tokenizer):
        print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
