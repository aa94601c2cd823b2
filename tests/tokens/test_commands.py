"""The validate, audit and reprocess verbs end to end (real files, a real SQLite database in tmp_path)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from app.cli import main


def _cases(sample_data_dir):
    return json.loads((sample_data_dir / "reference_cases.json").read_text())["samples"]


def _validate(*extra, sample_reference, sample_tokenizer_dir):
    return main(
        [
            "validate",
            "--reference",
            str(sample_reference),
            "--tokenizer",
            str(sample_tokenizer_dir),
            "--profile",
            "kimi-k2.5",
            *extra,
        ]
    )


def test_validate_json_counts_every_verdict(capsys, sample_reference, sample_tokenizer_dir, sample_data_dir):
    assert _validate("--json", sample_reference=sample_reference, sample_tokenizer_dir=sample_tokenizer_dir) == 0
    out = json.loads(capsys.readouterr().out)
    cases = _cases(sample_data_dir)
    assert out["total"] == len(cases)
    assert set(out["verdicts"]) == {
        "exact",
        "bpe_equivalent",
        "text_mismatch",
        "structure_mismatch",
        "truncated",
        "unchecked",
    }
    assert out["verdicts"]["text_mismatch"] == 0 and out["verdicts"]["structure_mismatch"] == 0
    non_canonical = sum("non_canonical" in s["kinds"] for s in cases.values())
    assert out["verdicts"]["bpe_equivalent"] == non_canonical > 0


def test_validate_per_sample_verdicts_match_the_case_list(sample_reference, sample_tokenizer_dir, sample_data_dir):
    from app.datasets import iter_references
    from app.tokens import Reconstructor, get_profile, load_tokenizer
    from app.tokens.validation import validate_all

    cases = _cases(sample_data_dir)
    rec = Reconstructor(get_profile("kimi-k2.5"), load_tokenizer(sample_tokenizer_dir))
    results = validate_all(rec, [(r.sample_id, r.output_ids) for r in iter_references(sample_reference)])
    for r in results:
        kinds = cases[r.sample_id]["kinds"]
        if "non_canonical" in kinds:
            want = {"bpe_equivalent", "truncated"} if "truncated" in kinds else {"bpe_equivalent"}
        elif "truncated" in kinds:
            want = {"truncated"}
        else:
            want = {"exact"}
        assert r.verdict.category in want, (r.sample_id, kinds, r.verdict.explanation)


def test_validate_table_names_the_worst_examples(capsys, sample_reference, sample_tokenizer_dir):
    assert _validate(sample_reference=sample_reference, sample_tokenizer_dir=sample_tokenizer_dir) == 0
    out = capsys.readouterr().out
    assert "bpe_equivalent" in out and "worst examples:" in out and "benign: same text" in out


def test_validate_exits_4_beyond_a_threshold(tmp_path, capsys, sample_tokenizer_dir):
    from app.tokens import load_tokenizer

    tok = load_tokenizer(sample_tokenizer_dir)
    # A reference whose marker the model spelled as ordinary tokens cannot round-trip: a structure mismatch.
    ids = tok.encode("r</think>see ") + tok.encode_ordinary("</think>") + tok.encode("<|im_end|>")
    ref = tmp_path / "ref.jsonl"
    ref.write_text(
        json.dumps({"id": "s1", "output_ids": ids})
        + "\n"
        + json.dumps({"id": "s2", "output_ids": tok.encode("a</think>b<|im_end|>")})
        + "\n"
    )
    code = main(
        [
            "validate",
            "--reference",
            str(ref),
            "--tokenizer",
            str(sample_tokenizer_dir),
            "--max-structure-mismatch-rate",
            "0.1",
        ]
    )
    assert code == 4
    assert "structure_mismatch rate 0.5000 > 0.1" in capsys.readouterr().err


def test_validate_rejects_ids_outside_the_vocabulary(tmp_path, capsys, sample_tokenizer_dir):
    ref = tmp_path / "ref.jsonl"
    ref.write_text(json.dumps({"id": "s1", "output_ids": [1, 999999]}) + "\n")
    assert main(["validate", "--reference", str(ref), "--tokenizer", str(sample_tokenizer_dir)]) == 2
    assert "ref.jsonl:1: sample s1: output id 999999 is outside" in capsys.readouterr().err


def test_validate_stores_results_and_reprocess_reconstructs_them(
    tmp_path, capsys, sample_reference, sample_tokenizer_dir
):
    db = tmp_path / "v.db"
    assert (
        _validate(
            "--db", str(db), "--json", sample_reference=sample_reference, sample_tokenizer_dir=sample_tokenizer_dir
        )
        == 0
    )
    verdicts = json.loads(capsys.readouterr().out)["verdicts"]
    conn = sqlite3.connect(db)
    stored = dict(conn.execute("SELECT category, COUNT(*) FROM reconstructions GROUP BY category").fetchall())
    assert stored == {k: v for k, v in verdicts.items() if v}
    # Corrupt one stored reconstruction; reprocess must reconstruct it from the stored response.
    conn.execute("UPDATE reconstructions SET category = 'text_mismatch', output_ids = x'00000000' WHERE id = 1")
    conn.commit()
    conn.close()
    assert main(["reprocess", "--db", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (
        out["before"]["text_mismatch"] == 1
        and out["after"] == verdicts
        and out["reprocessed"] == sum(verdicts.values())
    )


def test_reprocess_names_the_runs_when_none_matches(tmp_path, capsys, sample_reference, sample_tokenizer_dir):
    db = tmp_path / "v.db"
    _validate("--db", str(db), "--json", sample_reference=sample_reference, sample_tokenizer_dir=sample_tokenizer_dir)
    capsys.readouterr()
    assert main(["reprocess", "--db", str(db), "--run", "nope"]) == 2
    assert "no run named 'nope'" in capsys.readouterr().err


def test_audit_of_the_sample_tokenizer_passes(capsys, sample_tokenizer_dir):
    assert main(["audit", "--tokenizer", str(sample_tokenizer_dir), "--profile", "kimi-k2.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_audit_bad_constants_file_is_a_sentence(tmp_path, capsys, sample_tokenizer_dir):
    consts = tmp_path / "c.json"
    consts.write_text('{"<|im_end|>": "x"}')
    assert main(["audit", "--tokenizer", str(sample_tokenizer_dir), "--constants", str(consts)]) == 2
    assert "expected an integer token id" in capsys.readouterr().err


@pytest.mark.kimi
def test_audit_cli_rejects_163533(tmp_path, capsys, kimi_tokenizer_dir):
    consts = tmp_path / "c.json"
    consts.write_text('{"<|im_end|>": 163533}')
    assert (
        main(["audit", "--tokenizer", str(kimi_tokenizer_dir), "--profile", "kimi-k2.5", "--constants", str(consts)])
        == 1
    )
    captured = capsys.readouterr()
    assert "decodes to 'chas'" in captured.out and "audit failed" in captured.err


def test_validate_measures_production_and_shows_the_assisted_bound(capsys, sample_reference, sample_tokenizer_dir):
    quirks = ("--quirks", "think_spaces,no_content", "--json")
    assert (
        _validate(*quirks, "--assisted", sample_reference=sample_reference, sample_tokenizer_dir=sample_tokenizer_dir)
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["regime"] == "production" and out["verdicts"]["text_mismatch"] > 0  # no profile: nothing inverted
    assert out["assisted"]["verdicts"]["text_mismatch"] == 0  # the reference-assisted upper bound
    assert (
        _validate(
            *quirks, "--calibrate", "75", sample_reference=sample_reference, sample_tokenizer_dir=sample_tokenizer_dir
        )
        == 0
    )
    calibrated = json.loads(capsys.readouterr().out)
    assert calibrated["wrong_kept"] == 0 < calibrated["suspects"]
    assert calibrated["verdicts"]["text_mismatch"] < out["verdicts"]["text_mismatch"]
    assert {s["name"] for s in calibrated["fidelity"]["steps"]} >= {"think_spaces", "no_content"}


def test_validate_table_shows_both_regimes_and_the_learned_steps(capsys, sample_reference, sample_tokenizer_dir):
    assert (
        _validate(
            "--quirks",
            "json_reserialised",
            "--calibrate",
            "40",
            "--assisted",
            sample_reference=sample_reference,
            sample_tokenizer_dir=sample_tokenizer_dir,
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "production" in out and "assisted" in out and "json_reserialised" in out and "corrupt, not flagged" in out


def test_validate_rejects_an_unknown_quirk(capsys, sample_reference, sample_tokenizer_dir):
    assert (
        _validate("--quirks", "nope", sample_reference=sample_reference, sample_tokenizer_dir=sample_tokenizer_dir) == 2
    )
    assert "unknown server step(s) nope" in capsys.readouterr().err
