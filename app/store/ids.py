"""Token id arrays as packed little-endian uint32 BLOBs (4 bytes per id, no header)."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

_SWAP = sys.byteorder != "little"


def pack_ids(ids: Sequence[int] | None) -> bytes | None:
    """Pack token ids into little-endian uint32 bytes; None stays None. Raises ValueError outside 0..2**32-1."""
    if ids is None:
        return None
    try:
        arr = array("I", ids)
    except OverflowError as exc:
        raise ValueError(f"token ids must be in 0..4294967295: {exc}") from None
    if arr.itemsize != 4:  # pragma: no cover - no mainstream platform has a non-4-byte unsigned int
        arr = array("L", ids)
    if _SWAP:  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return arr.tobytes()


def unpack_ids(blob: bytes | memoryview | None) -> tuple[int, ...] | None:
    """Unpack a BLOB written by `pack_ids` into a tuple of ints; None stays None."""
    if blob is None:
        return None
    if len(blob) % 4:
        raise ValueError(f"a packed id array must be a multiple of 4 bytes long, got {len(blob)}")
    arr = array("I")
    arr.frombytes(bytes(blob))
    if _SWAP:  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return tuple(arr)
