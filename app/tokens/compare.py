"""Classify rebuilt ids against reference ids: exact, benign re-split, corruption, or layout bug."""

from __future__ import annotations

import weakref
from typing import Sequence

from app.records import DiffSpan, Verdict
from app.tokens.align import common_prefix, diff_spans
from app.tokens.profile import Profile
from app.tokens.tokenizer import Tokenizer

_SNIPPET = 40
UNCHECKED = "unchecked (not verified): no reference ids to check this sample against"
_STOP_IDS: "weakref.WeakKeyDictionary[Tokenizer, dict[str, frozenset[int]]]" = weakref.WeakKeyDictionary()


def stop_token_ids(profile: Profile, tokenizer: Tokenizer) -> frozenset[int]:
    """Ids of the profile's stop tokens in this tokenizer (cached per tokenizer and profile)."""
    per = _STOP_IDS.setdefault(tokenizer, {})
    ids = per.get(profile.name)
    if ids is None:
        ids = per[profile.name] = frozenset(i for t in profile.stop_tokens if (i := tokenizer.special_id(t)) is not None)
    return ids


def compare(
    rec_ids: Sequence[int], ref_ids: Sequence[int] | None, tokenizer: Tokenizer, profile: Profile, *,
    ref_bytes: bytes | None = None, rec_bytes: bytes | None = None,
) -> Verdict:
    """Verdict of rebuilt ids vs reference ids (see app.records.VERDICTS), with an explanation sentence.

    structure_mismatch: the special-token sequence differs; bpe_equivalent: same bytes, other split;
    truncated: the reference has no stop token and the two agree (up to a partial UTF-8 tail).
    `ref_bytes` / `rec_bytes`: the decoded bytes when the caller has them (saves decoding long ids again;
    `rec_bytes` must be those of `rec_ids` as given).
    """
    rec = rec_ids if isinstance(rec_ids, list) else list(rec_ids)
    if ref_ids is None:
        return Verdict("unchecked", rec_len=len(rec), explanation=UNCHECKED)
    ref = ref_ids if isinstance(ref_ids, list) else list(ref_ids)
    stop_ids = stop_token_ids(profile, tokenizer)
    truncated = not ref or ref[-1] not in stop_ids
    if rec == ref:
        if truncated:
            return Verdict("truncated", None, len(ref), len(rec), (),
                           f"truncated: no end-of-turn token; all {len(ref)} ids match")
        return Verdict("exact", None, len(ref), len(rec), (), f"exact: all {len(ref)} ids match")
    first = common_prefix(ref, rec)
    spans = diff_spans(ref, rec)
    special = tokenizer.special_ids
    ref_marks = list(filter(special.__contains__, ref))  # C-level filter: long id lists
    rec_marks = list(filter(special.__contains__, rec))
    if ref_marks != rec_marks and not (truncated and _prefix_layout(ref_marks, rec_marks, stop_ids)):
        return Verdict("structure_mismatch", first, len(ref), len(rec), spans, _layout_sentence(ref_marks, rec_marks, tokenizer))
    if ref_bytes is None:
        ref_bytes = tokenizer.decode_bytes(ref)
    if truncated:
        while rec and rec[-1] in stop_ids and len(rec) > len(ref):
            rec = rec[:-1]
            rec_bytes = None  # the given bytes included the stop token
    if rec_bytes is None:
        rec_bytes = tokenizer.decode_bytes(rec)
    if ref_bytes == rec_bytes:
        cat = "truncated" if truncated else "bpe_equivalent"
        return Verdict(cat, first, len(ref), len(rec), spans, _resplit_sentence(ref, rec, spans, tokenizer, truncated))
    if truncated and _same_but_partial_tail(ref_bytes, rec_bytes):
        return Verdict("truncated", first, len(ref), len(rec), spans,
                       "truncated: no end-of-turn token; the text matches except a partial UTF-8 character at the cut")
    return Verdict("text_mismatch", first, len(ref), len(rec), spans, _text_sentence(ref, rec, spans, tokenizer, first))


def _prefix_layout(ref_marks: list[int], rec_marks: list[int], stop_ids: frozenset[int]) -> bool:
    # A truncated reference may be rebuilt with an end token when the API said "stop"; that alone is no layout bug.
    return rec_marks[: len(ref_marks)] == ref_marks and all(i in stop_ids for i in rec_marks[len(ref_marks):])


def _same_but_partial_tail(ref_bytes: bytes, rec_bytes: bytes) -> bool:
    n = common_prefix(ref_bytes, rec_bytes)
    tail = ref_bytes[n:]
    if len(tail) > 3 or not tail:
        return False
    try:
        tail.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return rec_bytes[n:].decode("utf-8", errors="replace").strip("\ufffd") == ""


def _tok_repr(ids: Sequence[int], tokenizer: Tokenizer) -> str:
    parts = [repr(tokenizer.token_bytes(i).decode("utf-8", errors="replace")) for i in ids[:6]]
    more = " + …" if len(ids) > 6 else ""
    return " + ".join(parts) + more if parts else "nothing"


def _resplit_sentence(ref: list[int], rec: list[int], spans: tuple[DiffSpan, ...], tokenizer: Tokenizer, truncated: bool) -> str:
    s = spans[0]
    head = "truncated: no end-of-turn token; same text, different BPE split" if truncated else "benign: same text, different BPE split"
    more = f" (and {len(spans) - 1} more region{'s' if len(spans) > 2 else ''})" if len(spans) > 1 else ""
    return (f"{head} — {_tok_repr(ref[s.ref_start:s.ref_end], tokenizer)} vs "
            f"{_tok_repr(rec[s.rec_start:s.rec_end], tokenizer)} at token {s.ref_start}{more}")


def _text_sentence(ref: list[int], rec: list[int], spans: tuple[DiffSpan, ...], tokenizer: Tokenizer, first: int) -> str:
    s = spans[0] if spans else DiffSpan(first, len(ref), first, len(rec))
    a = tokenizer.decode(ref[s.ref_start:s.ref_end])[:_SNIPPET]
    b = tokenizer.decode(rec[s.rec_start:s.rec_end])[:_SNIPPET]
    more = f" ({len(spans)} differing regions)" if len(spans) > 1 else ""
    return f"corrupt: text differs at token {s.ref_start} — reference {a!r} vs rebuilt {b!r}{more}"


def _layout_sentence(ref_marks: list[int], rec_marks: list[int], tokenizer: Tokenizer) -> str:
    name = lambda i: tokenizer.token_bytes(i).decode("utf-8", errors="replace")  # noqa: E731
    for k, (x, y) in enumerate(zip(ref_marks, rec_marks)):
        if x != y:
            return f"structure: special token #{k + 1} is {name(x)} in the reference but {name(y)} in the rebuild"
    if len(ref_marks) > len(rec_marks):
        return f"structure: the rebuild lacks {name(ref_marks[len(rec_marks)])} (special token #{len(rec_marks) + 1} of the reference)"
    return f"structure: the rebuild has an extra {name(rec_marks[len(ref_marks)])} (special token #{len(ref_marks) + 1})"
