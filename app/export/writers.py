"""One writer per export format; each writes its data files under `<out>/data/` (never beside the manifest,
so a consumer pointed at `data/` sees only data). Formats and their consumers: docs/contracts.md ("Export
shards") and docs/jobs.md ("Train with it").

Consumers' readers (read from their source):
- SpecForge `specforge.data.preprocessing.build_eagle3_dataset` (`conversations`, or `text` with
  `is_preformatted`) and `specforge.data.prompt_builder.prepare_prompt_tasks` (pre-tokenized
  `input_ids` + `loss_mask` rows).
- speculators `speculators.data_generation.preprocessing.load_raw_dataset` (a folder: every `*.json` /
  `*.jsonl` below it, recursively) and `_passthrough_pretokenized` (`input_ids` + `loss_mask` rows).
- Model-Optimizer `examples/speculative_decoding/collect_hidden_states/compute_hidden_states_*.py`
  (`conversation_id` or `uuid`, then `messages` or `conversations`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import orjson
from typing import Any

from app.records import ToolCall

DATA_DIR = "data"
SINGLE_FILE = {
    "sglang-raw": "sglang_raw.jsonl",
    "specforge": "specforge.jsonl",
    "specforge-text": "specforge_text.jsonl",
    "modelopt": "modelopt.jsonl",
}
SHARD_PREFIX = {"eagle3-shards": "shard", "speculators": "speculators"}
WRITE_BUFFER = 1 << 20  # bytes: few large writes for long rows

# SpecForge's registered chat templates (specforge/data/template.py, TEMPLATE_REGISTRY) whose assistant
# span matches a profile's prompts: name, assistant_header, end_of_turn_token
SPECFORGE_TEMPLATES = {
    "kimi-k2.5": ("kimi-k2-thinking", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"),
    "qwen3": ("qwen3-thinking", "<|im_start|>assistant\n", "<|im_end|>\n"),
}


def _jsonl(obj: Any) -> bytes:
    """One compact UTF-8 JSON line (orjson: the writers' cost is mostly this; the stdlib for what orjson refuses,
    such as a lone surrogate kept from a stored message)."""
    try:
        return orjson.dumps(obj) + b"\n"
    except TypeError:  # orjson.JSONEncodeError subclasses TypeError
        # ASCII escapes (\\ud800) keep the line valid UTF-8 JSON for every reader
        return (json.dumps(obj, separators=(",", ":")) + "\n").encode("ascii")


def assistant_turn(view) -> dict[str, Any]:
    """The OpenAI-style assistant message for a `ProviderView` (reasoning_content, content, tool_calls)."""
    message: dict[str, Any] = {"role": "assistant", "content": view.content}
    if view.reasoning is not None:
        message["reasoning_content"] = view.reasoning
    if view.tool_calls:
        message["tool_calls"] = [_tool_call_dict(c) for c in view.tool_calls]
    return message


def _tool_call_dict(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": call.type or "function", "function": {"name": call.name, "arguments": call.arguments}}


class Writer:
    """Base: `write` one kept sample (None, or a skip reason when this format cannot hold it); `close` returns
    the files written (paths relative to the export folder) with their counts."""

    def write(self, row, prompt_ids: list[int], output_ids: tuple[int, ...], ids_source: str) -> str | None:
        """Write one kept sample; None when written, else the skip reason (this format cannot hold it)."""
        raise NotImplementedError

    def close(self) -> list[dict[str, Any]]:
        """Close the files; their paths (relative to the export folder) with sample and token counts."""
        raise NotImplementedError

    def manifest_extra(self) -> dict[str, Any]:
        """What this format adds to the manifest (how its consumer is pointed at the files)."""
        return {}

    def warnings(self) -> list[str]:
        """What the person exporting must know about this export's consumer (called after the last write)."""
        return []


class _SingleFile(Writer):
    def __init__(self, out: Path, fmt: str) -> None:
        self.rel = f"{DATA_DIR}/{SINGLE_FILE[fmt]}"
        self.fh = (out / self.rel).open("wb", buffering=WRITE_BUFFER)
        self.n = 0
        self.tokens = 0

    def _emit(self, record: dict[str, Any], tokens: int) -> None:
        self.fh.write(_jsonl(record))
        self.n += 1
        self.tokens += tokens

    def close(self) -> list[dict[str, Any]]:
        self.fh.close()
        return [{"path": self.rel, "samples": self.n, "tokens": self.tokens}]


