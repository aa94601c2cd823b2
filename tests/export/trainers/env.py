"""The trainer environment (scripts/trainer_venv.sh): where it is, and running the consumers' own loaders in it.

The consumers' code runs in a child process whose PYTHONPATH puts the trainer folder (SpecForge, speculators,
Model-Optimizer, installed with --no-deps) before the checkout, so nothing of it leaks into the test process.
Without the folder the tests skip with a loud reason; with EAGLEWATCH_REQUIRE_TRAINERS=1 (scripts/test sets
it after building the folder) they fail instead, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# one line per trainer route a test proved (counts of rows, ids and masks equal), printed at the end of the session
PROVEN: list[str] = []


def proven(line: str) -> None:
    """Record what a test measured through a trainer's own code (tests/export/conftest.py prints the list)."""
    PROVEN.append(line)


def trainer_site() -> Path:
    """The trainer folder, or skip (fail under EAGLEWATCH_REQUIRE_TRAINERS=1) when it was not built."""
    site = Path(os.environ.get("EAGLEWATCH_TRAINERS_SITE") or ROOT / ".trainers" / "site")
    if not (site / ".eaglewatch-stamp").exists():
        reason = (
            f"TRAINER ENV ABSENT: {site} not built; run scripts/trainer_venv.sh to test eaglewatch's outputs "
            "through SpecForge, speculators and Model-Optimizer's own loaders"
        )
        if os.environ.get("EAGLEWATCH_REQUIRE_TRAINERS"):
            pytest.fail(reason)
        pytest.skip(reason)
    return site


def _env(scratch: Path, overlay: str | None = None) -> dict[str, str]:
    site = trainer_site()
    if overlay and not (site / "overlays" / overlay).is_dir():
        reason = (
            f"TRAINER ENV OUTDATED: {site} has no overlays/{overlay} (built by an older scripts/trainer_venv.sh); "
            "run scripts/trainer_venv.sh again"
        )
        if os.environ.get("EAGLEWATCH_REQUIRE_TRAINERS"):
            pytest.fail(reason)
        pytest.skip(reason)
    paths = ([str(site / "overlays" / overlay)] if overlay else []) + [str(site), str(ROOT)]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(scratch / "hf-cache"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }


CONSUMERS = Path(__file__).with_name("consumers.py")
FAMILIES = ("specforge", "speculators", "modelopt")  # consumers.py PRELOAD: the trainers with a warm process


class _Zygote:
    """`consumers.py --zygote FAMILY` in the trainer env: one trainer's modules imported once, a fresh child
    forked per check (this test process keeps one per trainer; closed at exit)."""

    def __init__(self, family: str) -> None:
        self._scratch = Path(tempfile.mkdtemp(prefix=f"eaglewatch-{family}-"))
        with open(self._scratch / "zygote.err", "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(CONSUMERS), "--zygote", family],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=_env(self._scratch),
                cwd=self._scratch,
            )
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = self._line(600)
        if "ready" not in ready:
            raise AssertionError(
                f"the {family} trainer process did not start: {(self._scratch / 'zygote.err').read_text()[-6000:]}"
            )

    def _line(self, timeout: float) -> dict:
        if not self._sel.select(timeout):
            raise TimeoutError(f"no answer in {timeout:g} s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the trainer process ended: {(self._scratch / 'zygote.err').read_text()[-6000:]}")
        return json.loads(line)

    def run(
        self,
        argv: list[str],
        out: Path,
        err: Path,
        timeout: float,
        *,
        module: str | None = None,
        cwd: Path | None = None,
    ) -> int:
        self.proc.stdin.write(
            json.dumps(
                {"argv": argv, "stdout": str(out), "stderr": str(err), "module": module, "cwd": str(cwd or out.parent)}
            )
            + "\n"
        )
        self.proc.stdin.flush()
        pid = self._line(60)["pid"]
        try:
            return int(self._line(timeout)["rc"])
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self.close()
            raise

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self._scratch, ignore_errors=True)


_ZYGOTES: dict[str, _Zygote] = {}
FAMILY_OF = {"arrow": "speculators"}  # checks of no trainer, run where their library (datasets) is imported


def _zygote(family: str) -> _Zygote:
    if family not in _ZYGOTES or _ZYGOTES[family].proc.poll() is not None:
        _ZYGOTES[family] = _Zygote(family)
    return _ZYGOTES[family]


@atexit.register
def _close_zygotes() -> None:
    for z in _ZYGOTES.values():
        z.close()
    _ZYGOTES.clear()


def run_consumer(check: str, *args: str | Path, result: Path, overlay: str | None = None) -> dict:
    """Run `tests/export/trainers/consumers.py CHECK ARGS... RESULT` in the trainer env (with `overlay`, the
    folder of scripts/trainer_venv.sh's overlays put first, in a cold process of its own; otherwise forked from
    the trainer's warm process, a process of its own too); return its JSON summary (what it loaded is in
    RESULT, a torch.save file)."""
    argv = [check, *map(str, args), str(result)]
    family = FAMILY_OF.get(check.split("-")[0], check.split("-")[0])
    if overlay is None and family in FAMILIES:
        out, err = result.with_name(result.name + ".out"), result.with_name(result.name + ".err")
        rc = _zygote(family).run(argv, out, err, timeout=900)
        stdout, stderr = out.read_text(), err.read_text()
    else:
        env = _env(result.parent, overlay)
        proc = subprocess.run(
            [sys.executable, str(CONSUMERS), *argv], capture_output=True, text=True, env=env, timeout=900
        )
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    if rc != 0:
        raise AssertionError(f"consumer check {check} failed (exit {rc}):\n{stderr[-6000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def run_trainer_cli(module: str, *args: str | Path, scratch: Path) -> subprocess.CompletedProcess:
    """Run a trainer's own command line, `python -m MODULE ARGS...` (e.g. `speculators prepare-data`), in the
    trainer env, in `scratch`: forked from that trainer's warm process (its modules imported once; the command's
    own `__main__` runs as `python -m` runs it); the finished process (its exit status and output), whatever the
    status."""
    argv = [str(a) for a in args]
    family = module.split(".")[0]
    if family in FAMILIES:
        out = Path(tempfile.mkdtemp(prefix="cli-", dir=scratch))
        out, err = out / "stdout", out / "stderr"
        rc = _zygote(family).run(argv, out, err, timeout=900, module=module, cwd=scratch)
        return subprocess.CompletedProcess([sys.executable, "-m", module, *argv], rc, out.read_text(), err.read_text())
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        capture_output=True,
        text=True,
        env=_env(scratch),
        timeout=900,
        cwd=scratch,
    )
