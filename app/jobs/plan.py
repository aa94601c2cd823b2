"""From a run config's [extraction] section and an eagle3-shards manifest to a JobSpec and an executor."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from app.errors import InputError
from app.jobs.local import LocalExecutor, slots_for
from app.jobs.slurm import SlurmExecutor
from app.jobs.spec import JobSpec, Resources
from app.jobs.store import JobStore

SLURM_OPTION_KEYS = ("partition", "account", "qos", "constraint", "extra")


def spec_from_config(config, manifest: Path, *, shards: list[int] | None = None, name: str | None = None) -> JobSpec:
    """The JobSpec for `config.extraction` over `manifest`'s shards (all, or `shards`)."""
    from app.extract.manifest import read_manifest

    ext = config.extraction
    m = read_manifest(manifest)
    available = [e.index for e in m.shards]
    chosen = available if shards is None else shards
    missing = sorted(set(chosen) - set(available))
    if missing:
        raise InputError(f"{m.path}: has no shard(s) {missing}; it lists {available}")
    params: dict[str, str] = {}
    if ext.model_path is not None:
        params["model"] = str(ext.model_path)
    if ext.extractor == "builtin":
        if ext.model_path is None:
            raise InputError(
                "extraction.model_path: the built-in extractor needs the target model folder; "
                'set it in the config, or use extractor = "command"'
            )
        python = sys.executable
        if ext.backend == "vllm":
            python = ext.python or os.environ.get("EAGLEWATCH_VLLM_PYTHON") or ""
            if not python:
                raise InputError(
                    'extraction.backend = "vllm" runs in vLLM\'s own Python: set extraction.python (or '
                    "EAGLEWATCH_VLLM_PYTHON) to that venv's bin/python"
                )
            # that Python has no eaglewatch installed: both executors put this checkout's app/ on PYTHONPATH
        argv = [
            python,
            "-m",
            "app.extract",
            "--manifest",
            "{manifest}",
            "--shard",
            "{shard}",
            "--model",
            "{model}",
            "--out",
            "{out}",
            "--layer-convention",
            ext.layer_convention,
            "--layout",
            ext.layout,
        ]
        if ext.backend == "vllm":
            argv += ["--backend", "vllm"]
        if ext.aux_layers:
            argv += ["--aux-layers", ",".join(str(i) for i in ext.aux_layers)]
        if ext.gpus == 0:
            argv += ["--device", "cpu"]
        writes_marker = True
    else:
        argv = list(ext.command or [])
        writes_marker = False
    slurm = dict(ext.slurm)
    max_parallel = slurm.get("max_parallel")
    if max_parallel is not None and (not isinstance(max_parallel, int) or max_parallel < 1):
        raise InputError(f"extraction.slurm.max_parallel: expected an integer >= 1, got {max_parallel!r}")
    out = Path(ext.output_dir).resolve()
    return JobSpec(
        name=name or f"{config.run.name}-extract",
        argv=tuple(argv),
        shards=tuple(chosen),
        output_dir=out,
        workdir=Path.cwd(),
        resources=Resources(
            gpus=ext.gpus if ext.executor == "slurm" else min(ext.gpus, 1),
            cpus=int(slurm["cpus"] if "cpus" in slurm else slurm.get("cpus_per_task", 1)),
            mem=str(slurm["mem"]) if slurm.get("mem") else None,
            time=str(slurm["time"]) if slurm.get("time") else None,
        ),
        manifest=m.path,
        params=tuple(sorted(params.items())),
        max_parallel=max_parallel,
        writes_done_marker=writes_marker,
        slurm=tuple(sorted((k, str(v)) for k, v in slurm.items() if k in SLURM_OPTION_KEYS)),
    )


def visible_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L`, else none."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(row for row in out.splitlines() if row.startswith("GPU "))]


def local_slots(gpus: int, cpu_slots: int = 1) -> list[str]:
    """Slots for the local executor: `gpus` visible GPUs used in parallel, one per shard (0 → CPU slots)."""
    if gpus == 0:
        return slots_for(0, 1, cpu_slots)
    have = visible_gpus()
    if len(have) < gpus:
        raise InputError(
            f"extraction.gpus = {gpus} but this machine shows {len(have)} GPU(s) "
            f"({'CUDA_VISIBLE_DEVICES' if 'CUDA_VISIBLE_DEVICES' in os.environ else 'nvidia-smi -L'}); "
            "lower extraction.gpus, or set it to 0 to run shards on the CPU"
        )
    return [str(g) for g in have[:gpus]]


def executor_for(kind: str, store: JobStore, slots: list[str] | None = None):
    """A LocalExecutor (with `slots`) or a SlurmExecutor over `store`."""
    if kind == "local":
        return LocalExecutor(store, slots if slots is not None else [""])
    if kind == "slurm":
        return SlurmExecutor(store)
    raise InputError(f"executor {kind!r}: use local or slurm")
