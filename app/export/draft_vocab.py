"""The reduced draft vocabulary of an EAGLE-3 drafter: the N target tokens most frequent in the loss spans, and
the mapping files each trainer reads (`eaglewatch vocab`).

Selection follows speculators' `build_vocab_mappings_from_distribution` (speculators/train/vocab_mapping.py):
tokens by descending count, ties by ascending id; when fewer than N distinct tokens were seen, the lowest unused
ids fill the rest; the chosen ids sorted ascending. Then `d2t[i] = chosen[i] - i` (draft index -> offset to the
target id) and `t2d[t] = t is chosen`, the layout all three trainers share. Files, for size N:

| file | read by | content |
|---|---|---|
| `token_freq.pt` | speculators `--token-freq-path` (train derives d2t/t2d from it) | `{id: loss count}` (torch.save) |
| `d2t-N.npy`, `t2d-N.npy` | speculators `--d2t-path` / `--t2d-path` (`_load_mappings`: np.load) | int64 [N], bool [V] |
| `vocab_mapping-N.pt` | SpecForge `model.vocab_mapping_path` | `{"d2t": int64 [N], "t2d": bool [V]}` |
| `d2t-N.pt` | Model-Optimizer `data.draft_vocab_cache` (`HFEagleModel.load_draft_vocab_cache`) | int64 [N] tensor |
| `vocab.json` | people | sizes, coverage, counts |

numpy only; torch is imported for the `.pt` files alone, and without it they are skipped (said, exit 0) unless
`--trainer` asks for SpecForge or Model-Optimizer, whose files they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import InputError

COMMON_SIZES = (8192, 16384, 32768, 65536)  # the table `eaglewatch vocab` prints (8k, 16k, 32k, 64k)


class LossTokenCounts:
    """How often each target token id is in the loss, accumulated row by row (numpy bincount in chunks)."""

    def __init__(self) -> None:
        self._counts = np.zeros(0, dtype=np.int64)
        self._pending: list[np.ndarray] = []
        self._pending_n = 0
        self.rows = 0

    def add(self, input_ids: Sequence[int], loss_mask: Sequence[int] | None) -> None:
        """Count the ids of one row whose mask is 1 (every id when `loss_mask` is None)."""
        ids = np.asarray(input_ids, dtype=np.int64)
        if loss_mask is None:
            chosen = ids
        else:
            mask = np.asarray(loss_mask, dtype=bool)
            if ids.shape != mask.shape:
                raise InputError(f"a row has {ids.size} ids but {mask.size} loss_mask values")
            chosen = ids[mask]
        if chosen.size and chosen.min() < 0:
            raise InputError(f"a row holds a negative token id ({int(chosen.min())})")
        self._pending.append(chosen)
        self._pending_n += chosen.size
        self.rows += 1
        if self._pending_n > 1 << 22:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        add = np.bincount(np.concatenate(self._pending))
        if add.size > self._counts.size:
            add[: self._counts.size] += self._counts
            self._counts = add
        else:
            self._counts[: add.size] += add
        self._pending, self._pending_n = [], 0

    @property
    def counts(self) -> np.ndarray:
        """int64 [max id + 1]: the loss count of every id."""
        self._flush()
        return self._counts

    def as_dict(self) -> dict[int, int]:
        """{token id: count} for every id seen in the loss (speculators' token_freq.pt content)."""
        counts = self.counts
        seen = np.flatnonzero(counts)
        return dict(zip(seen.tolist(), counts[seen].tolist(), strict=True))


@dataclass(frozen=True)
class DraftVocab:
    """The chosen draft vocabulary: `size` target ids (ascending) out of `target_vocab_size`."""

    size: int
    target_vocab_size: int
    token_ids: np.ndarray  # int64 [size], ascending
    covered: int  # loss tokens whose id is in the draft vocabulary
    loss_tokens: int

    @property
    def d2t(self) -> np.ndarray:
        """int64 [size]: target id = draft index + d2t[draft index]."""
        return self.token_ids - np.arange(self.size, dtype=np.int64)

    @property
    def t2d(self) -> np.ndarray:
        """bool [target_vocab_size]: whether each target id has a draft index."""
        mask = np.zeros(self.target_vocab_size, dtype=bool)
        mask[self.token_ids] = True
        return mask

    @property
    def coverage(self) -> float:
        """Share of the loss tokens the draft vocabulary holds."""
        return self.covered / self.loss_tokens if self.loss_tokens else 0.0


def ranked_ids(counts: np.ndarray) -> np.ndarray:
    """Ids seen in the loss, most frequent first, ties by ascending id."""
    seen = np.flatnonzero(counts)
    order = np.lexsort((seen, -counts[seen]))  # last key first: count descending, then id ascending
    return seen[order]


def choose(counts: np.ndarray, size: int, target_vocab_size: int) -> DraftVocab:
    """The `size` draft ids by speculators' rule (see the module docstring); InputError when `size` does not fit
    the target vocabulary or an id seen lies outside it."""
    if size <= 0:
        raise InputError(f"--size: a draft vocabulary needs at least one token, got {size}")
    if size > target_vocab_size:
        raise InputError(
            f"--size: {size} exceeds the target vocabulary ({target_vocab_size} tokens); choose a "
            "smaller draft vocabulary"
        )
    if counts.size > target_vocab_size and counts[target_vocab_size:].any():
        bad = int(target_vocab_size + np.flatnonzero(counts[target_vocab_size:])[0])
        raise InputError(
            f"token id {bad} is in the loss but outside the target vocabulary ({target_vocab_size} "
            "tokens); pass the target model's --target-vocab-size or --model"
        )
    ranked = ranked_ids(counts)
    chosen = ranked[:size]
    if chosen.size < size:  # fewer distinct tokens than asked: the lowest unused ids fill the rest
        free = np.setdiff1d(np.arange(target_vocab_size, dtype=np.int64), chosen, assume_unique=True)
        chosen = np.concatenate([chosen, free[: size - chosen.size]])
    chosen = np.sort(chosen.astype(np.int64))
    covered = int(counts[chosen[chosen < counts.size]].sum())
    return DraftVocab(size, target_vocab_size, chosen, covered, int(counts.sum()))


def coverage_table(counts: np.ndarray, sizes: Iterable[int]) -> list[tuple[int, int, float]]:
    """(size, loss tokens covered, share) for each size: what the top `size` ids hold of the loss."""
    ranked = counts[ranked_ids(counts)]
    cumulative = np.cumsum(ranked)
    total = int(counts.sum())
    out = []
    for size in sizes:
        covered = int(cumulative[min(size, cumulative.size) - 1]) if cumulative.size and size > 0 else 0
        out.append((size, covered, covered / total if total else 0.0))
    return out


# which trainer reads each file (the module table); the .npy files need numpy only, the .pt files torch
TRAINERS = ("speculators", "specforge", "modelopt")
TORCH_FILES = {
    "specforge": ("vocab_mapping-{n}.pt",),
    "modelopt": ("d2t-{n}.pt",),
    "speculators": ("token_freq.pt",),
}  # speculators reads the .npy pair; token_freq.pt is its other way
EXTRACT_EXTRA = "pip install -e '.[extract]'"


@dataclass(frozen=True)
class VocabFiles:
    """What `write_vocab_files` wrote, and the torch files it left out (file -> the trainer that reads it)."""

    written: list[str]
    skipped: dict[str, str]

    def skipped_sentence(self) -> str:
        """Which files were left out, for whom, and the extra that brings torch ("" when none were)."""
        if not self.skipped:
            return ""
        files = ", ".join(f"{f} ({t})" for f, t in self.skipped.items())
        return f"skipped {files}: torch is not installed; {EXTRACT_EXTRA} brings it"


def write_vocab_files(
    vocab: DraftVocab, freq: dict[int, int], out_dir: Path, trainers: Sequence[str] = ()
) -> VocabFiles:
    """Write the trainers' files for `vocab` into `out_dir` (created). Without torch the `.pt` files are left out
    and named in `skipped`, unless `trainers` asks for one that needs them: then InputError, after the numpy files
    are written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    n = vocab.size
    written = []
    # speculators/train/cli.py `_load_mappings`: np.load of int64 d2t and bool t2d
    np.save(out_dir / f"d2t-{n}.npy", vocab.d2t)
    np.save(out_dir / f"t2d-{n}.npy", vocab.t2d)
    written += [f"d2t-{n}.npy", f"t2d-{n}.npy"]
    try:
        import torch
    except ImportError:
        needing = [t for t in trainers if t in ("specforge", "modelopt")]
        if needing:
            raise InputError(
                f"{out_dir}: wrote {', '.join(written)}, but {' and '.join(needing)} read(s) "
                f"{', '.join(TORCH_FILES[t][0].format(n=n) for t in needing)}, which need torch: "
                f"{EXTRACT_EXTRA}, then run this again"
            ) from None
        asked = trainers or TRAINERS
        skipped = {f.format(n=n): t for t in asked for f in TORCH_FILES[t]}
        return VocabFiles(written, skipped)
    d2t = torch.from_numpy(vocab.d2t.copy())
    t2d = torch.from_numpy(vocab.t2d.copy())
    # speculators/train/vocab_mapping.py `save_token_frequency_distribution`: a plain {id: count} dict
    torch.save(dict(freq), out_dir / "token_freq.pt")
    # specforge/modeling/draft/base.py `load_vocab_mapping`: {"d2t", "t2d"} copied into the draft's buffers
    torch.save({"d2t": d2t, "t2d": t2d}, out_dir / f"vocab_mapping-{n}.pt")
    # modelopt/torch/speculative/plugins/hf_eagle.py `load_draft_vocab_cache`: the int64 d2t tensor itself
    torch.save(d2t, out_dir / f"d2t-{n}.pt")
    written += ["token_freq.pt", f"vocab_mapping-{n}.pt", f"d2t-{n}.pt"]
    return VocabFiles(written, {})


def write_summary(
    vocab: DraftVocab,
    table: list[tuple[int, int, float]],
    counts: LossTokenCounts,
    source: str,
    out_dir: Path,
    files: list[str],
) -> dict[str, Any]:
    """`vocab.json`: what was chosen from what, with the coverage table; returned as written."""
    summary = {
        "source": source,
        "rows": counts.rows,
        "loss_tokens": vocab.loss_tokens,
        "distinct_tokens": int(np.count_nonzero(counts.counts)),
        "target_vocab_size": vocab.target_vocab_size,
        "draft_vocab_size": vocab.size,
        "coverage": round(vocab.coverage, 6),
        "table": [{"size": s, "loss_tokens": c, "coverage": round(share, 6)} for s, c, share in table],
        "rule": "by loss count descending, ties by id ascending; lowest unused ids fill; d2t[i] = id[i] - i",
        "files": files + ["vocab.json"],
    }
    (out_dir / "vocab.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary


def rows_of_export(export_dir: Path) -> Iterator[tuple[Sequence[int], Sequence[int] | None]]:
    """(input_ids, loss_mask) of every row an export trains on (its data/, not its eval split): pre-tokenized
    formats only (eagle3-shards, speculators, specforge)."""
    import orjson

    manifest_path = export_dir / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{manifest_path}: not found; pass an export folder (eaglewatch export --out) or --db"
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{manifest_path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    fmt = manifest.get("format")
    entries = manifest.get("shards") or manifest.get("files") or []
    if fmt not in ("eagle3-shards", "speculators", "specforge"):
        raise InputError(
            f"{export_dir}: a {fmt!r} export holds no token ids; count from an eagle3-shards, "
            "speculators or specforge export, or from the run with --db"
        )
    for entry in entries:
        path = export_dir / entry["path"]
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = orjson.loads(line)
                    yield row["input_ids"], row["loss_mask"]
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    raise InputError(f"{path}:{lineno}: not a row with input_ids and loss_mask") from None


def rows_of_run(
    db: Path, run: str | None, eval_fraction: float = 0.0
) -> Iterator[tuple[Sequence[int], Sequence[int] | None]]:
    """(output ids, None: all in the loss) of every sample the default export policy keeps, from the run database: the
    true ids it would export (policy.true_ids), leaving out the rows held out at `eval_fraction`."""
    from app.export.eval_split import held_out
    from app.export.policy import ExportPolicy, skip_reason, true_ids
    from app.store.export_reads import iter_rows
    from app.store.queries import connect_readonly, resolve_run

    conn = connect_readonly(db)
    try:
        info = resolve_run(conn, run, db_label=str(db))
        policy = ExportPolicy()
        for row in iter_rows(conn, info.id):
            if skip_reason(row, policy) is not None or held_out(row.sample_id, eval_fraction):
                continue
            ids, _ = true_ids(row)
            yield ids, None
    finally:
        conn.close()
