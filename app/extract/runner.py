"""The extractor itself: run each shard batched by length, check every batch, stream it to disk in a layout.

Imports torch and transformers (the `extract` extra); everything else in `app.extract` stays torch-free.
The model (`app.extract.model`) takes states with forward hooks, so the LM head never runs and no full
`hidden_states` tuple is kept; the files a consumer reads are written by `app.extract.layouts`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.errors import EaglewatchError, InputError
from app.extract.batching import plan_batches
from app.extract.disk_budget import check_disk_room, estimate_output_bytes, model_shape
from app.extract.layers import resolve_aux_layers
from app.extract.layouts import check_folder, global_offsets, last_is_prenorm, layout_record, make_writer
from app.extract.manifest import Manifest, ShardSample, read_manifest, read_shard
from app.extract.model import (  # noqa: F401  (re-exported: the extractor's one import point)
    TORCH_DTYPES,
    CapturedBatch,
    TargetModel,
    load_target,
    resolve_device,
    resolve_dtype,
)
from app.extract.output import FORMAT, done_marker_path, read_done_marker, shard_is_complete, write_done_marker
from app.extract.progress_lines import ProgressLog

# threads that wait for a batch's copies, check it and write it (pwrite at disjoint offsets, so batches
# are written in parallel: one thread cannot keep up with a GPU at ~32 KB of states per token)
WRITER_THREADS = 4
# batches handed to the writers and not yet on disk; bounds pinned host memory
MAX_PENDING_WRITES = WRITER_THREADS + 1


class ExtractionError(EaglewatchError):
    """A shard failed its checks or its run; names the shard (and sample). The shard is not marked done."""

    def __init__(self, message: str, *, shard: int, sample_id: str | None = None) -> None:
        super().__init__(message)
        self.shard = shard
        self.sample_id = sample_id


@dataclass(frozen=True, slots=True)
class ExtractOptions:
    """How to extract: the local model folder, output folder, layers, batching, dtype and device."""

    model_path: Path
    out_dir: Path
    aux_layers: tuple[int, ...] | None = None  # None: [1, N//2-1, N-4] ("output" numbering)
    convention: str = "output"
    batch_tokens: int = 8192
    dtype: str | None = None  # None: bf16 on GPUs, fp32 on the CPU
    device: str = "auto"  # auto | cpu | cuda
    per_sample: bool = False  # packed layout: one file per sample instead of one per shard
    trust_remote_code: bool = False
    layout: str = "packed"  # packed | specforge | speculators | modelopt (app.extract.layouts.LAYOUTS)
    # speculators layout: the dataset `speculators prepare-data` wrote (None: <manifest folder>/prepared)
    speculators_prepared: Path | None = None
    backend: str = "builtin"  # builtin (transformers) | vllm (vLLM's hidden-states connector, in vLLM's Python)


@dataclass(frozen=True, slots=True)
class ShardResult:
    """What one shard produced (or that it was skipped because already complete)."""

    shard: int
    path: Path
    samples: int
    tokens: int
    bytes: int
    skipped: bool
    seconds: float


def _shard_metadata(
    target: TargetModel, manifest: Manifest, shard: int, samples: Sequence[ShardSample]
) -> dict[str, str]:
    meta: dict[str, object] = {
        "format": FORMAT,
        "shard": shard,
        "sample_ids": [s.sample_id for s in samples],
        **target.aux.metadata(),
        "last_hidden_state": (
            "output of the last decoder layer, BEFORE the final norm"
            if target.last_prenorm
            else "decoder output after the final norm (the input of the LM head)"
        ),
        "last_hidden_state_norm": "pre_norm" if target.last_prenorm else "post_norm",
        "model": str(target.model_path),
        "model_type": getattr(target.config, "model_type", None),
        "hidden_size": target.hidden_size,
        "dtype": target.dtype,
        "manifest": str(manifest.path),
        "tokenizer_fingerprint": manifest.tokenizer_fingerprint,
    }
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}


def _check_ids_in_vocab(samples: Sequence[ShardSample], vocab: int, shard: int) -> None:
    for s in samples:
        top = max(s.input_ids)
        low = min(s.input_ids)
        if top >= vocab or low < 0:
            bad = top if top >= vocab else low
            raise ExtractionError(
                f"shard {shard}, sample {s.sample_id!r}: token id {bad} is outside the model's vocabulary "
                f"(0..{vocab - 1}); the shards were exported with a different tokenizer than this model's",
                shard=shard,
                sample_id=s.sample_id,
            )


def extract_shard(
    target: TargetModel,
    manifest: Manifest,
    shard: int,
    options: ExtractOptions,
    log: ProgressLog,
    speculators_order: Any = None,
) -> ShardResult:
    """Extract one shard unless it is already complete; the done-marker is written last.

    Every batch is checked before its bytes are written (finite values, shapes, token ids equal to the
    shard's); any failure raises ExtractionError naming shard and sample and leaves no marker behind.
    `speculators_order` (the speculators layout): where each sample's files go, found in the prepared dataset."""
    per_sample = options.per_sample
    if shard_is_complete(options.out_dir, shard):
        return _skip(manifest, shard, options, log)
    started = time.monotonic()
    done_marker_path(options.out_dir, shard).unlink(missing_ok=True)  # a stale marker of incomplete data
    samples = read_shard(manifest.shard(shard))
    _check_ids_in_vocab(samples, target.vocab_size, shard)
    total_tokens = sum(len(s.input_ids) for s in samples)
    n_aux = len(target.aux.ids)
    hidden = target.hidden_size
    if target.last_prenorm != last_is_prenorm(options.layout):
        raise ExtractionError(
            f"shard {shard}: the model was loaded with the last state "
            f"{'before' if target.last_prenorm else 'after'} the final norm, but layout "
            f"{options.layout!r} stores it the other way",
            shard=shard,
        )
    first = global_offsets(manifest)[shard] if options.layout in ("specforge", "speculators") else 0
    writer = make_writer(
        options.layout,
        per_sample,
        options.out_dir,
        shard,
        samples,
        first,
        hidden,
        n_aux,
        target.dtype,
        _shard_metadata(target, manifest, shard, samples),
        speculators_order,
    )
    log.progress(shard, 0, len(samples), 0, tokens_total=total_tokens)
    # the GPU runs batch b+1 while writer threads wait for earlier batches' copies, check and write them
    pool = ThreadPoolExecutor(max_workers=WRITER_THREADS, thread_name_prefix=f"shard{shard}-writer")
    pending: deque[Future] = deque()
    counts = {"done": 0, "tokens": 0}
    counts_lock = threading.Lock()

    def check_and_write(batch: list[int], captured: CapturedBatch) -> None:
        rows = [samples[k] for k in batch]
        try:
            captured.wait()
        except RuntimeError as exc:  # an asynchronous CUDA error surfaces here
            raise ExtractionError(
                f"shard {shard}: the GPU failed on the batch starting at sample {rows[0].sample_id!r}: {exc}",
                shard=shard,
                sample_id=rows[0].sample_id,
            ) from None
        _check_batch(rows, captured.last, captured.aux, captured.ids, bool(captured.finite), hidden, n_aux, shard)
        start = 0
        for k, sample in zip(batch, rows, strict=True):
            end = start + len(sample.input_ids)
            writer.write_sample(k, captured.ids[start:end], captured.last[start:end], captured.aux[start:end])
            start = end
        with counts_lock:  # one line per batch, `done` never going back
            counts["done"] += len(rows)
            counts["tokens"] += start
            log.progress(shard, counts["done"], len(samples), counts["tokens"], tokens_total=total_tokens)

    try:
        for batch in plan_batches([len(s.input_ids) for s in samples], options.batch_tokens):
            rows = [samples[k].input_ids for k in batch]
            try:
                captured = target.capture(rows)
            except RuntimeError as exc:  # CUDA OOM and friends: name the batch
                raise ExtractionError(
                    f"shard {shard}: the forward pass failed on a batch of {len(rows)} samples x {len(rows[0])} "
                    f"tokens (first sample {samples[batch[0]].sample_id!r}): {exc}; try a smaller --batch-tokens",
                    shard=shard,
                    sample_id=samples[batch[0]].sample_id,
                ) from None
            pending.append(pool.submit(check_and_write, batch, captured))
            while len(pending) > MAX_PENDING_WRITES or (pending and pending[0].done()):
                pending.popleft().result()
        while pending:
            pending.popleft().result()
        out_path, nbytes = writer.finish()
    except BaseException:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)
        writer.abort()
        raise
    pool.shutdown(wait=True)
    seconds = time.monotonic() - started
    rel = out_path.relative_to(options.out_dir)
    files = getattr(writer, "files", None)
    write_done_marker(
        options.out_dir,
        shard,
        {
            "shard": shard,
            "path": str(rel),
            "layout": ("per-sample" if per_sample else "shard") if options.layout == "packed" else options.layout,
            **({"files": list(files)} if files is not None and options.layout != "packed" else {}),
            "last_hidden_state": "pre_norm" if target.last_prenorm else "post_norm",
            "samples": len(samples),
            "tokens": total_tokens,
            "bytes": nbytes,
            "dtype": target.dtype,
            **target.aux.metadata(),
            "model": str(target.model_path),
            "manifest": str(manifest.path),
            "seconds": round(seconds, 3),
        },
    )
    log.emit(
        "shard_done",
        shard,
        path=str(out_path),
        done=len(samples),
        total=len(samples),
        tokens=total_tokens,
        bytes=nbytes,
        skipped=False,
        seconds=round(seconds, 3),
    )
    return ShardResult(shard, out_path, len(samples), total_tokens, nbytes, False, seconds)


