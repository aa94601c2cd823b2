"""The vLLM backend of the extractor: the target model run by vLLM's hidden-states connector.

Runs only in vLLM's own Python (its pins clash with eaglewatch's venv), so it imports vllm and torch lazily and
nothing of eaglewatch beyond the extractor's stdlib-level modules. It offers the `TargetModel` surface that
`app.extract.runner` drives (`capture`, `close`, `aux`, `dtype`, `hidden_size`, `vocab_size`, `last_prenorm`,
`model_path`), so manifest reading, checks, layouts, progress lines and done markers are the built-in extractor's.

vLLM's `extract_hidden_states` method names layers by the "input to layer i" convention (id i = transformers'
`hidden_states[i]`, id N = the last decoder layer's output before the final norm), de-duplicates repeated ids and
saves, per request, `hidden_states [T, n_ids, H]` for the prompt tokens. Every sample is sent as its exact ids
(prompt + output of the export row) with `max_tokens=1`; the saved `token_ids` are checked against them. Layouts that
store the last state after the final norm get it from the model's own RMSNorm weight (`model.norm.weight`,
`rms_norm_eps`), applied in fp32.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from app.errors import InputError
from app.extract.layers import AuxLayers
from app.extract.model import CapturedBatch

CONNECTOR_MODULE = "app.extract.vllm_connector"
CONNECTOR_CLASS = "CpuHiddenStatesConnector"
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def connector_layer_ids(aux: AuxLayers) -> list[int]:
    """The ids vLLM is asked for: the aux layers in its "input" convention plus N (the last state before the norm),
    sorted and unique, as its connector stores them."""
    return sorted(set(aux.hidden_state_indices) | {aux.num_layers})


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])


class VllmTarget:
    """vLLM's engine with the CPU hidden-states connector; `capture` sends one batch of samples as token ids."""

    def __init__(
        self, model_path: Path, aux: AuxLayers, dtype: str, *, last_prenorm: bool, max_len: int, device: str
    ) -> None:
        import torch
        from vllm import LLM

        self._torch = torch
        self.model_path = model_path
        self.aux = aux
        self.dtype = dtype
        self.last_prenorm = last_prenorm
        config = json.loads((model_path / "config.json").read_text())
        config = config.get("text_config", config)
        self.config = SimpleNamespace(**config)  # what the runner records (model_type)
        self.hidden_size = int(config["hidden_size"])
        self.vocab_size = int(config["vocab_size"])
        self._eps = float(config.get("rms_norm_eps", 1e-6))
        self._ids = connector_layer_ids(aux)
        self._slots = [self._ids.index(h) for h in aux.hidden_state_indices]
        self._last_slot = self._ids.index(aux.num_layers)
        self._norm = None if last_prenorm else self._load_norm_weight()
        self._storage = Path(tempfile.mkdtemp(prefix="eaglewatch-vllm-hs-"))
        # vLLM's engine core is a separate process that imports the connector by module path
        root = _repo_root()
        path = os.environ.get("PYTHONPATH", "")
        if root not in path.split(os.pathsep):
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, path) if p)
        self.llm = LLM(
            model=str(model_path),
            dtype=VLLM_DTYPES[dtype],
            max_model_len=max_len,
            enable_prefix_caching=False,  # a cached prefix is never run, so its states would not be saved
            enforce_eager=device == "cpu",  # no compile step on the CPU (minutes there, nothing gained)
            speculative_config={
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": self._ids}},
            },
            kv_transfer_config={
                "kv_connector": CONNECTOR_CLASS,
                "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(self._storage)},
            },
        )

    def _load_norm_weight(self) -> Any:
        from safetensors import safe_open

        for path in sorted(self.model_path.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                names = set(f.keys())
                for name in ("model.norm.weight", "model.language_model.norm.weight"):
                    if name in names:
                        return f.get_tensor(name).to(self._torch.float32)
        raise InputError(
            f"{self.model_path}: no model.norm.weight in its safetensors; the vLLM backend applies the final "
            "RMSNorm itself for layouts that store the last state after it (use the speculators layout, which "
            "stores it before the norm, or the built-in extractor)"
        )

    def capture(self, rows: Sequence[Sequence[int]]) -> CapturedBatch:
        """Run each row as a prompt of its exact ids; gather the saved states in row order."""
        from vllm import SamplingParams, TokensPrompt
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            cleanup_hidden_states,
            load_hidden_states,
        )

        torch = self._torch
        prompts = [TokensPrompt(prompt_token_ids=list(row)) for row in rows]
        outs = self.llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
        ids, last, aux = [], [], []
        for row, out in zip(rows, outs, strict=True):
            params = out.kv_transfer_params or {}
            path = params.get("hidden_states_path")
            if not path:
                raise RuntimeError(f"vLLM returned no hidden_states_path for a sample of {len(row)} tokens")
            # the path comes back before the worker writes the file: its lock file (held by the writer) says when
            saved = load_hidden_states(path)
            cleanup_hidden_states(path)
            states, seen = saved["hidden_states"], saved["token_ids"].to(torch.long)
            if states.shape[1] != len(self._ids) or states.shape[0] != len(row):
                raise RuntimeError(
                    f"vLLM saved hidden states of shape {tuple(states.shape)} for a sample of {len(row)} tokens "
                    f"and layer ids {self._ids}"
                )
            states = states.to(torch.float32)
            top = states[:, self._last_slot]
            if self._norm is not None:
                variance = top.pow(2).mean(-1, keepdim=True)
                top = top * torch.rsqrt(variance + self._eps) * self._norm
            ids.append(seen)
            last.append(top)
            aux.append(states[:, self._slots].reshape(len(row), -1))
        target = getattr(torch, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[self.dtype])
        last_t = torch.cat(last).to(target)
        aux_t = torch.cat(aux).to(target)
        finite = torch.isfinite(last_t).all() & torch.isfinite(aux_t).all()
        return CapturedBatch(ids=torch.cat(ids), last=last_t, aux=aux_t, finite=finite, ready=None)

    def close(self) -> None:
        """Stop the engine and remove the connector's scratch folder."""
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception as exc:  # noqa: BLE001  (closing must not hide the run's own outcome)
            print(f"warning: vLLM did not shut down cleanly: {exc}", file=sys.stderr)
        shutil.rmtree(self._storage, ignore_errors=True)


def load_vllm_target(
    model_path: Path, aux: AuxLayers, dtype: str, *, last_prenorm: bool, max_len: int, device: str
) -> VllmTarget:
    """Start vLLM on the model (local folder only); refuse what this backend cannot do."""
    if dtype not in VLLM_DTYPES:
        raise InputError(f"--dtype {dtype!r}: the vLLM backend takes bf16, fp16 or fp32")
    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device {device!r}: use auto, cpu or cuda")
    # stdout carries only the progress lines: vLLM logs to stdout unless told otherwise (read when it is imported)
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    try:
        import vllm  # noqa: F401
    except ModuleNotFoundError:
        raise InputError(
            f"--backend vllm needs vLLM in the Python that runs the job ({sys.executable}); launch the job with "
            "vLLM's Python (EAGLEWATCH_VLLM_PYTHON or [extraction] python)"
        ) from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return VllmTarget(model_path, aux, dtype, last_prenorm=last_prenorm, max_len=max_len, device=device)
