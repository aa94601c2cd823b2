"""SlurmExecutor: one `sbatch --array` over a job's shards, followed through `squeue` text output.

Array task ids are the shard ids, so `<array job id>_<shard>` names a shard's task. Each task runs the
shard's argv (substituted here, written into a generated batch script as a bash array, never through a
shell string) under `app.jobs.wrap`, which records the exit status next to the logs. State comes from
`squeue -h -r -t all -o '%F|%K|%T|%r'` (finished tasks stay listed for MinJobAge), then the exit file,
then `sacct --parsable2` when accounting is on; a done-marker wins over all of them. Cancels made here
are recorded in the database first, because Slurm keeps no trace of a cancelled pending array task.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from app.errors import EaglewatchError, InputError
from app.jobs.executor import Executor
from app.jobs.job_status import JobStatus, settle_job_state
from app.jobs.progress_reader import LogTail, last_lines
from app.jobs.spec import JobSpec
from app.jobs.store import FINAL_STATES, JobShard, JobStore

PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
FAILED_STATES = {
    "FAILED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
    "SPECIAL_EXIT",
}
SLURM_TIMEOUT_S = 60.0


class SlurmExecutor(Executor):
    """Submits a job's shards as a Slurm job array and follows them; stateless beyond the database."""

    kind = "slurm"
    poll_interval_s = 1.0

    def __init__(self, store: JobStore, *, python: str = sys.executable, use_sacct: bool | None = None) -> None:
        self.store = store
        self.python = python
        self._tails: dict[tuple[int, int], LogTail] = {}
        self._use_sacct = use_sacct

    # --- public API -----------------------------------------------------------------------------
    def submit(self, spec: JobSpec, run_id: int | None = None) -> int:
        """Record the job and submit its shards as one array (`sbatch --parsable`); return the job id."""
        _require("sbatch")
        job_id = self.store.create_job(spec, self.kind, run_id)
        self.poll(job_id)
        return job_id

    def poll(self, job_id: int, *, launch: bool = True) -> JobStatus:
        """Refresh shard states from markers, squeue, exit files (and sacct); submit pending shards."""
        job = self.store.job(job_id)
        spec = job.spec
        shards = self.store.shards(job_id)
        arrays = sorted({s.external_id.split("_")[0] for s in shards if s.external_id and s.state not in FINAL_STATES})
        queue = self._squeue(arrays) if arrays else {}
        for shard in shards:
            self._refresh(job_id, spec, shard, queue)
        if launch and not job.paused and job.state not in FINAL_STATES:
            pending = [s.shard for s in self.store.shards(job_id) if s.state == "pending"]
            if pending:
                self._submit_array(job_id, spec, pending)
        return settle_job_state(self.store, job_id)

    def pause(self, job_id: int, *, stop_running: bool = False) -> None:
        """Hold the job's pending tasks (`scontrol hold`); running tasks go on (`stop_running` is not offered)."""
        self.store.set_paused(job_id, True)
        for array in self._arrays(job_id):
            _run(["scontrol", "hold", array], ok_errors=("already", "no longer pending", "Invalid job id"))

    def resume(self, job_id: int) -> None:
        """Release held tasks (`scontrol release`); the next poll submits shards that were never submitted."""
        self.store.set_paused(job_id, False)
        for array in self._arrays(job_id):
            _run(["scontrol", "release", array], ok_errors=("already", "no longer pending", "Invalid job id"))
        settle_job_state(self.store, job_id)

    def cancel(self, job_id: int, shard: int | None = None, *, wait: bool = False) -> None:
        """Cancel one shard's task or the whole job: remembered in the database first, then `scancel`."""
        before = self.store.cancel_shards(job_id, None if shard is None else [shard])
        targets = [s.external_id for s in before if s.external_id and s.state in ("submitted", "running")]
        if shard is None:
            targets = sorted({t.split("_")[0] for t in targets})
        if targets:
            _run(["scancel", *targets], ok_errors=("already completing", "Invalid job id", "completed"))
        settle_job_state(self.store, job_id)

    def batch_script(self, job_id: int, spec: JobSpec, shards: list[int]) -> str:
        """The generated batch script: the argv of each shard, picked by SLURM_ARRAY_TASK_ID."""
        lines = [
            "#!/bin/bash",
            # every value is quoted, comments included: a comment ends at a newline, so the name is escaped to
            # one line first (names with control characters are refused anyway: app.config.name_problem)
            f"# generated by eaglewatch for job {int(job_id)} ({_one_line(spec.name)}): array task id = shard id",
            "set -u",
        ]
        for key, value in spec.env:
            lines.append(f"export {key}={shlex.quote(value)}")
        pythonpath = str(Path(__file__).resolve().parent.parent.parent)
        lines.append(f"export PYTHONPATH={shlex.quote(pythonpath)}${{PYTHONPATH:+:$PYTHONPATH}}")
        lines.append('case "$SLURM_ARRAY_TASK_ID" in')
        for shard in shards:
            argv = " ".join(shlex.quote(a) for a in spec.argv_for(shard))
            lines.append(f"  {int(shard)}) set -- {argv} ;;")
        lines.append('  *) echo "eaglewatch: no shard $SLURM_ARRAY_TASK_ID in this job" >&2; exit 2 ;;')
        lines.append("esac")
        wrap = [
            self.python,
            "-m",
            "app.jobs.wrap",
            "--shard",
            '"$SLURM_ARRAY_TASK_ID"',
            "--exit-file",
            shlex.quote(str(spec.logs)) + '/shard_"$SLURM_ARRAY_TASK_ID".exit',
        ]
        if not spec.writes_done_marker:
            wrap += ["--done-marker", shlex.quote(str(spec.output_dir)) + '/shard_"$SLURM_ARRAY_TASK_ID".done']
        wrap[0] = shlex.quote(wrap[0])
        lines.append("exec " + " ".join(wrap) + ' -- "$@"')
        return "\n".join(lines) + "\n"

    @staticmethod
    def sbatch_argv(spec: JobSpec, shards: list[int], script: Path, hold: bool = False) -> list[str]:
        """The sbatch command line for an array over `shards` (resources, logs, working dir, partition)."""
        array = _ranges(shards) + (f"%{spec.max_parallel}" if spec.max_parallel else "")
        argv = [
            "sbatch",
            "--parsable",
            f"--array={array}",
            f"--job-name={spec.name}",
            f"--output={spec.logs}/shard_%a.out",
            f"--error={spec.logs}/shard_%a.err",
            f"--chdir={spec.workdir}",
            f"--cpus-per-task={spec.resources.cpus}",
        ]
        if spec.resources.gpus > 0:
            argv.append(f"--gres=gpu:{spec.resources.gpus}")
        if spec.resources.mem:
            argv.append(f"--mem={spec.resources.mem}")
        if spec.resources.time:
            argv.append(f"--time={spec.resources.time}")
        opts = dict(spec.slurm)
        for key in ("partition", "account", "qos", "constraint"):
            if opts.get(key):
                argv.append(f"--{key}={opts[key]}")
        if opts.get("extra"):
            argv += shlex.split(opts["extra"])
        if hold:
            argv.append("--hold")
        return [*argv, str(script)]

    # --- internals ------------------------------------------------------------------------------
    def _submit_array(self, job_id: int, spec: JobSpec, shards: list[int]) -> None:
        todo = []
        for shard in shards:
            if spec.done_marker(shard).exists():
                self.store.set_shard(
                    job_id,
                    shard,
                    state="done",
                    exit_code=0,
                    ended_at=time.time(),
                    error=None,
                    output_path=str(spec.done_marker(shard)),
                )
            else:
                todo.append(shard)
        if not todo:
            return
        spec.logs.mkdir(parents=True, exist_ok=True)
        spec.output_dir.mkdir(parents=True, exist_ok=True)
        for shard in todo:
            for log in (spec.stdout_log(shard), spec.stderr_log(shard)):
                if log.exists() and log.stat().st_size:
                    os.replace(log, log.with_name(log.name + ".prev"))
            spec.exit_file(shard).unlink(missing_ok=True)
            self._tails.pop((job_id, shard), None)
        script = spec.logs / f"job_{job_id}_{int(time.time() * 1000)}.sbatch"
        script.write_text(self.batch_script(job_id, spec, todo))
        out = _run(self.sbatch_argv(spec, todo, script))
        array_id = out.strip().split(";")[0]
        if not array_id.isdigit():
            raise EaglewatchError(
                f"sbatch printed {out.strip()!r} instead of a job id for {script}; check `sbatch` by hand"
            )
        now = time.time()
        for shard in todo:
            self.store.set_shard(
                job_id,
                shard,
                state="submitted",
                external_id=f"{array_id}_{shard}",
                pid=None,
                exit_code=None,
                error=None,
                started_at=None,
                ended_at=None,
                done=0,
                tokens=0,
                log_path=str(spec.stdout_log(shard)),
            )
        arrays = [a for a in (self.store.job(job_id).external_id or "").split(",") if a]
        self.store.set_job(job_id, external_id=",".join([*arrays, array_id]), started_at=now)

    def _refresh(self, job_id: int, spec: JobSpec, shard: JobShard, queue: dict[str, tuple[str, str]]) -> None:
        key = (job_id, shard.shard)
        fields: dict[str, object] = {}
        if shard.state not in ("pending",):
            progress = self._tails.setdefault(key, LogTail(spec.stdout_log(shard.shard))).read()
            if (progress.done, progress.total, progress.tokens) != (shard.done, shard.total, shard.tokens):
                fields.update(done=progress.done, total=progress.total, tokens=progress.tokens)
            if progress.output_path and progress.output_path != shard.output_path:
                fields["output_path"] = progress.output_path
        if shard.state in FINAL_STATES or shard.state == "pending":
            if fields:
                self.store.set_shard(job_id, shard.shard, **fields)
            return
        marker = spec.done_marker(shard.shard)
        slurm_state, reason = queue.get(shard.external_id or "", (None, ""))
        code = _exit_code(spec, shard.shard)
        now = time.time()
        if marker.exists() and slurm_state not in RUNNING_STATES:
            fields.update(
                state="done",
                exit_code=code or 0,
                ended_at=now,
                error=None,
                output_path=fields.get("output_path") or shard.output_path or str(marker),
            )
        elif slurm_state in PENDING_STATES:
            note = f"held ({reason})" if "Held" in reason else None
            if shard.state != "submitted" or shard.error != note:
                fields.update(state="submitted", error=note)
        elif slurm_state in RUNNING_STATES:
            if shard.state != "running":
                fields.update(state="running", started_at=now, error=None)
        elif slurm_state == "CANCELLED":
            fields.update(state="cancelled", ended_at=now, error="cancelled outside eaglewatch (scancel)")
        elif slurm_state == "COMPLETED" or slurm_state in FAILED_STATES or code is not None:
            fields.update(self._failure(spec, shard.shard, code, slurm_state))
        else:
            # not in squeue: aged out (MinJobAge) or cancelled by someone else while pending
            acct = self._sacct(shard.external_id) if shard.external_id else None
            if acct is not None and acct[0] == "CANCELLED":
                fields.update(state="cancelled", ended_at=now, error="cancelled outside eaglewatch (scancel)")
            elif acct is not None and acct[0] not in PENDING_STATES | RUNNING_STATES:
                fields.update(self._failure(spec, shard.shard, acct[1], acct[0]))
            elif acct is None:
                fields.update(
                    state="pending",
                    external_id=None,
                    error=f"Slurm task {shard.external_id} vanished without a done-marker or exit status; "
                    "shard returned to pending",
                )
        if fields:
            self.store.set_shard(job_id, shard.shard, **fields)

    def _failure(self, spec: JobSpec, shard: int, code: int | None, slurm_state: str | None) -> dict[str, object]:
        log = spec.stderr_log(shard)
        if code == 0 or (code is None and slurm_state == "COMPLETED"):
            why = f"ended {slurm_state or 'with exit code 0'} but wrote no done-marker {spec.done_marker(shard)}"
        elif code is not None:
            why = f"exited with code {code}" + (
                f" (Slurm: {slurm_state})" if slurm_state and slurm_state != "FAILED" else ""
            )
        else:
            why = f"ended as {slurm_state}"
        tail = last_lines(log)
        return {
            "state": "failed",
            "exit_code": code,
            "ended_at": time.time(),
            "error": f"shard {shard} {why}; log: {log}" + (f" (last lines: {tail})" if tail else ""),
        }

    def _squeue(self, arrays: list[str]) -> dict[str, tuple[str, str]]:
        out = _run(
            ["squeue", "--noheader", "--array", "--states=all", f"--jobs={','.join(arrays)}", "--format=%F|%K|%T|%r"],
            ok_errors=("Invalid job id",),
        )
        rows: dict[str, tuple[str, str]] = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 4:
                continue
            array_id, task, state, reason = parts
            if task.isdigit():
                rows[f"{array_id}_{task}"] = (state.split()[0].rstrip("+"), reason)
            else:  # an unexpanded range such as "2-5%1": every task in it shares the state
                for t in _expand(task):
                    rows[f"{array_id}_{t}"] = (state.split()[0].rstrip("+"), reason)
        if not rows and len(arrays) > 1:  # one aged-out id makes squeue reject the whole list
            for array in arrays:
                rows.update(self._squeue([array]))
        return rows

    def _sacct(self, task_id: str) -> tuple[str, int | None] | None:
        if self._use_sacct is False or shutil.which("sacct") is None:
            return None
        try:
            out = _run(
                ["sacct", "--noheader", "--parsable2", "-X", f"--jobs={task_id}", "--format=JobID,State,ExitCode"]
            )
        except EaglewatchError:
            self._use_sacct = False  # accounting disabled: do not ask again
            return None
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[0] == task_id:
                code = parts[2].split(":")[0]
                return parts[1].split()[0], int(code) if code.isdigit() else None
        return None

    def _arrays(self, job_id: int) -> list[str]:
        return sorted(
            {
                s.external_id.split("_")[0]
                for s in self.store.shards(job_id)
                if s.external_id and s.state in ("submitted", "running")
            }
        )