class SglangRawWriter(_SingleFile):
    """`sglang_raw.jsonl`: `{"id", "messages", "tools"?, "output_ids", "meta_info"}` per sample."""

    def __init__(self, out: Path) -> None:
        super().__init__(out, "sglang-raw")

    def write(self, row, prompt_ids, output_ids, ids_source):
        ids = list(output_ids)
        record: dict[str, Any] = {"id": row.sample_id, "messages": row.messages}
        if row.tools:
            record["tools"] = row.tools
        record["output_ids"] = ids
        finish = "length" if (row.category == "truncated" or row.finish_reason == "length") else "stop"
        record["meta_info"] = {
            "finish_reason": {"type": finish},
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "verdict": row.category,
            "ids_source": ids_source,
        }
        self._emit(record, len(ids))
        return None


class _ConversationWriter(_SingleFile):
    """Conversations ending with the assistant turn split from the exported ids."""

    id_key = "id"
    turns_key = "conversations"

    def __init__(self, out: Path, fmt: str, tokenizer, profile) -> None:
        from app.tokens import split_output

        super().__init__(out, fmt)
        self.split_output = split_output
        self.tokenizer = tokenizer
        self.profile = profile

    def write(self, row, prompt_ids, output_ids, ids_source):
        view = self.split_output(output_ids, self.profile, self.tokenizer)
        record: dict[str, Any] = {self.id_key: row.sample_id, self.turns_key: [*row.messages, assistant_turn(view)]}
        if row.tools:
            record["tools"] = row.tools
        self._emit(record, len(prompt_ids) + len(output_ids))
        return None


class SpecforgeWriter(_ConversationWriter):
    """`specforge.jsonl`: `{"id", "conversations": [prompt messages..., assistant turn]}` per sample (SpecForge
    re-renders these with its own template: see `specforge-text` for ids that survive unchanged)."""

    def __init__(self, out: Path, tokenizer, profile) -> None:
        super().__init__(out, "specforge", tokenizer, profile)


class ModeloptWriter(_ConversationWriter):
    """`modelopt.jsonl`: `{"conversation_id", "conversations", "tools"?}`, what Model-Optimizer's
    `compute_hidden_states_*` scripts read (`entry.get("conversation_id", entry.get("uuid"))`).

    Those scripts re-render the conversation with `apply_chat_template(add_generation_prompt=False)` and no
    template kwargs, which renders the final assistant turn's reasoning only where the template is told to
    keep it: `chat_template.jinja` beside the manifest is the template with the run's kwargs (and
    `preserve_thinking`, when the template knows it) set at its top, for their `--chat-template` flag."""

    id_key = "conversation_id"
    TEMPLATE = "chat_template.jinja"

    def __init__(self, out: Path, tokenizer, profile, template=None) -> None:
        super().__init__(out, "modelopt", tokenizer, profile)
        self.template_written = False
        self.with_tools = 0
        if template is not None:
            settings = dict(template.kwargs)
            if "preserve_thinking" in template.text:
                settings.setdefault("preserve_thinking", True)
            head = "".join(f"{{%- set {k} = {json.dumps(v)} -%}}\n" for k, v in settings.items()
                           if k.isidentifier() and isinstance(v, (bool, int, float, str)))
            (out / self.TEMPLATE).write_text(head + template.text, encoding="utf-8")
            self.template_written = True

    def manifest_extra(self) -> dict[str, Any]:
        # Model-Optimizer's readers pass no `tools` to apply_chat_template (hf_streaming_dataset.py
        # `_tokenize_with_loss_mask`, collect_hidden_states/common.py): those rows re-render without the tool
        # declaration; hidden states from `eaglewatch extract --layout modelopt` keep eaglewatch's ids
        return {"modelopt": {"input_data": self.rel, "chat_template": self.TEMPLATE if self.template_written else None,
                             "rows_with_tools": self.with_tools}}

    def write(self, row, prompt_ids, output_ids, ids_source):
        self.with_tools += bool(row.tools)
        return super().write(row, prompt_ids, output_ids, ids_source)


