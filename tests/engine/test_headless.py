"""`eaglewatch run --headless`: ingests, runs to the end, pauses on Ctrl-C, resumes, exits 3 on 402."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.engine.conftest import wait_for_beats


def _config(
    tmp_path: Path, sample_data: Path, faults: str = "", latency_ms: float = 0.0, in_flight: int | None = None
) -> Path:
    """A headless run's config over the built-in simulator; `in_flight` pins the concurrency (start and ceiling),
    so a run lasts long enough (samples x latency / in_flight) to be steered before it ends."""
    text = f"""
[run]
name = "h"
database = "{tmp_path / "h.db"}"

[data]
reference = "{sample_data / "reference.jsonl"}"

[[data.datasets]]
path = "{sample_data / "prompts.openai.jsonl"}"

[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "{sample_data / "tokenizer"}"

[[endpoints]]
name = "sim"
timeout_s = 10.0

[endpoints.simulator]
latency_median_ms = {latency_ms}
latency_p95_ms = {latency_ms}
seed = 1
faults = {{ {faults} }}

[generation]
max_tokens = 4096
stream = true

[pricing."moonshotai/kimi-k2.5"]
prompt_per_m = 0.6
completion_per_m = 2.5
"""
    if in_flight is not None:
        text += f"\n[limits]\nconcurrency_initial = {in_flight}\nconcurrency_max = {in_flight}\n"
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def _eaglewatch(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "run", "--headless", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


class _Lines:
    """A process's output read line by line on a thread, so a test can wait for a line while the process runs."""

    def __init__(self, stream) -> None:
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()

    def wait_for(self, needle: str, deadline: float) -> bool:
        """Whether a line containing `needle` arrives before `deadline` (time.monotonic())."""
        with self._cond:
            return self._cond.wait_for(
                lambda: any(needle in line for line in self._lines), max(0.0, deadline - time.monotonic())
            )

    def text(self, *, until_end_s: float = 0.0) -> str:
        """Everything read so far; waiting up to `until_end_s` for the end of the stream (the process exited)."""
        self._thread.join(until_end_s)
        with self._cond:
            return "".join(self._lines)


def _states(tmp_path: Path) -> dict:
    db = sqlite3.connect(tmp_path / "h.db")
    return dict(db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())


def _done_so_far(tmp_path: Path) -> int:
    """Done samples, 0 until the engine has written the schema (the file exists before its tables do)."""
    path = tmp_path / "h.db"
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'samples'").fetchone() is None:
            return 0
        return db.execute("SELECT COUNT(*) FROM samples WHERE state = 'done'").fetchone()[0]
    except sqlite3.OperationalError:  # mid-migration: locked for a moment
        return 0
    finally:
        db.close()


def test_headless_run_ingests_and_exits_0_when_every_sample_has_ended(tmp_path, sample_data):
    cfg = _config(tmp_path, sample_data)
    out, err = _eaglewatch(str(cfg), "--limit", "25").communicate(timeout=120)
    assert "ingested 25 samples" in err and "run finished: 25 done" in err, err
    assert _states(tmp_path) == {"done": 25}
    p = _eaglewatch(str(cfg), "--limit", "25")
    p.communicate(timeout=120)
    assert p.returncode == 0


def test_headless_run_says_how_it_reads_a_dataset_whose_format_is_not_set(tmp_path, sample_data):
    cfg = _config(tmp_path, sample_data)
    out, err = _eaglewatch(str(cfg), "--limit", "3").communicate(timeout=120)
    assert (
        "read data.datasets[0] (prompts.openai): prompts.openai.jsonl: JSON lines, read as openai-messages "
        '(`format` not set: the default); `format = "auto"` tells it from the columns'
    ) in err.splitlines(), err


def test_ctrl_c_pauses_and_the_same_command_resumes(tmp_path, sample_data):
    # 4 at a time (slow start would double it each round trip) for 200 ms each: 3 s of work, Ctrl-C comes well before
    cfg = _config(tmp_path, sample_data, latency_ms=200.0, in_flight=4)
    p = _eaglewatch(str(cfg), "--limit", "60")
    deadline = time.monotonic() + 60
    while _done_so_far(tmp_path) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "run paused: operator (Ctrl-C)" in err
    states = _states(tmp_path)
    assert states.get("leased", 0) == 0 and 0 < states["done"] < 60
    db = sqlite3.connect(tmp_path / "h.db")
    assert db.execute("SELECT state FROM runs").fetchone()[0] == "paused"
    p = _eaglewatch(str(cfg), "--limit", "60", "--concurrency", "16")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert _states(tmp_path) == {"done": 60}


def test_out_of_credits_exits_3_with_the_reason(tmp_path, sample_data):
    cfg = _config(tmp_path, sample_data, faults='"402" = 1.0')
    p = _eaglewatch(str(cfg), "--limit", "10")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert "run paused" in err and "resume" in err
    assert _states(tmp_path) == {"pending": 10}


def _command(tmp_path: Path, verb: str, args: str = "{}") -> None:
    """What an attached viewer does: one row in the commands table (app.tui.db_source.AttachedControl)."""
    db = sqlite3.connect(tmp_path / "h.db")
    with db:
        db.execute(
            "INSERT INTO commands (run_id, verb, args, created_at) VALUES ((SELECT id FROM runs WHERE name = 'h'), "
            "?, ?, ?)",
            (verb, args, time.time()),
        )
    db.close()


def _run_state(tmp_path: Path) -> str:
    db = sqlite3.connect(f"file:{tmp_path / 'h.db'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT state FROM runs WHERE name = 'h'").fetchone()[0]
    finally:
        db.close()


def test_pause_now_from_an_attached_viewer_keeps_the_headless_engine_alive_for_its_resume(tmp_path, sample_data):
    # 4 at a time for 500 ms each: 5 s of work, several of the engine's command polls (once a second) for the
    # pause to arrive in (at the default 64 at once the run ended within one poll: the pause came too late)
    cfg = _config(tmp_path, sample_data, latency_ms=500.0, in_flight=4)
    proc = _eaglewatch(str(cfg), "--limit", "40")
    stderr = _Lines(proc.stderr)
    try:
        deadline = time.monotonic() + 60
        while _done_so_far(tmp_path) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, stderr.text(until_end_s=5)
            time.sleep(0.1)
        _command(tmp_path, "pause", '{"now": true}')  # P in the viewer: cancel in flight, keep the engine
        while (state := _run_state(tmp_path)) != "paused":
            assert state != "done", "the run ended before the pause arrived: give it more work"
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # the engine says it waits (where it would otherwise have exited), then goes on beating while it waits
        assert stderr.wait_for("waiting for its resume", deadline), (
            f"the engine did not wait for the viewer's resume: {stderr.text()}"
        )

        def alive() -> None:
            assert proc.poll() is None, f"the engine exited on a viewer's pause: {stderr.text()}"

        wait_for_beats(tmp_path / "h.db", time.time(), check=alive)
        assert proc.poll() is None, f"the engine exited on a viewer's pause: {stderr.text()}"
        _command(tmp_path, "resume")
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = stderr.text(until_end_s=30)
    assert proc.returncode == 0, err
    assert "waiting for its resume" in err
    assert _states(tmp_path) == {"done": 40}


def test_failed_samples_exit_1_with_how_many_and_retry_failed_recovers_them(tmp_path, sample_data):
    cfg = _config(tmp_path, sample_data, faults='"400" = 1.0')  # every request refused: every sample fails
    p = _eaglewatch(str(cfg), "--limit", "8")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    assert "run finished with 8 failed samples of 8 (0 done)" in err and "--retry-failed" in err
    assert _states(tmp_path) == {"failed": 8}
    _config(tmp_path, sample_data)  # the provider works again
    p = _eaglewatch(str(cfg), "--limit", "8")
    p.communicate(timeout=120)
    assert p.returncode == 1 and _states(tmp_path) == {"failed": 8}  # a plain rerun leaves them failed
    p = _eaglewatch(str(cfg), "--limit", "8", "--retry-failed")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "8 failed samples put back to pending" in err
    assert _states(tmp_path) == {"done": 8}
