#!/usr/bin/env python3
"""Build the whole-conversation sample sets in `sample_data/` with the sample tokenizer (deterministic, seeded).

Writes:
- `conversations.openai.jsonl`: openai-messages conversations of 2-5 assistant turns, most with tool calls and
  their recorded tool results (the dataset's ids `call_<hex>`), some ending with a user message (a final turn with
  nothing recorded); in `conv-oa-03` the model's first tool call differs from the recorded one (its arguments),
  so the conversation diverges there.
- `conversations.sharegpt.jsonl`: ShareGPT conversations (human / gpt, no tools) of 2-5 assistant turns.
- `conversations.reference.jsonl`: one SGLang-style reference line per turn, id `<conversation id>#<turn>`: the
  model's own answer (`output_ids`, Kimi K2.5 layout, tool ids `functions.<name>:<n>` counted over the
  conversation) and the on-policy request that turn gets (`messages`: the turn's segments with the model's earlier
  answers built by `app.conversation`, as the engine builds them, recorded tool results replayed after the
  divergent call), `meta_info.prompt_tokens` from the tokenizer's chat template.

The dataset's own assistant answers differ from the model's (other words), so a request that carried one is seen.
Run `scripts/build_sample_tokenizer.py` first. Usage: python scripts/build_sample_conversations.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import build_sample_reference as ref  # noqa: E402  (the sample writer, tools and text generators)
import build_sample_tokenizer as corpus  # noqa: E402

from app.conversation import answer_message, next_turn, split_turns  # noqa: E402
from app.tokens import get_profile, load_tokenizer, split_output  # noqa: E402

SEED = 2222
N_OPENAI = 10
N_SHAREGPT = 6
DIVERGES = {"conv-oa-03": 1}  # conversation -> the turn whose tool call differs from the recorded one


class ConversationWriter:
    """One conversation at a time from the sample tokenizer and a seeded RNG."""

    def __init__(self, tokenizer_dir: Path) -> None:
        self.w = ref.SampleWriter(tokenizer_dir, seed=SEED)
        self.rng = self.w.rng
        self.tok = load_tokenizer(tokenizer_dir)
        self.profile = get_profile("kimi-k2.5")

    def _call_id(self) -> str:
        return "call_" + "".join(self.rng.choice("0123456789abcdef") for _ in range(12))

    def _question(self) -> str:
        return self.w.question(set())

    def plan(self, tools: bool) -> tuple[list[str], bool]:
        """Each assistant turn's kind (tool | plain) and whether a user message ends the conversation."""
        n = self.rng.randint(2, 5)
        kinds = []
        for k in range(n):
            previous = kinds[-1] if kinds else "plain"
            kinds.append("tool" if tools and previous == "plain" and k < n - 1 and self.rng.random() < 0.7 else "plain")
        return kinds, self.rng.random() < 0.4

    def build(self, cid: str, tools: bool) -> tuple[dict, list[dict], list[tuple[list[int], list[dict]]]]:
        """(dataset line, tools, [(model output ids, ...)] per turn) — the outputs the simulator replays."""
        rng = self.rng
        kinds, trailing = self.plan(tools)
        tool_names = rng.sample(sorted(ref.TOOLS), k=rng.randint(1, 3)) if tools else []
        messages: list[dict] = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(ref.SYSTEM_PROMPTS)})
        messages.append({"role": "user", "content": self._question()})
        outputs: list[list[int]] = []
        calls_so_far = 0
        for k, kind in enumerate(kinds, 1):
            reasoning = corpus.prose(rng, rng.randint(1, 3))
            if kind == "tool":
                calls = []
                section = "<|tool_calls_section_begin|>"
                for name in rng.sample(tool_names, k=min(len(tool_names), rng.randint(1, 2))):
                    args = ref._compact(ref.tool_arguments(rng, name))
                    model_args = args
                    if DIVERGES.get(cid) == k:
                        model_args = ref._compact({**json.loads(args), **_other(rng, name)})
                    model_id = f"functions.{name}:{calls_so_far}"
                    calls_so_far += 1
                    calls.append(
                        {"id": self._call_id(), "type": "function", "function": {"name": name, "arguments": args}}
                    )
                    section += f"<|tool_call_begin|>{model_id}<|tool_call_argument_begin|>{model_args}<|tool_call_end|>"
                section += "<|tool_calls_section_end|>"
                said = rng.choice(["", "Let me check that.", "I'll look it up."])
                outputs.append(self.w.encode(f"{reasoning}</think>{said}{section}<|im_end|>"))
                messages.append(
                    {"role": "assistant", "content": "", "reasoning_content": corpus.prose(rng, 1), "tool_calls": calls}
                )
                for c in calls:
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": c["id"],
                            "name": c["function"]["name"],
                            "content": corpus.json_text(rng),
                        }
                    )
            else:
                answer = corpus.prose(rng, rng.randint(1, 3))
                outputs.append(self.w.encode(f"{reasoning}</think>{answer}<|im_end|>"))
                messages.append({"role": "assistant", "content": "The dataset says: " + corpus.prose(rng, 1)})
                if k < len(kinds):
                    messages.append({"role": "user", "content": self._question()})
        if trailing:
            messages.append({"role": "user", "content": self._question()})
            outputs.append(self.w.encode(f"{corpus.prose(rng, 1)}</think>{corpus.prose(rng, 2)}<|im_end|>"))
        line: dict = {"id": cid, "messages": messages}
        declared = [ref.tool_schema(n) for n in tool_names] if tool_names else None
        if declared:
            line["tools"] = declared
        return line, declared, outputs

    def references(self, cid: str, messages: list[dict], tools: list | None, outputs: list[list[int]]) -> list[dict]:
        """The per-turn reference lines: each turn's on-policy request (as the engine builds it) and output."""
        turns = split_turns(messages)
        assert len(turns) == len(outputs), cid
        lines = []
        history = json.dumps(list(turns[0].segment), ensure_ascii=False, separators=(",", ":"))
        for k, (turn, ids) in enumerate(zip(turns, outputs), 1):
            request = json.loads(history)
            lines.append(
                {
                    "id": f"{cid}#{k}",
                    "messages": request,
                    **({"tools": tools} if tools else {}),
                    "output_ids": ids,
                    "meta_info": {
                        "finish_reason": {"type": "stop"},
                        "prompt_tokens": len(self.w.render_prompt(request, tools)),
                        "completion_tokens": len(ids),
                    },
                }
            )
            if k < len(turns):
                view = split_output(ids, self.profile, self.tok)
                answer = answer_message(view.content, view.reasoning, view.tool_calls, "keep", turn=k)
                step = next_turn(history, answer, turn.recorded, turns[k].segment, policy="replay")
                assert step.kind == "ready", (cid, k, step.reason)
                history = step.messages_json
        return lines