def _check_batch(
    rows: Sequence[ShardSample], last: Any, aux: Any, seen_ids: Any, finite: bool, hidden: int, n_aux: int, shard: int
) -> None:
    """Raise ExtractionError naming the first sample whose states or ids are wrong."""
    import torch

    n = sum(len(s.input_ids) for s in rows)
    if tuple(last.shape) != (n, hidden) or tuple(aux.shape) != (n, n_aux * hidden) or tuple(seen_ids.shape) != (n,):
        raise ExtractionError(
            f"shard {shard}: batch starting at sample {rows[0].sample_id!r} produced states of shape "
            f"{tuple(last.shape)} / {tuple(aux.shape)}, expected ({n}, {hidden}) / ({n}, {n_aux * hidden}); "
            "the shard is not marked done",
            shard=shard,
            sample_id=rows[0].sample_id,
        )
    start = 0
    for s in rows:
        end = start + len(s.input_ids)
        if not torch.equal(seen_ids[start:end], torch.tensor(s.input_ids, dtype=seen_ids.dtype)):
            got = seen_ids[start:end].tolist()
            pairs = enumerate(zip(got, s.input_ids, strict=False))
            pos = next((i for i, (x, y) in pairs if x != y), min(len(got), len(s.input_ids)))
            raise ExtractionError(
                f"shard {shard}, sample {s.sample_id!r}: the token ids fed to the model differ from the manifest's "
                f"at position {pos}; the shard is not marked done",
                shard=shard,
                sample_id=s.sample_id,
            )
        if not finite and not (torch.isfinite(last[start:end]).all() and torch.isfinite(aux[start:end]).all()):
            raise ExtractionError(
                f"shard {shard}, sample {s.sample_id!r}: the hidden states contain NaN or Inf; the shard is not "
                "marked done (check the model weights and --dtype)",
                shard=shard,
                sample_id=s.sample_id,
            )
        start = end
    if not finite:  # the device saw a non-finite value that the per-sample scan did not locate
        raise ExtractionError(
            f"shard {shard}: the hidden states of the batch starting at sample {rows[0].sample_id!r} contain NaN "
            "or Inf; the shard is not marked done",
            shard=shard,
            sample_id=rows[0].sample_id,
        )


