"""LocalExecutor: one subprocess per GPU slot on this machine, driven by `poll()`.

Each shard runs as `python -m app.jobs.wrap ... -- <argv>` in its own session (process group), with
`CUDA_VISIBLE_DEVICES` set to its slot, stdout/stderr to `<logs>/shard_<i>.out|.err`. Progress is read
back from the stdout log, so a new executor (after a restart of eaglewatch) follows a shard exactly like
the one that started it: it re-attaches to the recorded pid when the pid is alive, has the recorded start
time and still runs this shard's wrapper; otherwise the shard goes back to pending. A done-marker wins
over anything the process state says.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from app.errors import InputError
from app.jobs.executor import Executor
from app.jobs.job_status import JobStatus, settle_job_state
from app.jobs.progress_reader import LogTail, last_lines
from app.jobs.spec import JobSpec
from app.jobs.store import FINAL_STATES, JobShard, JobStore


def slots_for(gpus: int | list[int] | None, gpus_per_shard: int = 1, cpu_slots: int = 1) -> list[str]:
    """CUDA_VISIBLE_DEVICES values, one per slot: GPU ids grouped `gpus_per_shard` at a time.

    `gpus` is a count (ids 0..n-1) or a list of ids; 0/None/[] means no GPUs, giving `cpu_slots` slots
    with an empty CUDA_VISIBLE_DEVICES (for CPU runs and tests).
    """
    ids = list(range(gpus)) if isinstance(gpus, int) else list(gpus or [])
    if not ids:
        return [""] * max(1, cpu_slots)
    per = max(1, gpus_per_shard)
    if len(ids) < per:
        raise InputError(f"extraction.gpus lists {len(ids)} GPU(s) but each shard needs {per}; lower resources.gpus")
    return [",".join(str(g) for g in ids[i : i + per]) for i in range(0, len(ids) - per + 1, per)]


@dataclass
class _Proc:
    pid: int
    slot: str
    popen: subprocess.Popen | None  # None when re-attached after a restart (not our child)
    kill_at: float | None = None


class LocalExecutor(Executor):
    """Runs a job's shards as local subprocesses, at most one per slot."""

    kind = "local"

    def __init__(
        self, store: JobStore, slots: list[str] | None = None, *, grace_s: float = 10.0, python: str = sys.executable
    ) -> None:
        self.store = store
        self.slots = list(slots) if slots is not None else [""]
        self.grace_s = grace_s
        self.python = python
        self._procs: dict[tuple[int, int], _Proc] = {}
        self._tails: dict[tuple[int, int], LogTail] = {}

    # --- public API -----------------------------------------------------------------------------
    def submit(self, spec: JobSpec, run_id: int | None = None) -> int:
        """Record the job (all shards pending) and start as many shards as there are free slots."""
        job_id = self.store.create_job(spec, self.kind, run_id)
        self.poll(job_id)
        return job_id

    def poll(self, job_id: int, *, launch: bool = True) -> JobStatus:
        """Refresh every shard (markers, exit files, pids, progress); start pending shards unless paused."""
        job = self.store.job(job_id)
        spec = job.spec
        for shard in self.store.shards(job_id):
            self._refresh(job_id, spec, shard)
        if launch and not job.paused and job.state not in FINAL_STATES:
            self._launch_pending(job_id, spec)
        self._escalate()
        return settle_job_state(self.store, job_id)

    def pause(self, job_id: int, *, stop_running: bool = False) -> None:
        """Start no new shards; with `stop_running`, also SIGSTOP the running ones."""
        self.store.set_paused(job_id, True)
        if stop_running:
            for shard in self._live_shards(job_id):
                _signal_group(shard.pid, signal.SIGSTOP)

    def resume(self, job_id: int) -> None:
        """Undo a pause: SIGCONT running shards (harmless if not stopped); the next poll starts pending ones."""
        self.store.set_paused(job_id, False)
        for shard in self._live_shards(job_id):
            _signal_group(shard.pid, signal.SIGCONT)
        settle_job_state(self.store, job_id)

    def cancel(self, job_id: int, shard: int | None = None, *, wait: bool = False) -> None:
        """Cancel one shard or the whole job: recorded first, then SIGTERM, SIGKILL after the grace period.

        With `wait`, block until the processes are gone (used from a process that did not start them).
        """
        job = self.store.job(job_id)
        before = self.store.cancel_shards(job_id, None if shard is None else [shard])
        deadline = time.time() + self.grace_s
        for s in before:
            if s.state == "running" and s.pid and _is_our_shard(job.spec, s):
                _signal_group(s.pid, signal.SIGCONT)  # a stopped process handles SIGTERM only once continued
                _signal_group(s.pid, signal.SIGTERM)
                key = (job_id, s.shard)
                proc = self._procs.get(key) or _Proc(s.pid, "", None)
                proc.kill_at = deadline
                self._procs[key] = proc
        if wait:
            while any(self._alive(p) for p in self._procs.values() if p.kill_at is not None):
                self._escalate()
                time.sleep(0.05)
        settle_job_state(self.store, job_id)

    # --- shard refresh --------------------------------------------------------------------------
    def _refresh(self, job_id: int, spec: JobSpec, shard: JobShard) -> None:
        key = (job_id, shard.shard)
        proc = self._procs.get(key)
        if proc is None and shard.state == "running" and shard.pid:
            proc = self._reattach(spec, shard)
            if proc is not None:
                self._procs[key] = proc
        alive = proc is not None and self._alive(proc)
        if proc is not None and alive and shard.state == "cancelled" and proc.kill_at is None:
            # cancelled from another process (`eaglewatch jobs cancel`, the TUI): make sure it stops
            _signal_group(proc.pid, signal.SIGCONT)
            _signal_group(proc.pid, signal.SIGTERM)
            proc.kill_at = time.time() + self.grace_s
        if proc is not None and not alive:
            self._procs.pop(key, None)
        fields: dict[str, object] = {}
        tail = self._tails.setdefault(key, LogTail(spec.stdout_log(shard.shard)))
        progress = tail.read()
        if (progress.done, progress.total, progress.tokens) != (
            shard.done,
            shard.total,
            shard.tokens,
        ) and shard.state != "pending":
            fields.update(done=progress.done, total=progress.total, tokens=progress.tokens)
        if progress.output_path and progress.output_path != shard.output_path:
            fields["output_path"] = progress.output_path
        marker = spec.done_marker(shard.shard)
        if shard.state not in FINAL_STATES:
            if marker.exists():
                if alive and _exit_code(spec, shard.shard) is None:
                    pass  # marker written, process still tearing down: settle once it exits
                else:
                    fields.update(
                        state="done",
                        ended_at=time.time(),
                        exit_code=_exit_code(spec, shard.shard) or 0,
                        error=None,
                        output_path=fields.get("output_path") or shard.output_path or str(marker),
                    )
            elif shard.state == "running" and not alive:
                code = proc.popen.returncode if proc is not None and proc.popen is not None else None
                if code is not None and code < 0:
                    code = 128 - code
                if code is None:
                    code = _exit_code(spec, shard.shard)
                if code is None:
                    # gone without an exit record (killed hard, machine restarted): run it again
                    fields.update(
                        state="pending",
                        pid=None,
                        external_id=None,
                        error=f"process {shard.pid} vanished without an exit status; shard returned to pending",
                    )
                else:
                    log = spec.stderr_log(shard.shard)
                    why = "exited 0 but wrote no done-marker" if code == 0 else f"exited with code {code}"
                    tail_text = last_lines(log)
                    fields.update(
                        state="failed",
                        exit_code=code,
                        ended_at=time.time(),
                        error=f"shard {shard.shard} {why}; log: {log}"
                        + (f" (last lines: {tail_text})" if tail_text else ""),
                    )
        if fields:
            self.store.set_shard(job_id, shard.shard, **fields)

    def _reattach(self, spec: JobSpec, shard: JobShard) -> _Proc | None:
        if not _is_our_shard(spec, shard) or shard.pid is None:
            return None
        slot = _slot_of(shard.pid) or ""
        return _Proc(pid=shard.pid, slot=slot, popen=None)

    def _alive(self, proc: _Proc) -> bool:
        if proc.popen is not None:
            return proc.popen.poll() is None
        return _pid_running(proc.pid)

    def _live_shards(self, job_id: int) -> list[JobShard]:
        spec = self.store.job(job_id).spec
        return [s for s in self.store.shards(job_id) if s.state == "running" and s.pid and _is_our_shard(spec, s)]

    # --- launching ------------------------------------------------------------------------------
    def _launch_pending(self, job_id: int, spec: JobSpec) -> None:
        busy = {p.slot for p in self._procs.values() if self._alive(p)}
        free = (
            [s for s in self.slots if s not in busy]
            if len(set(self.slots)) == len(self.slots)
            else self.slots[: max(0, len(self.slots) - sum(1 for p in self._procs.values() if self._alive(p)))]
        )
        if spec.max_parallel is not None:
            running = sum(1 for s in self.store.shards(job_id) if s.state == "running")
            free = free[: max(0, spec.max_parallel - running)]
        for shard in self.store.shards(job_id):
            if not free:
                return
            if shard.state != "pending":
                continue
            if spec.done_marker(shard.shard).exists():
                self.store.set_shard(
                    job_id,
                    shard.shard,
                    state="done",
                    exit_code=0,
                    ended_at=time.time(),
                    error=None,
                    output_path=str(spec.done_marker(shard.shard)),
                )
                continue
            self._start(job_id, spec, shard.shard, free.pop(0))

    def _start(self, job_id: int, spec: JobSpec, shard: int, slot: str) -> None:
        spec.logs.mkdir(parents=True, exist_ok=True)
        spec.output_dir.mkdir(parents=True, exist_ok=True)
        for log in (spec.stdout_log(shard), spec.stderr_log(shard)):
            if log.exists() and log.stat().st_size:
                os.replace(log, log.with_name(log.name + ".prev"))  # keep the previous attempt's log
        spec.exit_file(shard).unlink(missing_ok=True)
        argv = [
            self.python,
            "-m",
            "app.jobs.wrap",
            "--shard",
            str(shard),
            "--exit-file",
            str(spec.exit_file(shard)),
            "--slot",
            slot or "cpu",
        ]
        if not spec.writes_done_marker:
            argv += ["--done-marker", str(spec.done_marker(shard))]
        argv += ["--", *spec.argv_for(shard)]
        env = {**os.environ, **dict(spec.env), "CUDA_VISIBLE_DEVICES": slot}
        env["PYTHONPATH"] = _app_root() + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(spec.stdout_log(shard), "ab") as out, open(spec.stderr_log(shard), "ab") as err:
            try:
                popen = subprocess.Popen(
                    argv,
                    cwd=spec.workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            except OSError as exc:
                self.store.set_shard(
                    job_id,
                    shard,
                    state="failed",
                    error=f"cannot start shard {shard}: {exc}; check the working directory {spec.workdir}",
                    ended_at=time.time(),
                )
                return
        self._procs[(job_id, shard)] = _Proc(pid=popen.pid, slot=slot, popen=popen)
        self._tails[(job_id, shard)] = LogTail(spec.stdout_log(shard))
        self.store.set_shard(
            job_id,
            shard,
            state="running",
            pid=popen.pid,
            external_id=_start_ticks(popen.pid),
            started_at=time.time(),
            ended_at=None,
            exit_code=None,
            error=None,
            done=0,
            tokens=0,
            log_path=str(spec.stdout_log(shard)),
        )

    def _escalate(self) -> None:
        now = time.time()
        for key, proc in list(self._procs.items()):
            if proc.kill_at is None:
                continue
            if not self._alive(proc):
                self._procs.pop(key, None)
            elif now >= proc.kill_at:
                _signal_group(proc.pid, signal.SIGKILL)


# --- process identity (Linux /proc) -------------------------------------------------------------
def _app_root() -> str:
    return str(Path(__file__).resolve().parent.parent.parent)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()  # fields from 3 (state) on; the name may contain spaces


def _start_ticks(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields else None  # field 22: starttime (clock ticks since boot)


def _pid_running(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


def _is_our_shard(spec: JobSpec, shard: JobShard) -> bool:
    """The pid is alive, started when we recorded it, and still runs this shard's wrapper (no pid reuse)."""
    if not shard.pid or not _pid_running(shard.pid):
        return False
    if shard.external_id and _start_ticks(shard.pid) != shard.external_id:
        return False
    return str(spec.exit_file(shard.shard)) in _cmdline(shard.pid)


def _slot_of(pid: int) -> str | None:
    cmd = _cmdline(pid)
    if "--slot" in cmd:
        value = cmd[cmd.index("--slot") + 1]
        return "" if value == "cpu" else value
    return None


def _exit_code(spec: JobSpec, shard: int) -> int | None:
    try:
        return int(spec.exit_file(shard).read_text().strip())
    except (OSError, ValueError):
        return None


def _signal_group(pid: int | None, sig: int) -> None:
    if not pid:
        return
    try:
        os.killpg(pid, sig)  # the wrapper leads its own session: signal it and everything it started
    except (ProcessLookupError, PermissionError):
        pass
