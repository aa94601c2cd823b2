"""What was guessed is said: for each dataset whose `format` is "auto" or not set, `config check`, `ingest` and `run`
name its container and the row formats its columns told (`prompts.parquet: Parquet, columns messages →
openai-messages`), so the user can set `format` otherwise; a dataset whose `format` is set gets no such line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from app.config import apply_overrides, load_config
from app.datasets import check_inputs
from tests.store.test_dataset_containers import _messages, _save_to_disk, _sharegpt
from tests.store.test_ingest import TOKENIZER

HEAD = """\
[run]
name = "t"
database = "runs.db"

[model]
name = "m"
tokenizer = "{tokenizer}"

[[endpoints]]
base_url = "http://127.0.0.1:1/v1"
"""


def _config(tmp_path: Path, *datasets: str) -> Path:
    """A config of `datasets`, each the body of one [[data.datasets]] table."""
    text = HEAD.format(tokenizer=TOKENIZER) + "".join(f"\n[[data.datasets]]\n{d}\n" for d in datasets)
    cfg = tmp_path / "run.toml"
    cfg.write_text(text)
    return cfg


def _files(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist([_messages(i) for i in range(30)]), tmp_path / "prompts.parquet")
    rows = [_sharegpt(i) for i in range(8)] + [{"id": f"a{i}", "instruction": "do", "input": "x"} for i in range(2)]
    (tmp_path / "share.json").write_text(json.dumps(rows))
    _save_to_disk(tmp_path / "ds", [_sharegpt(i) for i in range(5)], shards=1)
    (tmp_path / "plain.jsonl").write_text("".join(json.dumps(_messages(i)) + "\n" for i in range(4)))


DATASETS = (
    'path = "prompts.parquet"\nformat = "auto"',
    'path = "share.json"\nformat = "auto"',
    'path = "ds"\nformat = "auto"\nname = "ds"',
    'path = "plain.jsonl"',
    'path = "plain.jsonl"\nformat = "openai-messages"\nname = "set"',
)
READINGS = [
    "data.datasets[0] (prompts): prompts.parquet: Parquet, columns messages → openai-messages (30 rows checked); "
    "set `format` to override",
    "data.datasets[1] (share): share.json: JSON array, columns conversations from/value → sharegpt (8 rows), "
    "columns instruction/input/output → alpaca (2 rows); set `format` to override",
    "data.datasets[2] (ds): ds: datasets save_to_disk folder, columns conversations from/value → sharegpt "
    "(5 rows checked); set `format` to override",
    "data.datasets[3] (plain): plain.jsonl: JSON lines, read as openai-messages (`format` not set: the default); "
    '`format = "auto"` tells it from the columns',
]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "400", "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def test_the_check_says_what_it_guessed_for_auto_and_unset_formats_only(tmp_path: Path) -> None:
    _files(tmp_path)
    config = load_config(_config(tmp_path, *DATASETS))
    assert [str(r) for r in check_inputs(config, require_keys=False).readings] == READINGS
    # a command-line override (a re-parse of every field) keeps an unset format unset
    again = apply_overrides(config, {"run.name": "other"})
    assert [str(r) for r in check_inputs(again, require_keys=False).readings] == READINGS


def test_a_mapped_column_is_named_as_the_file_has_it(tmp_path: Path) -> None:
    rows = [{"id": f"c{i}", "chat": [{"role": "user", "content": "q"}]} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    config = load_config(_config(tmp_path, 'path = "c.parquet"\nformat = "auto"\ncolumns = { messages = "chat" }'))
    (reading,) = check_inputs(config, require_keys=False).readings
    assert reading.text == (
        "c.parquet: Parquet, columns messages (the file's 'chat') → openai-messages (3 rows checked); "
        "set `format` to override"
    )


def test_config_check_prints_the_guesses(tmp_path: Path) -> None:
    _files(tmp_path)
    cfg = _config(tmp_path, *DATASETS)
    shown = _cli(tmp_path, "config", "check", str(cfg))
    assert shown.returncode == 0, shown.stderr
    assert [line for line in shown.stdout.splitlines() if line.startswith("# read ")] == [
        f"# read {r}" for r in READINGS
    ]
    payload = json.loads(_cli(tmp_path, "config", "check", str(cfg), "--json").stdout)
    assert payload["readings"] == READINGS


def test_ingest_prints_the_guesses_and_logs_those_of_the_files_it_read(tmp_path: Path) -> None:
    import sqlite3

    _files(tmp_path)
    cfg = _config(tmp_path, *DATASETS[:2])
    shown = _cli(tmp_path, "ingest", str(cfg))
    assert shown.returncode == 0, shown.stderr
    assert [line.strip() for line in shown.stdout.splitlines() if line.strip().startswith("read ")] == [
        f"read {r}" for r in READINGS[:2]
    ]
    again = json.loads(_cli(tmp_path, "ingest", str(cfg), "--json").stdout)
    assert again["readings"] == READINGS[:2]
    assert [d["state"] for d in again["datasets"]] == ["unchanged", "unchanged"]
    conn = sqlite3.connect(tmp_path / "runs.db")
    try:
        logged = [m for (m,) in conn.execute("SELECT message FROM events WHERE message LIKE 'read data.datasets%'")]
    finally:
        conn.close()
    assert logged == [f"read {r}" for r in READINGS[:2]]  # once: the unchanged files were not read again
