"""JobSpec: what an extraction job runs, per shard, and with which resources.

A spec is plain data (frozen, JSON round-trip) so it can be stored in `jobs.spec` and rebuilt after a
restart. The command is an argv list, never a shell string; `{shard}`, `{out}`, `{manifest}`,
`{num_shards}` and any key of `params` are substituted per shard in every argv element.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from app.errors import InputError

BUILTIN_PLACEHOLDERS = ("shard", "out", "manifest", "num_shards")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # exported by name in the Slurm batch script


@dataclass(frozen=True)
class Resources:
    """Per-shard resources: GPUs (CUDA devices per shard), CPUs, memory ("16G") and time ("02:00:00")."""

    gpus: int = 1
    cpus: int = 1
    mem: str | None = None
    time: str | None = None


@dataclass(frozen=True)
class JobSpec:
    """One job: `argv` run once per shard in `workdir` with `env` added, writing under `output_dir`.

    `writes_done_marker` says the command writes `<output_dir>/shard_<i>.done` itself (the built-in
    extractor does); when False the wrapper (`app.jobs.wrap`) writes it after an exit status of 0.
    """

    name: str
    argv: tuple[str, ...]
    shards: tuple[int, ...]
    output_dir: Path
    workdir: Path
    env: tuple[tuple[str, str], ...] = ()
    resources: Resources = field(default_factory=Resources)
    manifest: Path | None = None
    params: tuple[tuple[str, str], ...] = ()
    log_dir: Path | None = None
    max_parallel: int | None = None
    writes_done_marker: bool = True
    slurm: tuple[tuple[str, str], ...] = ()  # partition, account, qos, extra args ("extra": "--foo bar")

    def __post_init__(self) -> None:
        from app.config import name_problem

        problem = name_problem(self.name)
        if problem is not None:
            raise InputError(f"job name {problem}")
        for key, _ in self.env:
            if not _ENV_KEY.match(key):
                raise InputError(
                    f"job {self.name!r}: environment variable name {key!r} is not a valid shell name "
                    "(letters, digits and '_', not starting with a digit)"
                )
        if not self.argv:
            raise InputError(f"job {self.name!r}: the command (argv) is empty; give the extractor command as a list")
        if isinstance(self.argv, str):
            raise InputError(f"job {self.name!r}: the command must be a list of arguments, not a shell string")
        if len(set(self.shards)) != len(self.shards) or any(s < 0 for s in self.shards):
            raise InputError(f"job {self.name!r}: shard ids must be distinct non-negative integers")
        known = set(BUILTIN_PLACEHOLDERS) | {k for k, _ in self.params}
        for i, arg in enumerate(self.argv):
            try:
                fields = list(string.Formatter().parse(arg))
            except ValueError as exc:
                raise InputError(
                    f"job {self.name!r}: argv[{i}] {arg!r}: {exc}; write {{{{ and }}}} for literal braces"
                ) from None
            for _, name, _, _ in fields:
                if name is not None and name not in known:
                    raise InputError(
                        f"job {self.name!r}: argv[{i}] {arg!r} uses placeholder {{{name}}}; known placeholders are "
                        + ", ".join("{" + k + "}" for k in sorted(known))
                        + " (write {{ and }} for literal braces)"
                    )

    @property
    def logs(self) -> Path:
        """Directory of the per-shard stdout/stderr logs and exit files."""
        return self.log_dir if self.log_dir is not None else self.output_dir / "logs"

    def argv_for(self, shard: int) -> list[str]:
        """The argv for one shard, placeholders substituted."""
        values = {
            "shard": str(shard),
            "out": str(self.output_dir),
            "manifest": str(self.manifest) if self.manifest is not None else "",
            "num_shards": str(len(self.shards)),
            **dict(self.params),
        }
        return [arg.format_map(values) for arg in self.argv]

    def done_marker(self, shard: int) -> Path:
        """The file whose existence proves a shard finished: `<output_dir>/shard_<i>.done`."""
        return done_marker(self.output_dir, shard)

    def stdout_log(self, shard: int) -> Path:
        return self.logs / f"shard_{shard}.out"

    def stderr_log(self, shard: int) -> Path:
        return self.logs / f"shard_{shard}.err"

    def exit_file(self, shard: int) -> Path:
        """Where the wrapper records a shard's exit status (absent while running or after SIGKILL)."""
        return self.logs / f"shard_{shard}.exit"

    def to_json(self) -> str:
        """Compact JSON for the `jobs.spec` column."""
        return json.dumps(
            {
                "name": self.name,
                "argv": list(self.argv),
                "shards": list(self.shards),
                "output_dir": str(self.output_dir),
                "workdir": str(self.workdir),
                "env": dict(self.env),
                "resources": {
                    "gpus": self.resources.gpus,
                    "cpus": self.resources.cpus,
                    "mem": self.resources.mem,
                    "time": self.resources.time,
                },
                "manifest": str(self.manifest) if self.manifest is not None else None,
                "params": dict(self.params),
                "log_dir": str(self.log_dir) if self.log_dir is not None else None,
                "max_parallel": self.max_parallel,
                "writes_done_marker": self.writes_done_marker,
                "slurm": dict(self.slurm),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """Rebuild a spec stored by `to_json`."""
        d = json.loads(text)
        return cls(
            name=d["name"],
            argv=tuple(d["argv"]),
            shards=tuple(d["shards"]),
            output_dir=Path(d["output_dir"]),
            workdir=Path(d["workdir"]),
            env=tuple(sorted(d.get("env", {}).items())),
            resources=Resources(**d.get("resources", {})),
            manifest=Path(d["manifest"]) if d.get("manifest") else None,
            params=tuple(sorted(d.get("params", {}).items())),
            log_dir=Path(d["log_dir"]) if d.get("log_dir") else None,
            max_parallel=d.get("max_parallel"),
            writes_done_marker=d.get("writes_done_marker", True),
            slurm=tuple(sorted(d.get("slurm", {}).items())),
        )


def done_marker(output_dir: Path, shard: int) -> Path:
    """`<output_dir>/shard_<i>.done`: written last by the extractor (or the wrapper), trusted over any state."""
    return Path(output_dir) / f"shard_{shard}.done"
