"""eaglewatch against a real vLLM (the CPU build, `--dtype float32`, the qwen3 reasoning parser, the hermes tool parser
with auto tool choice) serving a tiny Qwen3 trained to the Qwen3 output layout, every id held against vLLM's own
`token_ids` / `prompt_token_ids` and transformers' greedy `generate` (fp32) on the same rendered prompt.

What real vLLM 0.32 was seen to do here (docs/providers.md holds the table):
- `return_token_ids`: `choices[].token_ids` (the end token included) and `prompt_token_ids`, streamed as per-chunk
  deltas with the prompt ids on the first chunk; the streamed tool calls' ids are complete (vLLM #27482 was fixed
  by #29074: eaglewatch still checks every answer's ids against its text, `Reconstructor.ids_carry_text`);
- its qwen3 parser starts inside reasoning: an answer with no think block comes back whole as `reasoning`; only the
  tags are removed (the template's `\\n` / `\\n\\n` stay), a repeated `</think>` or `<think>` is dropped;
- the hermes parser keeps the `\\n` before `<tool_call>` in content and re-serialises non-streamed arguments with
  `json.dumps(..., ensure_ascii=False)` (`\\u00fc` -> `ü`); streamed arguments are the model's text; a stream
  sends the `\\n\\n` before a tool call as content (null when not streaming); a tool-call region that is not JSON
  stays content non-streamed, and a stream loses the text after it (the ids keep it);
- `usage.completion_tokens` is the number of ids returned.
"""

from __future__ import annotations

import difflib
import json
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from app.store.ids import unpack_ids
from tests.realserver.test_transformers_serve import EXTRA, _cli, _exported, _shards
from tests.realserver.tiny_qwen3 import CASES, VLLM_CASES

pytestmark = pytest.mark.timeout(900)

MAX_TOKENS = 96
# the outputs the model was trained on, all finished within MAX_TOKENS; BROKEN: a tool-call region that is not JSON
TRAINED = [case for case in CASES + VLLM_CASES if "not json" not in case[2]]
BROKEN = [case for case in CASES if "not json" in case[2]]


def _sid(k: int, repeat: int = 0) -> str:
    return f"case-{k}" if not repeat else f"case-{k}-again{repeat}"


def _write(
    tmp_path: Path,
    name: str,
    cases,
    endpoints: str,
    *,
    stream: bool,
    model: str,
    model_dir: Path,
    repeat: int = 1,
    extra: str = "",
    limits: str = "",
) -> Path:
    """A run config over `cases` (each `repeat` times, the repeats after all the first answers: a probe learns
    before the next pass is measured), with these [[endpoints]] tables and no reference (production)."""
    data = tmp_path / f"{name}-prompts.jsonl"
    with open(data, "w", encoding="utf-8") as out:
        for r in range(repeat):
            for k, (messages, tools, _) in enumerate(cases):
                row = {"id": _sid(k, r), "messages": messages}
                if tools:
                    row["tools"] = tools
                out.write(json.dumps(row) + "\n")
    config = tmp_path / f"{name}.toml"
    config.write_text(f"""
[run]
name = "{name}"
database = "{tmp_path / f"{name}.db"}"
output_dir = "{tmp_path / f"{name}-out"}"

[[data.datasets]]
path = "{data}"
format = "openai-messages"

[model]
name = "{model}"
tokenizer = "{model_dir}"
profile = "qwen3"

{endpoints}

[generation]
max_tokens = {MAX_TOKENS}
temperature = 0.0
stream = {"true" if stream else "false"}
attempts = 2
{extra}

[limits]
{
        limits
        or '''concurrency_initial = 1
concurrency_min = 1
concurrency_max = 1'''
    }

[pricing."{model}"]
prompt_per_m = 0.0
completion_per_m = 0.0
""")
    return config


