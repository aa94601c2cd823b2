"""The target model of an extraction: load it from local files, hook the captured layers, run padded batches.

Imports torch and transformers (the `extract` extra). The last state is the decoder's `last_hidden_state`
(after the final norm) unless `last_prenorm`, when it is the output of the last decoder layer (before the
final norm, what speculators stores); a layout decides which (`app.extract.layouts.LAYOUTS`).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.extract.layers import AuxLayers
from app.libnoise import silence_library_noise

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


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
    last: Any  # [n, H], after the final norm (before it when the model was loaded with last_prenorm)
    aux: Any  # [n, len(aux) * H]
    finite: Any
    ready: Any

    def wait(self) -> None:
        """Block until the copies to host memory are done."""
        if self.ready is not None:
            self.ready.synchronize()


class TargetModel:
    """A loaded target model with hooks on the captured layers; `capture` runs one padded batch."""

    def __init__(self, model: Any, aux: AuxLayers, dtype: str, model_path: Path, last_prenorm: bool = False) -> None:
        import torch

        self.last_prenorm = last_prenorm
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
        # hidden_states[N] is the output of the last decoder layer, before the final norm
        self._last_index = aux.num_layers
        wanted = set(aux.hidden_state_indices) | ({self._last_index} if last_prenorm else set())
        for h in sorted(wanted):
            if h == 0:  # the state entering layer 0 (the embeddings)
                self._handles.append(self.layers[0].register_forward_pre_hook(self._pre_hook(h), with_kwargs=True))
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
                self.decoder(
                    input_ids=ids.to(self.input_device), attention_mask=mask.to(self.input_device), use_cache=False
                )
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
                if self.last_prenorm:
                    last = self._captured[self._last_index].to(last.device)
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


def load_target(
    model_path: Path,
    aux: AuxLayers,
    device: str,
    dtype: str,
    *,
    trust_remote_code: bool = False,
    last_prenorm: bool = False,
) -> TargetModel:
    """Load the model from local files only (bf16 + device_map="auto" on GPUs, fp32 on the CPU); the last state
    is taken before the final norm when `last_prenorm`."""
    silence_library_noise()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"local_files_only": True, "trust_remote_code": trust_remote_code}
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
        model = AutoModelForCausalLM.from_pretrained(str(model_path), **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(
            f"{model_path}: cannot load the model with transformers ({exc}); --model must be a local "
            "folder with config.json and weights (add --trust-remote-code only for models that need it)"
        ) from None
    if not spread:  # one GPU without accelerate, or the CPU
        # transformers' `to` wrapper is typed as taking the model first (functools.wraps on a method)
        model = model.to(device)  # type: ignore[arg-type]
    offloaded = sorted({str(v) for v in (getattr(model, "hf_device_map", None) or {}).values()} & {"cpu", "disk"})
    if device == "cuda" and offloaded:
        # EAGLE #105: device_map="auto" quietly moves layers off the GPUs when they do not fit
        print(
            f"warning: {model_path} does not fit on the visible GPUs; device_map='auto' put some layers "
            f"on {' and '.join(offloaded)}, which is much slower; give the job more GPUs",
            file=sys.stderr,
        )
    model.eval()
    return TargetModel(model, aux, dtype, model_path, last_prenorm)
