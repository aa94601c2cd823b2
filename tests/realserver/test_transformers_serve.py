"""eaglewatch against a real `transformers serve` (tiny Qwen3-layout model), checked against model.generate.

What the real server was shown to do (transformers 5.x; docs/providers.md holds the table):
- non-streaming: content and reasoning stripped of leading/trailing whitespace, empty thinking -> no
  reasoning field, tool arguments re-serialised with json.dumps (ASCII escapes), ids `{id}_tool_call_{i}`;
- streaming: the raw regions (reasoning "\\n...\\n", content "\\n\\n..."), a tool call in one delta, usage on
  a last chunk of its own (5.25; the finish chunk before), no [DONE];
- 422 to request fields outside its schema; 400 to a tool-call region that is not JSON (5.25; 500 before).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.providers import ChatClient, SampleFatalError
from app.simulator import SimulatorOptions, SimulatorServer
from app.tokens import Reconstructor, get_profile
from app.tokens.tokenizer import load_tokenizer
from tests.providers.support import Endpoint, Generation
from tests.realserver.tiny_qwen3 import CASES

# the first test of a session builds the tiny model (a few hundred CPU training steps) and starts the server
pytestmark = pytest.mark.timeout(900)

MAX_TOKENS = 96
CUT = 12  # max_tokens for the truncation cases: generation stops while thinking
GOOD = [case for case in CASES if "not json" not in case[2]]
BROKEN = [case for case in CASES if "not json" in case[2]]


def _client(base_url: str, stream: bool, max_tokens: int = MAX_TOKENS, **endpoint) -> ChatClient:
    return ChatClient(
        Endpoint(name="serve", timeout_s=120, server="transformers-serve", **endpoint),
        Generation(stream=stream, temperature=0.0, max_tokens=max_tokens),
        None,
        base_url=base_url,
    )


@pytest.fixture(scope="module")
def rec(tiny_model_dir):
    return Reconstructor(get_profile("qwen3"), load_tokenizer(tiny_model_dir))


async def _run_cases(base_url, model, stream, truth, cases, max_tokens):
    out = []
    async with _client(base_url, stream, max_tokens) as client:
        for messages, tools, _ in cases:
            completion = await client.complete(messages, tools, model=model)
            out.append((messages, tools, completion, truth(messages, tools, max_tokens)))
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_every_verdict_agrees_with_generate_truth(real_server, truth, rec, stream):
    base_url, model = real_server
    results = await _run_cases(base_url, model, stream, truth, GOOD, MAX_TOKENS)
    results += await _run_cases(base_url, model, stream, truth, GOOD[:2], CUT)
    report = []
    for messages, _tools, completion, ids in results:
        reconstruction, verdict = rec.process(completion, ids)
        right = tuple(reconstruction.output_ids) == tuple(ids)
        # never a wrong verdict: exact (truncated: exact without an end of turn) exactly when the reconstructed ids
        # are generate()'s ids; bpe_equivalent only for other ids of the same text
        assert (verdict.category in ("exact", "truncated")) == right, (messages, verdict)
        production, _ = rec.process(completion, None)  # no reference: what a real run reconstructs
        report.append(
            (
                messages[-1]["content"],
                completion.finish_reason,
                verdict.category,
                reconstruction.repair,
                tuple(production.output_ids) == tuple(ids),
            )
        )
        if ids[-1:] != [rec.tokenizer.special_id("<|im_end|>")]:
            assert completion.finish_reason == "length"
    print("\n".join(map(str, report)))
    assert any(r[1] == "tool_calls" for r in report) and any(r[1] == "length" for r in report)


def _shape(completion) -> dict:
    """What the mirror must reproduce: texts, calls (name, arguments, id pattern), finish, completion tokens."""
    return {
        "content": completion.content,
        "reasoning": completion.reasoning,
        "calls": [
            (c.name, c.arguments, c.id.replace(completion.generation_id or "", "{id}"), c.index)
            for c in completion.tool_calls
        ],
        "finish": completion.finish_reason,
        "completion_tokens": completion.usage.completion_tokens,
    }


def _raw_shape(completion) -> dict:
    """The wire: which fields the message (or the stream's chunks) carried, and how the stream ended."""
    if isinstance(completion.raw, list):
        keys = sorted(
            {
                k
                for chunk in completion.raw
                for choice in chunk.get("choices") or []
                for k in (choice.get("delta") or {})
            }
        )
        return {"delta_keys": keys, "usage_on_finish": any(c.get("usage") and c.get("choices") for c in completion.raw)}
    message = completion.raw["choices"][0]["message"]
    return {"message_keys": sorted(k for k, v in message.items() if v is not None)}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_the_simulator_personality_mirrors_the_real_server(real_server, truth, tiny_model_dir, tmp_path, stream):
    base_url, model = real_server
    cases = [(m, t, MAX_TOKENS) for m, t, _ in GOOD] + [(m, t, CUT) for m, t, _ in GOOD[:2]]
    tok = load_tokenizer(tiny_model_dir)
    real = []
    for messages, tools, max_tokens in cases:
        async with _client(base_url, stream, max_tokens) as client:
            real.append(await client.complete(messages, tools, model=model))
    # one simulator per budget: it replays generate()'s ids for each prompt
    mirrored = []
    for max_tokens in (MAX_TOKENS, CUT):
        path = tmp_path / f"reference-{max_tokens}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            for messages, tools, budget in cases:
                if budget == max_tokens:
                    handle.write(
                        json.dumps({"messages": messages, "output_ids": truth(messages, tools, budget)}) + "\n"
                    )
        options = SimulatorOptions(personality="transformers-serve")
        async with SimulatorServer(options, tokenizer=tok, reference=path, profile="qwen3", model=model) as sim:
            async with _client(sim.base_url, stream, max_tokens) as client:
                for messages, tools, budget in cases:
                    if budget == max_tokens:
                        mirrored.append((messages, await client.complete(messages, tools, model=model)))
    order = {repr(m) + str(b): i for i, (m, _, b) in enumerate(cases)}
    mirrored_in_order = [None] * len(cases)
    for k, (messages, completion) in enumerate(mirrored):
        budget = MAX_TOKENS if k < len(GOOD) else CUT
        mirrored_in_order[order[repr(messages) + str(budget)]] = completion
    for (messages, _, budget), got, want in zip(cases, mirrored_in_order, real):
        assert _shape(got) == _shape(want), (messages[-1]["content"], budget)
        assert _raw_shape(got) == _raw_shape(want), (messages[-1]["content"], budget)


async def test_real_server_and_mirror_fail_alike(real_server, truth, tiny_model_dir, tmp_path):
    base_url, model = real_server
    messages, tools, _ = BROKEN[0]
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"messages": messages, "output_ids": truth(messages, tools, MAX_TOKENS)}) + "\n")
    sim = SimulatorServer(
        SimulatorOptions(personality="transformers-serve"),
        tokenizer=load_tokenizer(tiny_model_dir),
        reference=path,
        profile="qwen3",
        model=model,
    )
    async with sim:
        for url in (base_url, sim.base_url):
            # a tool-call region that is not JSON: HTTP 400 (sample-fatal), non-streaming
            async with _client(url, False) as client:
                with pytest.raises(SampleFatalError) as caught:
                    await client.complete(messages, tools, model=model)
            assert caught.value.status == 400, url
            # a field outside its schema: 422 naming the field (sample-fatal)
            async with _client(url, False, extra={"return_token_ids": True}) as client:
                with pytest.raises(SampleFatalError, match="return_token_ids") as refused:
                    await client.complete(GOOD[0][0], model=model)
            assert refused.value.status == 422, url


