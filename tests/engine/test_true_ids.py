"""Samples with true ids are stored and exported with them, through the real engine path: the
simulator over loopback HTTP changes the text (vLLM's slow detokenizer: ' ' around added tokens) while
returning the model's ids (vLLM `token_ids`, or OpenRouter-style logprobs with bytes); no reference is given,
as in production. The stored and exported ids are the server's; the text path's mismatch is what the
fidelity report counts, until the probes have taught the endpoint's profile the step (one request at a time
here, so the first probe is measured with nothing learned and the later ones with what it showed); the changed
text is named in the notes, not taken for a failed round-trip."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.cli import main
from app.engine.fidelity.pool import build_reconstructor
from app.store.ids import unpack_ids
from tests.engine.conftest import make_config, run_to_end, sample_inputs

N = 8
CORRUPT = ("text_mismatch", "structure_mismatch")
ONE = {"concurrency_initial": 1, "concurrency_max": 1}


def _measured(row: dict) -> str:
    return next(f for f in row["flags"] if f.startswith("text_path:"))[len("text_path:") :]


def _learned(report: dict, endpoint: str) -> set[str]:
    """The steps `eaglewatch fidelity --json` says the probes taught `endpoint`'s profile."""
    return {s["name"] for r in report["rows"] if r["endpoint"] == endpoint for s in r["steps"] if not s.get("known")}


def _sim(**kw) -> dict:
    sim = {"latency_median_ms": 0.0, "latency_p95_ms": 0.0, "tokens_per_s": 0.0, "seed": 3, "quirks": ["think_spaces"]}
    sim.update(kw)
    return sim


def _stored(db: Path) -> list[dict]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT s.sample_id, r.output_ids, r.ids_source, r.strategy, r.roundtrip, r.notes, r.flags, r.category, "
            "p.token_ids FROM reconstructions r JOIN responses p ON p.id = r.response_id "
            "JOIN samples s ON s.pk = r.sample_pk ORDER BY r.sample_pk"
        ).fetchall()
    keys = ("id", "ids", "source", "strategy", "roundtrip", "notes", "flags", "category", "server_ids")
    out = []
    for row in rows:
        d = dict(zip(keys, row))
        d["ids"], d["server_ids"] = unpack_ids(d["ids"]), unpack_ids(d["server_ids"]) if d["server_ids"] else None
        d["notes"], d["flags"] = json.loads(d["notes"] or "[]"), json.loads(d["flags"] or "[]")
        out.append(d)
    return out


def _exported(tmp_path: Path, db: Path, capsys) -> tuple[dict[str, dict], dict]:
    out = tmp_path / "export"
    capsys.readouterr()
    assert main(["export", "--db", str(db), "--format", "sglang-raw", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    records = {}
    for path in sorted((out / "data").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            obj = json.loads(line)
            records[obj["id"]] = obj
    return records, report


def _fidelity(db: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["fidelity", "--db", str(db), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _corrupt_counted(report: dict, endpoint: str) -> tuple[int, int]:
    """(measured, corrupt) of `endpoint` over its rows (one per upstream provider) in `eaglewatch fidelity --json`."""
    rows = [r for r in report["rows"] if r["endpoint"] == endpoint]
    assert rows, report
    return sum(r["measured"] for r in rows), sum(sum(r["corrupt"].values()) for r in rows)


@pytest.mark.parametrize("stream", [False, True])
async def test_server_ids_are_stored_and_exported_while_the_text_path_counts_its_mismatch(
    tmp_path, sample_data, capsys, stream
) -> None:
    config = make_config(
        tmp_path,
        sample_data,
        stream=stream,
        endpoints=[{"name": "vllm", "simulator": _sim(personality="vllm", logprobs=False), "timeout_s": 5.0}],
        limits=ONE,
    )
    run, outcome = await run_to_end(config, sample_data, N, references=False, reconstructor=build_reconstructor(config))
    assert outcome.state == "done", outcome
    rows = _stored(config.run.database)
    assert len(rows) == N
    refs = {s.sample_id: s.reference_ids for s in sample_inputs(sample_data, N)}
    for r in rows:
        assert r["server_ids"], r["id"]
        # the model's ids as the server sent them (the simulator's are the reference set's), not a text reconstruction
        assert r["ids"] == r["server_ids"] == refs[r["id"]], r["id"]
        assert (r["source"], r["strategy"]) == ("server", "server_ids")
        # the server put ' ' around the think tags: that changed text is named, the round-trip is not failed
        assert r["roundtrip"] is None and "content_text_differs" in r["notes"], r
        assert r["category"] == "unchecked"  # no reference in production
        measured = [f for f in r["flags"] if f.startswith("text_path:")]
        assert len(measured) == 1, r["flags"]
    assert _measured(rows[0]) in CORRUPT  # measured before anything was learned
    m = run.snapshot().counts.answers
    # the live match rate counts the text path, not the stored ids; what the first probes showed is applied
    assert m.measured == N and 1 <= m.measured_corrupt_total < N, m
    assert m.verified == N  # while the stored ids are the server's: verified
    report = _fidelity(config.run.database, capsys)
    assert _corrupt_counted(report, "vllm") == (N, m.measured_corrupt_total)
    assert _learned(report, "vllm") >= {"think_spaces"}

    records, report = _exported(tmp_path, config.run.database, capsys)
    assert set(records) == set(refs), report  # none dropped for a "failed" round-trip or as suspect
    for r in rows:
        got = records[r["id"]]
        assert tuple(got["output_ids"]) == r["server_ids"] and got["meta_info"]["ids_source"] == "server"


async def test_logprob_ids_are_stored_and_exported_while_the_text_path_counts_its_mismatch(
    tmp_path, sample_data, capsys
) -> None:
    # OpenRouter-style: every request a probe asks for logprobs (with bytes); the text has ' ' around the tags
    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[{"name": "or", "simulator": _sim(logprobs=True), "timeout_s": 5.0, "probe_fraction": 1.0}],
        limits=ONE,
    )
    run, outcome = await run_to_end(config, sample_data, N, references=False, reconstructor=build_reconstructor(config))
    assert outcome.state == "done", outcome
    rows = _stored(config.run.database)
    refs = {s.sample_id: s.reference_ids for s in sample_inputs(sample_data, N)}
    assert len(rows) == N
    for r in rows:
        assert r["ids"] == refs[r["id"]], r["id"]  # the logprob tokens: the model's ids, not the spaced text
        assert (r["source"], r["strategy"], r["roundtrip"]) == ("logprobs", "logprobs", None), r
        assert "content_text_differs" in r["notes"], r
    assert _measured(rows[0]) in CORRUPT
    corrupt = run.snapshot().counts.answers.measured_corrupt_total
    assert 1 <= corrupt < N
    report = _fidelity(config.run.database, capsys)
    assert _corrupt_counted(report, "or") == (N, corrupt) and _learned(report, "or") >= {"think_spaces"}
    records, _ = _exported(tmp_path, config.run.database, capsys)
    assert {k: tuple(v["output_ids"]) for k, v in records.items()} == {r["id"]: r["ids"] for r in rows}
    assert {v["meta_info"]["ids_source"] for v in records.values()} == {"logprobs"}