class SpecforgeTextWriter(_SingleFile):
    """`specforge_text.jsonl`: `{"id", "text"}`, the shard ids decoded with special tokens as text, for
    SpecForge's `is_preformatted` path (`tokenizer(text, add_special_tokens=False)` gives the ids back; a
    sample whose text does not encode back to its ids is skipped as `not_reproducible`).

    SpecForge masks a pre-formatted row by regex (specforge/data/parse.py `GeneralParser.parse`): from the end
    of the template's `assistant_header` to its `end_of_turn_token`, every assistant turn unless
    `train_only_last_turn`. With the last turn only, the span is eaglewatch's output except what the
    generation prompt adds after the header (K2.5's `<think>`, which the server prefilled and the model never
    generated; no SpecForge 0.2 template's header includes it, and `data.chat_template` takes only a registered
    name). The differences are counted, recorded in the manifest and reported as a warning that points at the
    exact route: the pre-tokenized rows of `eagle3-shards` in SpecForge's `data.prompts_path`."""

    def __init__(self, out: Path, tokenizer, profile) -> None:
        super().__init__(out, "specforge-text")
        self.tokenizer = tokenizer
        self.template = SPECFORGE_TEMPLATES.get(profile.name)
        self.mask_samples = 0
        self.mask_tokens = 0
        self.prefills: Counter[str] = Counter()  # prompt text SpecForge puts in the loss -> samples
        self.longest = 0

    def write(self, row, prompt_ids, output_ids, ids_source):
        ids = [*prompt_ids, *output_ids]
        text = self.tokenizer.decode(ids)
        if self.tokenizer.encode(text) != ids:
            return "not_reproducible"
        if self.template is not None:
            delta, prefill = specforge_mask_delta(text, prompt_ids, ids, self.template[1], self.template[2],
                                                  self.tokenizer)
            if delta:
                self.mask_samples += 1
                self.mask_tokens += delta
                self.prefills[prefill] += 1
        self.longest = max(self.longest, len(ids))
        self._emit({"id": row.sample_id, "text": text}, len(ids))
        return None

    def warnings(self) -> list[str]:
        if not self.mask_samples:
            return []
        assert self.template is not None
        prefill = ", ".join(f"{text!r} in {n}" for text, n in self.prefills.most_common(3) if text)
        why = (f"the generation prompt continues past the template's assistant_header {self.template[1]!r} "
               f"({prefill} samples: prompt tokens the server prefilled, never generated)" if prefill else
               "its span does not start where the output does")
        return [
            f"specforge-text: SpecForge's pre-formatted route (data.is_preformatted with chat_template "
            f"{self.template[0]}) masks {self.mask_tokens} tokens in {self.mask_samples} of {self.n} samples "
            f"differently from eaglewatch: {why}; no SpecForge 0.2 template matches it. For eaglewatch's ids AND "
            "masks exactly, export --format eagle3-shards (one shard: --shard-size at least the samples) and run "
            "specforge train with data.prompts_path=OUT/data/shard_00000.jsonl (pre-tokenized rows; docs/jobs.md)"
        ]

    def manifest_extra(self) -> dict[str, Any]:
        data = {
            "train_data_path": self.rel,
            "is_preformatted": True,
            "train_only_last_turn": True,
            "chat_template": self.template[0] if self.template else None,
            "max_length": max(self.longest, 1),
        }
        return {
            "specforge": {
                "data": data,
                "loss_mask_differs": {"samples": self.mask_samples, "tokens": self.mask_tokens,
                                      "prompt_text_in_loss": dict(self.prefills.most_common())},
                "exact_route": "eagle3-shards rows as data.prompts_path" if self.mask_samples else None,
                "note": None if self.template else "no SpecForge template is registered for this profile; choose "
                "one whose assistant_header ends where this profile's generation prompt starts",
            }
        }


