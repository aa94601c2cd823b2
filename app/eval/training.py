"""What an eval knows of the drafter's training data, and the guards that need it.

- `TrainingData.load(OUT)`: an export folder (`eaglewatch export ... --out OUT`, ideally with `--eval-fraction`):
  its manifest's `sampling` (how the training answers were generated: temperature, top_p, top_k, thinking), the
  normalised prompt hash of every training row (`OUT/prompts.jsonl`, `app.export.eval_overlap.prompt_hash`, the
  export's own normalisation) and the eval split's prompts (`OUT/eval/prompts.jsonl`: the default eval prompts);
- `sampling_verdict`: the eval's sampling, as stored per request, against the training data's (`sampling differs`);
- `overlap_verdict`: eval prompts whose prompt hash is a training row's (`eval/training overlap`: they are left
  out of the figures);
- `read_d2t` / `coverage_verdict`: the drafter's draft vocabulary (a `d2t` file: `.npy`, `.safetensors`, `.pt`, or
  a checkpoint folder holding one) and the share of eval output tokens inside it (`draft vocabulary coverage`).

Each verdict is `{"verdict": name, "level": "warning" | "error" | "info", "message": sentence}`, like the others.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.export.eval_overlap import prompt_hash
from app.export.eval_split import EVAL_DIR

MANIFEST = "manifest.json"
PROMPTS = "prompts.jsonl"  # app.export.assemble.PROMPTS: per row id, category, prompt_hash (and messages in eval/)
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "thinking")
EXAMPLES = 5


def eval_split_prompts(out: Path) -> Path:
    """The eval split's prompt file of export folder `out` (what `[eval] training` makes the default prompts)."""
    return Path(out) / EVAL_DIR / PROMPTS


@dataclass(frozen=True)
class TrainingData:
    """An export folder as an eval sees it: how its answers were sampled and its training prompts' hashes."""

    folder: Path
    sampling: dict[str, Any] | None
    prompt_hashes: frozenset[str]

    @classmethod
    def load(cls, folder: Path) -> TrainingData:
        """Read `folder`'s manifest and prompts file; InputError naming the file when either is missing or bad."""
        folder = Path(folder)
        manifest_path = folder / MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(
                f"{manifest_path}: cannot be read ({exc.strerror or exc}); [eval] training names an export folder "
                "(`eaglewatch export ... --out OUT --eval-fraction 0.05`)"
            ) from None
        except json.JSONDecodeError as exc:
            raise InputError(f"{manifest_path}:{exc.lineno}: not JSON ({exc.msg}); export again") from None
        role = (manifest.get("split") or {}).get("role") if isinstance(manifest, dict) else None
        if role == "eval":
            raise InputError(
                f"{folder}: is an export's eval split; [eval] training names the export folder above it "
                f"({folder.parent})"
            )
        prompts_path = folder / PROMPTS
        hashes: set[str] = set()
        try:
            with prompts_path.open(encoding="utf-8") as fh:
                for number, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        value = json.loads(line).get("prompt_hash")
                    except (json.JSONDecodeError, AttributeError):
                        raise InputError(f"{prompts_path}:{number}: not a JSON object; export again") from None
                    if isinstance(value, str):
                        hashes.add(value)
        except FileNotFoundError:
            raise InputError(
                f"{prompts_path}: not found; the export predates the prompts file eval reads; export the run again"
            ) from None
        sampling = manifest.get("sampling") if isinstance(manifest, dict) else None
        return cls(folder, sampling if isinstance(sampling, dict) else None, frozenset(hashes))


def eval_sampling(stored: dict[str, Any]) -> dict[str, Any]:
    """A request's stored sampling (`app.eval.run.sampling_extra`) in the manifest's words."""
    kwargs = stored.get("chat_template_kwargs")
    thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    return {
        "temperature": stored.get("temperature"),
        "top_p": stored.get("top_p"),
        "top_k": stored.get("top_k"),
        "thinking": thinking,
    }


def sampling_verdict(samplings: Iterable[dict[str, Any]], training: TrainingData) -> dict[str, str] | None:
    """`sampling differs` when any eval request was sampled otherwise than the training answers (top_k unset on
    one side and set on the other differs: a `top_k = 1` eval is greedy-like; thinking is compared only where both
    sides set it); None when they agree."""
    if training.sampling is None:
        return {
            "verdict": "sampling unknown",
            "level": "info",
            "message": f"{training.folder}: its manifest records no sampling (an older export); export again to "
            "compare the eval's sampling with the training data's",
        }
    seen: dict[str, set[Any]] = {k: set() for k in SAMPLING_KEYS}
    for stored in samplings:
        for key, value in eval_sampling(stored).items():
            seen[key].add(json.dumps(value))
    differ = []

    def word(value: Any) -> str:
        return "unset (the server's default)" if value is None else str(value)

    for key in SAMPLING_KEYS:
        train = training.sampling.get(key)
        evals = {json.loads(v) for v in seen[key]}
        if key == "thinking" and (train is None or evals == {None}):
            continue  # the template's default on one side: not known to differ
        if evals and evals != {train}:
            shown = ", ".join(word(v) for v in sorted(evals, key=str))
            differ.append(f"{key} {shown} in the eval against {word(train)} in training")
    if not differ:
        return None
    return {
        "verdict": "sampling differs",
        "level": "warning",
        "message": "the eval's sampling differs from the training data's ("
        + "; ".join(differ)
        + f"; {training.folder}): acceptance is measured off the distribution the drafter learned; sample the eval "
        "as the data was generated ([eval] temperature, top_p, top_k, thinking)",
    }


