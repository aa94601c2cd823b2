"""bench/export.py's bare loops do the work of the formats they are compared with: each writes the same bytes
as the export of that format (so a ratio never flatters the export by a baseline that writes less)."""

from __future__ import annotations

import pytest

import bench.export as bench
from app.export import Export, ExportOptions


@pytest.fixture(scope="module")
def db(tmp_path_factory, sample_tokenizer_dir):
    path = tmp_path_factory.mktemp("bench") / "bench.db"
    bench.build_db(path, 320, sample_tokenizer_dir)  # every sample-data prompt, some twice
    return path


@pytest.mark.parametrize("fmt", ["specforge-text", "modelopt"])
def test_bare_format_loop_writes_the_export_bytes(db, sample_tokenizer_dir, tmp_path, fmt):
    bare = tmp_path / "bare.jsonl"
    n = bench.bare_format(db, bare, sample_tokenizer_dir, fmt)
    report = Export(db, tmp_path / "out", fmt).run()
    assert n == 320 and report.exported + sum(report.skipped.values()) == n
    [data] = [f for f in report.files if f.startswith("data/")]
    assert bare.read_bytes() == (tmp_path / "out" / data).read_bytes()


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_bare_render_loop_writes_the_pretokenized_rows(db, sample_tokenizer_dir, tmp_path, fmt):
    bare = tmp_path / "bare.jsonl"
    assert bench.bare_render(db, bare, sample_tokenizer_dir) == 320
    report = Export(db, tmp_path / "out", fmt, ExportOptions(shard_size=100000)).run()
    [data] = [f for f in report.files if f.startswith("data/")]
    assert bare.read_bytes() == (tmp_path / "out" / data).read_bytes()
