"""Ingest: the three prompt formats, reference files, bad lines, idempotence, bounded memory, the CLI verb."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.engine.ingest import ingest_config as _ingest_config
from app.config import load_config
from app.datasets import ReadStats, content_id, iter_prompts, iter_references
from app.errors import InputError
from app.store import queries
from app.store.run_store import RunStore


TOKENIZER = Path(__file__).resolve().parents[2] / "sample_data" / "tokenizer"


async def ingest_config(config, **kw):
    """Open the config's store, ingest it with the one `ingest_config`, close."""
    store = await RunStore.open(config.run.database)
    try:
        return await _ingest_config(store, config, **kw)
    finally:
        await store.close()


def write_lines(path: Path, lines: list[object]) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write((line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)) + "\n")
    return path


CONFIG = """\
[run]
name = "t"
database = "runs.db"

[data]
{reference}

[[data.datasets]]
path = "prompts.jsonl"
format = "{fmt}"

[model]
name = "m"
tokenizer = "{tokenizer}"

[[endpoints]]
base_url = "http://127.0.0.1:1/v1"
"""


def config_file(tmp_path: Path, fmt: str = "openai-messages", reference: bool = False) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG.format(fmt=fmt, reference='reference = "ref.jsonl"' if reference else "", tokenizer=TOKENIZER))
    return path


# ---------------------------------------------------------------------------------------------- readers


def test_openai_messages_prompt_drops_the_final_assistant_turn(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{
        "id": "a",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "answer"},
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }])
    (s,) = list(iter_prompts(path, "openai-messages"))
    assert s.sample_id == "a" and s.dataset == "p"
    assert s.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    assert s.tools == [{"type": "function", "function": {"name": "f"}}]


def test_sharegpt_roles_are_mapped(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{
        "id": 7,
        "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
    }])
    (s,) = list(iter_prompts(path, "sharegpt", dataset="share"))
    assert s.sample_id == "7" and s.dataset == "share"
    assert s.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]


def test_specforge_conversations(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{
        "id": "x", "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    }])
    (s,) = list(iter_prompts(path, "specforge-conversations"))
    assert s.messages == [{"role": "user", "content": "q"}]


def test_sample_without_id_gets_a_stable_content_hash(tmp_path: Path) -> None:
    line = {"messages": [{"role": "user", "content": "héllo"}]}
    a = list(iter_prompts(write_lines(tmp_path / "a.jsonl", [line]), "openai-messages"))
    b = list(iter_prompts(write_lines(tmp_path / "b.jsonl", [line]), "openai-messages"))
    assert a[0].sample_id == b[0].sample_id == content_id(line["messages"], None)
    assert a[0].sample_id.startswith("h-") and len(a[0].sample_id) == 18
    other = list(iter_prompts(write_lines(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "x"}]}]), "openai-messages"))
    assert other[0].sample_id != a[0].sample_id


def test_bad_lines_are_counted_reported_and_skipped(tmp_path: Path) -> None:
    good = {"id": "g", "messages": [{"role": "user", "content": "q"}]}
    path = write_lines(tmp_path / "p.jsonl", [
        good,
        "{not json",
        "",
        [1, 2],
        {"id": "r", "messages": [{"role": "robot", "content": "q"}]},
        {"id": "e", "messages": []},
        {"id": "a", "messages": [{"role": "assistant", "content": "only an answer"}]},
        {"id": ["x"], "messages": [{"role": "user", "content": "q"}]},
        {"id": "g2", "messages": [{"role": "user", "content": "q2"}]},
    ])
    stats = ReadStats()
    got = [s.sample_id for s in iter_prompts(path, "openai-messages", stats=stats)]
    assert got == ["g", "g2"]
    assert stats.bad == 6 and stats.good == 2
    assert stats.examples[0] == f"{path}:2: invalid JSON (Expecting property name enclosed in double quotes at column 2)"
    assert stats.examples[1] == f"{path}:4: expected a JSON object, got list"
    assert stats.examples[2].startswith(f"{path}:5: messages[0].role is 'robot'")
    assert f"{path}:6: 'messages' must be a non-empty list" in stats.examples[3]
    assert f"{path}:7: 'messages' holds no user turn" in stats.examples[4]
    assert len(stats.examples) == 5  # only the first few are kept


def test_strict_reading_raises_on_the_first_bad_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{"id": "g", "messages": [{"role": "user", "content": "q"}]}, "nope"])
    with pytest.raises(InputError, match=r"p\.jsonl:2: invalid JSON"):
        list(iter_prompts(path, "openai-messages"))


