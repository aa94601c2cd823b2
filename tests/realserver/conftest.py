"""Real servers on 127.0.0.1 over tiny Qwen3-layout models built once per test session: `transformers serve`
(head_dim 16) and vLLM (the CPU build, head_dim 32: its CPU attention refuses smaller heads).

`transformers serve` needs transformers' `serving` extra (fastapi, uvicorn: `pip install -e ".[serving]"`, which
scripts/test does). vLLM runs from a venv of its own (scripts/vllm_venv.sh, which scripts/test builds and names in
EAGLEWATCH_VLLM_PYTHON; else the newest complete one in the test cache is used); without one its tests skip, or
fail under EAGLEWATCH_REQUIRE_VLLM=1. Without them every test here is skipped with a reason saying so. Nothing is
downloaded: the models and their tokenizer are built from tests/realserver/tiny_qwen3.py, cached by its hash.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
SKIP_REASON = (
    f"REAL-SERVER TESTS NOT RUN: transformers' serving extra is missing ({', '.join(MISSING)}); "
    'install it with pip install -e ".[serving]" (scripts/test does)'
)


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
    yield from transformers_serve(tiny_model_dir, tmp_path_factory.mktemp("serve") / "serve.log")


def transformers_serve(model_dir: Path, log: Path):
    """Start `transformers serve` over `model_dir` on loopback; yield (base_url, model name: the folder); stop it."""
    port = _free_port()
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
        VLLM_LOG_STATS_INTERVAL="2",  # its periodic stats lines (SpecDecoding metrics) come often enough to read
    )
    exe = shutil.which("transformers", path=os.path.dirname(sys.executable)) or shutil.which("transformers")
    command = (
        [
            exe,
            "serve",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--log-level",
            "warning",
        ]
        if exe
        else None
    )
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
        yield base + "/v1", str(model_dir)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _truth_of(model_dir: Path):
    """generate(messages, tools, max_new_tokens) -> output ids of model.generate (fp32), greedy, on the templated
    prompt of the model in `model_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    cache: dict = {}

    def generate(messages, tools, max_new_tokens: int) -> list[int]:
        key = (repr(messages), repr(tools), max_new_tokens)
        if key not in cache:
            ids = tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
            )
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
            cache[key] = out[0, ids["input_ids"].shape[1] :].tolist()
        return cache[key]

    return generate


@pytest.fixture(scope="session")
def truth(tiny_model_dir):
    """generate(messages, tools, max_new_tokens) -> output ids of model.generate, greedy, on the templated prompt."""
    return _truth_of(tiny_model_dir)


# ---- vLLM -------------------------------------------------------------------------------------------------------

VLLM_MAX_NUM_SEQS = 4  # vLLM's batch: requests past it wait in its queue (what the limiter test meets)
VLLM_MAX_MODEL_LEN = 1024  # the tiny model's max_position_embeddings
VLLM_START_S = 300  # measured 27-84 s on 2 busy cores; a start past this is a fault


def vllm_python() -> str | None:
    """The vLLM venv's python: EAGLEWATCH_VLLM_PYTHON, else the newest complete scripts/vllm_venv.sh build in the
    test cache (None when there is none)."""
    from tests.realserver.tiny_qwen3 import cache_root

    named = os.environ.get("EAGLEWATCH_VLLM_PYTHON")
    if named:
        return named
    built = sorted((p.parent for p in cache_root().glob("vllm-*/.eaglewatch-stamp")), key=lambda p: p.stat().st_mtime)
    return str(built[-1] / "bin" / "python") if built else None


@pytest.fixture(scope="session")
def vllm_model_dir() -> Path:
    """The tiny model vLLM serves (head_dim 32)."""
    from tests.realserver.tiny_qwen3 import built

    return built("vllm")


@pytest.fixture(scope="session")
def vllm_truth(vllm_model_dir):
    """generate(messages, tools, max_new_tokens) for the vLLM model: transformers' greedy fp32 ids."""
    return _truth_of(vllm_model_dir)


@pytest.fixture(scope="session")
def vllm_server(vllm_model_dir):
    """(base_url, served model name) of a real vLLM (OpenAI API server, CPU, fp32, eager) over the tiny model, with
    the qwen3 reasoning parser, hermes tool calls and auto tool choice, started once per test process (the vLLM
    tests share one xdist group, tests/conftest.py). Its scratch (ZMQ sockets, vllm_dist_* files, compile cache)
    lives in a temporary folder of its own, removed with the server's process group at the end."""
    running = os.environ.get("EAGLEWATCH_VLLM_URL")
    if running:  # a vLLM someone started as this fixture would (the same flags and model): for iterating on tests
        models = httpx.get(running.rstrip("/") + "/models", timeout=10).json()
        yield running.rstrip("/"), models["data"][0]["id"]
        return
    yield from start_vllm(
        vllm_model_dir, ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    )


VLLM_LOGS: dict[str, Path] = {}  # base_url -> the log of the vLLM `start_vllm` started there


def start_vllm(vllm_model_dir: Path, more: list[str]):
    """Start a real vLLM (CPU, fp32, eager) over `vllm_model_dir` with the arguments `more` on loopback; yield
    (base_url, served model name); stop its process group and remove its scratch. Skips (fails under
    EAGLEWATCH_REQUIRE_VLLM) without a vLLM environment."""
    python = vllm_python()
    if python is None or not os.path.exists(python):
        message = (
            "VLLM TESTS NOT RUN: no vLLM environment (build it with scripts/vllm_venv.sh and set "
            "EAGLEWATCH_VLLM_PYTHON to its bin/python; scripts/test does both)"
        )
        if os.environ.get("EAGLEWATCH_REQUIRE_VLLM"):
            pytest.fail(message.replace("NOT RUN", "REQUIRED but missing"))
        pytest.skip(message)
    scratch = Path(tempfile.mkdtemp(prefix="ew-vllm-", dir="/tmp"))  # short: ZMQ ipc paths are capped at 107 bytes
    port = _free_port()
    log = scratch / "vllm.log"
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
        VLLM_LOG_STATS_INTERVAL="2",  # its periodic stats lines (SpecDecoding metrics) come often enough to read
    )
    env.pop("PYTHONPATH", None)  # the project's own packages must not shadow the venv's
    command = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(vllm_model_dir),
        "--served-model-name",
        str(vllm_model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(VLLM_MAX_MODEL_LEN),
        "--max-num-seqs",
        str(VLLM_MAX_NUM_SEQS),
        *more,
    ]
    started = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=scratch, start_new_session=True
        )  # its own process group: the engine core and workers
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM exited with {process.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
            try:
                if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > VLLM_START_S:
                pytest.fail(
                    f"vLLM did not answer /v1/models in {VLLM_START_S} s:\n{log.read_text(errors='replace')[-4000:]}"
                )
            time.sleep(0.5)
        print(f"\nvLLM started in {time.monotonic() - started:.1f} s")
        VLLM_LOGS[base + "/v1"] = log
        # served as its folder, the name `transformers serve` answers to for the same model (the trusted-twin test)
        yield base + "/v1", str(vllm_model_dir)
    finally:
        _stop_group(process)
        shutil.rmtree(scratch, ignore_errors=True)  # its ZMQ sockets and vllm_dist_* files (TMPDIR) with it


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL what is left after 20 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def pytest_terminal_summary(terminalreporter):
    """Say it at the end of every run, not only under -rs: skipped real-server tests prove nothing."""
    if MISSING:
        terminalreporter.write_line(f"!! {SKIP_REASON}", yellow=True, bold=True)
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "VLLM TESTS NOT RUN" in str(r.longrepr)]
    if skipped:
        terminalreporter.write_line(
            f"!! {len(skipped)} vLLM tests skipped: no vLLM environment (scripts/vllm_venv.sh; scripts/test builds it)",
            yellow=True,
            bold=True,
        )
