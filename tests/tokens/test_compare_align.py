"""compare() verdicts with explanations, and align() for the side-by-side token view."""

from __future__ import annotations

import random

from app.records import DiffSpan
from app.tokens import align, compare, diff_spans, get_profile, visible_text
from app.tokens.align import matching_runs

KIMI = get_profile("kimi-k2.5")


def test_identical_ids_are_exact(sample_tok):
    ids = sample_tok.encode("a</think>b<|im_end|>")
    v = compare(ids, ids, sample_tok, KIMI)
    assert (v.category, v.first_diff, v.ref_len, v.rec_len, v.spans) == ("exact", None, len(ids), len(ids), ())


def test_no_reference_is_unchecked(sample_tok):
    assert compare([1, 2], None, sample_tok, KIMI).category == "unchecked"


def test_same_bytes_other_split_is_bpe_equivalent_with_the_pieces_named(sample_tok):
    tok = sample_tok
    ref = tok.encode(" hello world<|im_end|>")
    b = tok.token_bytes(ref[0])
    cut = next(k for k in range(1, len(b)) if tok.id_of_bytes(b[:k]) is not None and tok.id_of_bytes(b[k:]) is not None)
    split = [tok.id_of_bytes(b[:cut]), tok.id_of_bytes(b[cut:])] + ref[1:]
    v = compare(ref, split, tok, KIMI)
    assert v.category == "bpe_equivalent" and v.first_diff == 0
    assert v.spans == (DiffSpan(0, 2, 0, 1),)
    assert v.explanation.startswith("benign: same text, different BPE split — ")
    assert repr(b[:cut].decode()) in v.explanation and repr(b.decode()) in v.explanation


def test_different_text_is_text_mismatch(sample_tok):
    ref = sample_tok.encode("r</think>the cat sat<|im_end|>")
    rec = sample_tok.encode("r</think>the dog sat<|im_end|>")
    v = compare(rec, ref, sample_tok, KIMI)
    assert v.category == "text_mismatch" and v.explanation.startswith("corrupt: text differs at token")


def test_different_special_layout_is_structure_mismatch(sample_tok):
    ref = sample_tok.encode("r</think>answer<|im_end|>")
    rec = sample_tok.encode("r answer<|im_end|>")
    v = compare(rec, ref, sample_tok, KIMI)
    assert v.category == "structure_mismatch" and "</think>" in v.explanation


def test_reference_without_end_token_is_truncated(sample_tok):
    ref = sample_tok.encode("r</think>cut here")
    assert compare(ref, ref, sample_tok, KIMI).category == "truncated"


def test_truncated_mid_character_is_truncated(sample_tok):
    tok = sample_tok
    full = tok.encode("r</think>go 🚀")
    data = tok.decode_bytes(full)
    # cut the reference inside the emoji's bytes, reconstructed from text carrying U+FFFD
    ref = tok.encode("r</think>go ") + [tok.id_of_bytes(data[-4:-3])]
    rec = tok.encode("r</think>go \ufffd")
    assert compare(rec, ref, tok, KIMI).category == "truncated"


def test_diff_spans_match_an_lcs(sample_tok):
    rng = random.Random(7)
    for _ in range(200):
        a = [rng.randint(0, 6) for _ in range(rng.randint(0, 25))]
        b = [rng.randint(0, 6) for _ in range(rng.randint(0, 25))]
        runs = matching_runs(a, b)
        lcs = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(len(a)):
            for j in range(len(b)):
                lcs[i + 1][j + 1] = lcs[i][j] + 1 if a[i] == b[j] else max(lcs[i][j + 1], lcs[i + 1][j])
        assert sum(s for _, _, s in runs) == lcs[-1][-1]
        assert all(a[x : x + s] == b[y : y + s] for x, y, s in runs)


def test_align_covers_both_sequences_in_order(sample_tok):
    ref = sample_tok.encode("one two three four five<|im_end|>")
    rec = ref[:2] + sample_tok.encode(" TWO") + ref[3:]
    al = align(ref, rec, sample_tok)
    assert (al.ref_len, al.rec_len) == (len(ref), len(rec))
    assert [t.id for b in al.blocks for t in b.ref] == ref
    assert [t.id for b in al.blocks for t in b.rec] == rec
    assert len(al.diff_blocks) == 1 and al.blocks[-1].ref[-1].special


def test_align_makes_whitespace_and_control_chars_visible(sample_tok):
    al = align(sample_tok.encode("a b\n\tc\x01"), [], sample_tok)
    shown = "".join(t.text for b in al.blocks for t in b.ref)
    assert "·" in shown and "↵" in shown and "→" in shown and "\\x01" in shown
    assert visible_text(" \n") == "·↵\n"


def test_align_shows_partial_utf8_bytes(sample_tok):
    emoji = "🚀".encode()
    lone = sample_tok.id_of_bytes(emoji[:1])
    al = align([lone], [], sample_tok)
    assert al.blocks[0].ref[0].text == "<0xF0>"


def test_diff_of_32k_tokens_with_many_edits_stays_correct():
    rng = random.Random(3)
    a = [rng.randint(0, 60000) for _ in range(32000)]
    b = list(a)
    for _ in range(150):
        p = rng.randrange(len(b))
        b[p : p + 1] = [rng.randint(0, 60000), rng.randint(0, 60000)]
    spans = diff_spans(a, b)
    assert 0 < len(spans) <= 150
    i = j = 0
    for s in spans:
        assert a[i : s.ref_start] == b[j : s.rec_start]
        i, j = s.ref_end, s.rec_end
    assert a[i:] == b[j:]