def overlapping(prompts: dict[int, Sequence[dict[str, Any]]], training: TrainingData) -> dict[int, str]:
    """The eval samples (by pk) whose normalised prompt hash is a training row's, with that hash."""
    out: dict[int, str] = {}
    for pk, messages in prompts.items():
        h = prompt_hash(messages)
        if h in training.prompt_hashes:
            out[pk] = h
    return out


def overlap_verdict(overlap: dict[int, str], sample_ids: dict[int, str], total: int) -> dict[str, str] | None:
    """`eval/training overlap` naming a few of the eval prompts also trained on (left out of the figures)."""
    if not overlap:
        return None
    names = ", ".join(sample_ids.get(pk, str(pk)) for pk in sorted(overlap)[:EXAMPLES])
    more = f" and {len(overlap) - EXAMPLES} more" if len(overlap) > EXAMPLES else ""
    return {
        "verdict": "eval/training overlap",
        "level": "warning",
        "message": f"{len(overlap)} of {total} eval prompts are also in the training data (normalised prompt hash: "
        f"{names}{more}); they are left out of the figures, which would otherwise flatter the drafter",
    }


def read_d2t(path: Path) -> frozenset[int]:
    """The target ids of a drafter's draft vocabulary from its `d2t` (target id = i + d2t[i]): a `.npy`, a
    `.safetensors` with a `d2t` tensor, a `.pt` (torch needed), or a checkpoint folder holding one of them."""
    import numpy as np

    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("*.safetensors")) + sorted(path.glob("d2t*.npy")) + sorted(path.glob("d2t*.pt"))
        if not found:
            raise InputError(f"{path}: no *.safetensors, d2t*.npy or d2t*.pt inside; name the d2t file itself")
        for candidate in found:
            try:
                return read_d2t(candidate)
            except InputError:
                if candidate == found[-1]:
                    raise
        raise AssertionError("unreachable")
    try:
        if path.suffix == ".npy":
            d2t = np.load(path, allow_pickle=False)
        elif path.suffix == ".safetensors":
            d2t = _safetensors_tensor(path, "d2t")
        elif path.suffix == ".pt":
            try:
                import torch
            except ImportError:
                raise InputError(
                    f"{path}: a .pt file needs torch (pip install -e '.[extract]'); or give the d2t-N.npy"
                ) from None
            loaded = torch.load(path, map_location="cpu", weights_only=True)
            d2t = (loaded["d2t"] if isinstance(loaded, dict) else loaded).numpy()
        else:
            raise InputError(f"{path}: a d2t is a .npy, .safetensors or .pt file, or a checkpoint folder")
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc}); check [eval] d2t") from None
    except ValueError as exc:
        raise InputError(f"{path}: not a d2t array ({exc})") from None
    d2t = np.asarray(d2t).reshape(-1).astype(np.int64)
    return frozenset(int(t) for t in np.arange(len(d2t), dtype=np.int64) + d2t)


_SAFETENSORS_DTYPES = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "U8": "u1", "I8": "i1"}


def _safetensors_tensor(path: Path, name: str) -> Any:
    """One integer tensor of a safetensors file, read by its header (8-byte length, JSON, then the raw data)."""
    import numpy as np

    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise InputError(f"{path}: not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", head)
        try:
            header = json.loads(fh.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise InputError(f"{path}: not a safetensors file (its header is not JSON)") from None
        key = next((k for k in header if k == name or k.endswith("." + name)), None)
        if key is None:
            raise InputError(f"{path}: holds no {name!r} tensor")
        info = header[key]
        dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise InputError(f"{path}: tensor {key!r} has dtype {info.get('dtype')}, not an integer type")
        start, end = info["data_offsets"]
        fh.seek(8 + size + start)
        return np.frombuffer(fh.read(end - start), dtype=dtype)


def vocabulary_coverage(outputs: Iterable[Sequence[int]], vocab: frozenset[int]) -> tuple[int, int]:
    """(output tokens inside the draft vocabulary, all output tokens)."""
    inside = total = 0
    for ids in outputs:
        total += len(ids)
        inside += sum(1 for t in ids if t in vocab)
    return inside, total


def coverage_verdict(inside: int, total: int, minimum: float, source: Path) -> dict[str, str] | None:
    """`draft vocabulary coverage` when the share of eval output tokens the drafter can propose is below
    `minimum` (a token outside its vocabulary is never accepted)."""
    if total == 0 or inside / total >= minimum:
        return None
    return {
        "verdict": "draft vocabulary coverage",
        "level": "warning",
        "message": f"only {inside / total:.1%} of the eval's {total} output tokens are in the drafter's draft "
        f"vocabulary ({source}; below {minimum:.0%}): the drafter cannot propose the rest, so acceptance is capped; "
        "build the vocabulary from data like the eval's (`eaglewatch vocab`) or a larger one",
    }
