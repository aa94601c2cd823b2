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

from app.config import load_config
from app.datasets import ReadStats, content_id, iter_prompts, iter_references
from app.engine.work.config_ingest import ingest_config as _ingest_config
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
    path.write_text(
        CONFIG.format(fmt=fmt, reference='reference = "ref.jsonl"' if reference else "", tokenizer=TOKENIZER)
    )
    return path


# ---------------------------------------------------------------------------------------------- readers


def test_openai_messages_prompt_drops_the_final_assistant_turn(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "p.jsonl",
        [
            {
                "id": "a",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "answer"},
                ],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            }
        ],
    )
    (s,) = list(iter_prompts(path, "openai-messages"))
    assert s.sample_id == "a" and s.dataset == "p"
    assert s.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    assert s.tools == [{"type": "function", "function": {"name": "f"}}]


def test_sharegpt_roles_are_mapped(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "p.jsonl",
        [
            {
                "id": 7,
                "conversations": [
                    {"from": "system", "value": "s"},
                    {"from": "human", "value": "q"},
                    {"from": "gpt", "value": "a"},
                ],
            }
        ],
    )
    (s,) = list(iter_prompts(path, "sharegpt", dataset="share"))
    assert s.sample_id == "7" and s.dataset == "share"
    assert s.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]


def test_specforge_conversations(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "p.jsonl",
        [
            {
                "id": "x",
                "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            }
        ],
    )
    (s,) = list(iter_prompts(path, "specforge-conversations"))
    assert s.messages == [{"role": "user", "content": "q"}]


def test_sample_without_id_gets_a_stable_content_hash(tmp_path: Path) -> None:
    line = {"messages": [{"role": "user", "content": "héllo"}]}
    a = list(iter_prompts(write_lines(tmp_path / "a.jsonl", [line]), "openai-messages"))
    b = list(iter_prompts(write_lines(tmp_path / "b.jsonl", [line]), "openai-messages"))
    assert a[0].sample_id == b[0].sample_id == content_id(line["messages"], None)
    assert a[0].sample_id.startswith("h-") and len(a[0].sample_id) == 18
    other = list(
        iter_prompts(
            write_lines(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "x"}]}]), "openai-messages"
        )
    )
    assert other[0].sample_id != a[0].sample_id


def test_bad_lines_are_counted_reported_and_skipped(tmp_path: Path) -> None:
    good = {"id": "g", "messages": [{"role": "user", "content": "q"}]}
    path = write_lines(
        tmp_path / "p.jsonl",
        [
            good,
            "{not json",
            "",
            [1, 2],
            {"id": "r", "messages": [{"role": "robot", "content": "q"}]},
            {"id": "e", "messages": []},
            {"id": "a", "messages": [{"role": "assistant", "content": "only an answer"}]},
            {"id": ["x"], "messages": [{"role": "user", "content": "q"}]},
            {"id": "g2", "messages": [{"role": "user", "content": "q2"}]},
        ],
    )
    stats = ReadStats()
    got = [s.sample_id for s in iter_prompts(path, "openai-messages", stats=stats)]
    assert got == ["g", "g2"]
    assert stats.bad == 6 and stats.good == 2
    assert stats.examples[0] == f"{path}:2:2: invalid JSON (Expecting property name enclosed in double quotes)"
    assert stats.examples[1] == f"{path}:4: expected a JSON object, got list"
    assert stats.examples[2].startswith(f"{path}:5: messages[0].role is 'robot'")
    assert f"{path}:6: 'messages' must be a non-empty list" in stats.examples[3]
    assert f"{path}:7: 'messages' holds no user turn" in stats.examples[4]
    assert len(stats.examples) == 5  # only the first few are kept


def test_strict_reading_raises_on_the_first_bad_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{"id": "g", "messages": [{"role": "user", "content": "q"}]}, "nope"])
    with pytest.raises(InputError, match=r"p\.jsonl:2:1: invalid JSON"):
        list(iter_prompts(path, "openai-messages"))


def test_non_utf8_line_is_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"id": "\xff", "messages": []}\n')
    stats = ReadStats()
    assert list(iter_prompts(path, "openai-messages", stats=stats)) == []
    assert "not UTF-8" in stats.examples[0]