def pending_shards(manifest: Manifest, shards: Iterable[int], out_dir: Path) -> list[int]:
    """The requested shards (duplicates dropped, unknown ones refused) that lack a complete output."""
    wanted = list(dict.fromkeys(shards))
    for index in wanted:
        manifest.shard(index)  # unknown shard -> InputError listing the ones that exist
    return [i for i in wanted if not shard_is_complete(out_dir, i)]


def run_extraction(
    manifest_path: str | Path, shards: Sequence[int], options: ExtractOptions, log: ProgressLog | None = None
) -> list[ShardResult]:
    """Extract `shards` of the manifest: skip complete ones, check disk room, load the model once, run the
    rest. Raises InputError on bad input; a failing shard is reported (`shard_failed` line) and the others
    still run, then ExtractionError names the first failure."""
    log = log or ProgressLog()
    options = replace(options, out_dir=Path(options.out_dir).resolve(), model_path=Path(options.model_path).resolve())
    manifest = read_manifest(manifest_path)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    _check_done_layouts(options.out_dir, shards, options)
    todo = pending_shards(manifest, shards, options.out_dir)
    target = None
    order = None
    if todo and options.layout == "speculators":  # before the model loads: a missing row is refused at once
        from app.extract.speculators_order import SpeculatorsOrder, prepared_path

        prepared = prepared_path(manifest.path, options.speculators_prepared)
        longest = (manifest.meta.get("train") or {}).get("max_length")
        order = SpeculatorsOrder.scan(
            prepared,
            ((s.sample_id, s.input_ids) for i in todo for s in read_shard(manifest.shard(i))),
            max_length=longest,
        )
    if todo:  # a run with every shard done never touches the model
        aux = resolve_aux_layers(options.aux_layers, options.convention, model_shape(options.model_path).num_layers)
        device = resolve_device(options.device)
        dtype = resolve_dtype(options.dtype, device)
        prenorm = last_is_prenorm(options.layout)
        # the norm trap: one folder, one layout, one set of layers, one norm convention
        check_folder(options.out_dir, layout_record(options.layout, aux.metadata(), str(options.model_path), dtype))
        needed = estimate_output_bytes(
            manifest,
            options.model_path,
            aux.ids,
            dtype,
            shards=todo,
            per_sample_files=options.per_sample or options.layout != "packed",
        )
        check_disk_room(options.out_dir, needed, f"{len(todo)} shard(s) of hidden states")
        target = _load(options, manifest, todo, aux, device, dtype, prenorm)
    results = []
    failures: list[ExtractionError] = []
    try:
        for index in dict.fromkeys(shards):
            if target is None or index not in todo:
                results.append(_skip(manifest, index, options, log))
                continue
            try:
                results.append(extract_shard(target, manifest, index, options, log, order))
            except ExtractionError as exc:
                # the other shards are independent: report this one and go on
                log.emit("shard_failed", index, error=str(exc), sample_id=exc.sample_id)
                failures.append(exc)
    finally:
        if target is not None:
            target.close()
    if failures:
        first = failures[0]
        more = f" ({len(failures) - 1} more shard(s) failed too)" if len(failures) > 1 else ""
        raise ExtractionError(f"{first}{more}", shard=first.shard, sample_id=first.sample_id)
    return results


