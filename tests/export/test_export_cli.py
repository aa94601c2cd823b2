"""`eaglewatch export` on the command line: report, --json, progress on stderr, exit codes."""

from __future__ import annotations

import json

from app.cli import main


def test_export_prints_a_json_report(built_run, tmp_path, capsys):
    code = main(
        [
            "export",
            "--db",
            str(built_run.db),
            "--format",
            "eagle3-shards",
            "--out",
            str(tmp_path),
            "--shard-size",
            "100",
            "--drop-bpe-equivalent",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    report = json.loads(captured.out)
    assert report["format"] == "eagle3-shards"
    assert report["exported"] == sum(c == "exact" for c in built_run.categories.values())
    assert report["files"][-2:] == ["manifest.json", "samples.tsv"]
    assert "export:" in captured.err  # progress goes to stderr


def test_export_text_report_names_what_was_skipped(built_run, tmp_path, capsys):
    code = main(
        [
            "export",
            "--db",
            str(built_run.db),
            "--run",
            "demo",
            "--format",
            "specforge",
            "--out",
            str(tmp_path),
            "--keep-truncated",
            "--max-length",
            "100000",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "exported" in out and "3 corrupt" in out and "truncated" not in out.split("skipped:")[1]
    # the trainer's command, with the cut length set to the longest row
    assert "train with it" in out and "data.prompts_path=" in out
    longest = json.loads((tmp_path / "manifest.json").read_text())["lengths"]["max"]
    assert f"data.max_length={longest}" in out


def test_export_error_is_one_sentence_and_nonzero_exit(tmp_path, capsys):
    code = main(["export", "--db", str(tmp_path / "missing.db"), "--format", "sglang-raw", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code != 0
    assert "eaglewatch export: error:" in err and "no such database" in err and "Traceback" not in err


def test_bad_template_kwargs_are_reported(built_run, tmp_path, capsys):
    code = main(
        [
            "export",
            "--db",
            str(built_run.db),
            "--format",
            "sglang-raw",
            "--out",
            str(tmp_path),
            "--template-kwargs",
            "{thinking",
        ]
    )
    assert code != 0
    assert "--template-kwargs: not valid JSON" in capsys.readouterr().err


def test_help_ends_with_an_example(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = capsys.readouterr().out
    assert "Example:" in out and "eaglewatch export --db" in out


def test_specforge_text_for_k25_warns_on_stderr_and_names_the_exact_route(built_run, tmp_path, capsys):
    code = main(["export", "--db", str(built_run.db), "--format", "specforge-text", "--out", str(tmp_path / "sf")])
    captured = capsys.readouterr()
    assert code == 0 and "exported" in captured.out
    [line] = [x for x in captured.err.splitlines() if x.startswith("warning: ")]
    assert "specforge-text: SpecForge's pre-formatted route" in line and "'<think>'" in line
    assert "data.prompts_path" in line
    # the formats whose consumer reads eaglewatch's ids and masks as written say nothing
    assert main(["export", "--db", str(built_run.db), "--format", "speculators", "--out", str(tmp_path / "s")]) == 0
    assert "warning:" not in capsys.readouterr().err