def test_limit_counts_good_samples(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "p.jsonl", ["bad"] + [{"id": i, "messages": [{"role": "user", "content": "q"}]} for i in range(10)]
    )
    assert [s.sample_id for s in iter_prompts(path, "openai-messages", limit=3, stats=ReadStats())] == ["0", "1", "2"]


def test_reference_reader_sglang_style(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "ref.jsonl",
        [
            {
                "id": "a",
                "messages": [{"role": "user", "content": "q"}],
                "output_ids": [1, 2],
                "meta_info": {"finish_reason": {"type": "length"}},
            },
            {"id": "b", "output_ids": [3], "meta_info": {"finish_reason": "stop"}},
            {"id": "c", "output_ids": [1, -1]},
            {"messages": [{"role": "user", "content": "q"}], "output_ids": [9]},
        ],
    )
    stats = ReadStats()
    refs = list(iter_references(path, stats=stats))
    assert [(r.sample_id, r.output_ids, r.finish_reason) for r in refs[:2]] == [
        ("a", (1, 2), "length"),
        ("b", (3,), "stop"),
    ]
    assert refs[2].sample_id == content_id([{"role": "user", "content": "q"}], None)
    assert stats.bad == 1 and "output_ids" in stats.examples[0] and ":3:" in stats.examples[0]


def test_sample_reference_file_reads_cleanly(sample_reference: Path) -> None:
    stats = ReadStats()
    refs = list(iter_references(sample_reference, stats=stats))
    assert stats.bad == 0 and len(refs) > 100
    assert all(r.output_ids for r in refs)


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("prompts.openai.jsonl", "openai-messages"),
        ("prompts.sharegpt.jsonl", "sharegpt"),
        ("prompts.specforge.jsonl", "specforge-conversations"),
    ],
)
def test_sample_prompt_files_read_cleanly(sample_data_dir: Path, name: str, fmt: str) -> None:
    stats = ReadStats()
    got = list(iter_prompts(sample_data_dir / name, fmt, stats=stats))
    assert stats.bad == 0 and len(got) > 0
    assert all(s.messages[-1]["role"] != "assistant" for s in got)


# ---------------------------------------------------------------------------------------------- ingest


