"""A real `transformers serve` on 127.0.0.1 over a tiny Qwen3-layout model built once per test session.

Needs transformers' `serving` extra (fastapi, uvicorn: `pip install -e ".[serving]"`, which scripts/test does).
Without it every test here is skipped with a reason saying so. Nothing is downloaded: the model and its
tokenizer are built from tests/realserver/tiny_qwen3.py, cached by that file's hash.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).resolve().parent
def _missing(names: tuple[str, ...]) -> list[str]:
    out = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                out.append(name)
        except (ImportError, ValueError):  # ValueError: a module blocked in sys.modules
            out.append(name)
    return out


MISSING = _missing(("fastapi", "uvicorn", "torch"))
SKIP_REASON = (f"REAL-SERVER TESTS NOT RUN: transformers' serving extra is missing ({', '.join(MISSING)}); "
               'install it with pip install -e ".[serving]" (scripts/test does)')


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.realserver)
    if not MISSING:
        return
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny model `transformers serve` loads (head_dim 16)."""
    from tests.realserver.tiny_qwen3 import built

    return built()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def real_server(tiny_model_dir, tmp_path_factory):
    """(base_url, model name) of a `transformers serve` pinned to the tiny model, offline, on loopback."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")
    exe = shutil.which("transformers", path=os.path.dirname(sys.executable)) or shutil.which("transformers")
    command = [exe, "serve", str(tiny_model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
               "--log-level", "warning"] if exe else None
    if command is None:
        pytest.skip("REAL-SERVER TESTS NOT RUN: the `transformers` command is not on PATH")
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"transformers serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not answer /health in 180 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base + "/v1", str(tiny_model_dir)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def truth(tiny_model_dir):
    """generate(messages, tools, max_new_tokens) -> output ids of model.generate, greedy, on the templated prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    cache: dict = {}

    def generate(messages, tools, max_new_tokens: int) -> list[int]:
        key = (repr(messages), repr(tools), max_new_tokens)
        if key not in cache:
            ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                                return_dict=True, return_tensors="pt")
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
            cache[key] = out[0, ids["input_ids"].shape[1]:].tolist()
        return cache[key]

    return generate


def pytest_terminal_summary(terminalreporter):
    """Say it at the end of every run, not only under -rs: skipped real-server tests prove nothing."""
    if MISSING:
        terminalreporter.write_line(f"!! {SKIP_REASON}", yellow=True, bold=True)
