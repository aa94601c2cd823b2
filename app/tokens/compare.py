"""Classify reconstructed ids against reference ids: exact, benign re-split, corruption, or layout bug."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from app.records import DiffSpan, Verdict
from app.tokens.align import common_prefix, diff_spans
from app.tokens.profile import Profile
from app.tokens.tokenizer import Tokenizer

UNCHECKED = "unchecked (not verified): no reference ids to check this sample against"
_STOP_IDS: weakref.WeakKeyDictionary[Tokenizer, dict[str, frozenset[int]]] = weakref.WeakKeyDictionary()


def stop_token_ids(profile: Profile, tokenizer: Tokenizer) -> frozenset[int]:
    """Ids of the profile's stop tokens in this tokenizer (cached per tokenizer and profile)."""
    per = _STOP_IDS.setdefault(tokenizer, {})
    ids = per.get(profile.name)
    if ids is None:
        ids = per[profile.name] = frozenset(
            i for t in profile.stop_tokens if (i := tokenizer.special_id(t)) is not None
        )
    return ids


def compare(
    rec_ids: Sequence[int],
    ref_ids: Sequence[int] | None,
    tokenizer: Tokenizer,
    profile: Profile,
    *,
    ref_bytes: bytes | None = None,
    rec_bytes: bytes | None = None,
) -> Verdict:
    """Verdict of reconstructed ids vs reference ids (see app.records.VERDICTS), with an explanation sentence.

    structure_mismatch: the special-token sequence differs; bpe_equivalent: same bytes, other split;
    truncated: the reference has no stop token and the two agree (up to a partial UTF-8 tail).
    `ref_bytes` / `rec_bytes`: the decoded bytes when the caller has them (saves decoding long ids again;
    `rec_bytes` must be those of `rec_ids` as given).
    """
    rec = rec_ids if isinstance(rec_ids, list) else list(rec_ids)
    if ref_ids is None:
        return Verdict("unchecked", rec_len=len(rec), explanation=UNCHECKED)
    ref = ref_ids if isinstance(ref_ids, list) else list(ref_ids)
    j = _judge(rec, ref, tokenizer, profile, ref_bytes, rec_bytes)
    if j.equal:
        if j.truncated:
            return Verdict(
                "truncated", None, len(ref), len(rec), (), f"truncated: no end-of-turn token; all {len(ref)} ids match"
            )
        return Verdict("exact", None, len(ref), len(rec), (), f"exact: all {len(ref)} ids match")
    first = common_prefix(ref, rec)
    spans = diff_spans(ref, rec)
    if j.category == "structure_mismatch":
        assert j.ref_marks is not None and j.rec_marks is not None  # _judge sets them for unequal ids
        return Verdict(
            "structure_mismatch",
            first,
            len(ref),
            len(rec),
            spans,
            _layout_sentence(j.ref_marks, j.rec_marks, tokenizer),
        )
    # _judge sets these for unequal ids of the same layout
    assert j.rec is not None and j.ref_bytes is not None and j.rec_bytes is not None
    rec = j.rec  # without the stop tokens a truncated reference does not have
    if j.same_bytes:
        return Verdict(
            j.category, first, len(ref), len(rec), spans, _resplit_sentence(ref, rec, spans, tokenizer, j.truncated)
        )
    if j.category == "truncated":
        return Verdict(
            "truncated",
            first,
            len(ref),
            len(rec),
            spans,
            "truncated: no end-of-turn token; the text matches except a partial UTF-8 character at the cut",
        )
    return Verdict(
        "text_mismatch",
        first,
        len(ref),
        len(rec),
        spans,
        _text_sentence(ref, rec, spans, tokenizer, first, j.ref_bytes, j.rec_bytes),
    )


def compare_category(rec_ids: Sequence[int], ref_ids: Sequence[int], tokenizer: Tokenizer, profile: Profile) -> str:
    """`compare(rec_ids, ref_ids, ...).category`, without the diff spans and the sentence (a probe's text-path
    measurement keeps only the category: the spans' diff is most of compare's time on a mismatch)."""
    rec = rec_ids if isinstance(rec_ids, list) else list(rec_ids)
    return _judge(rec, ref_ids if isinstance(ref_ids, list) else list(ref_ids), tokenizer, profile, None, None).category


@dataclass(frozen=True, slots=True)
class _Judged:
    category: str
    truncated: bool
    equal: bool = False  # the ids are the same
    ref_marks: list[int] | None = None
    rec_marks: list[int] | None = None
    rec: list[int] | None = None  # rec without the stop tokens a truncated reference lacks
    ref_bytes: bytes | None = None
    rec_bytes: bytes | None = None
    same_bytes: bool = False