def test_non_utf8_line_is_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"id": "\xff", "messages": []}\n')
    stats = ReadStats()
    assert list(iter_prompts(path, "openai-messages", stats=stats)) == []
    assert "not UTF-8" in stats.examples[0]


def test_limit_counts_good_samples(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", ["bad"] + [{"id": i, "messages": [{"role": "user", "content": "q"}]} for i in range(10)])
    assert [s.sample_id for s in iter_prompts(path, "openai-messages", limit=3, stats=ReadStats())] == ["0", "1", "2"]


def test_reference_reader_sglang_style(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "ref.jsonl", [
        {"id": "a", "messages": [{"role": "user", "content": "q"}], "output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "length"}}},
        {"id": "b", "output_ids": [3], "meta_info": {"finish_reason": "stop"}},
        {"id": "c", "output_ids": [1, -1]},
        {"messages": [{"role": "user", "content": "q"}], "output_ids": [9]},
    ])
    stats = ReadStats()
    refs = list(iter_references(path, stats=stats))
    assert [(r.sample_id, r.output_ids, r.finish_reason) for r in refs[:2]] == [("a", (1, 2), "length"), ("b", (3,), "stop")]
    assert refs[2].sample_id == content_id([{"role": "user", "content": "q"}], None)
    assert stats.bad == 1 and "output_ids" in stats.examples[0] and ":3:" in stats.examples[0]


def test_sample_reference_file_reads_cleanly(sample_reference: Path) -> None:
    stats = ReadStats()
    refs = list(iter_references(sample_reference, stats=stats))
    assert stats.bad == 0 and len(refs) > 100
    assert all(r.output_ids for r in refs)


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("prompts.openai.jsonl", "openai-messages"), ("prompts.sharegpt.jsonl", "sharegpt"), ("prompts.specforge.jsonl", "specforge-conversations")],
)
def test_sample_prompt_files_read_cleanly(sample_data_dir: Path, name: str, fmt: str) -> None:
    stats = ReadStats()
    got = list(iter_prompts(sample_data_dir / name, fmt, stats=stats))
    assert stats.bad == 0 and len(got) > 0
    assert all(s.messages[-1]["role"] != "assistant" for s in got)


# ---------------------------------------------------------------------------------------------- ingest


