"""Where the extractor writes, the done-markers, and the safetensors files it streams.

Layout under the output folder (`--out`):
- `shard_<i>.safetensors` (default, one file per shard; samples packed without padding, in shard order):
  `input_ids` int64 [T], `loss_mask` int64 [T], `sample_offsets` int64 [n+1] (sample k is rows
  offsets[k]:offsets[k+1]), `hidden_states` [T, H] (the LAST hidden state, after the model's final norm, as
  SpecForge's `hidden_state` and EAGLE expect), `aux_hidden_states` [T, len(aux)*H] (the auxiliary layers
  concatenated along the last axis in the order of `aux_layers`, as SpecForge's `aux_hidden_state`).
  T is the shard's token count. The header's `__metadata__` holds `sample_ids` (JSON list), the layer ids in
  both conventions, the model, dtype and the manifest (see `app.extract.layers.AuxLayers.metadata`).
- `shard_<i>/<k:06d>.safetensors` with `--per-sample`: the same four keys for sample k alone (no
  `sample_offsets`), `sample_id` in its metadata, and `shard_<i>/index.json` mapping positions to sample ids.
- consumer layouts (`--layout specforge | speculators | modelopt`): see `app.extract.layouts`; their markers
  list every file of the shard (`files`).
- `shard_<i>.done`: JSON written last (after the data is renamed into place); a shard counts as finished
  only when the marker parses and the data it names is complete.

The files are written by hand in the safetensors format (header, then raw little-endian bytes) so a shard
can be streamed batch by batch with bounded memory; `safetensors.safe_open` reads them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "eaglewatch-eagle3-hidden-states/1"
ST_DTYPES = {"bf16": "BF16", "fp16": "F16", "fp32": "F32", "int64": "I64"}
ITEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int64": 8}


def shard_data_path(out_dir: str | Path, shard: int, per_sample: bool = False) -> Path:
    """The shard's data: a `.safetensors` file, or a folder of per-sample files."""
    name = f"shard_{shard}" if per_sample else f"shard_{shard}.safetensors"
    return Path(out_dir) / name


def done_marker_path(out_dir: str | Path, shard: int) -> Path:
    """`<out>/shard_<i>.done`, written last and trusted over any executor state."""
    return Path(out_dir) / f"shard_{shard}.done"


def read_done_marker(out_dir: str | Path, shard: int) -> dict[str, Any] | None:
    """The marker's content when it exists and parses, else None."""
    try:
        data = json.loads(done_marker_path(out_dir, shard).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def shard_is_complete(out_dir: str | Path, shard: int) -> bool:
    """True when shard `shard` has a done-marker and the complete data it names (size or file count)."""
    marker = read_done_marker(out_dir, shard)
    if marker is None or not isinstance(marker.get("path"), str):
        return False
    path = Path(out_dir) / marker["path"]
    try:
        if isinstance(marker.get("files"), list):  # a consumer layout: one file per sample, all listed
            files = marker["files"]
            return len(files) == marker.get("samples") and all((Path(out_dir) / f).is_file() for f in files)
        if marker.get("layout") == "per-sample":
            index = json.loads((path / "index.json").read_text(encoding="utf-8"))
            files = [row["file"] for row in index["samples"]]
            return len(files) == marker.get("samples") and all((path / f).is_file() for f in files)
        return path.is_file() and path.stat().st_size == marker.get("bytes")
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_done_marker(out_dir: str | Path, shard: int, content: Mapping[str, Any]) -> Path:
    """Write the marker atomically (temp file, fsync, rename)."""
    path = done_marker_path(out_dir, shard)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(dict(content), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor of a safetensors file: name, dtype key (see ST_DTYPES) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = ITEM_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


class SafetensorsLayout:
    """Header and byte offsets of a safetensors file whose tensors are laid out in the given order."""

    def __init__(self, specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> None:
        header: dict[str, Any] = {"__metadata__": dict(metadata)}
        self.offsets: dict[str, int] = {}
        pos = 0
        for spec in specs:
            header[spec.name] = {
                "dtype": ST_DTYPES[spec.dtype],
                "shape": list(spec.shape),
                "data_offsets": [pos, pos + spec.nbytes],
            }
            self.offsets[spec.name] = pos
            pos += spec.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as safetensors does
        self.header = len(raw).to_bytes(8, "little") + raw
        self.data_start = len(self.header)
        self.total_bytes = self.data_start + pos

    def position(self, name: str, byte_offset: int = 0) -> int:
        """File position of byte `byte_offset` inside tensor `name`."""
        return self.data_start + self.offsets[name] + byte_offset


def tensor_bytes(tensor: Any) -> memoryview:
    """The raw little-endian bytes of a CPU tensor (bf16 included), without a copy when contiguous."""
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def write_at(fd: int, position: int, data: memoryview | bytes) -> None:
    """pwrite all of `data` at `position` (loops over short writes)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, position)
        view = view[n:]
        position += n


def load_shard_output(path: str | Path) -> list[dict[str, Any]]:
    """Read a shard file (or a per-sample folder) back as one dict per sample, in shard order:
    `sample_id`, `input_ids`, `loss_mask`, `hidden_states`, `aux_hidden_states` (torch tensors)."""
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        index = json.loads((path / "index.json").read_text(encoding="utf-8"))
        out = []
        for row in index["samples"]:
            with safe_open(str(path / row["file"]), framework="pt") as f:
                sample = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
                sample["sample_id"] = f.metadata()["sample_id"]
            out.append(sample)
        return out
    with safe_open(str(path), framework="pt") as f:
        ids = json.loads(f.metadata()["sample_ids"])
        offsets = f.get_tensor("sample_offsets").tolist()
        tensors = {key: f.get_tensor(key) for key in ("input_ids", "loss_mask", "hidden_states", "aux_hidden_states")}
    return [
        {"sample_id": sid, **{key: t[offsets[k] : offsets[k + 1]] for key, t in tensors.items()}}
        for k, sid in enumerate(ids)
    ]


def read_output_metadata(path: str | Path) -> dict[str, str]:
    """The `__metadata__` of a shard file (or of the first file of a per-sample folder)."""
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        index = json.loads((path / "index.json").read_text(encoding="utf-8"))
        path = path / index["samples"][0]["file"]
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata())
