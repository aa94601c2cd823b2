"""One writer per export format; each writes its data files under `<out>/data/` (never beside the manifest,
so a consumer pointed at `data/` sees only data) and receives `TrainingRow`s: ids plus the generated spans.

Consumers' readers (read from their source, releases of late 2026):
- SpecForge 0.2 `specforge/data/prompt_builder.py` `prepare_prompt_tasks` (one JSONL file whose first record has
  `input_ids` + `loss_mask`: pre-tokenized rows, cut at `data.max_length`) and `specforge/data/preprocessing.py`
  `build_eagle3_dataset` (`text` with `is_preformatted`).
- speculators 0.9 `speculators/data_generation/preprocessing.py` `load_raw_dataset` (a folder: every `*.json` /
  `*.jsonl` below it) and `_passthrough_pretokenized` (`input_ids` + `loss_mask` rows, cut at `--seq-length`).
- Model-Optimizer 0.47 `modelopt/torch/speculative/plugins/hf_streaming_dataset.py` `_tokenize_with_loss_mask`
  and `modelopt/torch/utils/plugins/transformers_dataset.py` `LanguageDataCollator` (`conversation_id`,
  `messages`; one `apply_chat_template(..., return_assistant_tokens_mask=answer_only_loss)` call).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from app.errors import InputError
from app.export.training_rows import TrainingRow
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
    return {
        "id": call.id,
        "type": call.type or "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def consumer_encode(tokenizer):
    """`text -> ids` as a trainer's transformers tokenizer encodes it (add_special_tokens=False): the
    `tokenizers` library with the normaliser applied for a `tokenizer.json`, tiktoken otherwise."""
    if tokenizer.kind == "hf":
        backend = tokenizer.backend
        return lambda text: backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
    return tokenizer.encode


class Writer:
    """Base: `write` one kept row (None, or a skip reason when this format cannot hold it); `close` returns
    the files written (paths relative to the export folder) with their counts."""

    def write(self, row: TrainingRow) -> str | None:
        """Write one kept row; None when written, else the skip reason (this format cannot hold it)."""
        raise NotImplementedError

    def close(self) -> list[dict[str, Any]]:
        """Close the files; their paths (relative to the export folder) with sample and token counts."""
        raise NotImplementedError

    def manifest_extra(self) -> dict[str, Any]:
        """What this format adds to the manifest (how its consumer reads the files, what it measured)."""
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
    """`sglang_raw.jsonl`: `{"id", "messages", "tools"?, "output_ids", "meta_info"}` per sample (the last generated
    span as `output_ids`, the stored prompt messages)."""

    def __init__(self, out: Path) -> None:
        super().__init__(out, "sglang-raw")

    def write(self, row):
        src = row.source
        ids = row.output_ids
        record: dict[str, Any] = {"id": row.sample_id, "messages": src.messages}
        if src.tools:
            record["tools"] = src.tools
        record["output_ids"] = ids
        finish = "length" if (src.category == "truncated" or src.finish_reason == "length") else "stop"
        record["meta_info"] = {
            "finish_reason": {"type": finish},
            "prompt_tokens": len(row.input_ids) - len(ids),
            "completion_tokens": len(ids),
            "verdict": row.verdict,
            "ids_source": row.ids_source,
        }
        self._emit(record, len(ids))
        return None


class PretokenizedFileWriter(_SingleFile):
    """`specforge.jsonl`: `{"id", "input_ids", "loss_mask"}` per row in ONE file, what SpecForge's
    `data.prompts_path` takes (`prepare_prompt_tasks` passes such rows through unchanged, whatever their number;
    a folder is an IsADirectoryError there)."""

    def __init__(self, out: Path) -> None:
        super().__init__(out, "specforge")

    def write(self, row):
        self._emit({"id": row.sample_id, "input_ids": row.input_ids, "loss_mask": row.loss_mask}, len(row.input_ids))
        return None


class ModeloptWriter(_SingleFile):
    """`modelopt.jsonl`: `{"conversation_id", "messages"}` per row, and `chat_template.jinja` beside the manifest.

    Model-Optimizer tokenizes a row with ONE `apply_chat_template(messages, return_assistant_tokens_mask=...)`
    call (`_tokenize_with_loss_mask`, `LanguageDataCollator`) and takes the loss mask from the template's
    `{% generation %}` blocks. Its own templates re-render a conversation (and its readers pass no `tools`), so
    the row carries the text of eaglewatch's ids instead: `messages` alternate the rendered context (role
    "user": system prompt, tool declarations, earlier turns, the generation prompt) and each generated span
    (role "assistant"), and the template writes every message's text as it is, with generation tags around the
    assistant ones. A row is written only when transformers' tokenizer gives back its ids AND its mask from that
    text (checked here with the same `tokenizers` encoding and the char_to_token rule of
    `PreTrainedTokenizerBase.apply_chat_template`); otherwise it is skipped as `not_reproducible`.

    A tiktoken tokenizer (no tokenizer.json, e.g. Kimi K2.5's) is refused: transformers loads it as a slow
    tokenizer, with which Model-Optimizer ignores generation tags and masks by a per-model recovery
    (modelopt/torch/utils/loss_mask.py)."""

    TEMPLATE = "chat_template.jinja"
    # the whole template on one line: no text outside the tags, so trim_blocks / lstrip_blocks change nothing
    TEMPLATE_TEXT = (
        "{#- eaglewatch: each message is text already rendered with the model's chat template (tokens proven "
        "against the target's); assistant messages are the target model's generated tokens, in the loss through "
        "the generation tags. -#}"
        "{%- for message in messages -%}{%- if message['role'] == 'assistant' -%}{%- generation -%}"
        "{{- message['content'] -}}{%- endgeneration -%}{%- else -%}{{- message['content'] -}}{%- endif -%}"
        "{%- endfor -%}"
    )

    def __init__(self, out: Path, tokenizer) -> None:
        if tokenizer.kind != "hf":
            raise InputError(
                f"--format modelopt: {tokenizer.path} has no tokenizer.json (a {tokenizer.kind} tokenizer), so "
                "Model-Optimizer loads a slow tokenizer, ignores the template's generation tags and masks the loss "
                "by its per-model recovery (modelopt/torch/utils/loss_mask.py; for Kimi the text between "
                "<|im_middle|> and <|im_end|> of every assistant turn: the prefilled <think> in the loss, <|im_end|> "
                "out of it). For eaglewatch's ids and masks exactly, export --format eagle3-shards and extract with "
                '[extraction] layout = "modelopt" (its .pt files carry loss_mask; train with '
                "training.answer_only_loss=true and data.offline_data_path); docs/jobs.md"
            )
        super().__init__(out, "modelopt")
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend
        (out / self.TEMPLATE).write_text(self.TEMPLATE_TEXT, encoding="utf-8")

    def write(self, row):
        chunks = row.chunks()
        texts = [self.tokenizer.decode(ids) for _, ids in chunks]
        encoding = self.backend.encode("".join(texts), add_special_tokens=False)
        if encoding.ids != row.input_ids or _assistant_mask(encoding, chunks, texts) != row.loss_mask:
            return "not_reproducible"
        messages = [
            {"role": "assistant" if generated else "user", "content": text}
            for (generated, _), text in zip(chunks, texts, strict=True)
        ]
        self._emit({"conversation_id": row.sample_id, "messages": messages}, len(row.input_ids))
        return None

    def manifest_extra(self) -> dict[str, Any]:
        return {
            "modelopt": {
                "input_data": self.rel,
                "chat_template": self.TEMPLATE,
                "answer_only_loss": True,
                "messages": "rendered context as 'user', each generated span as 'assistant'",
            }
        }


def _assistant_mask(encoding, chunks: list[tuple[bool, list[int]]], texts: list[str]) -> list[int]:
    """The mask `apply_chat_template(return_assistant_tokens_mask=True)` gives for these chunks' generation
    blocks: per block, the tokens from char_to_token(first char) to char_to_token(last char) (to the end when
    the last is None); it stops at a block whose first char maps to no token."""
    n = len(encoding.ids)
    mask = [0] * n
    at = 0
    for (generated, _), text in zip(chunks, texts, strict=True):
        if generated and text:
            start = encoding.char_to_token(at)
            if start is None:
                break
            end = encoding.char_to_token(at + len(text) - 1)
            mask[start : (end + 1 if end else n)] = [1] * ((end + 1 if end else n) - start)
        at += len(text)
    return mask


class SpecforgeTextWriter(_SingleFile):
    """`specforge_text.jsonl`: `{"id", "text"}`, the row's ids decoded with special tokens as text, for
    SpecForge's `is_preformatted` path (a row whose text does not encode back to its ids is skipped as
    `not_reproducible`).

    SpecForge masks a pre-formatted row by regex (specforge/data/parse.py `GeneralParser.parse`): from the end
    of the template's `assistant_header` to its `end_of_turn_token`, every assistant turn unless
    `train_only_last_turn`. With the last turn only, the span is eaglewatch's output except what the
    generation prompt adds after the header (K2.5's `<think>`, which the server prefilled and the model never
    generated; no SpecForge 0.2 template's header includes it, and `data.chat_template` takes only a registered
    name), and a row with several generated spans keeps only its last one. The differences are counted,
    recorded in the manifest and reported as a warning that points at the exact route: `--format specforge`
    (pre-tokenized rows for SpecForge's `data.prompts_path`)."""

    def __init__(self, out: Path, tokenizer, profile) -> None:
        super().__init__(out, "specforge-text")
        self.tokenizer = tokenizer
        self.encode = consumer_encode(tokenizer)
        self.template = SPECFORGE_TEMPLATES.get(profile.name)
        self.mask_samples = 0
        self.mask_tokens = 0
        self.prefills: Counter[str] = Counter()  # prompt text SpecForge puts in the loss -> samples

    def write(self, row):
        ids = row.input_ids
        text = self.tokenizer.decode(ids)
        if self.encode(text) != ids:
            return "not_reproducible"
        if self.template is not None:
            delta, prefill = specforge_mask_delta(text, row, self.template[1], self.template[2], self.tokenizer)
            if delta:
                self.mask_samples += 1
                self.mask_tokens += delta
                self.prefills[prefill] += 1
        self._emit({"id": row.sample_id, "text": text}, len(ids))
        return None

    def warnings(self) -> list[str]:
        if not self.mask_samples:
            return []
        assert self.template is not None
        prefill = ", ".join(f"{text!r} in {n}" for text, n in self.prefills.most_common(3) if text)
        why = (
            f"the generation prompt continues past the template's assistant_header {self.template[1]!r} "
            f"({prefill} samples: prompt tokens the server prefilled, never generated)"
            if prefill
            else "its span does not start where the output does"
        )
        return [
            f"specforge-text: SpecForge's pre-formatted route (data.is_preformatted with chat_template "
            f"{self.template[0]}) masks {self.mask_tokens} tokens in {self.mask_samples} of {self.n} samples "
            f"differently from eaglewatch: {why}; no SpecForge 0.2 template matches it. For eaglewatch's ids AND "
            "masks exactly, export --format specforge (pre-tokenized rows in one file) and run specforge train "
            "with data.prompts_path=OUT/data/specforge.jsonl (docs/jobs.md)"
        ]

    def manifest_extra(self) -> dict[str, Any]:
        return {
            "specforge": {
                "data": {
                    "train_data_path": self.rel,
                    "is_preformatted": True,
                    "train_only_last_turn": True,
                    "chat_template": self.template[0] if self.template else None,
                },
                "loss_mask_differs": {
                    "samples": self.mask_samples,
                    "tokens": self.mask_tokens,
                    "prompt_text_in_loss": dict(self.prefills.most_common()),
                },
                "exact_route": "--format specforge: pre-tokenized rows as data.prompts_path"
                if self.mask_samples
                else None,
                "note": None
                if self.template
                else "no SpecForge template is registered for this profile; choose "
                "one whose assistant_header ends where this profile's generation prompt starts",
            }
        }


def specforge_mask_delta(text: str, row: TrainingRow, header: str, end_of_turn: str, tokenizer) -> tuple[int, str]:
    """Tokens where SpecForge's last-turn loss mask of `text` differs from eaglewatch's (the row's generated
    spans), and the prompt text SpecForge's span takes in ("" when it starts at or after the last span).

    SpecForge's span (`GeneralParser.parse`, last regex match of header..end_of_turn) starts at the token count
    of `text[:end of the last assistant_header]` and ends at that of `text[:end of the next end_of_turn_token]`
    (or of the text). Token counts at a boundary inside the context before the last span come from decoding
    the tail tokens (the usual case: a generation prompt of a few special tokens), else from encoding."""
    ids = row.input_ids
    p, n = row.loss_spans[-1][0], len(ids)
    at = text.rfind(header)
    if at < 0:
        return row.loss_tokens, ""
    start_char = at + len(header)
    stop = text.find(end_of_turn, start_char)
    end_char = len(text) if stop < 0 else stop + len(end_of_turn)
    prompt_ids = ids[:p]
    prompt_chars = len(text) - len(tokenizer.decode(ids[p:]))
    start = _tokens_before(text, start_char, prompt_ids, prompt_chars, tokenizer)
    end = n if end_char == len(text) else len(tokenizer.encode(text[:end_char]))
    # |symmetric difference| of [start, end) and the union of the generated spans
    overlap = sum(max(0, min(end, b) - max(start, a)) for a, b in row.loss_spans)
    return (end - start) + row.loss_tokens - 2 * overlap, text[start_char:prompt_chars]


def _tokens_before(text: str, char: int, prompt_ids: list[int], prompt_chars: int, tokenizer) -> int:
    if char == prompt_chars:
        return len(prompt_ids)
    if char < prompt_chars:
        for k in range(1, min(8, len(prompt_ids)) + 1):
            if prompt_chars - len(tokenizer.decode(prompt_ids[-k:])) == char:
                return len(prompt_ids) - k
    return len(tokenizer.encode(text[:char]))


class ShardWriter(Writer):
    """`data/<prefix>_NNNNN.jsonl` files of `{"id", "input_ids", "loss_mask"}`, `shard_size` rows each
    (`eagle3-shards` for the extractor, also `ids_source`; `speculators` for `speculators prepare-data`)."""

    def __init__(self, out: Path, shard_size: int, prefix: str = "shard", extra_columns: bool = True) -> None:
        self.out = out
        self.shard_size = shard_size
        self.prefix = prefix
        self.extra_columns = extra_columns
        self.shards: list[dict[str, Any]] = []
        self.fh: BinaryIO | None = None
        self.in_shard = 0

    def _open(self) -> None:
        index = len(self.shards)
        rel = f"{DATA_DIR}/{self.prefix}_{index:05d}.jsonl"
        self.fh = (self.out / rel).open("wb", buffering=WRITE_BUFFER)
        self.shards.append({"index": index, "path": rel, "samples": 0, "tokens": 0})
        self.in_shard = 0

    def write(self, row):
        if self.fh is None or self.in_shard >= self.shard_size:
            self._finish_shard()
            self._open()
        record: dict[str, Any] = {"id": row.sample_id, "input_ids": row.input_ids, "loss_mask": row.loss_mask}
        if self.extra_columns:
            record["ids_source"] = row.ids_source
        assert self.fh is not None
        self.fh.write(_jsonl(record))
        self.in_shard += 1
        self.shards[-1]["samples"] += 1
        self.shards[-1]["tokens"] += len(row.input_ids)
        return None

    def _finish_shard(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def close(self) -> list[dict[str, Any]]:
        self._finish_shard()
        return list(self.shards)


def make_writer(fmt: str, out: Path, tokenizer, profile, shard_size: int) -> Writer:
    """The writer for format `fmt` (one of FORMATS), its files under `out/data/`."""
    (out / DATA_DIR).mkdir(parents=True, exist_ok=True)
    if fmt == "sglang-raw":
        return SglangRawWriter(out)
    if fmt == "specforge":
        return PretokenizedFileWriter(out)
    if fmt == "specforge-text":
        return SpecforgeTextWriter(out, tokenizer, profile)
    if fmt == "modelopt":
        return ModeloptWriter(out, tokenizer)
    if fmt == "speculators":
        return ShardWriter(out, shard_size, SHARD_PREFIX[fmt], extra_columns=False)
    return ShardWriter(out, shard_size, SHARD_PREFIX["eagle3-shards"])