async def test_ingest_config_is_idempotent_and_attaches_references(tmp_path: Path) -> None:
    write_lines(
        tmp_path / "prompts.jsonl",
        [{"id": f"s{i}", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(20)] + ["oops"],
    )
    write_lines(
        tmp_path / "ref.jsonl",
        [{"id": f"s{i}", "output_ids": [i, i + 1]} for i in range(0, 20, 2)] + [{"id": "zz", "output_ids": [1]}],
    )
    config = load_config(config_file(tmp_path, reference=True))
    first = await ingest_config(config)
    unchanged = await ingest_config(config)  # nothing changed: no file is read again
    assert [f.state for f in unchanged.files] == ["unchanged", "unchanged"] and unchanged.summary() is None
    second = await ingest_config(config, force=True)
    d1, d2 = first.datasets[0], second.datasets[0]
    assert (d1.added, d1.already_present, d1.bad_lines) == (20, 0, 1)
    assert (d2.added, d2.already_present, d2.bad_lines) == (0, 20, 1)
    assert d1.bad_examples == (f"{tmp_path / 'prompts.jsonl'}:21:1: invalid JSON (Expecting value)",)
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


async def _rss_growth_mb(config) -> tuple[object, float]:
    """Ingest `config`, sampling this process's RSS every 5 ms: (the report, peak growth in MB)."""
    import psutil

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
    return summary, (peak - base) / 1e6


async def test_100k_line_file_ingests_with_bounded_memory(tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    n = 100_000
    path = _big_file(tmp_path / "prompts.jsonl", n)
    file_mb = path.stat().st_size / 1e6
    config = load_config(config_file(tmp_path))
    warm = tmp_path / "warm"  # a small ingest first, so one-time allocations are not counted
    warm.mkdir()
    _big_file(warm / "prompts.jsonl", 10_000)
    await ingest_config(load_config(config_file(warm)))
    summary, growth_mb = await _rss_growth_mb(config)
    assert summary.datasets[0].added == n
    # Holding the file's samples as Python objects at once would take several times its size (~44 MB here);
    # streaming in chunks grows the process by a few MB.
    assert growth_mb < min(40.0, file_mb), f"RSS grew {growth_mb:.1f} MB ingesting a {file_mb:.0f} MB file"


async def test_long_prompts_are_ingested_in_chunks_of_bounded_bytes(tmp_path: Path) -> None:
    """3,000 prompts of 20 KB (a 60 MB JSON array) fit one 5,000-row chunk: held at once (the samples, their JSON,
    SQLite's copy) they grew the process by ~250 MB. Chunks cut at INGEST_CHUNK_BYTES keep it to ~15-30 MB."""
    pytest.importorskip("psutil")
    pad = "lorem ipsum dolor sit amet " * 740
    rows = [{"id": f"long{i}", "messages": [{"role": "user", "content": f"{i} {pad}"}]} for i in range(3000)]
    (tmp_path / "prompts.json").write_text(json.dumps(rows))
    del rows
    cfg = config_file(tmp_path)
    cfg.write_text(cfg.read_text().replace('"prompts.jsonl"', '"prompts.json"'))
    config = load_config(cfg)
    warm = tmp_path / "warm"
    warm.mkdir()
    _big_file(warm / "prompts.jsonl", 10_000)
    await ingest_config(load_config(config_file(warm)))
    summary, growth_mb = await _rss_growth_mb(config)
    assert summary.datasets[0].added == 3000
    assert growth_mb < 60.0, f"RSS grew {growth_mb:.1f} MB ingesting 60 MB of long prompts"


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


# ------------------------------------------------------------------ resumable ingest, per-file fingerprints


def _quick_file(path: Path, n: int, start: int = 0) -> Path:
    with path.open("a", encoding="utf-8") as fh:
        for i in range(start, start + n):
            fh.write('{"id": "s%d", "messages": [{"role": "user", "content": "q %d"}]}\n' % (i, i))
    return path


def _ref_file(path: Path, n: int) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write('{"id": "s%d", "output_ids": [%d, %d]}\n' % (i, i % 6000, (i + 1) % 6000))
    return path


def _db_counts(db: Path) -> tuple[int, int]:
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT COUNT(*), COUNT(reference_ids) FROM samples").fetchone()
    finally:
        conn.close()


def _progress_of(db: Path, role: str) -> int:
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.2)
        try:
            row = conn.execute("SELECT lines_done FROM ingest_files WHERE role = ?", (role,)).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
    return row[0] if row else 0


@pytest.mark.parametrize("phase", ["dataset", "reference"])
async def test_sigkill_during_the_first_ingest_is_finished_on_restart(tmp_path: Path, phase: str) -> None:
    """A real `eaglewatch ingest` process SIGKILLed mid-file: the run is marked half-ingested, the engine's
    question says so, and the restart ends with every line and every reference id."""
    import os
    import signal

    from app.store.ingest_ops import ingest_status, require_complete

    n = 200_000
    _quick_file(tmp_path / "prompts.jsonl", n)
    _ref_file(tmp_path / "ref.jsonl", n)
    cfg = config_file(tmp_path, reference=True)
    db = tmp_path / "runs.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "ingest", str(cfg)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while _progress_of(db, phase) == 0:  # at least one chunk of that file committed
            assert proc.poll() is None, f"ingest ended before it could be killed: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no progress recorded in 120 s"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    samples, with_refs = _db_counts(db)
    assert (samples < n) if phase == "dataset" else (samples == n and with_refs < n)

    conn = queries.connect_readonly(db)
    run = queries.resolve_run(conn, None)
    status = ingest_status(conn, run.id)
    conn.close()
    assert not status.complete and [f.role for f in status.incomplete] == [phase]
    with pytest.raises(InputError, match="did not finish"):
        require_complete(status)
    require_complete(status, allow_partial=True)  # told to: no error

    report = await ingest_config(load_config(cfg))
    assert report.complete
    states = {f.role: f.state for f in report.files}
    assert states[phase] == "resumed"
    assert _db_counts(db) == (n, n)
    again = await ingest_config(load_config(cfg))
    assert [f.state for f in again.files] == ["unchanged", "unchanged"]


async def test_a_failed_file_leaves_the_run_half_ingested_unless_partial_is_allowed(tmp_path: Path) -> None:
    _quick_file(tmp_path / "prompts.jsonl", 10)
    config = load_config(config_file(tmp_path))
    await ingest_config(config)
    (tmp_path / "prompts.jsonl").unlink()
    # the inputs check refuses before anything is written
    with pytest.raises(InputError, match=r"data\.datasets\[0\]\.path: .* does not exist"):
        await ingest_config(config)
    partial = await ingest_config(config, check=False, allow_partial=True)
    assert [f.state for f in partial.files] == ["failed"] and "no such file" in (partial.files[0].error or "")


async def test_inputs_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path))  # prompts.jsonl does not exist
    with pytest.raises(InputError, match=r"run\.toml: data\.datasets\[0\]\.path: "):
        await ingest_config(config)
    conn = __import__("sqlite3").connect(tmp_path / "runs.db")
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0  # no run was even created
    conn.close()


