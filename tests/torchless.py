"""Run a command as in a core install, where torch is absent: a `sitecustomize` on PYTHONPATH hides it.

`sys.modules["torch"] = None` makes `import torch` (and every `torch.x`) raise ModuleNotFoundError and
`importlib.util.find_spec("torch")` answer None, which is how transformers and our own code ask; a meta-path
finder raising ModuleNotFoundError catches anything that drops the entry first. Children of the command (reconstruct
workers, spawned processes) inherit PYTHONPATH, so they see no torch either.
"""

from __future__ import annotations

import os
from pathlib import Path

SITECUSTOMIZE = '''\
import sys


class _NoTorch:
    """Hides torch, as a core install (pip install -e ., no extras) lacks it."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (torch hidden: a core install)", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
sys.modules["torch"] = None
'''


def torchless_env(folder: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default os.environ) with a sitecustomize that hides torch first on PYTHONPATH (written in `folder`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), out.get("PYTHONPATH", "")) if p)
    return out