def _judge(
    rec: list[int],
    ref: list[int],
    tokenizer: Tokenizer,
    profile: Profile,
    ref_bytes: bytes | None,
    rec_bytes: bytes | None,
) -> _Judged:
    """The verdict's category and what compare's sentence needs of how it was reached (see compare)."""
    stop_ids = stop_token_ids(profile, tokenizer)
    truncated = not ref or ref[-1] not in stop_ids
    if rec == ref:
        return _Judged("truncated" if truncated else "exact", truncated, True)
    special = tokenizer.special_ids
    ref_marks = list(filter(special.__contains__, ref))  # C-level filter: long id lists
    rec_marks = list(filter(special.__contains__, rec))
    if ref_marks != rec_marks and not (truncated and _prefix_layout(ref_marks, rec_marks, stop_ids)):
        return _Judged("structure_mismatch", truncated, False, ref_marks, rec_marks)
    if ref_bytes is None:
        ref_bytes = tokenizer.decode_bytes(ref)
    if truncated:
        while rec and rec[-1] in stop_ids and len(rec) > len(ref):
            rec = rec[:-1]
            rec_bytes = None  # the given bytes included the stop token
    if rec_bytes is None:
        rec_bytes = tokenizer.decode_bytes(rec)
    if ref_bytes == rec_bytes:
        return _Judged(
            "truncated" if truncated else "bpe_equivalent",
            truncated,
            False,
            ref_marks,
            rec_marks,
            rec,
            ref_bytes,
            rec_bytes,
            True,
        )
    cat = "truncated" if truncated and _same_but_partial_tail(ref_bytes, rec_bytes) else "text_mismatch"
    return _Judged(cat, truncated, False, ref_marks, rec_marks, rec, ref_bytes, rec_bytes)


def _prefix_layout(ref_marks: list[int], rec_marks: list[int], stop_ids: frozenset[int]) -> bool:
    # A truncated reference may be reconstructed with an end token when the API said "stop"; that alone is no layout
    # bug.
    return rec_marks[: len(ref_marks)] == ref_marks and all(i in stop_ids for i in rec_marks[len(ref_marks) :])


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


def _resplit_sentence(
    ref: list[int], rec: list[int], spans: tuple[DiffSpan, ...], tokenizer: Tokenizer, truncated: bool
) -> str:
    s = spans[0]
    head = (
        "truncated: no end-of-turn token; same text, different BPE split"
        if truncated
        else "benign: same text, different BPE split"
    )
    more = f" (and {len(spans) - 1} more region{'s' if len(spans) > 2 else ''})" if len(spans) > 1 else ""
    return (
        f"{head} — {_tok_repr(ref[s.ref_start : s.ref_end], tokenizer)} vs "
        f"{_tok_repr(rec[s.rec_start : s.rec_end], tokenizer)} at token {s.ref_start}{more}"
    )


@dataclass(frozen=True, slots=True)
class TextDifference:
    """Where two decoded texts first differ, and a window of each around that byte.

    `byte`: the first differing byte offset (the shorter text's length when one is a prefix of the other);
    `ref_token` / `rec_token`: the index of the token holding that byte on each side (the length when that
    side ends there). The window is `[start, ref_end)` of the reference bytes and `[start, rec_end)` of the
    reconstructed bytes: `context` is the shared text before the difference, `ref_text` / `rec_text` each side's
    text from there on (stray bytes shown as <0xNN>); `cut_before` / `cut_after_*` say when more exists.
    """

    byte: int
    ref_token: int
    rec_token: int
    start: int
    ref_end: int
    rec_end: int
    context: str
    ref_text: str
    rec_text: str
    cut_before: bool
    cut_after_ref: bool
    cut_after_rec: bool

    def quoted(self, side: str) -> str:
        """One side's window as the explanation quotes it: escaped (repr), … outside the quotes where cut."""
        text, cut = (self.ref_text, self.cut_after_ref) if side == "ref" else (self.rec_text, self.cut_after_rec)
        return f"{'…' if self.cut_before else ''}{self.context + text!r}{'…' if cut else ''}"


_CONTEXT_CHARS = 16  # shared text shown before the difference
_AFTER_CHARS = 24  # each side's text shown from the difference on
# surrogateescape turns each stray byte into one lone surrogate; show it as align does (<0xNN>)
_STRAY = {0xDC00 + b: f"<0x{b:02X}>" for b in range(0x80, 0x100)}


