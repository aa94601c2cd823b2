"""Hidden-state layouts, one per consumer: which files, names, keys, shapes and dtypes, and the last state's norm.

| layout | files under --out | keys | last state |
|---|---|---|---|
| `packed` | `shard_<i>.safetensors` (or `shard_<i>/<k>.safetensors` per sample) | `input_ids`, `loss_mask`, `sample_offsets`, `hidden_states` [T, H], `aux_hidden_states` [T, n*H] | after the final norm |
| `specforge` | `rows_<a>-<b>/data_<k>.ckpt` (torch.save, one sample each) | `input_ids` [T], `loss_mask` [T], `hidden_state` [1, T, H], `aux_hidden_state` [1, T, n*H] | after the final norm |
| `speculators` | `hidden_states/hs_<k>.safetensors` | `token_ids` [T], `hidden_states` [T, n+1, H] (aux layers, then the last) | BEFORE the final norm |
| `modelopt` | `<conversation_id>.pt` (torch.save) | `input_ids`, `hidden_states` [T, H], `aux_hidden_states` [T, n*H], `loss_mask`, `conversation_id`, `hidden_states_prenorm` | after the final norm |

k is the sample's position in the whole export (shard order, then sample order) for `specforge`; for
`speculators` it is the row of speculators' prepared dataset holding the sample's ids (`speculators
prepare-data` shuffles the rows: app.extract.speculators_order finds them by token ids). Consumers' loaders, read
from their source: SpecForge `specforge/data/preprocessing.py` (`list_local_files`,
`OfflineEagle3Dataset.process_data`) and `scripts/prepare_hidden_states.py` (`rows_<start>-<end>/data_<idx>.ckpt`);
speculators `hs_connectors.transfer.FileTransfer`
(`hs_{file_idx}.safetensors`) and `speculators/train/data.py` (`hidden_states[:, :-1]` aux, `[:, -1]` the verifier's
last state, normalised by speculators itself); Model-Optimizer `modelopt/torch/speculative/eagle/utils.py`
(`OfflineSupervisedDataset`) and `examples/speculative_decoding/eagle_utils.py` (`rglob("*.pt")`).

`<out>/eaglewatch_layout.json` records the layout, the layer ids in both conventions and the last state's norm;
`check_folder` refuses to add to a folder written with another layout, layers or norm (a mixed folder).
"""  # noqa: E501 (the table's rows: a markdown row cannot wrap)

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.extract.manifest import ShardSample
from app.extract.output import SafetensorsLayout, TensorSpec, tensor_bytes, write_at

# layout -> whether its last state is taken before the final norm
LAYOUTS = {"packed": False, "specforge": False, "speculators": True, "modelopt": False}
LAYOUT_FILE = "eaglewatch_layout.json"


