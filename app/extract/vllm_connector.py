"""vLLM's hidden-states connector made to run on the CPU build; loaded by vLLM by module path, never by eaglewatch.

vLLM 0.32's `ExampleHiddenStatesConnector` copies the states through a CUDA stream into pinned memory, which kills
the CPU engine (`pin_memory=True requires a CUDA or other accelerator backend`). This subclass writes the same
safetensors file (`hidden_states [T, n_layers, H]`, `token_ids [T]`) synchronously, without streams or pinning.
It imports vLLM at module level: only vLLM's own Python loads it (`kv_connector_module_path`).
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Written:
    """Stands in for the stock connector's CUDA copy event: the write is already done when it is recorded."""

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """The stock connector with a synchronous host-side write (the CPU build has no streams or pinned memory)."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).to("cpu").clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file({"hidden_states": states, "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Written()  # get_finished reports it as sent
