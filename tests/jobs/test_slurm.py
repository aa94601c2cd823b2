"""SlurmExecutor against the real single-node cluster of scripts/slurm_ci_up.sh (`. $BASE/env` first)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from app.jobs.slurm import SlurmExecutor, _ranges
from app.jobs.spec import Resources
from app.jobs.store import JobStore

from .conftest import fake_spec, poll_until

needs_slurm = pytest.mark.skipif(
    os.environ.get("EAGLEWATCH_SLURM") != "1",
    reason="no Slurm cluster: run `bash scripts/slurm_ci_up.sh`, then `. $BASE/env` (sets EAGLEWATCH_SLURM=1)",
)


DEFAULT_CONF = Path(os.environ.get("EAGLEWATCH_SLURM_BASE", "/tmp/eaglewatch-slurm")) / "etc" / "slurm.conf"


@pytest.fixture(scope="module")
def cluster():
    """EAGLEWATCH_SLURM=1 promises a cluster: fail (not skip) when it does not answer.

    Without SLURM_CONF, use the cluster scripts/slurm_ci_up.sh starts at its default BASE.
    """
    with pytest.MonkeyPatch.context() as mp:
        if "SLURM_CONF" not in os.environ and DEFAULT_CONF.exists():
            mp.setenv("SLURM_CONF", str(DEFAULT_CONF))
        _check_cluster()
        yield


def _check_cluster() -> None:
    if shutil.which("sbatch") is None:
        pytest.fail("EAGLEWATCH_SLURM=1 but sbatch is not on PATH")
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"EAGLEWATCH_SLURM=1 but `sinfo` did not answer in 15 s (SLURM_CONF={os.environ.get('SLURM_CONF')!r})"
        )
    if not any(s.strip() in ("idle", "mixed", "allocated") for s in out.stdout.splitlines()):
        pytest.fail(
            f"EAGLEWATCH_SLURM=1 but no usable Slurm node (SLURM_CONF={os.environ.get('SLURM_CONF')!r}; "
            f"sinfo: {(out.stdout + out.stderr).strip()!r})"
        )


CPU = Resources(gpus=0, cpus=1, mem="200M", time="00:05:00")


@pytest.mark.parametrize("ids, text", [([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([3], "3")])
def test_array_ranges(ids, text):
    assert _ranges(ids) == text


def test_batch_script_quotes_each_argument_and_picks_the_shard(store, ctl, tmp_path):
    spec = fake_spec(tmp_path, ctl, (0, 2), "--items", "it's 3", resources=CPU, env=(("HF_HOME", "/a b"),))
    script = SlurmExecutor(store).batch_script(1, spec, [0, 2])
    assert "  2) set -- " in script and "'it'\"'\"'s 3'" in script
    assert "export HF_HOME='/a b'" in script
    argv = SlurmExecutor(store).sbatch_argv(spec, [0, 2], tmp_path / "s.sbatch")
    assert "--array=0,2" in argv and "--mem=200M" in argv and not any(a.startswith("--gres") for a in argv)


@pytest.mark.slurm
@needs_slurm
def test_array_progress_cancel_one_task_and_one_failing_shard(cluster, store, ctl, tmp_path):
    (ctl / "hold_1").touch()
    ex = SlurmExecutor(store)
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0, 1, 2, 3), "--fail", "2", resources=CPU))
    status = poll_until(ex, job_id, lambda s: s.shards[1].state == "running" and s.shards[1].done == 1, timeout=30)
    assert status.shards[1].external_id == f"{status.job.external_id}_1"

    ex.cancel(job_id, 1)
    status = poll_until(ex, job_id, lambda s: s.finished, timeout=40)

    assert [s.state for s in status.shards] == ["done", "cancelled", "failed", "done"]
    failed = status.failures()[0]
    assert failed.exit_code == 3 and "shard_2.err" in failed.error and "failed on purpose" in failed.error
    assert (status.shards[0].done, status.shards[3].done, status.shards[3].tokens) == (3, 3, 30)
    assert status.job.state == "failed"


@pytest.mark.slurm
@needs_slurm
def test_hold_release_and_a_cancelled_pending_task_is_not_a_failure(cluster, store, ctl, tmp_path):
    (ctl / "hold_all").touch()
    ex = SlurmExecutor(store)
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0, 1, 2), resources=CPU, max_parallel=1))
    poll_until(ex, job_id, lambda s: s.shards[0].state == "running", timeout=30)

    ex.pause(job_id)
    status = poll_until(ex, job_id, lambda s: all("held" in (s.error or "") for s in s.shards[1:]), timeout=10)
    assert status.job.state == "paused"
    ex.cancel(job_id, 2)  # a pending task: Slurm forgets it, we must not
    (ctl / "hold_all").unlink()
    status = poll_until(ex, job_id, lambda s: s.shards[0].state == "done", timeout=30)
    assert status.shards[1].state == "submitted"

    ex.resume(job_id)
    status = poll_until(ex, job_id, lambda s: s.finished, timeout=30)
    assert [s.state for s in status.shards] == ["done", "done", "cancelled"]
    assert status.failures() == []


@pytest.mark.slurm
@needs_slurm
def test_a_restarted_eaglewatch_follows_the_array_from_the_database(cluster, store, ctl, tmp_path):
    (ctl / "hold_all").touch()
    first = SlurmExecutor(store)
    job_id = first.submit(fake_spec(tmp_path, ctl, (0, 1), resources=CPU))
    before = poll_until(first, job_id, lambda s: s.counts.get("running") == 2, timeout=30)
    del first

    restarted = SlurmExecutor(JobStore(store.path))
    status = restarted.poll(job_id)
    assert [s.external_id for s in status.shards] == [s.external_id for s in before.shards]
    assert [s.state for s in status.shards] == ["running", "running"]
    (ctl / "hold_all").unlink()
    status = poll_until(restarted, job_id, lambda s: s.finished, timeout=30)
    assert status.job.state == "done" and status.done_items == 6


@pytest.mark.slurm
@needs_slurm
def test_extract_command_on_slurm_detach_then_follow(cluster, ctl, tmp_path, capsys):
    import json

    from app.cli import main

    from .test_cli import _setup

    cfg = _setup(tmp_path, ctl)
    db = str(tmp_path / "run.db")
    args = ["extract", str(cfg), "--manifest", str(tmp_path / "shards"), "--executor", "slurm"]
    assert main([*args, "--detach"]) == 0
    assert main(["jobs", "--db", db, "1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["executor"] == "slurm" and shown["external_id"]
    assert main(["extract", str(cfg), "--job", "1", "--interval", "0.2", "--json"]) == 0
    final = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in final["shards"]] == ["done"] * 3 and final["done_items"] == 9