async def test_changed_file_adds_only_the_new_lines(tmp_path: Path) -> None:
    path = _quick_file(tmp_path / "prompts.jsonl", 30)
    config = load_config(config_file(tmp_path))
    await ingest_config(config)
    _quick_file(path, 5, start=30)
    report = await ingest_config(config)
    d = report.datasets[0]
    assert (d.state, d.added, d.already_present, d.conflicts) == ("ingested", 5, 30, 0)


async def test_duplicate_ids_with_other_content_are_reported_per_line(tmp_path: Path) -> None:
    def line(i, content, tools=None):
        obj = {"id": i, "messages": [{"role": "user", "content": content}]}
        if tools is not None:
            obj["tools"] = tools
        return obj

    path = write_lines(
        tmp_path / "prompts.jsonl",
        [
            line(7, "first"),
            line("7", "second"),  # line 2: the same id as a string, other content
            line("a", "same"),
            line("a", "same"),  # line 4: an identical duplicate: already present
            line("b", "x"),
            line("b", "x", tools=[]),  # line 6: same prompt, other tools
        ],
    )
    report = await ingest_config(load_config(config_file(tmp_path)))
    d = report.datasets[0]
    assert (d.added, d.already_present, d.conflicts) == (3, 1, 2)
    assert d.conflict_examples == (
        f"{path}:2: id '7' already held with a different prompt or tools; skipped (give the line a distinct id)",
        f"{path}:6: id 'b' already held with a different prompt or tools; skipped (give the line a distinct id)",
    )
    # the same conflicts are counted again on a forced re-read; the stored prompt is the first one
    again = (await ingest_config(load_config(config_file(tmp_path)), force=True)).datasets[0]
    assert (again.added, again.already_present, again.conflicts) == (0, 4, 2)
    conn = queries.connect_readonly(tmp_path / "runs.db")
    assert (
        conn.execute("SELECT messages FROM samples WHERE sample_id = '7'").fetchone()[0]
        == '[{"role":"user","content":"first"}]'
    )
    conn.close()


async def test_a_second_dataset_holding_an_id_is_a_conflict_by_line(tmp_path: Path) -> None:
    a = write_lines(tmp_path / "a.jsonl", [{"id": "x", "messages": [{"role": "user", "content": "q"}]}])
    b = write_lines(tmp_path / "b.jsonl", ["bad", {"id": "x", "messages": [{"role": "user", "content": "q"}]}])
    cfg = config_file(tmp_path)
    cfg.write_text(
        cfg.read_text().replace(
            'path = "prompts.jsonl"\nformat = "openai-messages"\n',
            'path = "a.jsonl"\n\n[[data.datasets]]\npath = "b.jsonl"\n',
        )
    )
    report = await ingest_config(load_config(cfg))
    assert a.exists()
    (_, second) = report.datasets
    assert second.conflicts == 1 and second.conflict_examples[0].startswith(f"{b}:2: id 'x' held by dataset 'a'")