def last_is_prenorm(layout: str) -> bool:
    """Whether `layout` stores the last decoder layer's output before the final norm (speculators) or after."""
    if layout not in LAYOUTS:
        raise InputError(f"--layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    return LAYOUTS[layout]


def layout_record(layout: str, aux_metadata: dict[str, Any], model: str, dtype: str) -> dict[str, Any]:
    """What `eaglewatch_layout.json` says about a folder: layout, layers (both conventions) and the last norm."""
    prenorm = last_is_prenorm(layout)
    return {
        "layout": layout,
        "last_hidden_state": "pre_norm" if prenorm else "post_norm",
        "last_hidden_state_meaning": (
            "output of the last decoder layer, BEFORE the final norm"
            if prenorm
            else "decoder output after the final norm (the input of the LM head)"
        ),
        **aux_metadata,
        "model": model,
        "dtype": dtype,
    }


def check_folder(out_dir: Path, record: dict[str, Any]) -> None:
    """Refuse to write `record`'s layout into a folder that holds another layout, other layers or another
    norm convention; write the record when the folder has none yet."""
    path = Path(out_dir) / LAYOUT_FILE
    keys = ("layout", "last_hidden_state", "aux_layers_output_convention", "model", "dtype")
    if path.exists():
        try:
            have = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise InputError(
                f"{path}: not valid JSON ({exc}); remove the folder's outputs or choose another --out"
            ) from None
        diff = [k for k in keys if have.get(k) != record.get(k)]
        if diff:
            pairs = ", ".join(f"{k}: folder {have.get(k)!r} vs now {record.get(k)!r}" for k in diff)
            raise InputError(
                f"{out_dir}: already holds hidden states of another kind ({pairs}); a folder must hold "
                "one layout, one set of layers and one norm convention; choose another --out"
            )
        return
    others = _foreign_files(Path(out_dir), record["layout"])
    if others:
        raise InputError(
            f"{out_dir}: holds hidden-state files without {LAYOUT_FILE} (e.g. {others[0]}); a folder "
            "must hold one layout; choose another --out"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _foreign_files(out_dir: Path, layout: str) -> list[str]:
    if not out_dir.is_dir():
        return []
    patterns = {
        "packed": ("shard_*.safetensors", "shard_*/*.safetensors"),
        "specforge": ("rows_*/*.ckpt",),
        "speculators": ("hidden_states/hs_*.safetensors",),
        "modelopt": ("*.pt",),
    }
    return [str(p.relative_to(out_dir)) for name, pats in patterns.items() for pat in pats for p in out_dir.glob(pat)][
        :1
    ]


def global_offsets(manifest) -> dict[int, int]:
    """Position of each shard's first sample in the whole export (shards in index order)."""
    offsets, at = {}, 0
    for entry in manifest.shards:
        offsets[entry.index] = at
        if entry.samples is None:
            raise InputError(
                f"{manifest.path}: shard {entry.index} has no 'samples' count; the {{specforge, speculators}} "
                "layouts number samples across shards; export the shards again"
            )
        at += entry.samples
    return offsets


def safe_file_stem(sample_id: str) -> str:
    """A sample id as a file name (Model-Optimizer names each dump `<conversation_id>.pt`)."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", sample_id).strip(".") or "sample"
    return stem[:200]


class PackedShardWriter:
    """Streams one shard into `shard_<i>.safetensors.partial`; `finish` renames it into place."""

    def __init__(
        self, path: Path, samples: Sequence[ShardSample], hidden: int, n_aux: int, dtype: str, metadata: dict[str, str]
    ) -> None:
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


class PackedSampleWriter:
    """Writes `shard_<i>.partial/<k>.safetensors` per sample; `finish` renames the folder into place."""

    def __init__(
        self, path: Path, samples: Sequence[ShardSample], hidden: int, n_aux: int, dtype: str, metadata: dict[str, str]
    ) -> None:
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


class _PerSampleFiles:
    """Base of the one-file-per-sample consumer layouts: each sample goes to `<file>.partial-<pid>` as its batch is
    written; `finish` renames them all into place (so a consumer never lists a half-written file). A sample
    may have several files (speculators: every prepared row holding its ids), all the same bytes."""

    def __init__(self, out_dir: Path, shard: int, samples: Sequence[ShardSample], first_index: int, dtype: str) -> None:
        self.out_dir, self.shard, self.samples, self.first, self.dtype = out_dir, shard, samples, first_index, dtype
        self.targets = [self.relatives(k) for k in range(len(samples))]
        self.files = [rel for rels in self.targets for rel in rels]
        self.bytes = 0
        self.written = [False] * len(samples)
        self._lock = threading.Lock()
        self._suffix = f".partial-{os.getpid()}"  # two shards may write the same file (same ids): their own partials
        for rel in {str(Path(f).parent) for f in self.files}:
            (out_dir / rel).mkdir(parents=True, exist_ok=True)

    def relative(self, k: int) -> str:
        """The file of sample k of this shard, relative to the output folder."""
        raise NotImplementedError

    def relatives(self, k: int) -> list[str]:
        """Every file of sample k (one, unless the consumer looks for the same ids at several places)."""
        return [self.relative(k)]

    def tensors(self, k: int, ids: Any, last: Any, aux: Any) -> dict[str, Any]:
        """The dict this consumer's loader reads for sample k, from its ids, last state and aux states."""
        raise NotImplementedError

    def save(self, tensors: dict[str, Any], path: Path) -> None:
        """Write one sample's dict (torch.save unless the consumer reads safetensors)."""
        import torch

        torch.save(tensors, path)

    def write_sample(self, k: int, ids: Any, last: Any, aux: Any) -> None:
        """Write sample k (its unpadded ids, last state [T, H] and aux states [T, n*H], on the CPU)."""
        first, *more = self.targets[k]
        partial = self.out_dir / (first + self._suffix)
        # clone: a slice of the batch would be saved with the whole batch's storage
        self.save(
            {key: (t.clone() if hasattr(t, "clone") else t) for key, t in self.tensors(k, ids, last, aux).items()},
            partial,
        )
        for rel in more:
            shutil.copyfile(partial, self.out_dir / (rel + self._suffix))
        with self._lock:
            self.bytes += partial.stat().st_size * (1 + len(more))
            self.written[k] = True

    def finish(self) -> tuple[Path, int]:
        """Rename every sample's file into place; (the output folder, bytes written)."""
        if not all(self.written):
            raise AssertionError(f"{self.written.count(False)} samples were never written")
        for rel in dict.fromkeys(self.files):  # samples with the same ids share their files: rename each once
            os.replace(self.out_dir / (rel + self._suffix), self.out_dir / rel)
        return self.out_dir, self.bytes

    def abort(self) -> None:
        """Remove the partial files of a failed shard."""
        for rel in self.files:
            (self.out_dir / (rel + self._suffix)).unlink(missing_ok=True)


class SpecforgeWriter(_PerSampleFiles):
    """`rows_<a>-<b>/data_<k>.ckpt`: the dict SpecForge's `scripts/prepare_hidden_states.py` saves and
    `OfflineEagle3Dataset` loads (`hidden_state`/`aux_hidden_state` with a leading batch dim of 1)."""

    def relative(self, k: int) -> str:
        a = self.first
        return f"rows_{a}-{a + len(self.samples)}/data_{a + k}.ckpt"

    def tensors(self, k, ids, last, aux):
        import torch

        return {
            "input_ids": ids,
            "loss_mask": torch.tensor(self.samples[k].loss_mask, dtype=torch.long),
            "hidden_state": last.unsqueeze(0),
            "aux_hidden_state": aux.unsqueeze(0),
        }


class ModeloptWriter(_PerSampleFiles):
    """`<conversation_id>.pt`: the dict Model-Optimizer's `compute_hidden_states_hf.py` saves and
    `OfflineSupervisedDataset` loads (`hidden_states_prenorm` False: the last state is after the norm)."""

    def relative(self, k: int) -> str:
        return f"{safe_file_stem(self.samples[k].sample_id)}.pt"

    def tensors(self, k, ids, last, aux):
        import torch

        return {
            "input_ids": ids,
            "hidden_states": last,
            "aux_hidden_states": aux,
            "loss_mask": torch.tensor(self.samples[k].loss_mask, dtype=torch.long),
            "conversation_id": self.samples[k].sample_id,
            "hidden_states_prenorm": False,
        }


class SpeculatorsWriter(_PerSampleFiles):
    """`hidden_states/hs_<k>.safetensors`: `token_ids` [T] and `hidden_states` [T, n+1, H], the aux layers in
    order and, last, the last decoder layer's output BEFORE the final norm (speculators' trainer splits
    `[:, :-1]` / `[:, -1]` and applies the verifier's norm itself). k is the row of speculators' prepared
    dataset that holds the sample's ids (app.extract.speculators_order), every such row when several do."""

    def __init__(self, out_dir: Path, shard: int, samples: Sequence[ShardSample], order: Any, dtype: str) -> None:
        self.order = order
        super().__init__(out_dir, shard, samples, 0, dtype)

    def relatives(self, k: int) -> list[str]:
        rows = self.order.indices(self.samples[k].input_ids)
        if not rows:
            raise InputError(f"sample {self.samples[k].sample_id!r}: no row of {self.order.prepared} holds its ids")
        return [f"hidden_states/hs_{row}.safetensors" for row in rows]

    def tensors(self, k, ids, last, aux):
        import torch

        n, hidden = last.shape
        stacked = torch.cat([aux.reshape(n, -1, hidden), last.reshape(n, 1, hidden)], dim=1)
        return {"token_ids": ids, "hidden_states": stacked}

    def save(self, tensors, path):
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def make_writer(
    layout: str,
    per_sample: bool,
    out_dir: Path,
    shard: int,
    samples: Sequence[ShardSample],
    first_index: int,
    hidden: int,
    n_aux: int,
    dtype: str,
    metadata: dict[str, str],
    speculators_order: Any = None,
):
    """The writer of one shard in `layout` (`packed` honours `per_sample`; `speculators` numbers its files by
    `speculators_order`, an app.extract.speculators_order.SpeculatorsOrder)."""
    from app.extract.output import shard_data_path

    if layout == "packed":
        cls = PackedSampleWriter if per_sample else PackedShardWriter
        return cls(shard_data_path(out_dir, shard, per_sample), samples, hidden, n_aux, dtype, metadata)
    if layout == "speculators":
        return SpeculatorsWriter(out_dir, shard, samples, speculators_order, dtype)
    per_file = {"specforge": SpecforgeWriter, "modelopt": ModeloptWriter}[layout]
    return per_file(out_dir, shard, samples, first_index, dtype)
