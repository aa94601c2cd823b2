"""`eaglewatch eval` end to end: the real engine against the simulator on loopback (vLLM personality with
`metrics.speculative_decoding`), a real SQLite store, the real CLI."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.cli import main
from app.commands.eval import EXIT_BELOW_MIN
from app.config import SimulatorOptions
from app.simulator.server import SimulatorServer
from app.store.db import migrate
from app.store.schema import MIGRATIONS

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"
N = 24


@pytest.fixture
async def spec_server(request):
    """A vLLM-personality simulator whose answers carry acceptance drawn from `request.param` per position."""
    options = SimulatorOptions(
        reference=SAMPLE / "reference.jsonl", personality="vllm", latency_median_ms=0, latency_p95_ms=0,
        spec_acceptance=list(request.param), logprobs=False,
    )  # fmt: skip
    server = SimulatorServer(
        options, tokenizer_dir=SAMPLE / "tokenizer", reference=SAMPLE / "reference.jsonl",
        model="moonshotai/kimi-k2.5", profile="kimi-k2.5",
    )  # fmt: skip
    await server.start()
    yield server
    await server.close()


def write_config(tmp_path: Path, base_url: str, *, stream: bool = True, dead_after: int = 10) -> Path:
    path = tmp_path / "eval.toml"
    path.write_text(
        f"""
[run]
name = "eval-a"
database = "{tmp_path / "e.db"}"
[data]
[[data.datasets]]
path = "{SAMPLE / "prompts.openai.jsonl"}"
format = "openai-messages"
limit = {N}
[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{SAMPLE / "tokenizer"}"
[[endpoints]]
name = "spec"
base_url = "{base_url}"
server = "vllm"
timeout_s = 20
[generation]
stream = {"true" if stream else "false"}
[limits]
concurrency_max = 8
[eval]
drafter = "test/drafter-1"
max_tokens = 4096
dead_after = {dead_after}
bootstrap = 200
"""
    )
    return path


def stored(db: Path) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT * FROM eval_requests ORDER BY id").fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("spec_server", [(0.9, 0.7, 0.5)], indirect=True)
@pytest.mark.parametrize("stream", [True, False])
async def test_stored_totals_equal_the_servers_counters(spec_server, tmp_path, capsys, stream) -> None:
    config = write_config(tmp_path, spec_server.base_url, stream=stream)
    assert await _main(["eval", "--headless", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = stored(tmp_path / "e.db")
    assert len(rows) == N and all(r["error"] is None and r["spec_source"] == "vllm" for r in rows)
    totals = spec_server.spec_totals
    assert sum(r["accepted"] for r in rows) == totals["accepted"]
    assert sum(r["drafted"] for r in rows) == totals["draft_tokens"]
    assert sum(r["steps"] for r in rows) == totals["drafts"]
    per_pos = [sum(json.loads(r["per_position"])[k] for r in rows) for k in range(3)]
    assert per_pos == [totals["pos0"], totals["pos1"], totals["pos2"]]
    assert all(r["output_ids"] and r["tokens_per_s"] and r["latency_ms"] for r in rows)
    assert all((r["ttft_ms"] is not None) == stream for r in rows)
    fig = report["endpoints"]["spec"]["figures"]
    assert fig["accepted_tokens"] + fig["steps"] > 0 and fig["mean_acceptance_length"] > 2.0
    assert fig["draft_tokens"] == totals["draft_tokens"] - sum(r["drafted"] for r in rows if r["loop"])
    assert "dead drafter" not in [v["verdict"] for v in report["verdicts"]]


@pytest.mark.parametrize("spec_server", [(0.0, 0.0, 0.0)], indirect=True)
async def test_a_dead_drafter_is_named_and_fails_the_gate(spec_server, tmp_path, capsys) -> None:
    config = write_config(tmp_path, spec_server.base_url)
    assert await _main(["eval", "--headless", str(config), "--min-acceptance", "1.5"]) == EXIT_BELOW_MIN
    out = capsys.readouterr()
    assert "VERDICT dead drafter" in out.out and "mean acceptance length 1.000" in out.out
    assert "below --min-acceptance 1.5" in out.err
    # the report reads back from the database alone, and passes a gate it meets
    assert await _main(["eval-report", "--db", str(tmp_path / "e.db"), "--min-acceptance", "1.0"]) == 0


@pytest.mark.parametrize("spec_server", [()], indirect=True)
async def test_an_endpoint_without_acceptance_is_named_at_its_first_answer(spec_server, tmp_path, capsys) -> None:
    config = write_config(tmp_path, spec_server.base_url)
    assert await _main(["eval", "--headless", str(config), "--json", "--min-acceptance", "1.0"]) == EXIT_BELOW_MIN
    out = capsys.readouterr()
    assert out.err.count("its first answer carries no acceptance figures") == 1
    report = json.loads(out.out)
    assert report["endpoints"]["spec"]["no_acceptance"] == N
    assert report["endpoints"]["spec"]["figures"]["mean_acceptance_length"] is None  # not a zero
    assert [v["verdict"] for v in report["verdicts"]] == ["no acceptance"]
    assert all(r["spec_source"] is None and r["accepted"] is None for r in stored(tmp_path / "e.db"))


@pytest.mark.parametrize("spec_server", [(0.5, 0.5, 0.5)], indirect=True)
async def test_a_second_eval_of_the_run_sends_only_what_is_missing(spec_server, tmp_path, capsys) -> None:
    config = write_config(tmp_path, spec_server.base_url)
    assert await _main(["eval", "--headless", str(config)]) == 0
    first = spec_server.spec_totals["drafts"]
    assert await _main(["eval", "--headless", str(config)]) == 0
    assert spec_server.spec_totals["drafts"] == first  # nothing sent again
    assert len(stored(tmp_path / "e.db")) == N


def test_a_version_9_database_opens_and_gains_the_eval_kind(tmp_path) -> None:
    db = tmp_path / "old.db"
    migrate(db, migrations=MIGRATIONS[:9])
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('old', 0, 0)")
    conn.commit()
    conn.close()
    assert migrate(db) == len(MIGRATIONS)
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT kind FROM runs WHERE name = 'old'").fetchone() == ("generate",)
        assert conn.execute("SELECT COUNT(*) FROM eval_requests").fetchone() == (0,)
    finally:
        conn.close()


def test_eval_report_refuses_a_generation_run(tmp_path, capsys) -> None:
    db = tmp_path / "g.db"
    migrate(db)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('gen', 0, 0)")
    conn.commit()
    conn.close()
    assert main(["eval-report", "--db", str(db)]) == 2
    assert "is a generation run, not an eval run" in capsys.readouterr().err


async def _main(argv: list[str]) -> int:
    """The CLI in a thread: it runs its own event loop, and the simulator serves on this one."""
    import asyncio

    return await asyncio.to_thread(main, argv)


@pytest.mark.parametrize("spec_server", [(0.0, 0.0, 0.0)], indirect=True)
async def test_status_shows_an_eval_runs_headline(spec_server, tmp_path, capsys) -> None:
    config = write_config(tmp_path, spec_server.base_url)
    assert await _main(["eval", "--headless", str(config)]) == 0
    capsys.readouterr()
    assert await _main(["status", "--db", str(tmp_path / "e.db"), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["kind"] == "eval" and run["eval"]["drafter"] == "test/drafter-1"
    assert run["eval"]["mean_acceptance_length"] == 1.0 and run["eval"]["verdicts"] == ["dead drafter"]
    assert await _main(["status", "--db", str(tmp_path / "e.db")]) == 0
    assert "eval of test/drafter-1: mean acceptance length 1.0" in capsys.readouterr().out
