"""Training-data export from a run store: `sglang-raw`, `specforge` and `eagle3-shards`.

Rows stream from the database in pages (keyset on `samples.pk`), so memory stays bounded whatever the run's
size. The completion ids are the stored reconstruction's `output_ids`; the prompt ids are the chat template
rendered with the generation prompt (transformers' Jinja renderer over the tokenizer directory's
`chat_template`, or a template file given explicitly) and encoded with `app.tokens`. Formats are described in
docs/contracts.md ("Export shards").
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.records import ToolCall
from app.store.ids import unpack_ids

FORMATS = ("sglang-raw", "specforge", "eagle3-shards")
MANIFEST = "manifest.json"
SINGLE_FILE = {"sglang-raw": "sglang_raw.jsonl", "specforge": "specforge.jsonl"}

# skip reasons, in the order they are checked (also the keys of ExportReport.skipped)
SKIP_REASONS = ("no_reconstruction", "text_mismatch", "structure_mismatch", "bpe_equivalent", "truncated", "too_long")


@dataclass(frozen=True)
class ExportPolicy:
    """Which samples to export: bpe_equivalent kept by default; mismatches and truncated dropped by default."""

    keep_bpe_equivalent: bool = True
    keep_mismatches: bool = False
    keep_truncated: bool = False
    max_length: int | None = None  # prompt + completion tokens; longer samples are skipped, never cut

    def as_dict(self) -> dict[str, Any]:
        """The policy as JSON-ready data (recorded in the manifest)."""
        return {
            "keep_bpe_equivalent": self.keep_bpe_equivalent,
            "keep_mismatches": self.keep_mismatches,
            "keep_truncated": self.keep_truncated,
            "max_length": self.max_length,
        }


@dataclass(frozen=True)
class ExportRow:
    """One done sample with its current reconstruction, as read from the store."""

    pk: int
    sample_id: str
    dataset: str
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    output_ids: tuple[int, ...] | None
    category: str | None
    finish_reason: str | None
    tokenizer_fingerprint: str


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote: counts by outcome, token totals and the files (relative to `out_dir`)."""

    run: str
    format: str
    out_dir: Path
    exported: int
    skipped: dict[str, int]
    tokens: int
    loss_tokens: int
    min_length: int | None
    max_length: int | None
    files: tuple[str, ...]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (`export --json`)."""
        return {
            "run": self.run,
            "format": self.format,
            "out_dir": str(self.out_dir),
            "exported": self.exported,
            "skipped": dict(self.skipped),
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "min_length": self.min_length,
            "max_length": self.max_length,
            "files": list(self.files),
            "seconds": round(self.seconds, 3),
        }


# ------------------------------------------------------------------------------------------- reading


_ROWS_SQL = """
SELECT s.pk, s.sample_id, s.dataset, s.messages, s.tools,
       r.output_ids, r.category, r.tokenizer, p.finish_reason
FROM samples AS s
LEFT JOIN reconstructions AS r ON r.run_id = s.run_id AND r.sample_pk = s.pk
LEFT JOIN responses AS p ON p.id = r.response_id
WHERE s.run_id = ? AND s.state = 'done' AND s.pk > ?
ORDER BY s.pk
LIMIT ?
"""


def iter_rows(conn: sqlite3.Connection, run_id: int, page_size: int = 256) -> Iterator[ExportRow]:
    """Every done sample of the run in pk order, read a page at a time (bounded memory)."""
    last = 0
    while True:
        page = conn.execute(_ROWS_SQL, (run_id, last, page_size)).fetchall()
        if not page:
            return
        for pk, sample_id, dataset, messages, tools, ids, category, fingerprint, finish in page:
            yield ExportRow(
                pk=int(pk),
                sample_id=str(sample_id),
                dataset=str(dataset),
                messages=_json_field(messages, sample_id, "messages") or [],
                tools=_json_field(tools, sample_id, "tools"),
                output_ids=unpack_ids(ids) if ids is not None else None,
                category=category,
                finish_reason=finish,
                tokenizer_fingerprint=fingerprint or "",
            )
        last = int(page[-1][0])


def _json_field(text: str | None, sample_id: str, name: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"sample {sample_id!r}: stored {name} is not valid JSON ({exc.msg}); re-ingest the run") from None


def skip_reason(row: ExportRow, policy: ExportPolicy) -> str | None:
    """Why the policy drops this row before rendering (None: keep it so far). See SKIP_REASONS."""
    if row.output_ids is None or not row.output_ids:
        return "no_reconstruction"
    if row.category in ("text_mismatch", "structure_mismatch") and not policy.keep_mismatches:
        return row.category
    if row.category == "bpe_equivalent" and not policy.keep_bpe_equivalent:
        return "bpe_equivalent"
    if (row.category == "truncated" or row.finish_reason == "length") and not policy.keep_truncated:
        return "truncated"
    return None


# ------------------------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the special-token strings transformers passes to it."""

    source: str  # where it came from, for messages and the manifest
    text: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs (e.g. thinking=False)

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None, *, add_generation_prompt: bool,
               **extra: Any) -> str:
        """The conversation as text, rendered exactly as transformers' `apply_chat_template(tokenize=False)`."""
        rendered, _ = _jinja_renderer()(
            conversations=[list(messages)],
            tools=list(tools) if tools else None,
            chat_template=self.text,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens, **self.kwargs, **extra},
        )
        return rendered[0]


