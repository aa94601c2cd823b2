"""`python -m app.jobs.wrap [options] -- ARGV...`: run one shard's command under the job contract.

Prints `{"event": "start", ...}` before and `{"event": "exit", "code": c}` after the command (stdout),
writes the shard's done-marker after an exit status of 0 when `--done-marker` is given (for third-party
extractors that do not write one), and records the exit status in `--exit-file` so an executor that
restarted, or Slurm without accounting, still learns how the shard ended. SIGTERM/SIGINT are forwarded
to the command, and the wrapper waits for it, so the exit file is written on cancel too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run the command after `--`; exit with its status (128+N when killed by signal N)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print(
            "app.jobs.wrap: usage: python -m app.jobs.wrap [--shard I] [--exit-file F] "
            "[--done-marker M] [--slot S] -- COMMAND ARGS...",
            file=sys.stderr,
        )
        return 2
    cut = args.index("--")
    parser = argparse.ArgumentParser(prog="python -m app.jobs.wrap")
    parser.add_argument("--shard", type=int, default=None)
    parser.add_argument("--exit-file", type=Path, default=None)
    parser.add_argument("--done-marker", type=Path, default=None)
    parser.add_argument("--slot", default=None, help="informational: the executor's slot (GPU ids)")
    opts = parser.parse_args(args[:cut])
    command = args[cut + 1 :]
    if not command:
        print("app.jobs.wrap: no command after '--'", file=sys.stderr)
        return 2
    if opts.exit_file is not None:
        opts.exit_file.unlink(missing_ok=True)

    start = time.time()
    # Handlers go in before the child starts: a cancel that lands in between is held and passed on, never
    # allowed to kill the wrapper before it can write the exit file.
    child: subprocess.Popen | None = None
    held: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child is None:
            held.append(signum)
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(
            f"app.jobs.wrap: cannot start {command[0]!r}: {exc.strerror or exc}; check the extractor command "
            "in the config (extraction.extractor)",
            file=sys.stderr,
        )
        code = 127
    else:
        _emit({"event": "start", "shard": opts.shard, "pid": child.pid, "argv": command, "ts": start})
        for signum in held:
            child.send_signal(signum)
        rc = child.wait()
        code = rc if rc >= 0 else 128 - rc
    if code == 0 and opts.done_marker is not None and not opts.done_marker.exists():
        _write_atomic(opts.done_marker, json.dumps({"shard": opts.shard, "ts": time.time()}) + "\n")
    if opts.exit_file is not None:
        _write_atomic(opts.exit_file, f"{code}\n")
    _emit({"event": "exit", "shard": opts.shard, "code": code, "seconds": round(time.time() - start, 3)})
    return code


if __name__ == "__main__":
    sys.exit(main())
