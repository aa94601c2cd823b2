"""`eaglewatch calibrate` against the real simulator on a loopback port, and `eaglewatch fidelity` over a
real SQLite run database."""

from __future__ import annotations

import json
import sqlite3
import struct
import time

import pytest

from app.cli import main
from app.store.db import migrate
from app.store.profile_store import load_profile, save_profile
from app.tokens.fidelity_profile import FidelityProfile


def _config(tmp_path, sample_data_dir, quirks, logprobs=True) -> str:
    d = sample_data_dir
    text = f"""
[run]
name = "calib"
database = "{tmp_path / "run.db"}"
[data]
reference = "{d / "reference.jsonl"}"
[[data.datasets]]
path = "{d / "prompts.openai.jsonl"}"
[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{d / "tokenizer"}"
profile = "kimi-k2.5"
[[endpoints]]
name = "sim"
[endpoints.simulator]
latency_median_ms = 0.0
latency_p95_ms = 0.0
logprobs = {str(logprobs).lower()}
quirks = {json.dumps(quirks)}
[generation]
stream = false
"""
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_calibrate_learns_stores_and_prints_the_profile(tmp_path, capsys, sample_data_dir):
    cfg = _config(tmp_path, sample_data_dir, ["think_spaces", "json_reserialised"])
    assert main(["calibrate", cfg, "--samples", "30", "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["verified"] == 30 and report["wrong_kept"] == 0
    names = {s["name"] for s in report["steps"] if s["invertible"]}
    assert {"think_spaces", "json_reserialised"} <= names
    stored = load_profile(tmp_path / "run.db", "sim", report["provider"], "kimi-k2.5")
    assert stored is not None and stored.probes == 30


def test_calibrate_with_logprobs_only_learns_from_their_bytes(tmp_path, capsys, sample_data_dir):
    cfg = _config(tmp_path, sample_data_dir, ["think_spaces"])
    assert main(["calibrate", cfg, "--samples", "12", "--no-token-ids"]) == 0
    out = capsys.readouterr().out
    assert "12 probe(s) with true ids" in out and "think_spaces" in out


def test_calibrate_without_ground_truth_says_so(tmp_path, capsys, sample_data_dir):
    cfg = _config(tmp_path, sample_data_dir, [], logprobs=False)
    assert main(["calibrate", cfg, "--samples", "5", "--no-token-ids"]) == 1
    assert "no profile: the endpoint returned no server ids" in capsys.readouterr().out


def test_calibrate_names_an_unknown_endpoint(tmp_path, capsys, sample_data_dir):
    cfg = _config(tmp_path, sample_data_dir, [])
    assert main(["calibrate", cfg, "--endpoint", "nope"]) == 2
    assert "no endpoint named 'nope'" in capsys.readouterr().err


def _db(tmp_path):
    """A run database: 25 verified samples from provider Good (all exact), 25 from Bad (6 corrupt),
    10 text reconstructions from Good without ground truth (3 with U+FFFD), and a stored profile for Bad."""
    path = tmp_path / "fid.db"
    migrate(path)
    conn = sqlite3.connect(path, isolation_level=None)
    now = time.time()
    conn.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('r', ?, ?)", (now, now))
    ids = struct.pack("<3I", 1, 2, 3)

    def add(k, provider, source, flags):
        pk = conn.execute(
            "INSERT INTO samples (run_id, sample_id, dataset, messages) VALUES (1, ?, 'd', '[]')", (f"s{k}",)
        ).lastrowid
        rid = conn.execute(
            "INSERT INTO responses (run_id, sample_pk, attempt, endpoint, provider, created_at) "
            "VALUES (1, ?, 1, 'openrouter', ?, ?)",
            (pk, provider, now),
        ).lastrowid
        conn.execute(
            "INSERT INTO reconstructions (run_id, sample_pk, response_id, strategy, output_ids, category, "
            "n_tokens, created_at, ids_source, flags) VALUES (1, ?, ?, 'canonical', ?, 'unchecked', 3, ?, ?, ?)",
            (pk, rid, ids, now, source, json.dumps(flags)),
        )
        return pk

    k = 0
    for _ in range(25):
        k += 1
        add(k, "Good", "logprobs", ["text_path:exact"])
    bad_pks = []
    for i in range(25):
        k += 1
        bad_pks.append(add(k, "Bad", "logprobs", ["text_path:text_mismatch" if i < 6 else "text_path:bpe_equivalent"]))
    for i in range(10):
        k += 1
        add(k, "Good", "text", ["replacement_char"] if i < 3 else [])
    conn.close()
    save_profile(path, FidelityProfile("openrouter", "Bad", "kimi-k2.5", 25, {"edge:content.lead": {"-\n": 3, "": 22}}))
    return path, bad_pks[0]


def test_fidelity_reports_per_provider_with_advice(tmp_path, capsys):
    db, first_bad = _db(tmp_path)
    assert main(["fidelity", "--db", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["provider"]: r for r in report["rows"]}
    good = rows["Good"]
    assert (good["samples"], good["measured"], good["exact"], good["suspects"]) == (35, 25, 25, 3)
    # the logprob answers are verified (true ids); the ten text reconstructions had no reference: unchecked
    assert good["verification"] == {"verified": 25, "checked_against_reference": 0, "unchecked": 10}
    bad = rows["Bad"]
    assert (bad["measured"], bad["benign"], bad["corrupt"], bad["example_corrupt_pk"]) == (
        25,
        19,
        {"text_mismatch": 6},
        first_bad,
    )
    assert bad["steps"][0]["name"] == "strip_whitespace" and not bad["steps"][0]["invertible"]
    advice = " | ".join(report["advice"])
    assert "ignore provider 'Bad'" in advice and "pin provider 'Good'" in advice and "24.0%" in advice
    assert "cannot be inverted from text" in advice


def test_fidelity_table_and_a_provider_with_too_few_samples(tmp_path, capsys):
    db, _ = _db(tmp_path)
    assert main(["fidelity", "--db", str(db), "--min-verified", "30"]) == 0
    out = capsys.readouterr().out
    assert "openrouter / Bad" in out and "corrupt by kind: text_mismatch 6" in out
    assert "only 25 measured answer(s) (need 30 to judge)" in out and "ignore provider" not in out


def test_fidelity_names_a_missing_run(tmp_path, capsys):
    db, _ = _db(tmp_path)
    assert main(["fidelity", "--db", str(db), "--run", "nope"]) == 2
    assert "no run named 'nope'; runs here: r" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--max-corrupt-rate", "3"]])
def test_fidelity_rejects_a_bad_rate(tmp_path, capsys, args):
    db, _ = _db(tmp_path)
    assert main(["fidelity", "--db", str(db), *args]) == 2