# prompts the model was not trained on, two with a CJK compatibility ideograph that Qwen3's NFC normaliser turns
# into U+5973 on the prompt side (what the server feeds the model), while the output side keeps raw bytes
NORMALISED = "\uf981"
EXTRA = [
    ([{"role": "user", "content": f"Translate {NORMALISED} into English."}], None, ""),
    ([{"role": "user", "content": f"Say hello to {NORMALISED}."}], None, ""),
    ([{"role": "user", "content": "What is two plus three?"}], None, ""),
]


def _write_run(
    tmp_path,
    base_url,
    model_dir,
    truth,
    stream: bool,
    *,
    cases=GOOD,
    reference: bool = True,
    server: bool = True,
    name: str = "run",
) -> Path:
    """A run config over the real server: the cases as a dataset, generate()'s ids as the reference (unless
    `reference` is False, as in production); `server` False leaves `server =` out (the default config: the
    engine identifies the server from its GET /v1/models)."""
    data, ref = tmp_path / f"{name}-prompts.jsonl", tmp_path / f"{name}-reference.jsonl"
    with open(data, "w", encoding="utf-8") as d, open(ref, "w", encoding="utf-8") as r:
        for k, (messages, tools, _) in enumerate(cases):
            row = {"id": f"case-{k}", "messages": messages}
            if tools:
                row["tools"] = tools
            d.write(json.dumps(row) + "\n")
            r.write(
                json.dumps({"id": f"case-{k}", "messages": messages, "output_ids": truth(messages, tools, MAX_TOKENS)})
                + "\n"
            )
    config = tmp_path / f"{name}.toml"
    config.write_text(f"""
[run]
name = "realserver"
database = "{tmp_path / f"{name}.db"}"
output_dir = "{tmp_path / "out"}"

[data]
{f'reference = "{ref}"' if reference else ""}

[[data.datasets]]
path = "{data}"
format = "openai-messages"

[model]
name = "{model_dir}"
tokenizer = "{model_dir}"
profile = "qwen3"

[[endpoints]]
name = "serve"
base_url = "{base_url}"
{'server = "transformers-serve"' if server else ""}
max_concurrency = 2
timeout_s = 120.0

[generation]
max_tokens = {MAX_TOKENS}
temperature = 0.0
stream = {"true" if stream else "false"}
attempts = 2

[limits]
concurrency_initial = 1
concurrency_min = 1
concurrency_max = 2

[pricing."{model_dir}"]
prompt_per_m = 0.0
completion_per_m = 0.0
""")
    return config


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (args, done.stderr[-3000:])
    return done


