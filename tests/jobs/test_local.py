"""LocalExecutor against real subprocesses (the fake extractor), a real SQLite file and /proc."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from app.errors import InputError
from app.jobs.local import LocalExecutor, _stat_fields, slots_for
from app.jobs.spec import JobSpec
from app.jobs.store import JobStore

from .conftest import fake_spec, poll_until


def _state_of(pid: int) -> str | None:
    f = _stat_fields(pid)
    return f[0] if f else None


def _eventually(check, timeout: float = 10.0) -> bool:
    """Signals arrive asynchronously: wait (bounded) for a process state to show."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_runs_every_shard_one_per_slot_and_sums_progress(store, ctl, tmp_path):
    ex = LocalExecutor(store, ["0", "1"])
    job_id = ex.submit(fake_spec(tmp_path, ctl))
    seen_running = []

    status = ex.wait(
        job_id, interval=0.02, on_status=lambda s: seen_running.append(s.counts.get("running", 0)), timeout=60
    )

    assert status.job.state == "done"
    assert [s.state for s in status.shards] == ["done"] * 4
    assert (status.done_items, status.total_items, status.tokens) == (12, 12, 120)
    assert max(seen_running) <= 2
    assert {(tmp_path / "out" / f"shard_{i}.env").read_text() for i in range(4)} <= {"0", "1"}
    for s in status.shards:
        assert s.exit_code == 0
        assert s.output_path.endswith(f"shard_{s.shard}.safetensors")
        assert "library noise" in Path(s.log_path).read_text()


def test_one_failing_shard_is_reported_with_exit_code_and_log(store, ctl, tmp_path):
    ex = LocalExecutor(store, ["", ""])
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0, 1, 2), "--fail", "1"))

    status = ex.wait(job_id, interval=0.02, timeout=60)

    assert status.job.state == "failed"
    failed = status.failures()
    assert [s.shard for s in failed] == [1]
    assert failed[0].exit_code == 3
    assert "shard_1.err" in failed[0].error and "failed on purpose" in failed[0].error
    assert [s.state for s in status.shards if s.shard != 1] == ["done", "done"]


def test_done_marker_is_trusted_over_a_nonzero_exit(store, ctl, tmp_path):
    ex = LocalExecutor(store, [""])
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0,), "--exit-after-marker", "0"))

    status = ex.wait(job_id, interval=0.02, timeout=60)

    assert status.shards[0].state == "done"


def test_exit_zero_without_marker_is_a_failure(store, ctl, tmp_path):
    ex = LocalExecutor(store, [""])
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0,), "--no-marker"))

    status = ex.wait(job_id, interval=0.02, timeout=60)

    assert status.shards[0].state == "failed"
    assert "no done-marker" in status.shards[0].error


def test_pause_starts_no_new_shard_and_resume_finishes(store, ctl, tmp_path):
    (ctl / "hold_all").touch()
    ex = LocalExecutor(store, [""])
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0, 1, 2)))
    poll_until(ex, job_id, lambda s: s.shards[0].state == "running" and s.shards[0].done == 1)

    ex.pause(job_id)
    (ctl / "hold_all").unlink()
    status = poll_until(ex, job_id, lambda s: s.shards[0].state == "done")
    status = ex.poll(job_id)
    assert status.job.state == "paused"
    assert [s.state for s in status.shards[1:]] == ["pending", "pending"]

    ex.resume(job_id)
    status = ex.wait(job_id, interval=0.02, timeout=60)
    assert status.job.state == "done"


def test_pause_with_stop_running_stops_and_resume_continues(store, ctl, tmp_path):
    (ctl / "hold_all").touch()
    ex = LocalExecutor(store, [""])
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0,)))
    pid = poll_until(ex, job_id, lambda s: s.shards[0].done == 1).shards[0].pid

    ex.pause(job_id, stop_running=True)
    assert _eventually(lambda: _state_of(pid) == "T")
    ex.resume(job_id)
    assert _eventually(lambda: _state_of(pid) != "T")
    (ctl / "hold_all").unlink()
    assert ex.wait(job_id, interval=0.02, timeout=60).job.state == "done"


def test_cancel_records_cancelled_shards_and_ends_the_processes(store, ctl, tmp_path):
    (ctl / "hold_all").touch()
    ex = LocalExecutor(store, ["", ""])
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0, 1, 2)))
    status = poll_until(ex, job_id, lambda s: s.counts.get("running") == 2)
    pids = [s.pid for s in status.shards if s.state == "running"]

    ex.cancel(job_id, wait=True)
    status = ex.poll(job_id)

    assert status.job.state == "cancelled"
    assert [s.state for s in status.shards] == ["cancelled"] * 3
    assert all(_state_of(p) in (None, "Z") for p in pids)
    assert not any((tmp_path / "out" / f"shard_{i}.done").exists() for i in range(3))


def test_cancel_one_shard_lets_the_others_finish(store, ctl, tmp_path):
    (ctl / "hold_0").touch()
    ex = LocalExecutor(store, ["", ""])
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0, 1, 2)))
    poll_until(ex, job_id, lambda s: s.shards[0].done == 1)

    ex.cancel(job_id, 0, wait=True)
    status = ex.wait(job_id, interval=0.02, timeout=60)

    assert [s.state for s in status.shards] == ["cancelled", "done", "done"]
    assert status.job.state == "cancelled"
    assert status.failures() == []


