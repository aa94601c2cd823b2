"""`--eval-fraction`: rows held out by a stable hash of their prompt's opening, on every format, the same ids on
every re-export."""

from __future__ import annotations

import csv
import json

import pytest

from app.errors import InputError
from app.export import EVAL_DIR, FORMATS, Export, ExportOptions, held_out
from app.export.eval_overlap import split_key


def _ids(folder):
    with (folder / "samples.tsv").open(encoding="utf-8") as fh:
        return {row["id"] for row in csv.DictReader(fh, delimiter="\t")}


def test_held_out_is_a_threshold_on_a_hash_so_a_larger_fraction_holds_out_more_of_the_same():
    keys = [f"sample-{i:05d}" for i in range(4000)]
    small = {k for k in keys if held_out(k, 0.05)}
    large = {k for k in keys if held_out(k, 0.10)}
    assert small <= large
    assert 120 <= len(small) <= 280 and 300 <= len(large) <= 500  # about 5 % and 10 %: a hash, not a shuffle
    assert not any(held_out(k, 0.0) for k in keys)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_holds_out_the_same_ids_in_an_export_folder_of_their_own(built_run, tmp_path, fmt):
    whole = Export(built_run.db, tmp_path / "whole", fmt).run()
    report = Export(built_run.db, tmp_path / "split", fmt, ExportOptions(eval_fraction=0.2)).run()
    train, evals = _ids(tmp_path / "split"), _ids(tmp_path / "split" / EVAL_DIR)
    assert not train & evals and train | evals == _ids(tmp_path / "whole")
    assert (
        evals
        == {sid for sid in _ids(tmp_path / "whole") if held_out(split_key(built_run.records[sid]["messages"]), 0.2)}
        and evals
    )
    assert (report.exported, report.eval_exported, report.skipped) == (whole.exported, len(evals), whole.skipped)
    main = json.loads((tmp_path / "split" / "manifest.json").read_text())
    held = json.loads((tmp_path / "split" / EVAL_DIR / "manifest.json").read_text())
    assert main["split"]["role"] == "train" and main["split"]["eval_dir"] == EVAL_DIR
    assert held["split"]["role"] == "eval" and held["format"] == fmt
    assert (main["counts"]["train"], main["counts"]["eval"]) == (len(train), len(evals))
    assert held["lengths"]["samples"] == len(evals) == held["counts"]["exported"]
    assert not list((tmp_path / "split" / "data").rglob("*.json"))  # data/ still holds data only
    assert f"{EVAL_DIR}/manifest.json" in report.files


def test_a_later_export_with_more_samples_holds_out_the_same_ids(
    tmp_path, sample_reference, sample_tokenizer_dir, sample_cases
):
    from tests.export.conftest import build_run_db

    early = build_run_db(tmp_path / "early.db", sample_reference, sample_tokenizer_dir, sample_cases, limit=120)
    late = build_run_db(tmp_path / "late.db", sample_reference, sample_tokenizer_dir, sample_cases)
    Export(early.db, tmp_path / "a", "eagle3-shards", ExportOptions(eval_fraction=0.1)).run()
    Export(late.db, tmp_path / "b", "speculators", ExportOptions(eval_fraction=0.1)).run()
    first, second = _ids(tmp_path / "a" / EVAL_DIR), _ids(tmp_path / "b" / EVAL_DIR)
    assert first and first <= second
    assert (
        second - first
        == {sid for sid in _ids(tmp_path / "b") | second if held_out(split_key(late.records[sid]["messages"]), 0.1)}
        - first
    )


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_a_fraction_outside_zero_to_one_is_refused(built_run, tmp_path, fraction):
    with pytest.raises(InputError, match=r"--eval-fraction: must be at least 0 and below 1"):
        Export(built_run.db, tmp_path / "out", "eagle3-shards", ExportOptions(eval_fraction=fraction)).run()
    assert not (tmp_path / "out").exists()


def test_the_cli_says_how_many_rows_went_where(built_run, tmp_path, capsys):
    from app.cli import main

    assert (
        main(
            [
                "export",
                "--db",
                str(built_run.db),
                "--format",
                "specforge",
                "--out",
                str(tmp_path / "o"),
                "--eval-fraction",
                "0.25",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    held = len(_ids(tmp_path / "o" / EVAL_DIR))
    assert f"{held} eval in {tmp_path / 'o'}/eval" in out