def _other(rng, name: str) -> dict:
    """Arguments that differ from any `tool_arguments(rng, name)` draw (the divergent call)."""
    return {"note": "a different call " + corpus.word(rng)}


def sharegpt_line(cid: str, messages: list[dict]) -> dict:
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    return {"id": cid, "conversations": [{"from": names[m["role"]], "value": m["content"]} for m in messages]}


def build(out: Path, tokenizer_dir: Path) -> list[Path]:
    """Write the two conversation sets and their per-turn reference into `out`; return the paths."""
    writer = ConversationWriter(tokenizer_dir)
    openai_lines, sharegpt_lines, reference = [], [], []
    for i in range(1, N_OPENAI + 1):
        cid = f"conv-oa-{i:02d}"
        line, tools, outputs = writer.build(cid, tools=i % 5 != 0)
        openai_lines.append(line)
        reference += writer.references(cid, line["messages"], tools, outputs)
    for i in range(1, N_SHAREGPT + 1):
        cid = f"conv-sg-{i:02d}"
        line, _, outputs = writer.build(cid, tools=False)
        sharegpt_lines.append(sharegpt_line(cid, line["messages"]))
        reference += writer.references(cid, line["messages"], None, outputs)
    out.mkdir(parents=True, exist_ok=True)

    files = {
        "conversations.openai.jsonl": ref.jsonl(openai_lines),
        "conversations.sharegpt.jsonl": ref.jsonl(sharegpt_lines),
        "conversations.reference.jsonl": ref.jsonl(reference),
    }
    return corpus.write_files(out, files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ref.DEFAULT_OUT, help=f"output directory (default {ref.DEFAULT_OUT})"
    )
    parser.add_argument(
        "--tokenizer", type=Path, default=ref.DEFAULT_OUT / "tokenizer", help="sample tokenizer directory"
    )
    args = parser.parse_args(argv)
    for path in build(args.out, args.tokenizer):
        print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
