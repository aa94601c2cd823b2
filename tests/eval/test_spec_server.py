"""The simulator as a speculative-decoding server, and what `eaglewatch eval` makes of it: per-position and
per-category acceptance, a dead drafter, repetition loops, SGLang's meta_info, Prometheus counters on /metrics
(the per-window deltas of a counter-only server), the template guard through a raw completions prompt, and a
refused key stopping the run. Real loopback HTTP, a real SQLite store, the real CLI."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from app.cli import main
from app.config import SimulatorOptions
from app.eval.counters import parse_counters
from app.simulator.server import SimulatorServer

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"
N = 40
CATEGORIES = ("code", "chat")


def categorised(tmp_path: Path) -> tuple[Path, Path]:
    """The sample prompts and reference with a category per row (even rows code, odd rows chat)."""
    prompts, reference = tmp_path / "prompts.jsonl", tmp_path / "reference.jsonl"
    with open(SAMPLE / "prompts.openai.jsonl") as p, open(SAMPLE / "reference.jsonl") as r:
        rows = [(json.loads(a), json.loads(b)) for a, b, _ in zip(p, r, range(N), strict=False)]
    with open(prompts, "w") as p, open(reference, "w") as r:
        for k, (prompt, ref) in enumerate(rows):
            category = CATEGORIES[k % 2]
            p.write(json.dumps({**prompt, "category": category}) + "\n")
            r.write(json.dumps({**ref, "category": category}) + "\n")
    return prompts, reference


async def serve(reference: Path, *, api_key: str | None = None, **spec) -> SimulatorServer:
    options = SimulatorOptions(
        reference=reference, personality=spec.pop("personality", "vllm"),
        latency_median_ms=spec.pop("latency_median_ms", 0), latency_p95_ms=spec.pop("latency_p95_ms", 0),
        logprobs=False, **spec,
    )  # fmt: skip
    server = SimulatorServer(
        options, tokenizer_dir=SAMPLE / "tokenizer", model="moonshotai/kimi-k2.5", profile="kimi-k2.5",
        api_key=api_key,
    )  # fmt: skip
    await server.start()
    return server


def write_config(tmp_path: Path, prompts: Path, endpoints: list[tuple[str, str]], **eval_fields) -> Path:
    """An eval config over `prompts`; `endpoints`: (name, base_url, extra TOML lines) each."""
    eps = "".join(
        f'[[endpoints]]\nname = "{name}"\nbase_url = "{url}"\nserver = "{server}"\ntimeout_s = 20\n{extra}\n'
        for name, url, server, extra in endpoints
    )
    fields = "".join(f"{k} = {json.dumps(v)}\n" for k, v in eval_fields.items())
    path = tmp_path / "eval.toml"
    path.write_text(f"""
