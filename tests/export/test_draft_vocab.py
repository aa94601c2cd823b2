"""`eaglewatch vocab`: the N most frequent loss tokens as the draft vocabulary, in every trainer's file layout,
with the share of the loss each size covers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.cli import main
from app.errors import InputError
from app.export import Export, ExportOptions
from app.export.draft_vocab import LossTokenCounts, choose, coverage_table


def _counts(ids):
    counts = LossTokenCounts()
    counts.add(ids, None)
    return counts


def test_the_most_frequent_tokens_are_chosen_ties_by_the_lower_id():
    counts = _counts([5, 5, 5, 3, 3, 9, 9, 1]).counts  # 5 x3, 3 x2, 9 x2, 1 x1
    vocab = choose(counts, 2, 12)
    assert vocab.token_ids.tolist() == [3, 5] and vocab.d2t.tolist() == [3, 4]
    assert np.flatnonzero(vocab.t2d).tolist() == [3, 5] and vocab.t2d.shape == (12,)
    assert (vocab.covered, vocab.loss_tokens) == (5, 8)


def test_fewer_tokens_seen_than_asked_fills_with_the_lowest_unused_ids():
    vocab = choose(_counts([5, 5, 3, 9]).counts, 5, 12)
    assert vocab.token_ids.tolist() == [0, 1, 3, 5, 9] and vocab.coverage == 1.0
    assert (vocab.token_ids == np.arange(5) + vocab.d2t).all()


def test_only_masked_ids_are_counted():
    counts = LossTokenCounts()
    counts.add([7, 8, 9, 8], [0, 1, 1, 1])
    assert counts.as_dict() == {8: 2, 9: 1} and counts.rows == 1


def test_coverage_table_is_the_share_of_the_loss_the_top_n_hold():
    counts = _counts([1] * 6 + [2] * 3 + [3]).counts
    assert coverage_table(counts, [1, 2, 8]) == [(1, 6, 0.6), (2, 9, 0.9), (8, 10, 1.0)]


@pytest.mark.parametrize(
    ("size", "target", "error"),
    [
        (0, 10, "at least one token"),
        (11, 10, "exceeds the target vocabulary"),
        (2, 5, "token id 9 is in the loss"),
    ],
)
def test_impossible_sizes_are_refused(size, target, error):
    with pytest.raises(InputError, match=error):
        choose(_counts([1, 9]).counts, size, target)


def test_vocab_on_the_demo_run_writes_every_trainers_files_and_reports_coverage(built_run, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    out = tmp_path / "vocab"
    assert main(["vocab", "--db", str(built_run.db), "--size", "1024", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    want = LossTokenCounts()
    report = Export(built_run.db, tmp_path / "shards", "eagle3-shards").run()
    for sid, ids in built_run.exported_ids.items():
        if built_run.categories[sid] in ("exact", "bpe_equivalent"):
            want.add(ids, None)
    vocab = choose(want.counts, 1024, 6160)
    assert f"1024 of 6160 target tokens covers {vocab.coverage:.2%} of the {report.loss_tokens} loss tokens" in printed
    for size in (8192, 16384, 32768, 65536):
        assert f"{size:>8}" in printed
    assert np.array_equal(np.load(out / "d2t-1024.npy"), vocab.d2t) and np.load(out / "d2t-1024.npy").dtype == np.int64
    assert np.array_equal(np.load(out / "t2d-1024.npy"), vocab.t2d) and np.load(out / "t2d-1024.npy").dtype == bool
    assert torch.load(out / "token_freq.pt", weights_only=True) == want.as_dict()
    mapping = torch.load(out / "vocab_mapping-1024.pt", weights_only=True)
    assert mapping["d2t"].dtype == torch.int64 and mapping["t2d"].dtype == torch.bool
    assert torch.equal(mapping["d2t"], torch.load(out / "d2t-1024.pt", weights_only=True))
    summary = json.loads((out / "vocab.json").read_text())
    assert summary["draft_vocab_size"] == 1024 and summary["loss_tokens"] == report.loss_tokens
    assert [row["size"] for row in summary["table"]] == [1024, 8192, 16384, 32768, 65536]


def test_vocab_of_an_export_counts_its_training_rows_only(built_run, tmp_path, capsys):
    pytest.importorskip("torch")
    report = Export(built_run.db, tmp_path / "x", "specforge", ExportOptions(eval_fraction=0.2)).run()
    assert main(["vocab", str(tmp_path / "x"), "--size", "512", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == report.exported - report.eval_exported
    assert summary["out"] == str(tmp_path / "x" / "vocab") and (tmp_path / "x" / "vocab" / "d2t-512.pt").exists()


def test_vocab_refuses_an_export_without_ids_and_names_what_works(built_run, tmp_path, capsys):
    Export(built_run.db, tmp_path / "mo", "modelopt").run()
    assert main(["vocab", str(tmp_path / "mo"), "--size", "64"]) == 2
    err = capsys.readouterr().err
    assert "a 'modelopt' export holds no token ids" in err and "--db" in err


def test_vocab_with_no_flags_on_the_demo_run_writes_the_files_beside_the_database(built_run, capsys):
    """A new user's first call: no --size (the demo's 6,160-token vocabulary is below the default 32,000, so the
    draft vocabulary is all of it, said so) and no --out (the files go beside the database)."""
    pytest.importorskip("torch")
    assert main(["vocab", "--db", str(built_run.db)]) == 0
    printed = capsys.readouterr().out
    out = built_run.db.parent / f"{built_run.db.stem}-vocab"
    assert "fewer than the default 32000" in printed and "6160 of 6160 target tokens covers 100.00%" in printed
    assert (out / "d2t-6160.npy").exists() and (out / "t2d-6160.npy").exists() and (out / "token_freq.pt").exists()
    assert f"wrote {out}/" in printed


def _vocab_without_torch(tmp_path, *args):
    import subprocess
    import sys

    from tests.torchless import torchless_env

    return subprocess.run(
        [sys.executable, "-m", "app.cli", "vocab", *args],
        capture_output=True,
        text=True,
        env=torchless_env(tmp_path / "no-torch"),
        timeout=300,
    )


def test_vocab_without_torch_writes_what_needs_none_and_says_what_it_skipped(built_run, tmp_path):
    out = tmp_path / "vocab"
    proc = _vocab_without_torch(tmp_path, "--db", str(built_run.db), "--size", "512", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["d2t-512.npy", "t2d-512.npy", "vocab.json"]
    assert (
        "skipped token_freq.pt (speculators), vocab_mapping-512.pt (specforge), d2t-512.pt (modelopt): torch is "
        "not installed; pip install -e '.[extract]' brings it"
    ) in proc.stdout
    assert "Traceback" not in proc.stderr


def test_vocab_without_torch_for_speculators_needs_no_torch(built_run, tmp_path):
    out = tmp_path / "vocab"
    proc = _vocab_without_torch(
        tmp_path, "--db", str(built_run.db), "--size", "512", "--out", str(out), "--trainer", "speculators"
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "d2t-512.npy").exists() and "skipped token_freq.pt (speculators)" in proc.stdout


@pytest.mark.parametrize("trainer, reads", [("specforge", "vocab_mapping-512.pt"), ("modelopt", "d2t-512.pt")])
def test_vocab_without_torch_fails_for_a_trainer_that_reads_a_pt_file(built_run, tmp_path, trainer, reads):
    out = tmp_path / "vocab"
    proc = _vocab_without_torch(
        tmp_path, "--db", str(built_run.db), "--size", "512", "--out", str(out), "--trainer", trainer
    )
    assert proc.returncode != 0
    assert f"but {trainer} read(s) {reads}, which need torch: pip install -e '.[extract]'" in proc.stderr
    assert (out / "d2t-512.npy").exists() and "Traceback" not in proc.stderr