def _jinja_renderer() -> Callable[..., tuple[list[str], Any]]:
    """transformers' `render_jinja_template` (the code behind `apply_chat_template`), imported quietly."""
    from app.libnoise import silence_library_noise

    silence_library_noise()
    from transformers.utils.chat_template_utils import render_jinja_template

    return render_jinja_template


def load_chat_template(tokenizer_dir: Path, override: Path | None = None, kwargs: dict[str, Any] | None = None) -> ChatTemplate | None:
    """The chat template for a tokenizer directory: `override` file, `chat_template.jinja`, or the config's
    `chat_template` entry; None when the directory has none."""
    specials: dict[str, str] = {}
    config: dict[str, Any] = {}
    config_path = tokenizer_dir / "tokenizer_config.json"
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"{config_path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                specials[key] = value
    kwargs = dict(kwargs or {})
    if override is not None:
        try:
            return ChatTemplate(str(override), override.read_text(encoding="utf-8"), specials, kwargs)
        except OSError as exc:
            raise InputError(f"{override}: cannot read the chat template ({exc.strerror or exc})") from None
    jinja = tokenizer_dir / "chat_template.jinja"
    if jinja.exists():
        return ChatTemplate(str(jinja), jinja.read_text(encoding="utf-8"), specials, kwargs)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template:
        return ChatTemplate(f"{config_path}:chat_template", template, specials, kwargs)
    return None