def _exported(tmp_path, db: Path, *keep: str) -> dict[str, dict]:
    out = tmp_path / f"export-{db.stem}"
    _cli("export", "--db", str(db), "--format", "sglang-raw", "--out", str(out), "--keep-truncated", *keep, timeout=120)
    return {row["id"]: row for row in map(json.loads, (out / "data" / "sglang_raw.jsonl").read_text().splitlines())}


def _shards(tmp_path, db: Path, *flags: str) -> tuple[dict[str, tuple[list[int], list[int]]], dict]:
    """The default export format's rows (id -> (prompt ids, output ids), split by the loss mask) and its manifest."""
    out = tmp_path / f"shards-{db.stem}-{len(flags)}"
    _cli("export", "--db", str(db), "--format", "eagle3-shards", "--out", str(out), *flags, timeout=120)
    rows = {}
    for path in sorted((out / "data").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            obj = json.loads(line)
            cut = obj["loss_mask"].index(1) if 1 in obj["loss_mask"] else len(obj["loss_mask"])
            rows[obj["id"]] = (obj["input_ids"][:cut], obj["input_ids"][cut:])
    return rows, json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def template_ids(tiny_model_dir):
    """messages, tools -> the prompt ids transformers' apply_chat_template gives (what the server encodes)."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_model_dir)

    def ids(messages, tools) -> list[int]:
        out = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"])

    return ids


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_the_engine_end_to_end_against_the_real_server(real_server, truth, tiny_model_dir, tmp_path, stream):
    """`eaglewatch run --headless` over the real server with generate()'s ids as the reference: every verdict
    agrees with the ids."""
    base_url, model = real_server
    config = _write_run(tmp_path, base_url, model, truth, stream)
    _cli("run", "--headless", str(config))
    status = json.loads(_cli("status", "--db", str(tmp_path / "run.db"), "--json", timeout=60).stdout)
    assert status["runs"][0]["states"]["done"] == len(GOOD)
    truth_of = {f"case-{k}": truth(m, t, MAX_TOKENS) for k, (m, t, _) in enumerate(GOOD)}
    # every sample, whatever its verdict, to hold each verdict against the ids
    rows = _exported(tmp_path, tmp_path / "run.db", "--keep-mismatches", "--keep-roundtrip-failed", "--keep-suspect")
    assert set(rows) == set(truth_of)
    for sid, row in rows.items():
        right = row["output_ids"] == truth_of[sid]
        assert (row["meta_info"]["verdict"] in ("exact", "truncated")) == right, (sid, row["meta_info"])


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_default_config_without_a_reference_exports_no_wrong_bytes(
    real_server, truth, tiny_model_dir, tmp_path, template_ids, stream
):
    """Production as a new user runs it: no `server =`, no reference, no calibrate, the default export. The engine
    identifies transformers serve, reconstructs on its known text steps (prior only: it returns neither ids nor
    logprobs), and the export writes no wrong byte: it keeps at least 60 % of the samples whose text can carry
    their ids, or says why not and what to do (streaming). Every exported row's prompt ids are what
    apply_chat_template gives (what the server encodes), normaliser-changing text included."""
    from app.tokens import Reconstructor, get_profile, split_output
    from app.tokens.reconstruct import Fields
    from app.tokens.tokenizer import load_tokenizer

    base_url, model = real_server
    cases = GOOD + EXTRA
    config = _write_run(
        tmp_path, base_url, model, truth, stream, cases=cases, reference=False, server=False, name="prod"
    )
    _cli("run", "--headless", str(config))
    db = tmp_path / "prod.db"
    with sqlite3.connect(db) as conn:
        events = [m for (m,) in conn.execute("SELECT message FROM events WHERE kind = 'fidelity'")]
    assert any("identified as transformers-serve (GET /models)" in e for e in events), events
    truth_of = {f"case-{k}": truth(m, t, MAX_TOKENS) for k, (m, t, _) in enumerate(cases)}
    case_of = {f"case-{k}": (m, t) for k, (m, t, _) in enumerate(cases)}
    rows, manifest = _shards(tmp_path, db)
    wrong = sorted(sid for sid, (_, output) in rows.items() if output != truth_of[sid])
    rec = Reconstructor(get_profile("qwen3"), load_tokenizer(tiny_model_dir))
    end = rec.tokenizer.special_id("<|im_end|>")

    def can_carry(ids: list[int]) -> bool:
        # a finished answer whose ids are the canonical encoding of the fields a server would return for them
        view = split_output(ids, rec.profile, rec.tokenizer)
        fields = Fields(view.reasoning, view.content, view.tool_calls, view.finish_reason)
        return ids[-1:] == [end] and rec.encode_fields(fields) == list(ids)

    carry = {sid for sid, ids in truth_of.items() if can_carry(ids)}
    kept = carry & set(rows)
    advice = " ".join(manifest["warnings"])
    states = {e["endpoint"]: e["state"] for e in manifest["verification"]["endpoints"]}
    print(
        f"\nproduction ({'stream' if stream else 'plain'}, default config): {len(rows)} exported, "
        f"{len(rows) - len(wrong)} with generate()'s ids, wrong: {wrong}; kept {len(kept)} of the {len(carry)} "
        f"samples whose text can carry their ids; states {states}; warnings: {manifest['warnings']}"
    )
    assert wrong == []  # never a wrong byte by default
    assert states == {"serve": "prior only"}
    assert len(kept) >= 0.6 * len(carry) or "stream" in advice, advice
    for sid, (prompt, _) in rows.items():
        assert prompt == template_ids(*case_of[sid]), sid
    # the prompt side of every stored sample, the held-back ones too (the normaliser-changing prompts among them)
    every, _ = _shards(
        tmp_path,
        db,
        "--keep-truncated",
        "--keep-suspect",
        "--keep-roundtrip-failed",
        "--keep-mismatches",
        "--accept-unverified",
    )
    assert {sid for sid in every if NORMALISED in json.dumps(case_of[sid], ensure_ascii=False)}
    for sid, (prompt, _) in every.items():
        assert prompt == template_ids(*case_of[sid]), sid