def _endpoint(name: str, base_url: str, *lines: str) -> str:
    return "\n".join([f'[[endpoints]]\nname = "{name}"\nbase_url = "{base_url}"\ntimeout_s = 120.0', *lines]) + "\n"


def _events(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [m for (m,) in conn.execute("SELECT message FROM events")]


def _stored(db: Path) -> dict[str, dict]:
    """sample id -> its done response (token ids, prompt ids, finish) and reconstruction (ids source, flags)."""
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(
            "SELECT s.sample_id, s.state, p.token_ids, p.prompt_ids, p.finish_reason, p.endpoint, "
            "r.ids_source, r.flags, r.prompt_check FROM samples s "
            "JOIN reconstructions r ON r.sample_pk = s.pk JOIN responses p ON p.id = r.response_id"
        ).fetchall()
    return {
        r["sample_id"]: {
            "state": r["state"],
            "token_ids": unpack_ids(r["token_ids"]),
            "prompt_ids": unpack_ids(r["prompt_ids"]),
            "finish": r["finish_reason"],
            "endpoint": r["endpoint"],
            "ids_source": r["ids_source"],
            "flags": json.loads(r["flags"] or "[]"),
            "prompt_check": r["prompt_check"],
        }
        for r in rows
    }


@pytest.fixture(scope="module")
def vllm_answer(vllm_server):
    """(messages, tools, stream) -> vLLM's own answer with return_token_ids: {token_ids, prompt_token_ids, reasoning,
    content, tool_calls, finish_reason, usage}, asked once per key."""
    base_url, model = vllm_server
    cache: dict = {}

    def ask(messages, tools, stream: bool) -> dict:
        key = (json.dumps(messages), json.dumps(tools), stream)
        if key in cache:
            return cache[key]
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "return_token_ids": True,
        }
        if tools:
            body["tools"] = tools
        if not stream:
            answer = httpx.post(base_url + "/chat/completions", json=body, timeout=120).json()
            choice = answer["choices"][0]
            out = {
                "token_ids": choice["token_ids"],
                "prompt_token_ids": answer["prompt_token_ids"],
                "reasoning": choice["message"].get("reasoning"),
                "content": choice["message"].get("content"),
                "tool_calls": choice["message"].get("tool_calls") or [],
                "finish_reason": choice["finish_reason"],
                "usage": answer["usage"],
            }
        else:
            chunks = _stream(base_url, dict(body, stream=True, stream_options={"include_usage": True}))
            deltas = [c["choices"][0] for c in chunks if c.get("choices")]
            calls: dict[int, dict] = {}
            for d in deltas:
                for call in (d.get("delta") or {}).get("tool_calls") or []:
                    slot = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                    fn = call.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
            out = {
                "token_ids": [i for d in deltas for i in d.get("token_ids") or []],
                "prompt_token_ids": chunks[0]["prompt_token_ids"],
                "reasoning": "".join((d.get("delta") or {}).get("reasoning") or "" for d in deltas) or None,
                "content": "".join((d.get("delta") or {}).get("content") or "" for d in deltas) or None,
                "tool_calls": [{"function": calls[i]} for i in sorted(calls)],
                "finish_reason": next(d["finish_reason"] for d in deltas if d.get("finish_reason")),
                "usage": next(c["usage"] for c in chunks if c.get("usage")),
            }
        cache[key] = out
        return out

    return ask


