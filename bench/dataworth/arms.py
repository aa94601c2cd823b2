"""The training sets of the data-worth bench: each differs from the exact one in one thing.

A row is `{"id", "input_ids", "loss_mask"}` as eaglewatch's `eagle3-shards` export writes it; an answer is a run of
loss-masked ids. Every arm but the text path is made from the exact export's rows by changing only the answers'
ids, so the prompts (and, in conversations, the turns between answers) stay the server's own.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Row = dict[str, Any]

ARMS = {
    "exact": "the server's own ids (eaglewatch against vLLM, return_token_ids): on-policy, exact",
    "reencoded": "each answer decoded to text and encoded again (the naive pipeline: canonical BPE everywhere)",
    "wrong-eos": "the end-of-turn id of each answer replaced by another special token (<|endoftext|>)",
    "off-policy": "the dataset's own answers (another model's), in the same prompts",
    "text-path": "eaglewatch's default text path from a text-only endpoint, its verdicts and export policy applied",
}


def answer_spans(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s in a loss mask."""
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def replace_answers(row: Row, new: Callable[[int, list[int]], list[int]]) -> Row:
    """`row` with its k-th answer's ids replaced by new(k, ids), the mask following."""
    ids, mask = row["input_ids"], row["loss_mask"]
    out_ids: list[int] = []
    out_mask: list[int] = []
    at = 0
    for k, (s, e) in enumerate(answer_spans(mask)):
        out_ids += ids[at:s]
        out_mask += [0] * (s - at)
        got = new(k, ids[s:e])
        out_ids += got
        out_mask += [1] * len(got)
        at = e
    out_ids += ids[at:]
    out_mask += [0] * (len(ids) - at)
    return {"id": row["id"], "input_ids": out_ids, "loss_mask": out_mask}


def reencoded(rows: Iterable[Row], tokenizer) -> list[Row]:
    """Arm (b): decode -> encode every answer (special tokens kept as text and matched again)."""
    return [
        replace_answers(
            r,
            lambda _k, ids: tokenizer.encode(
                tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False),
                add_special_tokens=False,
            ),
        )
        for r in rows
    ]


def wrong_eos(rows: Iterable[Row], end_id: int, wrong_id: int) -> list[Row]:
    """Arm (c): the answer's final end-of-turn id swapped for `wrong_id` (the seed's wrong `<|im_end|>` constant)."""

    def swap(_k: int, ids: list[int]) -> list[int]:
        return [*ids[:-1], wrong_id] if ids and ids[-1] == end_id else ids

    return [replace_answers(r, swap) for r in rows]


def off_policy(rows: Iterable[Row], originals: dict[str, tuple[str, ...]], tokenizer, end: str) -> list[Row]:
    """Arm (d): each answer replaced by the dataset's own answer to that turn (`originals[conversation id]`), encoded
    with the end-of-turn marker. A per-turn row `<id>#<turn>` (turns from 1) ends with that turn's answer."""
    out = []
    for r in rows:
        base, _, turn = r["id"].partition("#")
        answers = originals[base]
        last = int(turn) - 1 if turn else len(answers) - 1  # eaglewatch numbers turns from 1
        spans = answer_spans(r["loss_mask"])
        first = last - len(spans) + 1  # the answers in this row are turns first..last

        def original(k: int, _ids: list[int], first: int = first, answers=answers) -> list[int]:
            return tokenizer.encode(answers[first + k] + end, add_special_tokens=False)

        out.append(replace_answers(r, original))
    return out


def answer_ids(row: Row) -> list[int]:
    """The answers' ids of a row, concatenated."""
    return [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]


def differing_share(arm: list[Row], exact: list[Row]) -> dict[str, Any]:
    """Share of answer tokens that differ from the exact arm (aligned by difflib, per sample id), over the samples
    both hold; and how many of the exact arm's samples the arm lacks."""
    by_id = {r["id"]: answer_ids(r) for r in exact}
    differ = total = changed = 0
    common = 0
    for r in arm:
        want = by_id.get(r["id"])
        if want is None:
            continue
        common += 1
        got = answer_ids(r)
        same = sum(b.size for b in difflib.SequenceMatcher(None, got, want, autojunk=False).get_matching_blocks())
        d = max(len(got), len(want)) - same
        differ += d
        total += len(want)
        changed += d > 0
    return {
        "samples": len(arm),
        "missing_vs_exact": len(by_id) - common,
        "samples_changed": changed,
        "token_share_differing": round(differ / total, 4) if total else None,
    }


def write_arm(rows: list[Row], folder: Path) -> Path:
    """The arm as an eagle3-shards folder (manifest.json + one shard: what `eaglewatch extract` reads) and as
    `data/rows.jsonl` (input_ids + loss_mask: what `speculators prepare-data` reads); returns the manifest."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    with open(folder / "shard_00000.jsonl", "w", encoding="utf-8") as out:
        for r in rows:
            out.write(json.dumps(r) + "\n")
    with open(folder / "data" / "rows.jsonl", "w", encoding="utf-8") as out:
        for r in rows:
            out.write(json.dumps({"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}) + "\n")
    tokens = sum(len(r["input_ids"]) for r in rows)
    shard = {"index": 0, "path": "shard_00000.jsonl", "samples": len(rows), "tokens": tokens}
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"format": "eagle3-shards", "tokenizer_fingerprint": "bench", "shards": [shard]}))
    return manifest


def read_rows(folder: Path) -> list[Row]:
    """Every row of an eagle3-shards export folder, in shard order."""
    manifest = json.loads((folder / "manifest.json").read_text())
    rows = []
    for entry in sorted(manifest["shards"], key=lambda e: e["index"]):
        with open(folder / entry["path"], encoding="utf-8") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows
