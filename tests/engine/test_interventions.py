"""The ledger of server interventions, end to end: the real engine against two loopback simulators — an OpenRouter
that compresses some prompts and falls back for some samples (and says so in `openrouter_metadata`), a vLLM whose
thinking budget closes long reasoning itself — ends with exactly those samples flagged, counted by kind in the
store's counts, `status --json`, the headless line and the TUI's errors tile, and absent from the default export."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from app.cli import main
from app.commands.run import progress_line
from app.engine.fidelity.pool import build_reconstructor
from app.engine.interventions import reasoning_length
from app.engine.record.snapshot import RunRecord
from app.simulator.options import SimulatorOptions
from app.simulator.reference import messages_key
from app.simulator.server import SimulatorServer, intervened
from app.tokens import get_profile
from app.tui.screens.dashboard import error_lines
from tests.engine.conftest import make_config, run_to_end, sample_inputs

N = 24
SEED = 5
RATES = {"context_compression": 0.3, "provider_fallback": 0.25}
BUDGET = 60  # reasoning tokens: about half the sample answers think longer


def _stored(db: Path) -> dict[str, tuple[str, set[str], list[str]]]:
    """sample id -> (endpoint of its stored answer, its intervened:* flags' kinds, its ledger's kinds)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT s.sample_id, p.endpoint, r.flags, s.pk FROM reconstructions r "
            "JOIN responses p ON p.id = r.response_id JOIN samples s ON s.pk = r.sample_pk"
        ).fetchall()
        out = {}
        for sid, endpoint, flags, pk in rows:
            kinds = {f.split(":", 1)[1] for f in json.loads(flags or "[]") if f.startswith("intervened:")}
            ledger = [k for (k,) in conn.execute("SELECT kind FROM interventions WHERE sample_pk = ?", (pk,))]
            out[sid] = (endpoint, kinds, ledger)
    return out


def _expected(sample_data: Path, endpoint: str, sid: str, messages: list, think: tuple[int, int], ref) -> set[str]:
    if endpoint == "openrouter":
        return {k for k, rate in RATES.items() if intervened(SEED, k, messages_key(messages), rate)}
    n = reasoning_length(ref, *think)
    return {"thinking_budget"} if n is not None and n >= BUDGET else set()


@pytest.mark.parametrize("stream", [False, True])
async def test_compressed_fallen_back_and_budget_stopped_samples_are_flagged_counted_and_not_exported(
    tmp_path, sample_data, capsys, stream
) -> None:
    openrouter = SimulatorServer(
        SimulatorOptions(personality="openrouter", interventions=RATES, seed=SEED, logprobs=False),
        tokenizer_dir=sample_data / "tokenizer",
        reference=sample_data / "reference.jsonl",
    )
    vllm = SimulatorServer(
        SimulatorOptions(personality="vllm", seed=SEED, logprobs=False),
        tokenizer_dir=sample_data / "tokenizer",
        reference=sample_data / "reference.jsonl",
    )
    async with openrouter, vllm:
        config = make_config(
            tmp_path,
            sample_data,
            stream=stream,
            endpoints=[
                # prompt transforms allowed: OpenRouter compresses where it would by default
                {
                    "name": "openrouter",
                    "base_url": openrouter.base_url,
                    "server": "openrouter",
                    "allow_prompt_transforms": True,
                    "timeout_s": 5.0,
                },
                {
                    "name": "vllm",
                    "base_url": vllm.base_url,
                    "server": "vllm",
                    "extra": {"thinking_token_budget": BUDGET},
                    "timeout_s": 5.0,
                },
            ],
        )
        run, outcome = await run_to_end(
            config, sample_data, N, references=False, reconstructor=build_reconstructor(config)
        )
    assert outcome.state == "done", outcome
    stored = _stored(config.run.database)
    assert len(stored) == N
    profile = get_profile("kimi-k2.5")
    tok = openrouter.tokenizer
    think = (tok.special_id(profile.think_open), tok.special_id(profile.think_close))
    expected: dict[str, set[str]] = {}
    for s in sample_inputs(sample_data, N):
        endpoint = stored[s.sample_id][0]
        expected[s.sample_id] = _expected(sample_data, endpoint, s.sample_id, list(s.messages), think, s.reference_ids)
    got = {sid: kinds for sid, (_, kinds, _) in stored.items()}
    assert got == expected
    assert {sid: set(ledger) for sid, (_, _, ledger) in stored.items()} == expected  # one row per kind, stored
    by_kind: dict[str, int] = {}
    for kinds in expected.values():
        for k in kinds:
            by_kind[k] = by_kind.get(k, 0) + 1
    flagged = {sid for sid, kinds in expected.items() if kinds}
    # each kind happened on both endpoints' share of the run (the draw and the budget are not vacuous)
    assert set(by_kind) == {"context_compression", "provider_fallback", "thinking_budget"}, by_kind
    assert len(flagged) < N

    counts = run.snapshot().counts
    assert counts.intervened == len(flagged)
    assert dict(counts.interventions) == by_kind

    capsys.readouterr()
    assert main(["status", "--db", str(config.run.database), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    ledger = status["runs"][0]["interventions"]
    assert ledger == {"samples": len(flagged), "by_kind": by_kind}
    assert main(["status", "--db", str(config.run.database)]) == 0
    human = capsys.readouterr().out
    assert f"server intervened {len(flagged)} (" in human and f"think budget {by_kind['thinking_budget']}" in human

    record = RunRecord("t", "done", counts)
    assert f"intervened {len(flagged)} (" in progress_line(record)
    tile = error_lines(record, width=18, compact=True)  # the errors tile at 80x24
    assert any(f"interv {len(flagged)}" in line for line in tile), tile

    out = tmp_path / "export"
    assert (
        main(["export", "--db", str(config.run.database), "--format", "sglang-raw", "--out", str(out), "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    exported = {
        json.loads(line)["id"] for path in (out / "data").glob("*.jsonl") for line in path.read_text().splitlines()
    }
    assert exported  # the samples nothing intervened on are written
    assert not exported & flagged
    assert report["skipped"]["intervened"] == len(flagged), report["skipped"]
    kept = tmp_path / "kept"
    assert (
        main(
            ["export", "--db", str(config.run.database), "--format", "sglang-raw", "--out", str(kept), "--json"]
            + ["--keep-intervened"]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["skipped"].get("intervened", 0) == 0
    kept_ids = {
        json.loads(line)["id"] for path in (kept / "data").glob("*.jsonl") for line in path.read_text().splitlines()
    }
    assert kept_ids > exported and kept_ids - exported <= flagged  # only the intervened ones come back

    # a reprocess replaces the reconstructions: the ledger puts the flags back, so the export still leaves them out
    reprocess = ["reprocess", "--db", str(config.run.database), "--tokenizer", str(sample_data / "tokenizer")]
    assert await asyncio.to_thread(main, reprocess) == 0  # its own event loop, off this test's
    capsys.readouterr()
    again = tmp_path / "again"
    assert (
        main(["export", "--db", str(config.run.database), "--format", "sglang-raw", "--out", str(again), "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["skipped"]["intervened"] == len(flagged), report["skipped"]
    again_ids = {
        json.loads(line)["id"] for path in (again / "data").glob("*.jsonl") for line in path.read_text().splitlines()
    }
    assert again_ids == exported