def _stream(base_url: str, body: dict) -> list[dict]:
    """The chunks of one streamed chat completion (the `[DONE]` checked and left out)."""
    chunks, done = [], False
    with httpx.stream("POST", base_url + "/chat/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunks.append(json.loads(line[6:]))
    assert done, "vLLM ended a stream without [DONE]"
    return chunks


@pytest.fixture(scope="module")
def template_ids(vllm_model_dir):
    """messages, tools -> the prompt ids transformers' apply_chat_template gives."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(vllm_model_dir)

    def ids(messages, tools) -> list[int]:
        return list(
            hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )

    return ids


# ---- the ids path ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_default_config_asks_vllm_for_ids_and_exports_them(
    vllm_server, vllm_model_dir, vllm_truth, vllm_answer, template_ids, tmp_path, stream
):
    """Production as a new user runs it: no `server =`, no reference. eaglewatch identifies vLLM from GET /models,
    asks for `return_token_ids`, stores every answer's ids as verified, and the default export writes every
    finished answer: output ids equal to vLLM's own `token_ids` and to transformers' greedy `generate`, prompt
    ids equal to vLLM's `prompt_token_ids` (the normaliser-changing prompts included) and to apply_chat_template."""
    base_url, model = vllm_server
    cases = TRAINED + BROKEN + EXTRA
    config = _write(
        tmp_path, "ids", cases, _endpoint("vllm", base_url), stream=stream, model=model, model_dir=vllm_model_dir
    )
    started = time.monotonic()
    _cli("run", "--headless", str(config))
    took = time.monotonic() - started
    db = tmp_path / "ids.db"
    assert any("vllm: identified as vllm (GET /models)" in e for e in _events(db)), _events(db)
    stored = _stored(db)
    assert set(stored) == {_sid(k) for k in range(len(cases))}
    case_of = {_sid(k): (m, t) for k, (m, t, _) in enumerate(cases)}
    for sid, row in stored.items():
        messages, tools = case_of[sid]
        own = vllm_answer(messages, tools, stream)
        assert row["ids_source"] == "server", (sid, row)  # asked for and stored as verified
        assert list(row["token_ids"]) == own["token_ids"] == vllm_truth(messages, tools, MAX_TOKENS), sid
        assert list(row["prompt_ids"]) == own["prompt_token_ids"] == template_ids(messages, tools), sid
        assert row["prompt_check"] == "agree", sid
        assert own["usage"]["completion_tokens"] == len(own["token_ids"]), sid  # the count relation: 0
    finished = {sid for sid, row in stored.items() if row["finish"] != "length"}
    rows, manifest = _shards(tmp_path, db)
    assert set(rows) == finished, sorted(set(finished) ^ set(rows))
    for sid, (prompt, output) in rows.items():
        messages, tools = case_of[sid]
        assert output == vllm_truth(messages, tools, MAX_TOKENS), sid
        assert prompt == template_ids(messages, tools), sid
    states = {e["endpoint"]: e["state"] for e in manifest["verification"]["endpoints"]}
    assert states["vllm"].startswith("verified"), states
    measured = {sid: next((f for f in row["flags"] if f.startswith("text_path:")), None) for sid, row in stored.items()}
    assert all(measured.values()), measured  # every answer with ids is a probe: its text path measured
    trained = {_sid(k) for k in range(len(TRAINED))}
    print(
        f"\nvLLM ids path ({'stream' if stream else 'plain'}, default config): {len(stored)} answers in {took:.1f} s, "
        f"{len(rows)} exported, all with generate()'s ids; text path measured: "
        f"{sorted((sid, m) for sid, m in measured.items() if m != 'text_path:exact')} not exact "
        f"({sum(measured[s] == 'text_path:exact' for s in trained)} of {len(trained)} trained exact)"
    )


# ---- the text path ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_the_text_path_learns_vllms_steps_from_logprob_probes(
    vllm_server, vllm_model_dir, vllm_truth, tmp_path, stream
):
    """vLLM configured as a plain OpenAI-compatible server (ids not asked for): every request is a probe that asks
    for logprobs, whose tokens are the ground truth the text path is measured against and learns from. After one
    pass over the trained outputs (reasoning, think-less answers, tool calls with re-serialised arguments), the
    profile learned from vLLM's own text reconstructs every answer of the second pass exactly, and every exported row
    has generate()'s ids."""
    base_url, model = vllm_server
    config = _write(
        tmp_path,
        "text",
        TRAINED,
        _endpoint("vllm", base_url, 'server = "openai"'),
        stream=stream,
        model=model,
        model_dir=vllm_model_dir,
        repeat=2,
    )
    _cli("run", "--headless", str(config))
    db = tmp_path / "text.db"
    stored = _stored(db)
    assert len(stored) == 2 * len(TRAINED)
    assert all(row["ids_source"] == "logprobs" and not row["token_ids"] for row in stored.values()), stored
    measured = {
        sid: next((f[10:] for f in row["flags"] if f.startswith("text_path:")), None) for sid, row in stored.items()
    }
    second = {sid: m for sid, m in measured.items() if "-again" in sid}
    fidelity = _cli("fidelity", "--db", str(db)).stdout
    print(
        f"\nvLLM text path ({'stream' if stream else 'plain'}, logprob probes): first pass "
        f"{sorted(m for s, m in measured.items() if '-again' not in s)}; second pass {sorted(second.values())}\n"
        f"{fidelity}"
    )
    assert set(second.values()) == {"exact"}, second
    case_of = {_sid(k, r): (m, t) for r in (0, 1) for k, (m, t, _) in enumerate(TRAINED)}
    rows = _exported(tmp_path, db, "--keep-mismatches", "--keep-roundtrip-failed", "--keep-suspect")
    assert set(rows) == set(stored)
    for sid, row in rows.items():
        assert row["output_ids"] == vllm_truth(*case_of[sid], MAX_TOKENS), sid