def _units(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _char_start(data: bytes, n: int) -> int:
    """The start of the UTF-8 character holding byte `n` of `data` (n itself when the bytes before it end a
    character or are stray): a difference inside a multi-byte character quotes the whole character."""
    for k in range(n - 1, max(n - 4, -1), -1):
        b = data[k]
        if b < 0x80:
            return n
        if b >= 0xC0:  # a lead byte: does its sequence reach byte n?
            size = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return k if k + size > n else n
    return n


def first_text_difference(
    ref_bytes: bytes,
    rec_bytes: bytes,
    ref: Sequence[int] = (),
    rec: Sequence[int] = (),
    tokenizer: Tokenizer | None = None,
    same_tokens: int = 0,
) -> TextDifference | None:
    """The first differing byte of two decoded texts and a window of each side around it (None when equal).

    With `ref` / `rec` ids and their `tokenizer`, the tokens holding that byte are found (the first
    `same_tokens` ids are known equal on both sides, so the walk starts after them).
    """
    if ref_bytes == rec_bytes:
        return None
    n = common_prefix(ref_bytes, rec_bytes)
    s = _char_start(ref_bytes, n)
    # 4 bytes per character at most: a window this wide holds enough whole characters, so a character cut
    # at the window's edge falls outside the part kept
    before = _units(ref_bytes[max(0, s - 4 * _CONTEXT_CHARS - 4) : s])
    context = before[-_CONTEXT_CHARS:]
    start = s - len(context.encode("utf-8", "surrogateescape"))

    def after(data: bytes) -> tuple[str, int, bool]:
        text = _units(data[s : s + 4 * _AFTER_CHARS + 4])[:_AFTER_CHARS]
        end = s + len(text.encode("utf-8", "surrogateescape"))
        return text, end, end < len(data)

    ref_text, ref_end, ref_cut = after(ref_bytes)
    rec_text, rec_end, rec_cut = after(rec_bytes)
    ref_tok = rec_tok = 0
    if tokenizer is not None:
        base = len(tokenizer.decode_bytes(ref[:same_tokens]))
        ref_tok, rec_tok = (
            _token_at(ref, same_tokens, base, n, tokenizer),
            _token_at(rec, same_tokens, base, n, tokenizer),
        )
    context, ref_text, rec_text = context.translate(_STRAY), ref_text.translate(_STRAY), rec_text.translate(_STRAY)
    if ref_text == rec_text:  # distinct bytes that read alike (a literal "<0xF0>" vs the byte): show the bytes
        ref_text, rec_text = repr(ref_bytes[s:ref_end])[2:-1], repr(rec_bytes[s:rec_end])[2:-1]
    return TextDifference(
        n, ref_tok, rec_tok, start, ref_end, rec_end, context, ref_text, rec_text, start > 0, ref_cut, rec_cut
    )


def _token_at(ids: Sequence[int], first: int, offset: int, byte: int, tokenizer: Tokenizer) -> int:
    # offset: where ids[first] starts; walk on until the token whose bytes hold `byte`
    for k in range(first, len(ids)):
        offset += len(tokenizer.token_bytes(ids[k]))
        if offset > byte:
            return k
    return len(ids)


def _text_sentence(
    ref: list[int],
    rec: list[int],
    spans: tuple[DiffSpan, ...],
    tokenizer: Tokenizer,
    first: int,
    ref_bytes: bytes,
    rec_bytes: bytes,
) -> str:
    # Quote where the decoded texts first differ, not the first differing token region: that region may be
    # a benign re-split (same bytes) with the real difference later, or longer than the quote.
    d = first_text_difference(ref_bytes, rec_bytes, ref, rec, tokenizer, first)
    assert d is not None  # compare() calls this only when the bytes differ
    where = (
        f"token {d.ref_token}" if d.ref_token == d.rec_token else f"token {d.ref_token} (reconstructed {d.rec_token})"
    )
    more = f" ({len(spans)} differing regions)" if len(spans) > 1 else ""
    return (
        f"corrupt: text differs at {where}, byte {d.byte:,} — reference {d.quoted('ref')} vs "
        f"reconstructed {d.quoted('rec')}{more}"
    )


def _layout_sentence(ref_marks: list[int], rec_marks: list[int], tokenizer: Tokenizer) -> str:
    name = lambda i: tokenizer.token_bytes(i).decode("utf-8", errors="replace")  # noqa: E731
    for k, (x, y) in enumerate(zip(ref_marks, rec_marks)):
        if x != y:
            return (
                f"structure: special token #{k + 1} is {name(x)} in the reference but {name(y)} in the reconstruction"
            )
    if len(ref_marks) > len(rec_marks):
        return (
            f"structure: the reconstruction lacks {name(ref_marks[len(rec_marks)])} "
            f"(special token #{len(rec_marks) + 1} of "
            f"the reference)"
        )
    return (
        f"structure: the reconstruction has an extra {name(rec_marks[len(ref_marks)])} "
        f"(special token #{len(ref_marks) + 1})"
    )
