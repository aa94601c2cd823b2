"""Token-sequence diff and the side-by-side alignment the token diff view draws.

The diff trims the common prefix and suffix, then runs Myers' O(ND) algorithm on what is left; past a
budget of edits it anchors on tokens that occur once in each side (patience diff) and diffs between
anchors, so a 32k-token pair takes well under a second even when the sides share little.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Sequence

from app.records import AlignBlock, AlignedToken, Alignment, DiffSpan
from app.tokens.tokenizer import Tokenizer

MAX_EDITS = 400  # Myers budget per region; its cost grows with the square of this
WORK_BUDGET = 200_000  # Myers diagonal steps per diff in all; past it the rest is one differing region

Match = tuple[int, int, int]  # (a_start, b_start, length)
# Display tokens per tokenizer, kept while the tokenizer lives (the diff view re-aligns often).
_TOKEN_CACHE: weakref.WeakKeyDictionary[Tokenizer, dict[int, AlignedToken]] = weakref.WeakKeyDictionary()


_CHUNK = 4096


def common_prefix(a: Sequence, b: Sequence, limit: int | None = None) -> int:
    """Length of the shared start of `a` and `b` (lists, bytes or str), at most `limit`.

    Chunked slice comparisons (C-level) then a binary search inside the first differing chunk: linear
    in the shared length with a small constant, where an element loop costs a Python step per item.
    """
    n = min(len(a), len(b)) if limit is None else min(limit, len(a), len(b))
    i = 0
    while i + _CHUNK <= n and a[i : i + _CHUNK] == b[i : i + _CHUNK]:
        i += _CHUNK
    if a[i:n] == b[i:n]:
        return n
    lo, hi = i, min(i + _CHUNK, n)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[i:mid] == b[i:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix(a: Sequence, b: Sequence, limit: int | None = None) -> int:
    """Length of the shared end of `a` and `b`, at most `limit` (see common_prefix)."""
    la, lb = len(a), len(b)
    n = min(la, lb) if limit is None else min(limit, la, lb)
    i = 0
    while i + _CHUNK <= n and a[la - i - _CHUNK : la - i] == b[lb - i - _CHUNK : lb - i]:
        i += _CHUNK
    if a[la - n : la - i] == b[lb - n : lb - i]:
        return n
    lo, hi = i, min(i + _CHUNK, n)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[la - mid : la - i] == b[lb - mid : lb - i]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def matching_runs(a: Sequence[int], b: Sequence[int]) -> list[Match]:
    """Runs of equal tokens shared by `a` and `b`, in order (a longest-common-subsequence style diff)."""
    a, b = list(a), list(b)
    n, m = len(a), len(b)
    limit = min(n, m)
    pre = common_prefix(a, b)
    suf = common_suffix(a, b, limit - pre)
    runs: list[Match] = []
    if pre:
        runs.append((0, 0, pre))
    _diff_region(a, pre, n - suf, b, pre, m - suf, runs, 0, [WORK_BUDGET])
    if suf:
        runs.append((n - suf, m - suf, suf))
    return _merge(runs)


def diff_spans(ref: Sequence[int], rec: Sequence[int]) -> tuple[DiffSpan, ...]:
    """The differing regions of ref vs rec, in order."""
    spans: list[DiffSpan] = []
    i = j = 0
    for a0, b0, size in [*matching_runs(ref, rec), (len(ref), len(rec), 0)]:
        if a0 > i or b0 > j:
            spans.append(DiffSpan(ref_start=i, ref_end=a0, rec_start=j, rec_end=b0))
        i, j = a0 + size, b0 + size
    return tuple(spans)


def align(ref: Sequence[int], rec: Sequence[int], tokenizer: Tokenizer) -> Alignment:
    """Blocks of equal runs and differing regions covering both sequences, each token with visible text."""
    blocks: list[AlignBlock] = []
    cache = _TOKEN_CACHE.setdefault(tokenizer, {})

    def tokens(ids: Sequence[int]) -> tuple[AlignedToken, ...]:
        out = []
        for t in ids:
            at = cache.get(t)
            if at is None:
                at = cache[t] = aligned_token(t, tokenizer)
            out.append(at)
        return tuple(out)

    i = j = 0
    for a0, b0, size in [*matching_runs(ref, rec), (len(ref), len(rec), 0)]:
        if a0 > i or b0 > j:
            blocks.append(AlignBlock(False, i, j, tokens(ref[i:a0]), tokens(rec[j:b0])))
        if size:
            run = tokens(ref[a0 : a0 + size])
            blocks.append(AlignBlock(True, a0, b0, run, run))
        i, j = a0 + size, b0 + size
    return Alignment(blocks=tuple(blocks), ref_len=len(ref), rec_len=len(rec))


_VISIBLE = {ord(" "): "·", ord("\n"): "↵\n", ord("\t"): "→", ord("\r"): "␍"}
for _c in [*range(32), *range(0x7F, 0xA0)]:
    _VISIBLE.setdefault(_c, f"\\x{_c:02x}")


def visible_text(text: str) -> str:
    """`text` with spaces, newlines, tabs and other control characters made visible."""
    return text.translate(_VISIBLE)


def aligned_token(token_id: int, tokenizer: Tokenizer) -> AlignedToken:
    """One token for display; bytes that are not whole UTF-8 characters are shown as <0xNN>."""
    special = tokenizer.is_special(token_id)
    try:
        data = tokenizer.token_bytes(token_id)
    except ValueError:
        return AlignedToken(token_id, f"<id {token_id}?>", False)
    if special:
        return AlignedToken(token_id, data.decode("utf-8", errors="replace"), True)
    try:
        text = visible_text(data.decode("utf-8"))
    except UnicodeDecodeError:
        text = _partial_utf8(data)
    return AlignedToken(token_id, text, False)


def _partial_utf8(data: bytes) -> str:
    # Keep the decodable parts readable and show stray bytes as <0xNN>.
    out, i = [], 0
    while i < len(data):
        for size in (4, 3, 2, 1):
            chunk = data[i : i + size]
            try:
                out.append(visible_text(chunk.decode("utf-8")))
                i += size
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<0x{data[i]:02X}>")
            i += 1
    return "".join(out)


def _merge(runs: list[Match]) -> list[Match]:
    out: list[Match] = []
    for a0, b0, size in runs:
        if size <= 0:
            continue
        if out and out[-1][0] + out[-1][2] == a0 and out[-1][1] + out[-1][2] == b0:
            pa, pb, ps = out[-1]
            out[-1] = (pa, pb, ps + size)
        else:
            out.append((a0, b0, size))
    return out


def _diff_region(
    a: list[int], alo: int, ahi: int, b: list[int], blo: int, bhi: int, runs: list[Match], depth: int, budget: list[int]
) -> None:
    if alo >= ahi or blo >= bhi or budget[0] <= 0:
        return
    found = _myers(a, alo, ahi, b, blo, bhi, MAX_EDITS, budget)
    if found is not None:
        runs.extend(found)
        return
    if depth > 8:
        return  # give up: one differing region
    anchors = _patience_anchors(a, alo, ahi, b, blo, bhi)
    if not anchors:
        return
    i, j = alo, blo
    for x, y in anchors:
        _diff_region(a, i, x, b, j, y, runs, depth + 1, budget)
        runs.append((x, y, 1))
        i, j = x + 1, y + 1
    _diff_region(a, i, ahi, b, j, bhi, runs, depth + 1, budget)


def _patience_anchors(a: list[int], alo: int, ahi: int, b: list[int], blo: int, bhi: int) -> list[tuple[int, int]]:
    ca = Counter(a[alo:ahi])
    cb = Counter(b[blo:bhi])
    pos_b = {t: j for j in range(blo, bhi) if cb[t := b[j]] == 1 and ca.get(t) == 1}
    pairs = [(i, pos_b[a[i]]) for i in range(alo, ahi) if a[i] in pos_b]
    # Longest increasing subsequence of b positions (patience sorting).
    import bisect

    tails: list[int] = []
    tail_idx: list[int] = []
    prev: list[int] = [-1] * len(pairs)
    for idx, (_, y) in enumerate(pairs):
        k = bisect.bisect_left(tails, y)
        if k == len(tails):
            tails.append(y)
            tail_idx.append(idx)
        else:
            tails[k] = y
            tail_idx[k] = idx
        prev[idx] = tail_idx[k - 1] if k else -1
    out: list[tuple[int, int]] = []
    idx = tail_idx[-1] if tail_idx else -1
    while idx >= 0:
        out.append(pairs[idx])
        idx = prev[idx]
    out.reverse()
    return out


def _myers(
    a: list[int], alo: int, ahi: int, b: list[int], blo: int, bhi: int, max_d: int, budget: list[int]
) -> list[Match] | None:
    """Matching runs between a[alo:ahi] and b[blo:bhi], or None when more than max_d edits are needed."""
    n, m = ahi - alo, bhi - blo
    max_d = min(max_d, n + m)
    off = max_d + 1
    v = [0] * (2 * max_d + 3)
    trace: list[list[int]] = []
    for d in range(max_d + 1):
        budget[0] -= d + 1
        if budget[0] <= 0:
            return None
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):
                x = v[off + k + 1]
            else:
                x = v[off + k - 1] + 1
            y = x - k
            while x < n and y < m and a[alo + x] == b[blo + y]:
                x += 1
                y += 1
            v[off + k] = x
            if x >= n and y >= m:
                trace.append(v[off - d : off + d + 1])
                return _backtrack(trace, n, m, alo, blo)
        trace.append(v[off - d : off + d + 1])
    return None


def _backtrack(trace: list[list[int]], n: int, m: int, alo: int, blo: int) -> list[Match]:
    runs: list[Match] = []
    x, y = n, m
    for d in range(len(trace) - 1, 0, -1):
        prev = trace[d - 1]  # V after step d-1, index k + (d-1)
        k = x - y
        if k == -d or (k != d and prev[k - 1 + d - 1] < prev[k + 1 + d - 1]):
            pk = k + 1
            px = prev[pk + d - 1]
            sx = px
        else:
            pk = k - 1
            px = prev[pk + d - 1]
            sx = px + 1
        if x > sx:
            runs.append((alo + sx, blo + sx - k, x - sx))
        x, y = px, px - pk
    if x > 0:
        runs.append((alo, blo, x))
    runs.reverse()
    return runs
