"""A text_mismatch explanation quotes the first differing byte of the decoded texts, both sides around it."""

from __future__ import annotations

import random

from app.tokens import compare, get_profile
from app.tokens.compare import first_text_difference

KIMI = get_profile("kimi-k2.5")
# words, whitespace runs and multi-byte characters (2, 3 and 4 UTF-8 bytes); no special-token text
PIECES = [
    "the",
    " cat",
    " sat",
    "on",
    " mat",
    "gate",
    "NOR",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "é",
    "ü",
    "北京",
    "天气",
    "🙂",
    "🚀",
    ",",
    ".",
    '{"a": 1}',
    "0",
    "24830",
    "x",
]


def _first_diff(a: bytes, b: bytes) -> int:
    """The first differing byte offset, found the slow obvious way (independent of the code under test)."""
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def _random_pair(rng: random.Random) -> tuple[str, str]:
    """A text and an edited copy: insertions, deletions or substitutions at random characters, often after a
    long identical prefix (and sometimes also a second edit later)."""
    prefix = "".join(rng.choice(PIECES) for _ in range(rng.choice((0, 3, 40, 400))))
    body = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 30)))
    ref = prefix + body
    chars = list(ref)
    for _ in range(rng.choice((1, 1, 2, 3))):
        pos = rng.randrange(len(prefix), len(chars) + 1) if len(chars) > len(prefix) else len(chars)
        kind = rng.choice(("insert", "delete", "substitute"))
        alphabet = "".join(PIECES)
        if kind == "insert" or pos >= len(chars):
            chars[pos:pos] = list(rng.choice(PIECES))
        elif kind == "delete":
            del chars[pos : pos + rng.randint(1, 3)]
        else:
            chars[pos] = rng.choice([c for c in alphabet if c != chars[pos]])
    rec = "".join(chars)
    if rec == ref:
        rec += "!"
    return ref, rec


def _check(d, ref_bytes: bytes, rec_bytes: bytes) -> None:
    n = _first_diff(ref_bytes, rec_bytes)
    assert d is not None and d.byte == n
    # the window holds the first differing byte on both sides (or its end, when that side stops there)
    assert d.start <= n <= d.ref_end and d.start <= n <= d.rec_end
    assert n < d.ref_end or n == len(ref_bytes)
    assert n < d.rec_end or n == len(rec_bytes)
    assert d.quoted("ref") != d.quoted("rec")


def test_random_edits_of_valid_text_quote_the_first_differing_byte():
    rng = random.Random(14)
    for _ in range(2000):
        ref, rec = _random_pair(rng)
        a, b = ref.encode(), rec.encode()
        d = first_text_difference(a, b)
        _check(d, a, b)
        # whole characters: each quoted window is the text itself, cut at character boundaries
        assert d.context + d.ref_text == a[d.start : d.ref_end].decode()
        assert d.context + d.rec_text == b[d.start : d.rec_end].decode()
        assert (d.context + d.ref_text) in ref and (d.context + d.rec_text) in rec


def test_random_byte_edits_with_stray_utf8_bytes_still_differ():
    rng = random.Random(15)
    for _ in range(2000):
        a = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 40))).encode()
        b = bytearray(a)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(b) + 1)
            if rng.random() < 0.5 or pos == len(b):
                b[pos:pos] = bytes([rng.randrange(256)])
            else:
                b[pos] = (b[pos] + rng.randrange(1, 256)) % 256
        b = bytes(b)
        if a == b:
            continue
        _check(first_text_difference(a, b), a, b)


def test_a_difference_inside_a_multibyte_character_quotes_the_whole_character():
    d = first_text_difference("go 北".encode(), "go 化".encode())  # same lead byte, other continuation
    assert (d.context, d.ref_text, d.rec_text) == ("go ", "北", "化")


def test_stray_bytes_show_as_hex_and_whitespace_escaped():
    d = first_text_difference(b"a\n\tb\xf0", b"a\n\tb\xf1")
    assert d.quoted("ref") == repr("a\n\tb<0xF0>") and d.quoted("rec") == repr("a\n\tb<0xF1>")
    assert "\\n\\t" in d.quoted("ref")


def test_equal_bytes_have_no_difference():
    assert first_text_difference(b"same", b"same") is None


def _resplit_first(tok, ids: list[int]) -> list[int]:
    """`ids` with the first token that can be split into two vocabulary tokens so split (same bytes)."""
    for i, t in enumerate(ids):
        data = tok.token_bytes(t)
        for k in range(1, len(data)):
            x, y = tok.id_of_bytes(data[:k]), tok.id_of_bytes(data[k:])
            if x is not None and y is not None and not tok.is_special(t):
                return ids[:i] + [x, y] + ids[i + 1 :]
    raise AssertionError("no token could be re-split")


def _assert_explains(v, tok, ref: list[int], rec: list[int]) -> None:
    a, b = tok.decode_bytes(ref), tok.decode_bytes(rec)
    d = first_text_difference(a, b, ref, rec, tok, 0)
    assert v.category == "text_mismatch"
    assert d.quoted("ref") in v.explanation and d.quoted("rec") in v.explanation
    # the named tokens hold the first differing byte
    for ids, k in ((ref, d.ref_token), (rec, d.rec_token)):
        start = len(tok.decode_bytes(ids[:k]))
        assert start <= d.byte and (k == len(ids) or d.byte < start + len(tok.token_bytes(ids[k])))
    assert f"token {d.ref_token}" in v.explanation


def _explained_over(tok, seed: int, n: int) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        ref_text, rec_text = _random_pair(rng)
        # "hello" gives every pair a token the re-split below can cut
        ref = tok.encode("r</think>hello " + ref_text + "<|im_end|>")
        rec = tok.encode("r</think>hello " + rec_text + "<|im_end|>")
        if rng.random() < 0.5:
            rec = _resplit_first(tok, rec)  # a benign re-split before the real difference
        _assert_explains(compare(rec, ref, tok, KIMI), tok, ref, rec)


def test_explanation_skips_a_benign_resplit_to_quote_the_real_difference(sample_tok):
    tok = sample_tok
    ref = tok.encode("r</think>hello world, the cat sat on the mat<|im_end|>")
    rec = _resplit_first(tok, tok.encode("r</think>hello world, the dog sat on the mat<|im_end|>"))
    v = compare(rec, ref, tok, KIMI)
    assert "cat" in v.explanation.split(" vs ")[0] and "dog" in v.explanation.split(" vs ")[1]
    _assert_explains(v, tok, ref, rec)


def test_explanation_quotes_a_difference_past_a_long_first_region(sample_tok):
    tok = sample_tok
    ref = tok.encode("r</think>" + "word " * 30 + "end<|im_end|>")
    rec = tok.encode("r</think>" + "word " * 29 + "wxrd end<|im_end|>")
    v = compare(rec, ref, tok, KIMI)
    assert "'word end'" in v.explanation.replace("…", "") or "word end" in v.explanation
    _assert_explains(v, tok, ref, rec)


def test_random_edits_are_explained_at_their_first_difference(sample_tok):
    _explained_over(sample_tok, 16, 300)


def test_random_edits_are_explained_at_their_first_difference_kimi(kimi_tok):
    _explained_over(kimi_tok, 17, 300)
