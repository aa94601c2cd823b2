"""Helpers shared by the provider and simulator tests: a reference file written from texts, endpoint objects."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# prompt -> the model output (as Kimi K2.5 text with markers) the simulator replays for it
OUTPUTS = {
    "plain": "Let me think.\nThe answer is simple.</think>Hello! ünï 中文 here.<|im_end|>",
    "tools": "I should call two tools.</think>Checking.<|tool_calls_section_begin|>"
    "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
    "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{\"tz\": \"Europe/Paris\", \"fmt\": 24}"
    "<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
    "length": "I keep thinking and thinking about this and never stop",
    "ws": "\nThinking hard.\n</think>\n\nAnswer.\n<|im_end|>",
    "spaces": "ok</think>1<|im_end|>",
    "nocontent": "Need a tool.</think>(no content)<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
    "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
    "toolws": "Call.</think><|tool_calls_section_begin|><|tool_call_begin|> functions.f:0 "
    "<|tool_call_argument_begin|> {\"a\": 1} \n<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
    "json": "Call.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:7"
    "<|tool_call_argument_begin|>{\"a\":1,  \"b\":\"\\u00e9\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
    "utf8": "Umlaut.</think>über<|im_end|>",
}


def user(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def write_reference(path: Path, tokenizer: Any, outputs: dict[str, str] = OUTPUTS) -> dict[str, list[int]]:
    """Write an SGLang-style reference.jsonl, one sample per prompt; returns prompt -> output ids."""
    ids = {}
    with open(path, "w", encoding="utf-8") as handle:
        for prompt, text in outputs.items():
            ids[prompt] = tokenizer.encode(text)
            row = {"id": prompt, "messages": user(prompt), "output_ids": ids[prompt],
                   "meta_info": {"prompt_tokens": 100, "cached_tokens": 40}}
            handle.write(json.dumps(row) + "\n")
    return ids


@dataclass
class Endpoint:
    name: str = "sim"
    base_url: str | None = None
    timeout_s: float = 5.0
    max_concurrency: int = 16
    extra: dict = field(default_factory=dict)
    server: str | None = None  # app.providers.servers kind: which ids to ask for


@dataclass
class Generation:
    max_tokens: int | None = 256
    temperature: float | None = 0.6
    top_p: float | None = None
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    attempts: int = 3
