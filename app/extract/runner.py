"""The extractor itself: load the target model, run each shard batched by length, check, stream to disk.

Imports torch and transformers (the `extract` extra); everything else in `app.extract` stays torch-free.
States are taken with forward hooks on the decoder layers and from the decoder's `last_hidden_state`
(the final norm applied), so the LM head never runs and no full `hidden_states` tuple is kept.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
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
from app.extract.budget import check_disk_room, estimate_output_bytes, model_shape
from app.extract.layers import AuxLayers, resolve_aux_layers
from app.extract.manifest import Manifest, ShardSample, read_manifest, read_shard
from app.extract.output import (
    FORMAT,
    SafetensorsLayout,
    TensorSpec,
    done_marker_path,
    shard_data_path,
    shard_is_complete,
    tensor_bytes,
    write_at,
    write_done_marker,
)
from app.extract.progress import ProgressLog
from app.libnoise import silence_library_noise

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
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
    per_sample: bool = False
    trust_remote_code: bool = False


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


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'."""
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device {device!r}: use auto, cpu or cuda")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no GPU is visible to this process (check CUDA_VISIBLE_DEVICES)")
    return device


def resolve_dtype(dtype: str | None, device: str) -> str:
    """The storage/compute dtype: as given, else bf16 on cuda and fp32 on cpu."""
    if dtype is None:
        return "bf16" if device == "cuda" else "fp32"
    if dtype not in TORCH_DTYPES:
        raise InputError(f"--dtype {dtype!r}: use bf16, fp16 or fp32")
    return dtype


@dataclass(frozen=True, slots=True)
class CapturedBatch:
    """One batch's unpadded states in host memory, rows concatenated in batch order; valid once `ready`
    (a CUDA event, None on the CPU) has completed. `finite` is a 0-d bool tensor over last and aux."""

    ids: Any  # int64 [n]: the ids the model consumed
    last: Any  # [n, H], after the final norm
    aux: Any  # [n, len(aux) * H]
    finite: Any
    ready: Any

    def wait(self) -> None:
        """Block until the copies to host memory are done."""
        if self.ready is not None:
            self.ready.synchronize()


class TargetModel:
    """A loaded target model with hooks on the captured layers; `capture` runs one padded batch."""

    def __init__(self, model: Any, aux: AuxLayers, dtype: str, model_path: Path) -> None:
        import torch

        self.model = model
        self.aux = aux
        self.dtype = dtype
        self.model_path = model_path
        self.config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.hidden_size = int(self.config.hidden_size)
        self.decoder = _find_decoder(model)
        self.layers = _find_layers(self.decoder, aux.num_layers, model_path)
        embeddings = model.get_input_embeddings()
        self.vocab_size = int(embeddings.num_embeddings)
        self.input_device = embeddings.weight.device
        pad = getattr(self.config, "pad_token_id", None)
        self.pad_id = pad if isinstance(pad, int) and 0 <= pad < self.vocab_size else 0
        self._captured: dict[int, Any] = {}
        self._handles = []
        for h in sorted(set(aux.hidden_state_indices)):
            if h == 0:  # the state entering layer 0 (the embeddings)
                self._handles.append(
                    self.layers[0].register_forward_pre_hook(self._pre_hook(h), with_kwargs=True)
                )
            else:  # hidden_states[h] is the output of decoder layer h-1
                self._handles.append(self.layers[h - 1].register_forward_hook(self._post_hook(h)))
        self._torch = torch

    def _pre_hook(self, h: int):
        def hook(module, args, kwargs):
            self._captured[h] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _post_hook(self, h: int):
        def hook(module, args, output):
            self._captured[h] = output[0] if isinstance(output, (tuple, list)) else output

        return hook

    def bare_forward(self, batches: Iterable[Sequence[Sequence[int]]]) -> None:
        """The decoder forward alone over the same right-padded batches, nothing kept or copied: the baseline
        that benchmarks and the GPU check time the extractor against. Waits for the GPU before returning."""
        torch = self._torch
        with torch.inference_mode():
            for rows in batches:
                width = max(len(r) for r in rows)
                ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for r, row in enumerate(rows):
                    ids[r, : len(row)] = torch.tensor(row)
                    mask[r, : len(row)] = 1
                self.decoder(input_ids=ids.to(self.input_device), attention_mask=mask.to(self.input_device),
                             use_cache=False)
        if self.input_device.type == "cuda":
            torch.cuda.synchronize()

    def capture(self, rows: Sequence[Sequence[int]]) -> CapturedBatch:
        """Queue one forward over `rows` (right-padded, with an attention mask) and the copies of its
        unpadded states to host memory; returns at once on a GPU (wait on `CapturedBatch.ready`)."""
        torch = self._torch
        lengths = [len(r) for r in rows]
        width = max(lengths)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[r, : len(row)] = 1
        # positions of the real tokens in the flattened batch: gathering by index, unlike a boolean
        # mask, needs no device-to-host sync, so the next batch is queued while this one is copied
        flat = torch.cat([torch.arange(n) + r * width for r, n in enumerate(lengths)])
        on_gpu = self.input_device.type == "cuda"
        if on_gpu:
            ids, mask, flat = ids.pin_memory(), mask.pin_memory(), flat.pin_memory()
        dev = self.input_device
        ids_d, mask_d, flat_d = (t.to(dev, non_blocking=on_gpu) for t in (ids, mask, flat))
        self._captured.clear()
        try:
            with torch.inference_mode():
                out = self.decoder(input_ids=ids_d, attention_mask=mask_d, use_cache=False)
                last = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
                home = last.device
                hidden = last.shape[-1]
                last_flat = last.reshape(-1, hidden).index_select(0, flat_d.to(home))
                parts = []
                for h in self.aux.hidden_state_indices:
                    state = self._captured[h]
                    parts.append(state.reshape(-1, hidden).index_select(0, flat_d.to(state.device)).to(home))
                aux_flat = torch.cat(parts, dim=-1)
                seen = ids_d.reshape(-1).index_select(0, flat_d).to(home)
                finite = torch.isfinite(last_flat).all() & torch.isfinite(aux_flat).all()
                host = [self._to_host(t) for t in (seen, last_flat, aux_flat, finite)]
                ready = None
                if home.type == "cuda":
                    ready = torch.cuda.Event()
                    ready.record(torch.cuda.current_stream(home))
        finally:
            self._captured.clear()
        return CapturedBatch(ids=host[0], last=host[1], aux=host[2], finite=host[3], ready=ready)

    def _to_host(self, tensor: Any) -> Any:
        if tensor.device.type == "cpu":
            return tensor
        out = self._torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        out.copy_(tensor, non_blocking=True)
        return out

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _find_decoder(model: Any) -> Any:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        decoder = getattr(model, getattr(model, "base_model_prefix", "model"), None) or model
    return decoder