def test_cancel_kills_a_shard_that_ignores_sigterm_after_the_grace_period(store, ctl, tmp_path):
    (ctl / "hold_all").touch()
    ex = LocalExecutor(store, [""], grace_s=0.3)
    job_id = ex.submit(fake_spec(tmp_path, ctl, (0,), "--ignore-term"))
    pid = poll_until(ex, job_id, lambda s: s.shards[0].done == 1).shards[0].pid

    ex.cancel(job_id, wait=True)

    assert _state_of(pid) in (None, "Z")
    assert ex.poll(job_id).shards[0].state == "cancelled"


def test_cancel_from_another_process_is_seen_by_the_launcher(store, ctl, tmp_path):
    (ctl / "hold_all").touch()
    launcher = LocalExecutor(store, [""])
    job_id = launcher.submit(fake_spec(tmp_path, ctl, (0, 1)))
    pid = poll_until(launcher, job_id, lambda s: s.shards[0].done == 1).shards[0].pid

    other = LocalExecutor(JobStore(store.path), [])
    other.cancel(job_id, wait=True)
    status = launcher.poll(job_id)

    assert [s.state for s in status.shards] == ["cancelled", "cancelled"]
    assert _state_of(pid) in (None, "Z")


def test_new_executor_reattaches_to_a_running_shard(store, ctl, tmp_path):
    (ctl / "hold_all").touch()
    first = LocalExecutor(store, ["7"])
    job_id = first.submit(fake_spec(tmp_path, ctl, (0, 1)))
    pid = poll_until(first, job_id, lambda s: s.shards[0].done == 1).shards[0].pid

    restarted = LocalExecutor(JobStore(store.path), ["7"])  # eaglewatch restarted: nothing in memory
    status = restarted.poll(job_id)
    assert status.shards[0].state == "running" and status.shards[0].pid == pid
    assert status.shards[1].state == "pending"  # its one slot is taken by the re-attached shard

    (ctl / "hold_all").unlink()
    status = restarted.wait(job_id, interval=0.02, timeout=60)
    assert status.job.state == "done"
    assert (status.done_items, status.total_items) == (6, 6)


def test_dead_pid_without_marker_returns_to_pending_after_restart(store, ctl, tmp_path):
    (ctl / "hold_all").touch()
    first = LocalExecutor(store, [""])
    job_id = first.submit(fake_spec(tmp_path, ctl, (0,)))
    pid = poll_until(first, job_id, lambda s: s.shards[0].done == 1).shards[0].pid
    os.killpg(pid, signal.SIGKILL)  # the machine "crashed": no exit file, no marker
    first._procs[(job_id, 0)].popen.wait()

    restarted = LocalExecutor(JobStore(store.path), [""])
    status = restarted.poll(job_id, launch=False)
    assert status.shards[0].state == "pending"
    assert "vanished" in status.shards[0].error

    (ctl / "hold_all").unlink()
    assert restarted.wait(job_id, interval=0.02, timeout=60).job.state == "done"


def test_a_reused_pid_is_not_mistaken_for_the_shard(store, ctl, tmp_path):
    spec = fake_spec(tmp_path, ctl, (0,))
    job_id = store.create_job(spec, "local")
    # a live process that is not this shard's wrapper: our own test process
    store.set_shard(job_id, 0, state="running", pid=os.getpid(), external_id="1")

    status = LocalExecutor(store, [""]).poll(job_id, launch=False)

    assert status.shards[0].state == "pending"


def test_marker_present_before_launch_skips_the_shard(store, ctl, tmp_path):
    spec = fake_spec(tmp_path, ctl, (0, 1))
    spec.output_dir.mkdir(parents=True)
    spec.done_marker(0).write_text("ok")
    ex = LocalExecutor(store, [""])
    job_id = ex.submit(spec)

    status = ex.wait(job_id, interval=0.02, timeout=60)

    assert status.job.state == "done"
    assert not (tmp_path / "out" / "shard_0.env").exists()  # never ran


def test_wrapper_writes_the_marker_for_a_third_party_command(store, tmp_path):
    spec = JobSpec(
        name="third-party",
        argv=(sys.executable, "-c", "import sys; print('hidden states for', sys.argv[1])", "{shard}"),
        shards=(0, 1),
        output_dir=tmp_path / "out",
        workdir=tmp_path,
        writes_done_marker=False,
    )
    ex = LocalExecutor(store, [""])
    status = ex.wait(ex.submit(spec), interval=0.02, timeout=60)

    assert status.job.state == "done"
    log = Path(status.shards[1].log_path).read_text()
    assert '"event":"start"' in log and "hidden states for 1" in log and '"event":"exit","shard":1,"code":0' in log
    assert spec.done_marker(1).exists()


def test_slots_group_gpus_per_shard():
    assert slots_for(4, 2) == ["0,1", "2,3"]
    assert slots_for([2, 5, 7], 1) == ["2", "5", "7"]
    assert slots_for(0, 1, cpu_slots=3) == ["", "", ""]


def test_spec_substitutes_placeholders_and_round_trips(tmp_path):
    spec = JobSpec(
        name="j",
        argv=("x", "--shard={shard}", "{out}/s{shard}", "{model}", "{{literal}}"),
        shards=(3, 4),
        output_dir=tmp_path,
        workdir=tmp_path,
        params=(("model", "/m"),),
    )
    assert spec.argv_for(4) == ["x", "--shard=4", f"{tmp_path}/s4", "/m", "{literal}"]
    assert JobSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("arg, why", [("{shrd}", "uses placeholder {shrd}"), ("{", "literal braces")])
def test_spec_rejects_unknown_or_broken_placeholders(tmp_path, arg, why):
    with pytest.raises(InputError, match=why.replace("{", r"\{")):
        JobSpec(name="j", argv=("x", arg), shards=(0,), output_dir=tmp_path, workdir=tmp_path)
