"""Disk budget of an extraction: bytes the hidden states will take, checked against free space.

Torch-free, so the job launcher can call `estimate_output_bytes` before it starts any GPU process.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.extract.manifest import Manifest, read_manifest

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# input_ids and loss_mask are stored as int64 next to the states
ID_BYTES_PER_TOKEN = 16
# safetensors header + done-marker + per-sample file headers, generously
FILE_OVERHEAD_BYTES = 64 * 1024
# one file per sample (layouts specforge, speculators, modelopt; packed --per-sample): torch.save's zip and
# pickle, or a safetensors header (about 2.4 KB measured for a torch.save dict of 4 tensors), generously
PER_SAMPLE_FILE_BYTES = 8 * 1024


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the budget needs from a model config: hidden size, decoder layers, vocabulary size."""

    hidden_size: int
    num_layers: int
    vocab_size: int | None
    model_type: str | None = None


def model_shape(model_config: str | Path | Mapping[str, Any] | Any) -> ModelShape:
    """Read hidden size / layer count from a model dir, a config.json, a dict or a transformers config."""
    source = str(model_config)
    if isinstance(model_config, (str, Path)):
        path = Path(model_config)
        if path.is_dir():
            path = path / "config.json"
        source = str(path)
        try:
            data: Any = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"{path}: model config not found; --model must be a local model folder") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    elif isinstance(model_config, Mapping):
        data = dict(model_config)
    elif hasattr(model_config, "to_dict"):
        data = model_config.to_dict()
    else:
        raise InputError(f"model config {model_config!r}: expected a folder, a config.json, a dict or a config")
    # multimodal wrappers (e.g. Kimi-K2.5) keep the language model's numbers in text_config
    text = data.get("text_config") if isinstance(data.get("text_config"), Mapping) else data
    hidden = text.get("hidden_size", text.get("n_embd", text.get("d_model")))
    layers = text.get("num_hidden_layers", text.get("n_layer", text.get("num_layers")))
    if not isinstance(hidden, int) or not isinstance(layers, int):
        raise InputError(f"{source}: the model config has no integer hidden_size / num_hidden_layers")
    vocab = text.get("vocab_size")
    return ModelShape(hidden, layers, vocab if isinstance(vocab, int) else None, text.get("model_type"))


def bytes_per_token(shape: ModelShape, n_aux: int, dtype: str) -> int:
    """Stored bytes per token: (aux layers + last hidden state) x hidden x dtype, plus the ids and mask."""
    if dtype not in DTYPE_BYTES:
        raise InputError(f"dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
    return (n_aux + 1) * shape.hidden_size * DTYPE_BYTES[dtype] + ID_BYTES_PER_TOKEN


def estimate_output_bytes(
    manifest: Manifest | str | Path,
    model_config: str | Path | Mapping[str, Any] | Any,
    aux_layers: int | Iterable[int] | None,
    dtype: str,
    shards: Iterable[int] | None = None,
    per_sample_files: bool = False,
) -> int:
    """Bytes the extractor will write for `shards` (default: all) of `manifest`.

    tokens x hidden_size x (aux layers + 1) x dtype size, plus ids/mask and file overheads.
    `aux_layers` is the list of captured layers (or their count; None = the 3 default layers);
    `per_sample_files` adds each sample's file overhead (every layout but packed writes one file per sample).
    """
    if not isinstance(manifest, Manifest):
        manifest = read_manifest(manifest)
    shape = model_shape(model_config)
    if aux_layers is None:
        n_aux = 3
    elif isinstance(aux_layers, int):
        n_aux = aux_layers
    else:
        n_aux = len(list(aux_layers))
    wanted = set(shards) if shards is not None else None
    total = 0
    for entry in manifest.shards:
        if wanted is not None and entry.index not in wanted:
            continue
        if entry.tokens is None:
            raise InputError(
                f"{manifest.path}: shard {entry.index} has no 'tokens' count, so the disk budget cannot be "
                "estimated; export the shards again"
            )
        total += entry.tokens * bytes_per_token(shape, n_aux, dtype) + FILE_OVERHEAD_BYTES
        if per_sample_files:
            total += (entry.samples or 0) * PER_SAMPLE_FILE_BYTES
    return total


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    raise AssertionError


def free_bytes(out_dir: str | Path) -> int:
    """Free bytes on the file system that holds `out_dir` (or its nearest existing parent)."""
    path = Path(out_dir).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk_room(out_dir: str | Path, needed: int, what: str = "the hidden states") -> None:
    """Raise InputError with both numbers when `out_dir` has less free space than `needed` bytes."""
    free = free_bytes(out_dir)
    if needed > free:
        raise InputError(
            f"{out_dir}: not enough disk space for {what}: needs {_human(needed)} ({needed:,} bytes) but only "
            f"{_human(free)} ({free:,} bytes) is free; free some space, choose another --out, or extract "
            "fewer shards at a time"
        )