class PromptRenderer:
    """Prompt ids for a conversation: the chat template (generation prompt included) encoded with the tokenizer,
    or the profile's own renderer from `app.tokens` when the tokenizer directory has no template."""

    def __init__(self, tokenizer, profile, template: ChatTemplate | None, kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.profile = profile
        self.template = template
        self._profile_kwargs = _profile_render_kwargs(kwargs or {})
        self._profile_render: Callable[..., str] | None = None
        if template is None:
            import app.tokens as tokens

            self._profile_render = getattr(tokens, "render_prompt", None)
            if self._profile_render is None:
                raise InputError(
                    f"{tokenizer.path}: has no chat template (no chat_template.jinja and no chat_template in "
                    f"tokenizer_config.json) and profile {profile.name!r} has no prompt renderer; pass "
                    "--chat-template FILE with the model's Jinja template"
                )

    @property
    def profile_kwargs(self) -> dict[str, Any]:
        """Options passed to the profile renderer (thinking, preserve_thinking), as the run sent them."""
        return dict(self._profile_kwargs)

    @property
    def kind(self) -> str:
        """`chat_template` or `profile`: which renderer made the prompt ids (recorded in the manifest)."""
        return "chat_template" if self.template is not None else "profile"

    def prompt_text(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None) -> str:
        """The prompt as text, ending with the generation prompt (for K2.5: `...<|im_middle|><think>`)."""
        if self.template is not None:
            return self.template.render(messages, tools, add_generation_prompt=True)
        assert self._profile_render is not None
        return self._profile_render(self.profile, list(messages), list(tools) if tools else None, **self._profile_kwargs)

    def prompt_ids(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None, sample_id: str = "?") -> list[int]:
        """The prompt ids a server would feed the model for this conversation (InputError naming the sample
        when the template rejects it)."""
        try:
            text = self.prompt_text(messages, tools)
        except InputError:
            raise
        except Exception as exc:  # jinja2 errors, raise_exception() in templates, malformed messages
            where = self.template.source if self.template is not None else f"profile {self.profile.name}"
            raise InputError(
                f"sample {sample_id!r}: the chat template ({where}) could not render its prompt: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return self.tokenizer.encode(text)


def _profile_render_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The run's chat_template_kwargs in `render_prompt`'s terms (Qwen's `enable_thinking` is `thinking`)."""
    out: dict[str, Any] = {}
    for key, name in (("thinking", "thinking"), ("enable_thinking", "thinking"), ("preserve_thinking", "preserve_thinking")):
        if key in kwargs:
            out[name] = bool(kwargs[key])
    return out


# ------------------------------------------------------------------------------------------- writers


def _jsonl(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


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


class _Writer:
    files: list[str]

    def write(self, row: ExportRow, prompt_ids: list[int] | None) -> int:
        raise NotImplementedError

    def close(self) -> list[dict[str, Any]]:
        raise NotImplementedError


class SglangRawWriter(_Writer):
    """`sglang_raw.jsonl`: `{"id", "messages", "tools"?, "output_ids", "meta_info"}` per sample."""

    def __init__(self, out: Path) -> None:
        self.path = out / SINGLE_FILE["sglang-raw"]
        self.fh = self.path.open("w", encoding="utf-8")
        self.n = 0
        self.tokens = 0

    def write(self, row: ExportRow, prompt_ids: list[int] | None) -> int:
        ids = list(row.output_ids or ())
        record: dict[str, Any] = {"id": row.sample_id, "messages": row.messages}
        if row.tools:
            record["tools"] = row.tools
        record["output_ids"] = ids
        finish = "length" if (row.category == "truncated" or row.finish_reason == "length") else "stop"
        record["meta_info"] = {
            "finish_reason": {"type": finish},
            "prompt_tokens": len(prompt_ids or ()),
            "completion_tokens": len(ids),
            "verdict": row.category,
        }
        self.fh.write(_jsonl(record))
        self.n += 1
        self.tokens += len(ids)
        return len(ids)

    def close(self) -> list[dict[str, Any]]:
        self.fh.close()
        return [{"path": self.path.name, "samples": self.n, "tokens": self.tokens}]


class SpecforgeWriter(_Writer):
    """`specforge.jsonl`: `{"id", "conversations": [prompt messages..., assistant turn]}` per sample, the
    assistant turn split from the exported ids (reasoning_content, content, tool_calls)."""

    def __init__(self, out: Path, tokenizer, profile) -> None:
        from app.tokens import split_output

        self.split_output = split_output
        self.path = out / SINGLE_FILE["specforge"]
        self.fh = self.path.open("w", encoding="utf-8")
        self.tokenizer = tokenizer
        self.profile = profile
        self.n = 0

    def write(self, row: ExportRow, prompt_ids: list[int] | None) -> int:
        view = self.split_output(row.output_ids or (), self.profile, self.tokenizer)
        record: dict[str, Any] = {"id": row.sample_id, "conversations": [*row.messages, assistant_turn(view)]}
        if row.tools:
            record["tools"] = row.tools
        self.fh.write(_jsonl(record))
        self.n += 1
        return len(row.output_ids or ())

    def close(self) -> list[dict[str, Any]]:
        self.fh.close()
        return [{"path": self.path.name, "samples": self.n}]


class ShardWriter(_Writer):
    """`shard_NNNNN.jsonl` files of `{"id", "input_ids", "loss_mask"}`, `shard_size` samples each."""

    def __init__(self, out: Path, shard_size: int) -> None:
        self.out = out
        self.shard_size = shard_size
        self.shards: list[dict[str, Any]] = []
        self.fh = None
        self.in_shard = 0
        self.shard_tokens = 0

    def _open(self) -> None:
        index = len(self.shards)
        name = f"shard_{index:05d}.jsonl"
        self.fh = (self.out / name).open("w", encoding="utf-8")
        self.shards.append({"index": index, "path": name, "samples": 0, "tokens": 0})
        self.in_shard = 0

    def write(self, row: ExportRow, prompt_ids: list[int] | None) -> int:
        if self.fh is None or self.in_shard >= self.shard_size:
            self._finish_shard()
            self._open()
        prompt = prompt_ids or []
        output = list(row.output_ids or ())
        record = {"id": row.sample_id, "input_ids": prompt + output, "loss_mask": [0] * len(prompt) + [1] * len(output)}
        assert self.fh is not None
        self.fh.write(_jsonl(record))
        self.in_shard += 1
        self.shards[-1]["samples"] += 1
        self.shards[-1]["tokens"] += len(prompt) + len(output)
        return len(prompt) + len(output)

    def _finish_shard(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def close(self) -> list[dict[str, Any]]:
        self._finish_shard()
        return list(self.shards)


# ------------------------------------------------------------------------------------------- parallel

_WORKER_RENDERER: PromptRenderer | None = None
_BATCH = 64


def _worker_init(tokenizer_dir: str, profile_name: str, template: ChatTemplate | None,
                 kwargs: dict[str, Any] | None = None) -> None:
    global _WORKER_RENDERER
    from app.libnoise import silence_library_noise

    silence_library_noise()
    from app.tokens import get_profile, load_tokenizer

    _WORKER_RENDERER = PromptRenderer(load_tokenizer(tokenizer_dir), get_profile(profile_name), template, kwargs)


def _worker_render(jobs: list[tuple[str, list[dict[str, Any]], list[Any] | None]]) -> list[list[int]]:
    assert _WORKER_RENDERER is not None
    return [_WORKER_RENDERER.prompt_ids(messages, tools, sid) for sid, messages, tools in jobs]


def _prepare_serial(
    rows: Iterator[ExportRow], check: Callable[[ExportRow], str | None], renderer: PromptRenderer
) -> Iterator[tuple[ExportRow, str | None, list[int] | None]]:
    """(row, skip reason, prompt ids) in store order, prompts rendered here."""
    for row in rows:
        reason = check(row)
        yield row, reason, (renderer.prompt_ids(row.messages, row.tools, row.sample_id) if reason is None else None)


def _prepare_parallel(
    rows: Iterator[ExportRow],
    check: Callable[[ExportRow], str | None],
    renderer: PromptRenderer,
    tokenizer_dir: Path,
    workers: int,
) -> Iterator[tuple[ExportRow, str | None, list[int] | None]]:
    """(row, skip reason, prompt ids) in store order, prompts rendered by a process pool in batches;
    at most 2 x workers batches are in flight, so memory stays bounded."""
    import multiprocessing as mp
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor
    from itertools import islice

    context = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_worker_init,
        initargs=(str(tokenizer_dir), renderer.profile.name, renderer.template, renderer.profile_kwargs),
    )
    pending: deque = deque()

    def drain(item):
        checked, future = item
        prompts = iter(future.result())
        for row, reason in checked:
            yield row, reason, (next(prompts) if reason is None else None)

    try:
        while batch := list(islice(rows, _BATCH)):
            checked = [(row, check(row)) for row in batch]
            jobs = [(row.sample_id, row.messages, row.tools) for row, reason in checked if reason is None]
            pending.append((checked, pool.submit(_worker_render, jobs)))
            while len(pending) > 2 * workers:
                yield from drain(pending.popleft())
        while pending:
            yield from drain(pending.popleft())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------------------- export


def _template_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """`chat_template_kwargs` the run sent (from its endpoints' `extra`), so the prompt matches the server's."""
    found: list[dict[str, Any]] = []
    for ep in config.get("endpoints") or []:
        extra = (ep.get("extra") or {}) if isinstance(ep, dict) else {}
        kwargs = extra.get("chat_template_kwargs") if isinstance(extra, dict) else None
        found.append(kwargs if isinstance(kwargs, dict) else {})
    if not found:
        return {}
    if any(f != found[0] for f in found):
        raise InputError(
            "the run's endpoints send different chat_template_kwargs, so prompts differ per endpoint; "
            "pass --template-kwargs JSON to choose one"
        )
    return found[0]


def export_run(
    db: Path,
    out_dir: Path,
    fmt: str,
    *,
    run: str | None = None,
    policy: ExportPolicy = ExportPolicy(),
    shard_size: int = 1000,
    tokenizer_dir: Path | None = None,
    profile_name: str | None = None,
    chat_template: Path | None = None,
    template_kwargs: dict[str, Any] | None = None,
    overwrite: bool = False,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Stream a run's done samples into `out_dir` in format `fmt`; write `manifest.json` last. Returns the report.

    workers > 1 renders prompts in that many processes (order and bounded memory kept).
    progress(seen, exported) is called after every sample. Raises InputError for a bad database, run,
    tokenizer, template, or an output directory that already holds an export (unless overwrite).
    """
    from app.store.queries import connect_readonly, resolve_run
    from app.tokens import get_profile, load_tokenizer

    if fmt not in FORMATS:
        raise InputError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if workers <= 0:
        raise InputError(f"--workers: must be at least 1, got {workers}")
    if shard_size <= 0:
        raise InputError(f"--shard-size: must be a positive number of samples, got {shard_size}")
    if policy.max_length is not None and policy.max_length <= 0:
        raise InputError(f"--max-length: must be a positive number of tokens, got {policy.max_length}")
    started = time.perf_counter()
    conn = connect_readonly(db)
    try:
        info = resolve_run(conn, run, db_label=str(db))
        config = info.config if isinstance(info.config, dict) else {}
        model = config.get("model") or {}
        tok_dir = tokenizer_dir or (Path(model["tokenizer"]) if model.get("tokenizer") else None)
        if tok_dir is None:
            raise InputError(f"run {info.name!r}: its stored config names no tokenizer; pass --tokenizer DIR")
        if not tok_dir.is_dir():
            raise InputError(f"{tok_dir}: tokenizer directory not found (from the run's config); pass --tokenizer DIR")
        tokenizer = load_tokenizer(tok_dir)
        profile = get_profile(profile_name or model.get("profile") or "kimi-k2.5")
        kwargs = template_kwargs if template_kwargs is not None else _template_kwargs(config)
        renderer = PromptRenderer(tokenizer, profile, load_chat_template(tok_dir, chat_template, kwargs), kwargs)

        out_dir.mkdir(parents=True, exist_ok=True)
        manifest_path = out_dir / MANIFEST
        if manifest_path.exists() and not overwrite:
            raise InputError(f"{out_dir}: already holds an export (manifest.json); pass --overwrite or another --out")
        if manifest_path.exists():
            manifest_path.unlink()  # an interrupted overwrite must not leave the old manifest claiming success
        writer: _Writer
        if fmt == "sglang-raw":
            writer = SglangRawWriter(out_dir)
        elif fmt == "specforge":
            writer = SpecforgeWriter(out_dir, tokenizer, profile)
        else:
            writer = ShardWriter(out_dir, shard_size)

        skipped: Counter[str] = Counter()
        exported = seen = tokens = loss_tokens = 0
        shortest: int | None = None
        longest: int | None = None
        def check(row: ExportRow) -> str | None:
            reason = skip_reason(row, policy)
            if reason is None and row.tokenizer_fingerprint and row.tokenizer_fingerprint != tokenizer.fingerprint:
                raise InputError(
                    f"sample {row.sample_id!r}: its ids were rebuilt with tokenizer {row.tokenizer_fingerprint[:12]}, "
                    f"not {tok_dir} ({tokenizer.fingerprint[:12]}); pass the run's tokenizer with --tokenizer, or "
                    "run `eaglewatch reprocess` with this one first"
                )
            return reason

        rows = iter_rows(conn, info.id)
        prepared = (
            _prepare_parallel(rows, check, renderer, tok_dir, workers)
            if workers > 1
            else _prepare_serial(rows, check, renderer)
        )
        for row, reason, prompt_ids in prepared:
            seen += 1
            total = len(prompt_ids or ()) + len(row.output_ids or ())
            if reason is None and policy.max_length is not None and total > policy.max_length:
                reason = "too_long"
            if reason is not None:
                skipped[reason] += 1
            else:
                writer.write(row, prompt_ids)
                exported += 1
                tokens += total
                loss_tokens += len(row.output_ids or ())
                shortest = total if shortest is None else min(shortest, total)
                longest = total if longest is None else max(longest, total)
            if progress is not None:
                progress(seen, exported)
        files = writer.close()
    finally:
        conn.close()

    manifest = {
        "format": fmt,
        "version": 1,
        "run": info.name,
        "profile": profile.name,
        "tokenizer": {"path": str(tok_dir), "fingerprint": tokenizer.fingerprint},
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "prompt_renderer": renderer.kind,
        "chat_template": renderer.template.source if renderer.template is not None else None,
        "chat_template_kwargs": kwargs,
        "policy": policy.as_dict(),
        "counts": {"seen": seen, "exported": exported, "skipped": dict(sorted(skipped.items()))},
        "lengths": {
            "samples": exported,
            "tokens": tokens,
            "loss_tokens": loss_tokens,
            "min": shortest,
            "max": longest,
            "mean": round(tokens / exported, 2) if exported else None,
        },
    }
    if fmt == "eagle3-shards":
        manifest["shard_size"] = shard_size
        manifest["shards"] = files
    else:
        manifest["files"] = files
    tmp = manifest_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(manifest_path)
    return ExportReport(
        run=info.name,
        format=fmt,
        out_dir=out_dir,
        exported=exported,
        skipped=dict(sorted(skipped.items())),
        tokens=tokens,
        loss_tokens=loss_tokens,
        min_length=shortest,
        max_length=longest,
        files=tuple(f["path"] for f in files) + (MANIFEST,),
        seconds=time.perf_counter() - started,
    )