[run]
name = "eval-s"
database = "{tmp_path / "e.db"}"
[[data.datasets]]
path = "{prompts}"
format = "openai-messages"
columns = {{category = "category"}}
[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{SAMPLE / "tokenizer"}"
[generation]
stream = false
[limits]
concurrency_max = 8
{eps}
[eval]
drafter = "test/drafter-1"
max_tokens = 4096
dead_after = 10
bootstrap = 200
{fields}""")
    return path


def stored(db: Path, table: str = "eval_requests") -> list[sqlite3.Row]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
    finally:
        conn.close()


async def _main(argv: list[str]) -> int:
    """The CLI in a thread: it runs its own event loop, and the simulator serves on this one."""
    return await asyncio.to_thread(main, argv)


async def metrics(server: SimulatorServer):
    async with httpx.AsyncClient() as client:
        return parse_counters((await client.get(f"http://127.0.0.1:{server.port}/metrics")).text)


async def test_acceptance_per_position_follows_each_categorys_rates_and_metrics_count_it(tmp_path, capsys) -> None:
    prompts, reference = categorised(tmp_path)
    rates = {"code": [0.9, 0.8, 0.7], "chat": [0.3, 0.2, 0.1]}
    server = await serve(reference, spec_acceptance=[0.5, 0.5, 0.5], spec_acceptance_by_category=rates)
    try:
        config = write_config(tmp_path, prompts, [("spec", server.base_url, "vllm", "")])
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        counters = await metrics(server)
    finally:
        await server.close()
    by_category = report["endpoints"]["spec"]["by_category"]
    for category, r in rates.items():
        # the share of steps that accepted position k is the product of the chances up to k
        expected = [r[0], r[0] * r[1], r[0] * r[1] * r[2]]
        got = by_category[category]["per_position_acceptance"]
        assert got == pytest.approx(expected, abs=0.06), (category, got)
    rows = stored(tmp_path / "e.db")
    assert counters is not None
    assert counters.accepted == sum(r["accepted"] for r in rows)
    assert counters.drafts == sum(r["steps"] for r in rows)
    assert counters.draft_tokens == sum(r["drafted"] for r in rows)
    assert list(counters.per_position) == [sum(json.loads(r["per_position"])[k] for r in rows) for k in range(3)]


async def test_a_dead_drafter_server_is_called_dead(tmp_path, capsys) -> None:
    prompts, reference = categorised(tmp_path)
    server = await serve(reference, spec_acceptance=[0.9, 0.8, 0.7], spec_dead=True)
    try:
        config = write_config(tmp_path, prompts, [("spec", server.base_url, "vllm", "")])
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    finally:
        await server.close()
    report = json.loads(capsys.readouterr().out)
    assert report["endpoints"]["spec"]["figures"]["mean_acceptance_length"] == 1.0
    assert [v["verdict"] for v in report["verdicts"]] == ["dead drafter"]


async def test_looping_outputs_are_caught_and_left_out_with_both_figures_shown(tmp_path, capsys) -> None:
    prompts, reference = categorised(tmp_path)
    server = await serve(reference, spec_acceptance=[0.4, 0.3, 0.2], spec_loop_rate=0.3)
    try:
        config = write_config(tmp_path, prompts, [("spec", server.base_url, "vllm", "")])
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    finally:
        await server.close()
    report = json.loads(capsys.readouterr().out)
    ep = report["endpoints"]["spec"]
    rows = stored(tmp_path / "e.db")
    looping = [r for r in rows if r["loop"]]
    assert 0 < len(looping) < N and ep["loops"] == len(looping)
    # a loop accepts every draft: with them in, the mean is flattered
    assert ep["figures_with_loops"]["mean_acceptance_length"] > ep["figures"]["mean_acceptance_length"] + 0.3
    assert ep["figures"]["mean_acceptance_length"] < 1.9
    (loops,) = [v for v in report["verdicts"] if v["verdict"] == "repetition loops"]
    assert f"{len(looping)} outputs caught in a repetition loop" in loops["message"]


async def test_sglang_meta_info_figures_are_stored_as_sglang(tmp_path, capsys) -> None:
    prompts, reference = categorised(tmp_path)
    server = await serve(reference, personality="sglang", spec_acceptance=[0.8, 0.6, 0.4])
    try:
        config = write_config(tmp_path, prompts, [("sgl", server.base_url, "sglang", "")])
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    finally:
        await server.close()
    rows = stored(tmp_path / "e.db")
    assert len(rows) == N and {r["spec_source"] for r in rows} == {"sglang"}
    assert sum(r["accepted"] for r in rows) == server.spec_totals["accepted"]
    assert sum(r["steps"] for r in rows) == server.spec_totals["drafts"]
    assert json.loads(capsys.readouterr().out)["endpoints"]["sgl"]["figures"]["requests"] > 0


async def test_a_counter_only_server_is_measured_by_prometheus_windows_kept_apart(tmp_path, capsys) -> None:
    prompts, reference = categorised(tmp_path)
    server = await serve(reference, spec_acceptance=[0.8, 0.5, 0.2], spec_per_request=False)
    try:
        config = write_config(tmp_path, prompts, [("counted", server.base_url, "vllm", "")], counter_window_requests=15)
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    finally:
        await server.close()
    out = capsys.readouterr()
    assert out.err.count("its first answer carries no acceptance figures") == 1
    assert "Its /metrics has the spec-decode counters" in out.err
    report = json.loads(out.out)
    assert report["endpoints"]["counted"]["figures"]["mean_acceptance_length"] is None  # never mixed in
    windows = stored(tmp_path / "e.db", "eval_windows")
    assert len(windows) == 3 and sum(w["requests"] for w in windows) == N  # 15 + 15 + 10
    totals = server.spec_totals
    assert sum(w["accepted"] for w in windows) == totals["accepted"]
    assert sum(w["drafts"] for w in windows) == totals["drafts"]
    assert [sum(json.loads(w["per_position"])[k] for w in windows) for k in range(3)] == [
        totals["pos0"], totals["pos1"], totals["pos2"],
    ]  # fmt: skip
    cw = report["counter_windows"]["counted"]
    assert cw["source"].startswith("prometheus counter deltas")
    assert cw["acceptance_length"] == round(1 + totals["accepted"] / totals["drafts"], 4)
    assert main(["eval-report", "--db", str(tmp_path / "e.db")]) == 0
    assert "counted (server counters, not per request): acceptance length" in capsys.readouterr().out


async def test_a_raw_completions_prompt_is_reported_as_a_template_mismatch(tmp_path, capsys) -> None:
    prompts, reference = categorised(tmp_path)
    server = await serve(reference, spec_acceptance=[0.8, 0.5, 0.2])
    try:
        config = write_config(
            tmp_path,
            prompts,
            [("chat", server.base_url, "vllm", ""), ("raw", server.base_url, "vllm", "")],
            raw_completion_endpoints=["raw"],
        )
        assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    finally:
        await server.close()
    report = json.loads(capsys.readouterr().out)
    rows = stored(tmp_path / "e.db")
    chat = [r for r in rows if r["endpoint"] == "chat"]
    raw = [r for r in rows if r["endpoint"] == "raw"]
    assert len(chat) == len(raw) == N and all(r["prompt_ids"] for r in rows)
    assert all(r["template"] is None for r in chat)  # the chat template's ids agree with the run's rendering
    first = json.loads(raw[0]["template"])
    assert first["position"] == 0 and first["rendered_token"] == "<|im_system|>"
    assert first["server_id"] != first["rendered_id"]
    (mismatch,) = [v for v in report["verdicts"] if v["verdict"] == "template mismatch"]
    assert mismatch["message"].startswith(f"raw: the server's prompt ids differ from the run's own chat-template "
                                          f"rendering in {N} of {N} requests; first at position 0")  # fmt: skip
    assert "'<|im_system|>'" in mismatch["message"]


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_key_stops_the_eval_at_once_naming_the_endpoint(tmp_path, capsys, status) -> None:
    prompts, reference = categorised(tmp_path)
    server = await serve(reference, spec_acceptance=[0.5], faults={str(status): 1.0})
    try:
        config = write_config(tmp_path, prompts, [("locked", server.base_url, "vllm", 'api_key_env = "EW_KEY"')])
        import os

        os.environ["EW_KEY"] = "wrong"
        try:
            code = await _main(["eval", "--headless", str(config)])
        finally:
            del os.environ["EW_KEY"]
    finally:
        await server.close()
    err = capsys.readouterr().err
    assert code == 3
    assert f"endpoint 'locked' ({server.base_url}) refused the eval's requests with HTTP {status}" in err
    assert "check the key in $EW_KEY" in err
    assert server.counters[str(status)] <= 8  # the requests already in flight, not all N
    assert stored(tmp_path / "e.db") == []  # no request stored as failed
    conn = sqlite3.connect(tmp_path / "e.db")
    assert conn.execute("SELECT state FROM runs").fetchone() == ("failed",)
    conn.close()


def test_a_version_11_eval_database_gains_prompt_ids_and_counter_windows(tmp_path) -> None:
    from app.store.db import migrate
    from app.store.schema import MIGRATIONS

    db = tmp_path / "v11.db"
    migrate(db, migrations=MIGRATIONS[:11])
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (name, created_at, updated_at, kind) VALUES ('old', 0, 0, 'eval')")
    conn.commit()
    conn.close()
    assert migrate(db, migrations=MIGRATIONS[:12]) == 12
    conn = sqlite3.connect(db)
    try:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(eval_requests)")}
        assert {"prompt_ids", "template"} <= columns
        assert conn.execute("SELECT COUNT(*) FROM eval_windows").fetchone() == (0,)
        assert conn.execute("SELECT kind FROM runs").fetchone() == ("eval",)
    finally:
        conn.close()


async def test_a_capped_server_gets_every_request_answered_through_its_429s(tmp_path, capsys) -> None:
    prompts, reference = categorised(tmp_path)
    server = await serve(reference, spec_acceptance=[0.5, 0.5], concurrency_cap=2, latency_median_ms=20,
                         latency_p95_ms=40)  # fmt: skip
    try:
        config = write_config(tmp_path, prompts, [("capped", server.base_url, "vllm", "")])
        assert await _main(["eval", "--headless", str(config)]) == 0
    finally:
        await server.close()
    assert sum(c for k, c in server.counters.items() if k.startswith("429")) > 0  # it started at 8: cap 2
    rows = stored(tmp_path / "e.db")
    assert len(rows) == N and all(r["error"] is None for r in rows)
