"""`python -m app.jobs.wrap`: exit status recorded, marker only after success, signals forwarded."""

from __future__ import annotations

import json
import signal
import subprocess
import sys


def _wrap(tmp_path, *argv, marker=True):
    cmd = [sys.executable, "-m", "app.jobs.wrap", "--shard", "4", "--exit-file", str(tmp_path / "x.exit")]
    if marker:
        cmd += ["--done-marker", str(tmp_path / "shard_4.done")]
    return cmd + ["--", *argv]


def test_failure_is_recorded_and_writes_no_marker(tmp_path):
    proc = subprocess.run(_wrap(tmp_path, sys.executable, "-c", "raise SystemExit(5)"), capture_output=True, text=True)
    assert proc.returncode == 5
    assert (tmp_path / "x.exit").read_text().strip() == "5"
    assert not (tmp_path / "shard_4.done").exists()
    events = [json.loads(line)["event"] for line in proc.stdout.splitlines()]
    assert events == ["start", "exit"]


def test_a_missing_program_is_exit_127_with_a_sentence(tmp_path):
    proc = subprocess.run(_wrap(tmp_path, str(tmp_path / "no-such-extractor")), capture_output=True, text=True)
    assert proc.returncode == 127
    assert "cannot start" in proc.stderr and "extraction.extractor" in proc.stderr
    assert (tmp_path / "x.exit").read_text().strip() == "127"


def test_sigterm_reaches_the_command_and_the_exit_file_is_still_written(tmp_path):
    script = "import time, sys\nprint('ready', flush=True)\ntime.sleep(60)"
    proc = subprocess.Popen(_wrap(tmp_path, sys.executable, "-c", script), stdout=subprocess.PIPE, text=True)
    while "ready" not in proc.stdout.readline():
        pass
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert (tmp_path / "x.exit").read_text().strip() == str(128 + signal.SIGTERM)
    assert not (tmp_path / "shard_4.done").exists()


def test_no_command_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "app.jobs.wrap", "--shard", "1"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr
