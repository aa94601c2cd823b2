"""The held-out evaluation split: which rows an export keeps out of training, by a stable hash of their id.

A row is held out when the first 8 bytes of sha256(its split key) read as a fraction of 2**64 fall below the
eval fraction. The key is the hash of the row's prompt opening (app.export.eval_overlap.split_key: its
normalised messages through the first user message), so rows with the same prompt and every row of a
conversation fall on the same side, and an export run again, later, with other samples added or another
format, holds out exactly the same ids. The share held out is close to the fraction, not equal to it (a hash,
not a shuffle); the manifest records the counts.
"""

from __future__ import annotations

import hashlib

EVAL_DIR = "eval"  # the eval split's own export folder inside OUT (data/, manifest.json, samples.tsv)


def check_fraction(fraction: float) -> float:
    """`fraction` if it is a usable eval fraction (0 <= f < 1), else ValueError naming the range."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"must be at least 0 and below 1 (a share of the rows), got {fraction}")
    return fraction


def held_out(key: str, fraction: float) -> bool:
    """Whether the row with split key `key` belongs to the eval split at `fraction`."""
    if fraction <= 0.0:
        return False
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64