async def test_bad_reference_rows_are_refused_at_ingest_by_file_and_line(tmp_path: Path) -> None:
    _quick_file(tmp_path / "prompts.jsonl", 4)
    ref = write_lines(
        tmp_path / "ref.jsonl",
        [
            {"id": "s0", "output_ids": [1, 2]},
            {"id": "s1", "output_ids": [1, 99_999_999]},  # beyond the sample tokenizer's vocabulary
            {"id": "s2", "output_ids": [1, "2"]},  # not an integer
            {"id": "s3", "output_ids": {"ids": [1]}},  # wrong shape
        ],
    )
    report = await ingest_config(load_config(config_file(tmp_path, reference=True)))
    r = report.reference
    assert r is not None and (r.attached, r.bad_lines) == (1, 3)
    assert r.bad_examples[0].startswith(f"{ref}:2: output id 99999999 is outside the tokenizer's vocabulary (size ")
    assert r.bad_examples[1].startswith(f"{ref}:3: 'output_ids' must be a list")
    assert r.bad_examples[2].startswith(f"{ref}:4: 'output_ids' must be a list")
    assert _db_counts(tmp_path / "runs.db") == (4, 1)


def test_the_conflict_check_walks_the_unique_index(tmp_path: Path) -> None:
    """One index lookup per line of the chunk, never a scan of the run's samples (which made re-ingest quadratic)."""
    import sqlite3

    from app.store.db import migrate
    from app.store.ingest_ops import _CONFLICTS

    db = tmp_path / "runs.db"
    migrate(db)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('t', 0, 0)")
    conn.executemany(
        "INSERT INTO samples (run_id, sample_id, dataset, messages) VALUES (1, ?, 'd', '[]')",
        [(f"s{i}",) for i in range(2000)],
    )
    conn.execute("ANALYZE")
    plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + _CONFLICTS, (1, '[["s1","d",[],null,1]]'))]
    conn.close()
    assert any("SEARCH s USING INDEX sqlite_autoindex_samples_1 (run_id=? AND sample_id=?)" in p for p in plan), plan
    assert not any(p.startswith("SCAN s") for p in plan), plan


async def test_re_ingest_commits_chunk_by_chunk(tmp_path: Path) -> None:
    """Beside a live engine the write lock is held for one chunk at a time, never the whole file."""
    _quick_file(tmp_path / "prompts.jsonl", 12_000)
    config = load_config(config_file(tmp_path))
    await ingest_config(config)
    store = await RunStore.open(config.run.database)
    try:
        before = store.commits
        report = await _ingest_config(store, config, force=True)
        assert report.datasets[0].already_present == 12_000
        assert store.commits - before >= 3  # 12,000 lines in chunks of 5,000 (+ progress rows)
    finally:
        await store.close()


async def test_a_writer_in_another_connection_gets_the_lock_during_a_re_ingest(tmp_path: Path) -> None:
    """A live engine's writes (here: a thread with its own connection and a 2 s busy timeout, as a second
    process would have) go through between the re-ingest's chunk transactions instead of failing."""
    import sqlite3

    _quick_file(tmp_path / "prompts.jsonl", 40_000)
    config = load_config(config_file(tmp_path))
    await ingest_config(config)
    stop = threading.Event()
    written: list[float] = []
    failures: list[str] = []

    def live_writer() -> None:
        conn = sqlite3.connect(config.run.database, timeout=2.0, isolation_level=None)
        try:
            while not stop.is_set():
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute(
                        "INSERT INTO events (run_id, ts, level, kind, message) VALUES (1, ?, 'info', 'x', 'y')",
                        (time.time(),),
                    )
                    conn.execute("COMMIT")
                    written.append(time.monotonic())
                except sqlite3.OperationalError as exc:
                    failures.append(str(exc))
                time.sleep(0.01)
        finally:
            conn.close()

    thread = threading.Thread(target=live_writer)
    thread.start()
    try:
        started = time.monotonic()
        report = await ingest_config(config, force=True)
        ended = time.monotonic()
    finally:
        stop.set()
        thread.join()
    assert report.datasets[0].already_present == 40_000
    assert failures == []
    assert sum(started <= t <= ended for t in written) >= 2  # it wrote while the re-ingest ran