def _load(
    options: ExtractOptions, manifest: Manifest, todo: Sequence[int], aux: Any, device: str, dtype: str, prenorm: bool
) -> Any:
    """The target model of the chosen backend (both offer `capture`, `close` and the same attributes)."""
    if options.backend == "vllm":
        from app.extract.vllm_model import load_vllm_target

        longest = max((len(s.input_ids) for i in todo for s in read_shard(manifest.shard(i))), default=1)
        # room for the one token each request generates
        return load_vllm_target(
            options.model_path, aux, dtype, last_prenorm=prenorm, max_len=longest + 1, device=device
        )
    if options.backend != "builtin":
        raise InputError(f"--backend {options.backend!r}: use builtin or vllm")
    return load_target(
        options.model_path, aux, device, dtype, trust_remote_code=options.trust_remote_code, last_prenorm=prenorm
    )


def _check_done_layouts(out_dir: Path, shards: Sequence[int], options: ExtractOptions) -> None:
    """Refuse when a requested shard is already done in another layout, or with other layers than the ones
    asked for explicitly (the model is not read for this)."""
    layout = options.layout
    for index in dict.fromkeys(shards):
        marker = read_done_marker(out_dir, index)
        if marker is None:
            continue
        kind = marker.get("layout")
        have = "packed" if kind in ("shard", "per-sample", None) else kind
        if have != layout:
            raise InputError(
                f"{out_dir}: shard {index} is done in layout {have!r}, not {layout!r}; a folder must "
                "hold one layout, one set of layers and one norm convention; choose another --out"
            )
        if options.aux_layers is not None and (
            list(options.aux_layers) != marker.get("aux_layers") or options.convention != marker.get("layer_convention")
        ):
            raise InputError(
                f"{out_dir}: shard {index} is done with aux layers {marker.get('aux_layers')} "
                f"({marker.get('layer_convention')} convention), not {list(options.aux_layers)} "
                f"({options.convention}); choose another --out"
            )


def _skip(manifest: Manifest, shard: int, options: ExtractOptions, log: ProgressLog) -> ShardResult:
    marker = json.loads(done_marker_path(options.out_dir, shard).read_text(encoding="utf-8"))
    result = ShardResult(
        shard,
        options.out_dir / marker["path"],
        marker.get("samples", 0),
        marker.get("tokens", 0),
        marker.get("bytes", 0),
        True,
        0.0,
    )
    log.emit(
        "shard_done",
        shard,
        path=str(result.path),
        done=result.samples,
        total=result.samples,
        tokens=result.tokens,
        bytes=result.bytes,
        skipped=True,
    )
    return result