def specforge_mask_delta(text: str, prompt_ids: list[int], ids: list[int], header: str, end_of_turn: str,
                         tokenizer) -> tuple[int, str]:
    """Tokens where SpecForge's last-turn loss mask of `text` differs from eaglewatch's (prompt 0, output 1),
    and the prompt text SpecForge's span takes in ("" when it starts at or after the output).

    SpecForge's span (`GeneralParser.parse`, last regex match of header..end_of_turn) starts at the token count
    of `text[:end of the last assistant_header]` and ends at that of `text[:end of the next end_of_turn_token]`
    (or of the text). Token counts at a boundary inside the prompt's tail come from decoding the tail tokens
    (the usual case: a generation prompt of a few special tokens), else from encoding the prefix."""
    at = text.rfind(header)
    if at < 0:
        return len(ids) - len(prompt_ids), ""
    start_char = at + len(header)
    stop = text.find(end_of_turn, start_char)
    end_char = len(text) if stop < 0 else stop + len(end_of_turn)
    output_chars = len(tokenizer.decode(ids[len(prompt_ids):]))
    prompt_chars = len(text) - output_chars
    start = _tokens_before(text, start_char, prompt_ids, prompt_chars, tokenizer)
    end = len(ids) if end_char == len(text) else len(tokenizer.encode(text[:end_char]))
    p, n = len(prompt_ids), len(ids)
    # |symmetric difference| of [start, end) and [p, n)
    overlap = max(0, min(end, n) - max(start, p))
    return (end - start) + (n - p) - 2 * overlap, text[start_char:prompt_chars]


def _tokens_before(text: str, char: int, prompt_ids: list[int], prompt_chars: int, tokenizer) -> int:
    if char == prompt_chars:
        return len(prompt_ids)
    if char < prompt_chars:
        for k in range(1, min(8, len(prompt_ids)) + 1):
            if prompt_chars - len(tokenizer.decode(prompt_ids[-k:])) == char:
                return len(prompt_ids) - k
    return len(tokenizer.encode(text[:char]))


class ShardWriter(Writer):
    """`data/<prefix>_NNNNN.jsonl` files of `{"id", "input_ids", "loss_mask"}`, `shard_size` samples each
    (`eagle3-shards` for the extractor, `speculators` for speculators' prepare_data / trainer)."""

    def __init__(self, out: Path, shard_size: int, prefix: str = "shard", extra_columns: bool = True) -> None:
        self.out = out
        self.shard_size = shard_size
        self.prefix = prefix
        self.extra_columns = extra_columns
        self.shards: list[dict[str, Any]] = []
        self.fh = None
        self.in_shard = 0

    def _open(self) -> None:
        index = len(self.shards)
        rel = f"{DATA_DIR}/{self.prefix}_{index:05d}.jsonl"
        self.fh = (self.out / rel).open("wb", buffering=WRITE_BUFFER)
        self.shards.append({"index": index, "path": rel, "samples": 0, "tokens": 0})
        self.in_shard = 0

    def write(self, row, prompt_ids, output_ids, ids_source):
        if self.fh is None or self.in_shard >= self.shard_size:
            self._finish_shard()
            self._open()
        record: dict[str, Any] = {"id": row.sample_id, "input_ids": [*prompt_ids, *output_ids],
                                  "loss_mask": [0] * len(prompt_ids) + [1] * len(output_ids)}
        if self.extra_columns:
            record["ids_source"] = ids_source
        assert self.fh is not None
        self.fh.write(_jsonl(record))
        self.in_shard += 1
        self.shards[-1]["samples"] += 1
        self.shards[-1]["tokens"] += len(prompt_ids) + len(output_ids)
        return None

    def _finish_shard(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def close(self) -> list[dict[str, Any]]:
        self._finish_shard()
        return list(self.shards)


def make_writer(fmt: str, out: Path, tokenizer, profile, shard_size: int, template=None) -> Writer:
    """The writer for format `fmt` (one of FORMATS), its files under `out/data/`."""
    (out / DATA_DIR).mkdir(parents=True, exist_ok=True)
    if fmt == "sglang-raw":
        return SglangRawWriter(out)
    if fmt == "specforge":
        return SpecforgeWriter(out, tokenizer, profile)
    if fmt == "specforge-text":
        return SpecforgeTextWriter(out, tokenizer, profile)
    if fmt == "modelopt":
        return ModeloptWriter(out, tokenizer, profile, template)
    if fmt == "speculators":
        return ShardWriter(out, shard_size, SHARD_PREFIX[fmt], extra_columns=False)
    return ShardWriter(out, shard_size, SHARD_PREFIX["eagle3-shards"])