def _exit_code(spec: JobSpec, shard: int) -> int | None:
    try:
        return int(spec.exit_file(shard).read_text().strip())
    except (OSError, ValueError):
        return None


def _ranges(ids: list[int]) -> str:
    """`[0,1,2,5,7,8]` → `"0-2,5,7-8"` (sbatch --array syntax)."""
    ids = sorted(ids)
    out, start, prev = [], ids[0], ids[0]
    for i in ids[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def _expand(spec: str) -> list[int]:
    spec = spec.strip("[]").split("%")[0]
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            if a.isdigit() and b.isdigit():
                out.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
    return out


def _require(tool: str) -> None:
    if shutil.which(tool) is None:
        raise InputError(
            f"`{tool}` is not on PATH: the Slurm executor needs the Slurm client tools "
            '(sbatch, squeue, scancel, scontrol); install them or set extraction.executor = "local"'
        )


def _run(argv: list[str], ok_errors: tuple[str, ...] = ()) -> str:
    """Run a Slurm client command; return stdout. Errors whose text contains one of `ok_errors` are ignored."""
    _require(argv[0])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise EaglewatchError(
            f"`{argv[0]}` did not answer in {SLURM_TIMEOUT_S:.0f} s; is slurmctld up? (`sinfo`)"
        ) from None
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()
        if any(e.lower() in err.lower() for e in ok_errors):
            return proc.stdout
        raise EaglewatchError(f"`{shlex.join(argv)}` failed (exit {proc.returncode}): {err or 'no message'}")
    return proc.stdout


def _one_line(value: str) -> str:
    """A value for a script comment: shell-quoted, with control characters escaped so it stays on its line."""
    escaped = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in value)
    return shlex.quote(escaped)
