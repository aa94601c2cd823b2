"""Dataset containers beyond JSON lines: JSON arrays (streamed), Parquet, Arrow and `save_to_disk` folders,
`.jsonl.gz` / `.jsonl.zst`; row positions, bad rows named, the per-row format guess, and a resumed ingest."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from app.config import load_config
from app.datasets import ReadStats, container_of, file_fingerprint, iter_prompts
from tests.store.test_ingest import TOKENIZER, _db_counts, _progress_of, ingest_config

CONFIG = """\
[run]
name = "t"
database = "runs.db"

[[data.datasets]]
path = "{path}"
format = "{fmt}"

[model]
name = "m"
tokenizer = "{tokenizer}"

[[endpoints]]
base_url = "http://127.0.0.1:1/v1"
"""


def _config(tmp_path: Path, path: str, fmt: str = "auto") -> Path:
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG.format(path=path, fmt=fmt, tokenizer=TOKENIZER))
    return cfg


def _sharegpt(i: int) -> dict:
    return {
        "id": f"s{i}",
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": f"q {i}"},
            {"from": "gpt", "value": "a"},
        ],
    }


def _messages(i: int) -> dict:
    return {"id": f"m{i}", "messages": [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": "a"}]}


def _save_to_disk(folder: Path, rows: list[dict], shards: int = 2) -> Path:
    """The layout `datasets` writes: Arrow IPC stream files data-0000i-of-0000n.arrow, state.json, dataset_info.json."""
    folder.mkdir()
    table = pa.Table.from_pylist(rows)
    per = -(-len(rows) // shards)
    names = []
    for k in range(shards):
        name = f"data-{k:05d}-of-{shards:05d}.arrow"
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(k * per, per), max_chunksize=7)
        names.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": names, "_split": "train"}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return folder


def test_a_sharegpt_json_array_is_read_row_by_row_with_bad_rows_named(tmp_path: Path) -> None:
    rows = [_sharegpt(i) for i in range(50)]
    rows[10] = {"id": "bad", "conversations": [{"from": "robot", "value": "x"}]}
    rows[20] = 7
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(rows, indent=1))
    assert container_of(path) == "json-array"
    stats = ReadStats()
    got = list(iter_prompts(path, "auto", stats=stats))
    assert len(got) == 48 and stats.bad == 2 and stats.lines == 50
    assert got[0].messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q 0"}]
    assert got[10].line == 12  # the row index, from 1
    assert stats.examples == [
        f"{path}:11: conversations[0].from is 'robot'; expected human, gpt, system or tool",
        f"{path}:21: expected a JSON object, got int",
    ]


def test_a_parquet_file_with_messages_is_read_by_row_group(tmp_path: Path) -> None:
    rows = [_messages(i) for i in range(1000)]
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=128)
    got = list(iter_prompts(path, "auto"))
    assert [s.sample_id for s in got] == [f"m{i}" for i in range(1000)]
    assert got[999].line == 1000 and got[3].messages == [{"role": "user", "content": "q 3"}]


def test_arrow_nulls_of_a_struct_column_do_not_reach_the_messages(tmp_path: Path) -> None:
    rows = [
        {
            "id": "a",
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
                {"role": "tool", "content": "r"},
            ],
        }
    ]
    path = tmp_path / "t.arrow"
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    (s,) = list(iter_prompts(path, "openai-messages"))
    assert s.messages[0] == {"role": "user", "content": "q"}


def test_a_save_to_disk_folder_with_conversations_is_read_across_its_shards(tmp_path: Path) -> None:
    folder = _save_to_disk(tmp_path / "ds", [_sharegpt(i) for i in range(41)], shards=3)
    assert container_of(folder) == "arrow-dir"
    got = list(iter_prompts(folder, "sharegpt"))
    assert len(got) == 41 and got[-1].sample_id == "s40" and got[-1].line == 41
    assert file_fingerprint(folder) == file_fingerprint(folder)
    before = file_fingerprint(folder)
    (folder / "state.json").write_text((folder / "state.json").read_text() + " ")
    assert file_fingerprint(folder) != before


@pytest.mark.parametrize("suffix", ["gz", "zst"])
def test_compressed_json_lines_keep_their_line_numbers(tmp_path: Path, suffix: str) -> None:
    text = "".join(json.dumps(_messages(i)) + "\n" for i in range(100)).replace('"m7"', '"m7",,', 1).encode()
    path = tmp_path / f"p.jsonl.{suffix}"
    path.write_bytes(gzip.compress(text) if suffix == "gz" else zstandard.ZstdCompressor().compress(text))
    stats = ReadStats()
    got = list(iter_prompts(path, "openai-messages", stats=stats))
    assert len(got) == 99 and stats.bad == 1 and stats.examples[0].startswith(f"{path}:8:")
    assert stats.bytes_read == path.stat().st_size


def test_the_format_guess_reads_prompt_response_and_alpaca_rows(tmp_path: Path) -> None:
    path = tmp_path / "mix.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "p", "response": "r"}]), path)
    (a,) = list(iter_prompts(path, "auto"))
    assert a.messages == [{"role": "user", "content": "p"}]
    path2 = tmp_path / "alp.json"
    path2.write_text(json.dumps([{"instruction": "do", "input": "this", "output": "done"}]))
    (b,) = list(iter_prompts(path2, "auto"))
    assert b.messages == [{"role": "user", "content": "do\n\nthis"}]


def test_a_json_array_is_streamed_not_loaded_whole(tmp_path: Path) -> None:
    """Reading a ~40 MB array grows the heap by far less than the file (the bound fails if it were loaded)."""
    import tracemalloc

    path = tmp_path / "big.json"
    pad = "x" * 4000
    with path.open("w") as fh:
        fh.write("[")
        for i in range(10_000):
            fh.write(("," if i else "") + json.dumps({"id": f"b{i}", "messages": [{"role": "user", "content": pad}]}))
        fh.write("]")
    size = path.stat().st_size
    tracemalloc.start()
    n = sum(1 for _ in iter_prompts(path, "openai-messages"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == 10_000 and size > 40_000_000 and peak < size // 8


async def test_a_save_to_disk_ingest_killed_midway_is_finished_on_restart(tmp_path: Path) -> None:
    n = 200_000
    _save_to_disk(
        tmp_path / "ds",
        [{"id": f"s{i}", "messages": [{"role": "user", "content": f"q {i}"}]} for i in range(n)],
        shards=4,
    )
    cfg = _config(tmp_path, "ds")
    db = tmp_path / "runs.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "ingest", str(cfg)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while _progress_of(db, "dataset") == 0:
            assert proc.poll() is None, f"ingest ended before it could be killed: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no progress recorded in 120 s"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert _db_counts(db)[0] < n
    report = await ingest_config(load_config(cfg))
    assert report.complete and report.files[0].state == "resumed"
    assert _db_counts(db)[0] == n
    again = await ingest_config(load_config(cfg))
    assert [f.state for f in again.files] == ["unchanged"]


async def test_mapped_columns_and_categories_reach_the_store(tmp_path: Path) -> None:
    import sqlite3

    rows = [
        {"uid": f"c{i}", "chat": [{"role": "user", "content": f"q {i}"}], "topic": ["code", "math"][i % 2]}
        for i in range(10)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    cfg = _config(tmp_path, "d.parquet")
    cfg.write_text(
        cfg.read_text().replace(
            'format = "auto"', 'format = "auto"\ncolumns = {messages = "chat", id = "uid", category = "topic"}'
        )
    )
    report = await ingest_config(load_config(cfg))
    assert report.files[0].added == 10
    conn = sqlite3.connect(tmp_path / "runs.db")
    got = conn.execute("SELECT sample_id, category FROM samples ORDER BY pk").fetchall()
    conn.close()
    assert got[:3] == [("c0", "code"), ("c1", "math"), ("c2", "code")]


def test_sample_fraction_keeps_the_same_seeded_share_every_time(tmp_path: Path) -> None:
    from app.datasets import RowChoice

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(_messages(i)) + "\n" for i in range(20_000)))
    first = [s.sample_id for s in iter_prompts(path, "auto", choice=RowChoice(fraction=0.25, seed=3))]
    again = [s.sample_id for s in iter_prompts(path, "auto", choice=RowChoice(fraction=0.25, seed=3))]
    other = [s.sample_id for s in iter_prompts(path, "auto", choice=RowChoice(fraction=0.25, seed=4))]
    assert first == again and first != other
    assert abs(len(first) - 5000) < 250
    assert len(list(iter_prompts(path, "auto", limit=100, choice=RowChoice(fraction=0.25)))) == 100


@pytest.mark.parametrize(
    ("text", "script"),
    [
        ("Explain sqlite indexes", "Latin"),
        ("解释一下索引 ok", "CJK"),
        ("Объясни индексы", "Cyrillic"),
        ("اشرح الفهارس", "Arabic"),
        ("12345 !!", "other"),
    ],
)
def test_a_prompts_script_is_guessed_from_most_of_its_letters(text: str, script: str) -> None:
    from app.datasets import script_of

    assert script_of([{"role": "system", "content": "You are kind."}, {"role": "user", "content": text}]) == script


async def test_the_four_shipped_containers_ingest_with_exact_counts_and_bad_rows_named(tmp_path: Path) -> None:
    """A ShareGPT JSON array, a Parquet file with `messages`, a save_to_disk folder with `conversations` and a
    .jsonl.zst, one bad row each, ingested into one run: every good row stored, each bad one named file:row."""
    import sqlite3

    share = [_sharegpt(i) for i in range(30)]
    share[4] = {"id": "bad-share", "conversations": [{"from": "robot", "value": "x"}]}
    (tmp_path / "share.json").write_text(json.dumps(share))
    messages = [{**_messages(i), "id": f"pq{i}"} for i in range(40)]
    messages[9] = {"id": "bad-pq", "messages": [{"role": "assistant", "content": "only an answer"}]}
    pq.write_table(pa.Table.from_pylist(messages), tmp_path / "chat.parquet", row_group_size=16)
    disk = [{**_sharegpt(i), "id": f"d{i}"} for i in range(25)]
    disk[24] = {"id": "bad-disk", "conversations": [{"from": "gpt", "value": "an answer to nothing"}]}
    _save_to_disk(tmp_path / "disk", disk, shards=2)
    lines = [json.dumps({**_messages(i), "id": f"z{i}"}) for i in range(20)]
    lines[0] = lines[0][:-1]  # cut short: not JSON
    (tmp_path / "p.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    cfg = tmp_path / "run.toml"
    text = CONFIG.format(path="share.json", fmt="auto", tokenizer=TOKENIZER)
    for path in ("chat.parquet", "disk", "p.jsonl.zst"):
        text += f'\n[[data.datasets]]\npath = "{path}"\nformat = "auto"\nname = "{path.split(".")[0]}"\n'
    cfg.write_text(text)
    report = await ingest_config(load_config(cfg))
    got = {f.name: (f.added, f.bad_lines, f.bad_examples) for f in report.datasets}
    assert got == {
        "share": (
            29,
            1,
            (f"{tmp_path / 'share.json'}:5: conversations[0].from is 'robot'; expected human, gpt, system or tool",),
        ),
        "chat": (
            39,
            1,
            (f"{tmp_path / 'chat.parquet'}:10: 'messages' holds no user turn before the final assistant turn",),
        ),
        "disk": (
            24,
            1,
            (f"{tmp_path / 'disk'}:25: 'conversations' holds no user turn before the final assistant turn",),
        ),
        "p": (19, 1, got["p"][2]),
    }
    assert got["p"][2][0].startswith(f"{tmp_path / 'p.jsonl.zst'}:1:")
    conn = sqlite3.connect(tmp_path / "runs.db")
    try:
        stored = dict(conn.execute("SELECT dataset, COUNT(*) FROM samples GROUP BY dataset"))
    finally:
        conn.close()
    assert stored == {"share": 29, "chat": 39, "disk": 24, "p": 19}