# ---- the trusted twin ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_only_server(vllm_model_dir, tmp_path_factory):
    """`transformers serve` over the same model vLLM serves: an endpoint that returns text only (no ids, no
    logprobs), answering to the same model name."""
    from tests.realserver.conftest import transformers_serve

    yield from transformers_serve(vllm_model_dir, tmp_path_factory.mktemp("text-only") / "serve.log")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_vllm_as_trusted_twin_verifies_a_text_only_endpoint(
    vllm_server, text_only_server, vllm_model_dir, vllm_truth, tmp_path, stream
):
    """A text-only endpoint of the same model (`transformers serve`: neither ids nor logprobs) beside a vLLM marked
    `trusted`: every probe to it is sent greedily and also asked of vLLM, whose ids measure and teach the text
    endpoint's steps. The figures say so: the text endpoint is *verified* with its measured answers (it would be
    'prior only' alone), and its exported rows carry generate()'s ids."""
    vllm_url, model = vllm_server
    serve_url, serve_model = text_only_server
    assert serve_model == model  # one model name for both endpoints
    endpoints = _endpoint("vllm", vllm_url, 'server = "vllm"', "trusted = true", "weight = 0.001") + _endpoint(
        "serve", serve_url, 'server = "transformers-serve"'
    )
    # room for every sample at once on the text endpoint, so the weights alone decide: (almost) all go there
    config = _write(
        tmp_path,
        "twin",
        TRAINED,
        endpoints,
        stream=stream,
        model=model,
        model_dir=vllm_model_dir,
        limits=f"concurrency_initial = {len(TRAINED)}\nconcurrency_min = 1\nconcurrency_max = {len(TRAINED)}",
    )
    _cli("run", "--headless", str(config))
    db = tmp_path / "twin.db"
    stored = _stored(db)
    on_serve = {sid for sid, row in stored.items() if row["endpoint"] == "serve"}
    assert len(on_serve) >= len(TRAINED) - 1, {sid: row["endpoint"] for sid, row in stored.items()}
    measured = {
        sid: next((f[10:] for f in stored[sid]["flags"] if f.startswith("text_path:")), None) for sid in on_serve
    }
    assert all(measured.values()), measured  # every probe to the text endpoint was measured against the twin
    fidelity = _cli("fidelity", "--db", str(db)).stdout
    rows, manifest = _shards(tmp_path, db)
    states = {e["endpoint"]: e["state"] for e in manifest["verification"]["endpoints"]}
    print(
        f"\ntrusted twin ({'stream' if stream else 'plain'}): serve measured {sorted(measured.values())}; "
        f"states {states}\n{fidelity}"
    )
    assert states["serve"].startswith("verified"), states
    assert f"serve: verified ({len(on_serve)} probes" in fidelity, fidelity
    case_of = {_sid(k): (m, t) for k, (m, t, _) in enumerate(TRAINED)}
    assert rows, manifest["warnings"]
    for sid, (_, output) in rows.items():
        assert output == vllm_truth(*case_of[sid], MAX_TOKENS), sid