def _find_layers(decoder: Any, num_layers: int, model_path: Path) -> Any:
    import torch

    layers = getattr(decoder, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) == num_layers:
        return layers
    for module in decoder.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return module
    raise InputError(
        f"{model_path}: cannot find the {num_layers} decoder layers in {type(decoder).__name__}; "
        "this architecture is not supported by the built-in extractor (use a command-template extractor)"
    )


def load_target(options: ExtractOptions, aux: AuxLayers, device: str, dtype: str) -> TargetModel:
    """Load the model from local files only (bf16 + device_map="auto" on GPUs, fp32 on the CPU)."""
    silence_library_noise()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"local_files_only": True, "trust_remote_code": options.trust_remote_code}
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    # transformers renamed torch_dtype to dtype in 4.56; older versions would ignore an unknown `dtype`
    major_minor = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    kwargs["dtype" if major_minor >= (4, 56) else "torch_dtype"] = torch_dtype
    spread = device == "cuda" and importlib.util.find_spec("accelerate") is not None
    if spread:
        kwargs["device_map"] = "auto"
    elif device == "cuda" and torch.cuda.device_count() > 1:
        raise InputError(
            f"{torch.cuda.device_count()} GPUs are visible but device_map='auto' needs the 'accelerate' package: "
            "pip install 'eaglewatch[extract]' (or give this job one GPU)"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(str(options.model_path), **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(
            f"{options.model_path}: cannot load the model with transformers ({exc}); --model must be a local "
            "folder with config.json and weights (add --trust-remote-code only for models that need it)"
        ) from None
    if not spread:  # one GPU without accelerate, or the CPU
        model = model.to(device)
    offloaded = sorted({str(v) for v in (getattr(model, "hf_device_map", None) or {}).values()} & {"cpu", "disk"})
    if device == "cuda" and offloaded:
        # EAGLE #105: device_map="auto" quietly moves layers off the GPUs when they do not fit
        print(f"warning: {options.model_path} does not fit on the visible GPUs; device_map='auto' put some layers "
              f"on {' and '.join(offloaded)}, which is much slower; give the job more GPUs", file=sys.stderr)
    model.eval()
    return TargetModel(model, aux, dtype, options.model_path)


class _ShardFileWriter:
    """Streams one shard into `shard_<i>.safetensors.partial`; `finish` renames it into place."""

    def __init__(self, path: Path, samples: Sequence[ShardSample], hidden: int, n_aux: int, dtype: str,
                 metadata: dict[str, str]) -> None:
        lengths = [len(s.input_ids) for s in samples]
        self.offsets = [0]
        for n in lengths:
            self.offsets.append(self.offsets[-1] + n)
        total = self.offsets[-1]
        self.hidden, self.n_aux, self.item = hidden, n_aux, {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
        self.layout = SafetensorsLayout(
            [
                TensorSpec("input_ids", "int64", (total,)),
                TensorSpec("loss_mask", "int64", (total,)),
                TensorSpec("sample_offsets", "int64", (len(samples) + 1,)),
                TensorSpec("hidden_states", dtype, (total, hidden)),
                TensorSpec("aux_hidden_states", dtype, (total, n_aux * hidden)),
            ],
            metadata,
        )
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.fd = os.open(self.partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self.fd, self.layout.total_bytes)
        write_at(self.fd, 0, self.layout.header)
        import struct

        write_at(self.fd, self.layout.position("sample_offsets"), struct.pack(f"<{len(self.offsets)}q", *self.offsets))
        mask = [m for s in samples for m in s.loss_mask]
        write_at(self.fd, self.layout.position("loss_mask"), struct.pack(f"<{len(mask)}q", *mask))
        self.written = [False] * len(samples)

    def write_sample(self, k: int, ids: Any, last: Any, aux: Any) -> None:
        start = self.offsets[k]
        write_at(self.fd, self.layout.position("input_ids", start * 8), tensor_bytes(ids))
        write_at(self.fd, self.layout.position("hidden_states", start * self.hidden * self.item), tensor_bytes(last))
        row = self.n_aux * self.hidden * self.item
        write_at(self.fd, self.layout.position("aux_hidden_states", start * row), tensor_bytes(aux))
        self.written[k] = True

    def finish(self) -> tuple[Path, int]:
        missing = self.written.count(False)
        if missing:
            raise AssertionError(f"{missing} samples were never written")
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        os.replace(self.partial, self.path)
        return self.path, self.layout.total_bytes

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.partial.unlink(missing_ok=True)


class _SampleFilesWriter:
    """Writes `shard_<i>.partial/<k>.safetensors` per sample; `finish` renames the folder into place."""

    def __init__(self, path: Path, samples: Sequence[ShardSample], hidden: int, n_aux: int, dtype: str,
                 metadata: dict[str, str]) -> None:
        self.path, self.samples, self.hidden, self.n_aux, self.dtype = path, samples, hidden, n_aux, dtype
        self.metadata = {k: v for k, v in metadata.items() if k != "sample_ids"}
        self.partial = path.with_name(path.name + ".partial")
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)
        self.bytes = 0
        self.written = [False] * len(samples)
        self._lock = threading.Lock()

    def write_sample(self, k: int, ids: Any, last: Any, aux: Any) -> None:
        import torch

        sample = self.samples[k]
        n = len(sample.input_ids)
        layout = SafetensorsLayout(
            [
                TensorSpec("input_ids", "int64", (n,)),
                TensorSpec("loss_mask", "int64", (n,)),
                TensorSpec("hidden_states", self.dtype, (n, self.hidden)),
                TensorSpec("aux_hidden_states", self.dtype, (n, self.n_aux * self.hidden)),
            ],
            {**self.metadata, "sample_id": sample.sample_id, "position": str(k)},
        )
        mask = torch.tensor(sample.loss_mask, dtype=torch.int64)
        with (self.partial / f"{k:06d}.safetensors").open("wb") as f:
            f.write(layout.header)
            for t in (ids, mask, last, aux):
                f.write(tensor_bytes(t))
        with self._lock:
            self.bytes += layout.total_bytes
            self.written[k] = True

    def finish(self) -> tuple[Path, int]:
        if not all(self.written):
            raise AssertionError(f"{self.written.count(False)} samples were never written")
        index = {
            "samples": [
                {"position": k, "sample_id": s.sample_id, "tokens": len(s.input_ids), "file": f"{k:06d}.safetensors"}
                for k, s in enumerate(self.samples)
            ]
        }
        (self.partial / "index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
        shutil.rmtree(self.path, ignore_errors=True)
        os.replace(self.partial, self.path)
        return self.path, self.bytes

    def abort(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)


def _shard_metadata(
    target: TargetModel, manifest: Manifest, shard: int, samples: Sequence[ShardSample]
) -> dict[str, str]:
    meta: dict[str, object] = {
        "format": FORMAT,
        "shard": shard,
        "sample_ids": [s.sample_id for s in samples],
        **target.aux.metadata(),
        "last_hidden_state": "decoder output after the final norm (the input of the LM head)",
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
                shard=shard, sample_id=s.sample_id,
            )


def extract_shard(
    target: TargetModel, manifest: Manifest, shard: int, options: ExtractOptions, log: ProgressLog
) -> ShardResult:
    """Extract one shard unless it is already complete; the done-marker is written last.

    Every batch is checked before its bytes are written (finite values, shapes, token ids equal to the
    shard's); any failure raises ExtractionError naming shard and sample and leaves no marker behind."""
    per_sample = options.per_sample
    path = shard_data_path(options.out_dir, shard, per_sample)
    if shard_is_complete(options.out_dir, shard):
        return _skip(manifest, shard, options, log)
    started = time.monotonic()
    done_marker_path(options.out_dir, shard).unlink(missing_ok=True)  # a stale marker of incomplete data
    samples = read_shard(manifest.shard(shard))
    _check_ids_in_vocab(samples, target.vocab_size, shard)
    total_tokens = sum(len(s.input_ids) for s in samples)
    n_aux = len(target.aux.ids)
    hidden = target.hidden_size
    writer_cls = _SampleFilesWriter if per_sample else _ShardFileWriter
    writer = writer_cls(path, samples, hidden, n_aux, target.dtype, _shard_metadata(target, manifest, shard, samples))
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
                shard=shard, sample_id=rows[0].sample_id,
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
                    shard=shard, sample_id=samples[batch[0]].sample_id,
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
    write_done_marker(
        options.out_dir,
        shard,
        {
            "shard": shard,
            "path": str(rel),
            "layout": "per-sample" if per_sample else "shard",
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
    log.emit("shard_done", shard, path=str(out_path), done=len(samples), total=len(samples), tokens=total_tokens,
             bytes=nbytes, skipped=False, seconds=round(seconds, 3))
    return ShardResult(shard, out_path, len(samples), total_tokens, nbytes, False, seconds)


def _check_batch(rows: Sequence[ShardSample], last: Any, aux: Any, seen_ids: Any, finite: bool, hidden: int,
                 n_aux: int, shard: int) -> None:
    """Raise ExtractionError naming the first sample whose states or ids are wrong."""
    import torch

    n = sum(len(s.input_ids) for s in rows)
    if tuple(last.shape) != (n, hidden) or tuple(aux.shape) != (n, n_aux * hidden) or tuple(seen_ids.shape) != (n,):
        raise ExtractionError(
            f"shard {shard}: batch starting at sample {rows[0].sample_id!r} produced states of shape "
            f"{tuple(last.shape)} / {tuple(aux.shape)}, expected ({n}, {hidden}) / ({n}, {n_aux * hidden}); "
            "the shard is not marked done",
            shard=shard, sample_id=rows[0].sample_id,
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
                shard=shard, sample_id=s.sample_id,
            )
        if not finite and not (torch.isfinite(last[start:end]).all() and torch.isfinite(aux[start:end]).all()):
            raise ExtractionError(
                f"shard {shard}, sample {s.sample_id!r}: the hidden states contain NaN or Inf; the shard is not "
                "marked done (check the model weights and --dtype)",
                shard=shard, sample_id=s.sample_id,
            )
        start = end
    if not finite:  # the device saw a non-finite value that the per-sample scan did not locate
        raise ExtractionError(
            f"shard {shard}: the hidden states of the batch starting at sample {rows[0].sample_id!r} contain NaN "
            "or Inf; the shard is not marked done",
            shard=shard, sample_id=rows[0].sample_id,
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
    todo = pending_shards(manifest, shards, options.out_dir)
    target = None
    if todo:  # a run with every shard done never touches the model
        aux = resolve_aux_layers(options.aux_layers, options.convention, model_shape(options.model_path).num_layers)
        device = resolve_device(options.device)
        dtype = resolve_dtype(options.dtype, device)
        needed = estimate_output_bytes(manifest, options.model_path, aux.ids, dtype, shards=todo)
        check_disk_room(options.out_dir, needed, f"{len(todo)} shard(s) of hidden states")
        target = load_target(options, aux, device, dtype)
    results = []
    failures: list[ExtractionError] = []
    try:
        for index in dict.fromkeys(shards):
            if target is None or index not in todo:
                results.append(_skip(manifest, index, options, log))
                continue
            try:
                results.append(extract_shard(target, manifest, index, options, log))
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


def _skip(manifest: Manifest, shard: int, options: ExtractOptions, log: ProgressLog) -> ShardResult:
    marker = json.loads(done_marker_path(options.out_dir, shard).read_text(encoding="utf-8"))
    result = ShardResult(shard, options.out_dir / marker["path"], marker.get("samples", 0), marker.get("tokens", 0),
                         marker.get("bytes", 0), True, 0.0)
    log.emit("shard_done", shard, path=str(result.path), done=result.samples, total=result.samples,
             tokens=result.tokens, bytes=result.bytes, skipped=True)
    return result