async def test_ingest_config_is_idempotent_and_attaches_references(tmp_path: Path) -> None:
    write_lines(tmp_path / "prompts.jsonl", [{"id": f"s{i}", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(20)] + ["oops"])
    write_lines(tmp_path / "ref.jsonl", [{"id": f"s{i}", "output_ids": [i, i + 1]} for i in range(0, 20, 2)] + [{"id": "zz", "output_ids": [1]}])
    config = load_config(config_file(tmp_path, reference=True))
    first = await ingest_config(config)
    unchanged = await ingest_config(config)  # nothing changed: no file is read again
    assert [f.state for f in unchanged.files] == ["unchanged", "unchanged"] and unchanged.summary() is None
    second = await ingest_config(config, force=True)
    d1, d2 = first.datasets[0], second.datasets[0]
    assert (d1.added, d1.already_present, d1.bad_lines) == (20, 0, 1)
    assert (d2.added, d2.already_present, d2.bad_lines) == (0, 20, 1)
    assert d1.bad_examples == (f"{tmp_path / 'prompts.jsonl'}:21: invalid JSON (Expecting value at column 1)",)
    assert first.reference is not None and (first.reference.attached, first.reference.unmatched) == (10, 1)
    assert second.reference is not None and second.reference.attached == 0

    conn = queries.connect_readonly(tmp_path / "runs.db")
    run = queries.resolve_run(conn, None)
    assert queries.state_counts(conn, run.id)["pending"] == 20
    detail = queries.sample_detail(conn, run.id, "s4")
    assert detail is not None and detail.reference_ids == (4, 5)
    assert run.config["endpoints"][0]["base_url"] == "http://127.0.0.1:1/v1"
    conn.close()


@pytest.mark.parametrize(
    ("fmt", "line"),
    [
        ("openai-messages", {"id": "a", "messages": [{"role": "user", "content": "q"}]}),
        ("sharegpt", {"id": "a", "conversations": [{"from": "human", "value": "q"}]}),
        ("specforge-conversations", {"id": "a", "conversations": [{"role": "user", "content": "q"}]}),
    ],
)
async def test_ingest_each_format(tmp_path: Path, fmt: str, line: dict) -> None:
    write_lines(tmp_path / "prompts.jsonl", [line])
    summary = await ingest_config(load_config(config_file(tmp_path, fmt=fmt)))
    assert summary.datasets[0].added == 1
    store = await RunStore.open(tmp_path / "runs.db")
    run_id = await store.ensure_run("t")
    (leased,) = await store.lease(run_id, 5, 60)
    assert leased.messages == [{"role": "user", "content": "q"}]
    await store.close()


def _big_file(path: Path, n: int) -> Path:
    filler = "lorem ipsum dolor sit amet " * 10
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(
                '{"id": "s%d", "messages": [{"role": "system", "content": "be brief"}, '
                '{"role": "user", "content": "question %d %s"}, {"role": "assistant", "content": "answer"}]}\n'
                % (i, i, filler)
            )
    return path


async def test_100k_line_file_ingests_with_bounded_memory(tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")
    n = 100_000
    path = _big_file(tmp_path / "prompts.jsonl", n)
    file_mb = path.stat().st_size / 1e6
    config = load_config(config_file(tmp_path))
    warm = tmp_path / "warm"  # a small ingest first, so one-time allocations are not counted
    warm.mkdir()
    _big_file(warm / "prompts.jsonl", 10_000)
    await ingest_config(load_config(config_file(warm)))
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = base
    done = threading.Event()

    def sample_rss() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample_rss)
    sampler.start()
    try:
        summary = await ingest_config(config)
    finally:
        done.set()
        sampler.join()
    assert summary.datasets[0].added == n
    growth_mb = (peak - base) / 1e6
    # Holding the file's samples as Python objects at once would take several times its size (~44 MB here);
    # streaming in chunks grows the process by a few MB.
    assert growth_mb < min(40.0, file_mb), f"RSS grew {growth_mb:.1f} MB ingesting a {file_mb:.0f} MB file"


# ---------------------------------------------------------------------------------------------- the verb


def eaglewatch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_ingest_and_status_verbs_json(tmp_path: Path) -> None:
    write_lines(tmp_path / "prompts.jsonl", [{"id": "a", "messages": [{"role": "user", "content": "q"}]}, "bad"])
    cfg = config_file(tmp_path)
    db = tmp_path / "other.db"
    out = eaglewatch("ingest", str(cfg), "--db", str(db), "--run", "named", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["run"] == "named" and payload["database"] == str(db)
    assert payload["added"] == 1 and payload["datasets"][0]["bad_lines"] == 1
    assert out.stderr == ""

    status = eaglewatch("status", "--db", str(db), "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["runs"][0]["name"] == "named"
    assert report["runs"][0]["states"]["pending"] == 1
    assert report["runs"][0]["cost_usd"] == 0
    assert set(report["runs"][0]["verdicts"]) >= {"exact", "text_mismatch", "unchecked"}

    human = eaglewatch("status", "--db", str(db), "--run", "named", cwd=tmp_path)
    assert human.returncode == 0 and "named" in human.stdout and "pending" in human.stdout

    missing = eaglewatch("status", "--db", str(db), "--run", "nope", cwd=tmp_path)
    assert missing.returncode == 2
    assert "has no run named 'nope' (runs: named)" in missing.stderr


def test_ingest_verb_reports_a_bad_config_without_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('[run]\nname = "t"\n')
    out = eaglewatch("ingest", str(cfg), cwd=tmp_path)
    assert out.returncode == 2
    assert "data: required key is missing" in out.stderr
    assert "Traceback" not in out.stderr


def test_status_on_a_non_database_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    db.write_text("hello")
    out = eaglewatch("status", "--db", str(db), cwd=tmp_path)
    assert out.returncode == 2 and "is not an SQLite database" in out.stderr
    assert db.read_text() == "hello"


def test_ingest_into_a_locked_database_fails_clearly(tmp_path: Path) -> None:
    import sqlite3

    write_lines(tmp_path / "prompts.jsonl", [{"id": "a", "messages": [{"role": "user", "content": "q"}]}])
    config = load_config(config_file(tmp_path))
    asyncio.run(ingest_config(config))
    holder = sqlite3.connect(tmp_path / "runs.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        async def go() -> None:
            store = await RunStore.open(tmp_path / "runs.db", busy_timeout_s=0.1)
            await store.close()

        with pytest.raises(InputError, match="is locked by another process"):
            asyncio.run(go())
    finally:
        holder.execute("ROLLBACK")
        holder.close()