# ---- whole conversations ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_conversations_on_vllm_export_the_prompt_ids_vllm_saw(
    vllm_server, vllm_model_dir, template_ids, tmp_path, stream
):
    """Whole conversations regenerated on vLLM (default config): every turn's request carries the model's own
    earlier answers (tool calls included), and the export's per-turn rows hold, id for id, the prompt ids vLLM
    returned for that turn's request and the output ids it returned for the answer."""
    from tests.realserver.test_conversations_serve import CONVERSATIONS, DATASET

    base_url, model = vllm_server
    data = tmp_path / "conversations.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS), encoding="utf-8")
    config = _write(
        tmp_path,
        "conv",
        [],
        _endpoint("vllm", base_url),
        stream=stream,
        model=model,
        model_dir=vllm_model_dir,
        limits="concurrency_initial = 2\nconcurrency_min = 1\nconcurrency_max = 2",
    )
    config.write_text(
        config.read_text().replace(
            f'path = "{tmp_path / "conv-prompts.jsonl"}"\nformat = "openai-messages"',
            f'path = "{data}"\nformat = "openai-messages"\nregenerate = "all"\non_tool_divergence = "replay"',
        )
    )
    _cli("run", "--headless", str(config))
    db = tmp_path / "conv.db"
    stored = _stored(db)
    with sqlite3.connect(db) as conn:
        turns = {
            sid: (json.loads(m), json.loads(t) if t else None, turn)
            for sid, m, t, turn in conn.execute(
                "SELECT sample_id, messages, tools, turn FROM samples WHERE state = 'done'"
            )
        }
    assert len(turns) >= 6 and any(turn > 1 for _, _, turn in turns.values()), turns
    for sid, (messages, tools, _turn) in turns.items():
        assert DATASET not in json.dumps(messages), sid  # the model's own history, never the dataset's answers
        assert stored[sid]["ids_source"] == "server" and stored[sid]["prompt_check"] == "agree", sid
        assert list(stored[sid]["prompt_ids"]) == template_ids(messages, tools), sid
    out = tmp_path / "export"
    _cli("export", "--db", str(db), "--format", "eagle3-shards", "--out", str(out), "--keep-truncated", timeout=120)
    rows = {}
    for path in sorted((out / "data").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            obj = json.loads(line)
            rows[obj["id"]] = obj
    assert set(rows) == set(turns)
    for sid, row in rows.items():
        start = row["loss_mask"].index(1)
        assert row["input_ids"][:start] == list(stored[sid]["prompt_ids"]), sid  # what vLLM saw, id for id
        assert row["input_ids"][start:] == list(stored[sid]["token_ids"]), sid  # what it generated
    print(
        f"\nvLLM conversations ({'stream' if stream else 'plain'}): {len(turns)} turns done, every exported "
        f"prompt equal to vLLM's prompt_token_ids"
    )


# ---- the limiter against vLLM's queue -----------------------------------------------------------------------------


def _limiter_run(
    tmp_path: Path, name: str, base_url: str, model: str, model_dir: Path, limits: str, n: int, max_tokens: int
) -> dict:
    """One streamed run of `n` copies of a prompt: the engine's last word on the endpoint (limit, reason, TTFT
    percentiles), answers per second over the run, and its concurrency events."""
    cases = [([{"role": "user", "content": "Write a long story."}], None, "")] * n
    config = _write(
        tmp_path,
        name,
        cases,
        _endpoint("vllm", base_url, 'server = "vllm"', "max_concurrency = 64"),
        stream=True,
        model=model,
        model_dir=model_dir,
        limits=limits,
    )
    config.write_text(config.read_text().replace(f"max_tokens = {MAX_TOKENS}", f"max_tokens = {max_tokens}"))
    _cli("run", "--headless", str(config))
    db = tmp_path / f"{name}.db"
    with sqlite3.connect(db) as conn:
        snapshot = json.loads(conn.execute("SELECT snapshot FROM engine_heartbeats").fetchone()[0])
        first, last, answers, failed = conn.execute(
            "SELECT MIN(created_at - latency_ms / 1000.0), MAX(created_at), COUNT(*), "
            "SUM(error_class IS NOT NULL) FROM responses"
        ).fetchone()
    endpoint = snapshot["endpoints"][0]
    return {
        "limit": endpoint["concurrency_limit"],
        "reason": endpoint["limit_reason"],
        "failed": failed,
        "answers": answers,
        "req_s": answers / (last - first),
        "ttft_p50_ms": endpoint["ttft_p50_ms"],
        "events": [e for e in _events(db) if "concurrency" in e],
    }


def test_the_limiter_meets_vllms_queue_without_failures_and_keeps_its_batch_full(vllm_server, vllm_model_dir, tmp_path):
    """vLLM never refuses a request: past `--max-num-seqs` they wait in its queue and the time to the first token
    grows. Started in slow start (2) under a maximum of 32, the adaptive limit answers every request without a
    failure or a refusal's cooldown and never holds fewer than vLLM's batch (its slots stay full); when it reads
    the queue in the latency it comes down ('latency rising'). Its answers per second and TTFT against a naive
    client holding 32 in flight, measured beside it, are printed."""
    from tests.realserver.conftest import VLLM_MAX_NUM_SEQS

    base_url, model = vllm_server
    n, max_tokens = 120, 24
    adaptive = _limiter_run(
        tmp_path,
        "adaptive",
        base_url,
        model,
        vllm_model_dir,
        "concurrency_initial = 2\nconcurrency_min = 1\nconcurrency_max = 32",
        n,
        max_tokens,
    )
    naive = _limiter_run(
        tmp_path,
        "naive",
        base_url,
        model,
        vllm_model_dir,
        "concurrency_initial = 32\nconcurrency_min = 32\nconcurrency_max = 32",
        n,
        max_tokens,
    )
    print(
        f"\nlimiter against vLLM (--max-num-seqs {VLLM_MAX_NUM_SEQS}, {n} answers of {max_tokens} tokens): "
        f"adaptive limit {adaptive['limit']} ({adaptive['reason']}), {adaptive['req_s']:.1f} answers/s, TTFT p50 "
        f"{adaptive['ttft_p50_ms']:.0f} ms; naive 32: {naive['req_s']:.1f} answers/s, TTFT p50 "
        f"{naive['ttft_p50_ms']:.0f} ms; ratio {adaptive['req_s'] / naive['req_s']:.2f}x answers/s, "
        f"{adaptive['ttft_p50_ms'] / naive['ttft_p50_ms']:.2f}x TTFT; events {adaptive['events']}"
    )
    assert adaptive["answers"] == naive["answers"] == n and not adaptive["failed"] and not naive["failed"]
    assert adaptive["reason"] in ("latency rising", "at ceiling", "growing"), adaptive  # never a 429 cooldown
    assert adaptive["limit"] >= VLLM_MAX_NUM_SEQS, adaptive
    # Whether the limit is cut for latency within 120 answers, and the answers per second against the naive
    # client, are printed, not asserted: on two busy cores they swing from run to run (no cut, or cuts to 8-29;
    # 0.5-1.7x the naive client's answers/s). bench/capacity.py measures the limiter against a queueing server.


# ---- the simulator held to the real server ------------------------------------------------------------------------


def _fields(value, path: str = "") -> dict[str, str]:
    """Every field of a JSON value as path -> type name (list items merged under `[]`): what two servers' bodies
    must share, whatever text they generated."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_fields(item, f"{path}.{key}" if path else key))
        return out or {path: "{}"}
    if isinstance(value, list):
        out = {}
        for item in value:
            out.update(_fields(item, f"{path}[]"))
        return out or {path: "[]"}
    return {path: type(value).__name__}


def _outline(chunks: list) -> list[str]:
    """A stream as the runs of its kinds of chunk (each chunk's fields and their types; `[DONE]` as itself), in
    order. A chunk with an empty delta and no finish_reason (a token whose text a parser held back, e.g. the
    think tag) is left out: whether vLLM sends it alone or merged into the next chunk depends on how many tokens
    its engine finished between two writes of the API server, which changes with the machine's load (the ids and
    texts, compared beside this, still hold every such token)."""
    kinds: list[str] = []
    for chunk in chunks:
        if isinstance(chunk, dict) and all(
            not ch.get("delta") and ch.get("finish_reason") is None for ch in chunk.get("choices") or [{"delta": 1}]
        ):
            continue
        kind = "[DONE]" if chunk == "[DONE]" else " ".join(f"{k}:{t}" for k, t in sorted(_fields(chunk).items()))
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


def _diff(real: dict[str, str], sim: dict[str, str]) -> list[str]:
    return [
        f"{k}: vLLM {real.get(k, 'absent')}, simulator {sim.get(k, 'absent')}"
        for k in sorted(set(real) | set(sim))
        if real.get(k) != sim.get(k)
    ]


def _texts(message: dict) -> tuple:
    """A message's reasoning, content and tool calls (name, arguments): the text the server's parsers made."""
    return (
        message.get("reasoning"),
        message.get("content"),
        [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []],
    )


def _streamed(chunks: list) -> dict:
    """A stream's deltas put together as a message (reasoning, content, tool calls by index)."""
    message: dict = {"reasoning": None, "content": None, "tool_calls": []}
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []) if isinstance(chunk, dict) else []:
            delta = choice.get("delta") or {}
            for key in ("reasoning", "content"):
                if delta.get(key):
                    message[key] = (message[key] or "") + delta[key]
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"function": {"name": "", "arguments": ""}})
                for key in ("name", "arguments"):
                    slot["function"][key] += (call.get("function") or {}).get(key) or ""
    message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def _raw(base_url: str, body: dict):
    if not body.get("stream"):
        return httpx.post(base_url + "/chat/completions", json=body, timeout=120).json()
    chunks = []
    with httpx.stream("POST", base_url + "/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return chunks


async def test_the_simulators_vllm_personality_answers_field_for_field_as_vllm(vllm_server, vllm_model_dir, tmp_path):
    """The same requests (chat, streaming and not, with and without return_token_ids, logprobs with top
    alternatives, tools, a cut by max_tokens) to real vLLM and to the simulator's `vllm` personality replaying
    vLLM's own ids: every body has the same fields of the same types, every stream the same kinds of chunk in the
    same order (where the prompt ids, each chunk's ids, the finish and the usage sit), the same ids, finish
    reasons and token counts, and the same reasoning, content and tool-call texts (its parsers' steps: the
    template's whitespace kept, a think-less answer as reasoning, the newline before a tool call, non-streamed
    arguments re-serialised). What is left is listed in docs/providers.md."""
    import asyncio

    from app.simulator import SimulatorOptions, SimulatorServer
    from app.tokens.tokenizer import load_tokenizer

    base_url, model = vllm_server
    cases = [(m, t, MAX_TOKENS) for m, t, _ in (CASES[0], CASES[2], CASES[3], *VLLM_CASES)] + [(CASES[0][0], None, 5)]
    reference = tmp_path / "reference.jsonl"
    answers = []
    with open(reference, "w", encoding="utf-8") as out:
        for messages, tools, budget in cases:
            body = {
                "model": model,
                "messages": messages,
                "max_tokens": budget,
                "temperature": 0,
                "return_token_ids": True,
                **({"tools": tools} if tools else {}),
            }
            answer = await asyncio.to_thread(_raw, base_url, body)
            answers.append(answer)
            out.write(
                json.dumps(
                    {
                        "id": f"case-{len(answers)}",
                        "messages": messages,
                        "output_ids": answer["choices"][0]["token_ids"],
                        "meta_info": {"prompt_tokens": answer["usage"]["prompt_tokens"]},
                    }
                )
                + "\n"
            )
    differences, compared = [], 0
    sim = SimulatorServer(
        SimulatorOptions(personality="vllm"),
        tokenizer=load_tokenizer(vllm_model_dir),
        reference=reference,
        profile="qwen3",
        model=model,
        stream_chunk_tokens=1,
    )
    async with sim:
        for k, (messages, tools, budget) in enumerate(cases):
            for stream in (False, True):
                for asks in (
                    {},
                    {"return_token_ids": True},
                    {"return_token_ids": True, "logprobs": True, "top_logprobs": 2},
                ):
                    body = {
                        "model": model,
                        "messages": messages,
                        "max_tokens": budget,
                        "temperature": 0,
                        **asks,
                        **({"tools": tools} if tools else {}),
                        "metadata": {"sample_id": f"case-{k + 1}"},
                    }
                    if stream:
                        body.update(stream=True, stream_options={"include_usage": True})
                    real = await asyncio.to_thread(_raw, base_url, {k: v for k, v in body.items() if k != "metadata"})
                    mine = await asyncio.to_thread(_raw, sim.base_url, body)
                    where = f"{messages[-1]['content']!r} max_tokens={budget} stream={stream} {sorted(asks)}"
                    compared += 1
                    if not stream:
                        differences += [f"{where}: {d}" for d in _diff(_fields(real), _fields(mine))]
                        got = [
                            (b["choices"][0]["finish_reason"], b["choices"][0]["token_ids"], b["usage"])
                            for b in (real, mine)
                        ]
                        if got[0][:2] != got[1][:2] or got[0][2]["completion_tokens"] != got[1][2]["completion_tokens"]:
                            differences.append(f"{where}: finish/ids/count {got[0][:2]} vs {got[1][:2]}")
                        texts = [_texts(b["choices"][0]["message"]) for b in (real, mine)]
                        if texts[0] != texts[1]:
                            differences.append(f"{where}: texts differ: vLLM {texts[0]}, simulator {texts[1]}")
                        continue
                    a, b = _outline(real), _outline(mine)
                    if a != b:
                        differences.append(
                            f"{where}: the kinds of chunk differ (- vLLM, + simulator):\n"
                            + "\n".join(difflib.unified_diff(a, b, lineterm="", n=0))
                        )
                    ids = [
                        [
                            i
                            for c in chunks
                            if isinstance(c, dict)
                            for ch in c["choices"]
                            for i in ch.get("token_ids") or []
                        ]
                        for chunks in (real, mine)
                    ]
                    finish = [
                        [
                            ch["finish_reason"]
                            for c in chunks
                            if isinstance(c, dict)
                            for ch in c["choices"]
                            if ch.get("finish_reason")
                        ]
                        for chunks in (real, mine)
                    ]
                    if ids[0] != ids[1] or finish[0] != finish[1]:
                        differences.append(f"{where}: streamed ids/finish differ: {ids} {finish}")
                    texts = [_texts(_streamed(chunks)) for chunks in (real, mine)]
                    if texts[0] != texts[1]:
                        differences.append(f"{where}: streamed texts differ: vLLM {texts[0]}, simulator {texts[1]}")
    print(f"\nconformance: {compared} request pairs, {len(differences)} differences")
    assert not differences, "\n".join(differences)
