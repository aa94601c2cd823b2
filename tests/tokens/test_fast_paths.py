"""The reconstruction's fast paths give exactly what the full paths give.

- tiktoken `encode`: specials found by a trie pattern, the text between them encoded ordinary, against
  tiktoken's own `encode(text, allowed_special="all")`, on a tiny vocabulary and on the real Kimi K2.5 files;
- `encode_known`: "known" ids decode to exactly the text (and Kimi's pre-tokeniser covers every code point);
- the round-trip check that parses the encoded text instead of decoding the ids, through `process`, against a
  tokenizer that never claims to know;
- the fidelity profile's per-profile plan against the released `apply` (kept here as the oracle);
- the one pass over a sample's fields (`Reconstructor._one_pass`: inverses, suspect flags, the layout by shape, the
  count check, the round-trip by shape) against the full path (`_canonical`), the layout by shape against the
  rendering, the re-serialising of tool-call arguments against json.loads / json.dumps, and the records built
  per sample against their constructors.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.records import Completion, ToolCall, Usage
from app.tokens import Reconstructor, get_profile, load_tokenizer
from app.tokens.fidelity_profile import (
    _BLANK_KEYS,
    _KIMI_ID,
    JSON_STYLES,
    NO_CONTENT,
    STRIPPED,
    Applied,
    FidelityProfile,
    _blank,
    _blank_ctx,
    _edge_step_name,
    _redump,
    _redumps,
    apply,
)
from app.tokens.flags import TEMPLATE_WHITESPACE_MISSING, UNINVERTIBLE
from app.tokens.reconstruct import Fields, _unchecked_verdict
from app.tokens.template import tool_calls_read_back
from tests.tokens.conftest import build_hf_tokenizer, build_tiktoken_dir

KIMI = get_profile("kimi-k2.5")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# text pieces that stress the special search: every marker, spelled halves of markers, other specials,
# the characters specials start with, unicode, whitespace
PIECES = [
    *KIMI.markers,
    "<|reserved_token_163600|>",
    "[BOS]",
    "<|im_user|>",
    "<|im_",
    "end|>",
    "<|",
    "|>",
    "<",
    "[",
    "]",
    "|",
    "<think",
    "/think>",
    "</",
    "[EOS",
    "EOS]",
    "hello",
    " world",
    "chas",
    "a",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "世界",
    "北京",
    "🙂",
    "é",
    "e\u0301",
    "ß",
    '{"city": "Paris"}',
    "\ufffd",
    "0123",
]
TEXT = st.lists(st.sampled_from(PIECES), max_size=25).map("".join)


@pytest.fixture(scope="module")
def tiny_kimi(tmp_path_factory):
    """A tiny tiktoken vocabulary whose special slots carry every Kimi marker (so CI needs no shared files)."""
    base = 256 + 11
    names = {base + i: m for i, m in enumerate(dict.fromkeys([*KIMI.markers, "[BOS]", "<|im_user|>"]))}
    return load_tokenizer(build_tiktoken_dir(tmp_path_factory.mktemp("tinykimi"), names), KIMI.pretokenizer_pattern)


def _tokenizers(request) -> list:
    toks = [request.getfixturevalue("tiny_kimi")]
    try:
        toks.append(request.getfixturevalue("kimi_tok"))
    except pytest.skip.Exception:
        pass  # the real files are not here: the tiny vocabulary still checks the same code
    return toks


# ---- tiktoken encode -------------------------------------------------------------------------------------


@SETTINGS
@given(text=TEXT)
def test_tiktoken_encode_is_tiktokens_own_encode(request, text):
    for tok in _tokenizers(request):
        assert tok.encode(text) == tok.encoding.encode(text, allowed_special="all"), (tok.path, text)
        ids, known = tok.encode_known(text)
        assert ids == tok.encode(text)
        assert known and tok.decode(ids) == text and tok.decode_bytes(ids) == text.encode("utf-8")


def test_tiktoken_encode_with_lone_surrogates_falls_back_as_tiktoken_does(request):
    for tok in _tokenizers(request):
        for text in ("a\ud800b", "<|im_end|>\udfff", "\ud83d"):
            ids, known = tok.encode_known(text)
            assert ids == tok.encode(text) == tok.encoding.encode(text, allowed_special="all")
            assert not known  # the surrogate became U+FFFD: the ids do not decode to this text


def test_kimi_pattern_covers_every_code_point(tiny_kimi):
    # `lossless` rests on this: every character falls in some match of the pre-tokeniser, so none is dropped
    assert tiny_kimi.encode_known("x")[1]
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for k in range(0, len(points), 997):
        text = "".join(map(chr, points[k : k + 997]))
        assert tiny_kimi.decode_bytes(tiny_kimi.encoding.encode_ordinary(text)) == text.encode("utf-8"), hex(points[k])


def test_other_patterns_and_vocabularies_never_claim_to_know(tmp_path):
    tok = load_tokenizer(build_tiktoken_dir(tmp_path / "t"), r"\w+")  # \w+ drops spaces: not lossless
    assert tok.encode_known("a b") == (tok.encode("a b"), False)
    # HF: a pre-tokeniser that removes whitespace, a prefix space, an added token that strips: not known
    base = json.loads((build_hf_tokenizer(tmp_path / "h", [("<|im_end|>", True)]) / "tokenizer.json").read_text())
    assert load_tokenizer(tmp_path / "h").encode_known("a b")[1] is True
    for k, change in enumerate(
        (
            {"pre_tokenizer": {"type": "Whitespace"}},
            {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}},
            {"added_tokens": [dict(t, lstrip=True) for t in base["added_tokens"]]},
            {"normalizer": {"type": "Lowercase"}},
        )
    ):
        d = tmp_path / f"h{k}"
        d.mkdir()
        (d / "tokenizer.json").write_text(json.dumps(dict(base, **change)))
        tok = load_tokenizer(d)
        assert tok.encode_known("a b") == (tok.encode("a b"), False), change


@SETTINGS
@given(text=TEXT)
def test_hf_known_ids_decode_to_the_text(sample_tok, family_tokenizers, nfc_qwen_tokenizer, text):
    for tok in (sample_tok, nfc_qwen_tokenizer, *family_tokenizers.values()):
        ids, known = tok.encode_known(text)
        assert ids == tok.encode(text) and known, tok.path
        assert tok.decode_bytes(ids) == text.encode("utf-8") and tok.decode(ids) == text


# ---- the round-trip check --------------------------------------------------------------------------------

FIELD_TEXT = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)


@st.composite
def completions(draw):
    calls = tuple(
        ToolCall(
            draw(st.sampled_from([f"functions.{n}:{i}", f" functions.{n}:{i}", n, "", "functions.other:0"])),
            n,
            draw(st.sampled_from(['{"a": 1}', ' {"a": 1}', '{"a":1}\n', "", "<|im_end|>"])),
            i,
        )
        for i, n in enumerate(draw(st.lists(st.sampled_from(["f", "get_weather"]), max_size=2)))
    )
    return Completion(
        content=draw(FIELD_TEXT),
        reasoning=draw(st.one_of(st.none(), FIELD_TEXT)),
        tool_calls=calls,
        finish_reason=draw(st.sampled_from(["stop", "length", "tool_calls"])),
    )


class _Unknowing:
    """A tokenizer that never claims to know what its ids decode to (the full path: decode and parse)."""

    def __init__(self, tok):
        self._tok = tok

    def encode_known(self, text):
        return self._tok.encode(text), False

    def encode_between(self, segments, between):
        return None  # never encodes a run at a time: the joined text, decoded and parsed

    def __getattr__(self, name):
        return getattr(self._tok, name)


@SETTINGS
@given(c=completions())
def test_round_trip_from_the_encoded_text_is_the_decoding_round_trip(request, sample_tok, c):
    for tok in (*_tokenizers(request), sample_tok):
        fast, full = Reconstructor(KIMI, tok), Reconstructor(KIMI, _Unknowing(tok))
        assert fast.process(c) == full.process(c)
        rec, _ = fast.process(c)
        fields = fast.production_fields(c)[0]
        text = "".join(t for _, t in fast._pieces(fields))
        assert fast._roundtrip_fields(rec.output_ids, fields, text) == fast._roundtrip_fields(rec.output_ids, fields)


_SHAPED: dict[int, tuple] = {}


@SETTINGS
@given(c=completions())
def test_round_trip_by_shape_is_the_parsed_round_trip(request, c):
    # a sample encoded a run at a time between its markers (no run spells a special) and without tool calls is
    # judged by a stand-in of its shape; the parse of its own text must always agree
    for tok in _tokenizers(request):
        # one Reconstructor for every example: its shapes' answers are reused, as in a run
        r = _SHAPED.setdefault(id(tok), (tok, Reconstructor(KIMI, tok)))[1]
        f0 = Fields.of(c)
        for f in (
            f0,
            replace(f0, tool_calls=()),
            *(
                replace(f0, tool_calls=(), finish_reason=end, close_think=close)
                for end in ("stop", "length")
                for close in (None, True, False)
            ),
        ):
            text, ids, known, split = r._encoded(f)
            assert ids == r.encode_fields(f) and known
            assert (
                r._roundtrip_fields(ids, f, text, split)
                == r._roundtrip_fields(ids, f)
                == Reconstructor(KIMI, _Unknowing(tok))._roundtrip_fields(ids, f)
            ), (f, split)


def test_round_trip_by_shape_is_taken(tiny_kimi):
    r = Reconstructor(KIMI, tiny_kimi)
    f = Fields("Let me think.", "Paris.", (), "stop")
    text, ids, known, split = r._encoded(f)
    assert split and known and r._roundtrip_fields(ids, f, text, split)
    assert r._shape_ok == {(False, False, False, False, None, True): True}
    # a shape whose stand-in does not round-trip decides nothing: the sample is parsed itself
    cut = Fields(None, "Paris.", (), "length")  # cut off with no think-close: all of it reads back as reasoning
    text, ids, known, split = r._encoded(cut)
    assert split and not r._roundtrip_fields(ids, cut, text, split)
    assert r._shape_ok[(True, True, False, True, None, True)] is False
    # tool calls read back where the name is the one the id spells; another name is parsed (and fails)
    call = Fields("x", "", (ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}', 0),), "tool_calls")
    text, ids, known, split = r._encoded(call)
    assert (
        split and r._roundtrip_fields(ids, call, text, split) and r._shape_ok[(False, False, True, False, None, False)]
    )
    renamed = replace(call, tool_calls=(replace(call.tool_calls[0], name="lookup"),))
    text, ids, known, split = r._encoded(renamed)
    assert split and not r._roundtrip_fields(ids, renamed, text, split)
    # a run that spells a special is not encoded a run at a time
    text, ids, known, split = r._encoded(Fields("a <|im_end|> b", "c", (), "stop"))
    assert not split and ids == r.encode_fields(Fields("a <|im_end|> b", "c", (), "stop"))


SEGMENTS = st.lists(TEXT, min_size=1, max_size=5)


@SETTINGS
@given(segments=SEGMENTS, data=st.data())
def test_encode_between_is_the_joined_encode(request, segments, data):
    for tok in _tokenizers(request):
        markers = [m for m in KIMI.markers if tok.special_id(m) is not None]
        between = data.draw(st.lists(st.sampled_from(markers), min_size=len(segments) - 1, max_size=len(segments) - 1))
        joined = segments[0] + "".join(m + s for m, s in zip(between, segments[1:]))
        found = tok.encode_between(segments, [tok.special_id(m) for m in between])
        if found is None:  # only where a run holds a special's first character at a special
            assert any(tok.encode_ordinary(s) != tok.encode(s) for s in segments), segments
        else:
            assert found == tok.encode_known(joined), (segments, between)


def test_encode_between_is_taken_and_refused_where_it_must_be(tiny_kimi, sample_tok):
    tok = tiny_kimi
    im_end = tok.special_id("<|im_end|>")
    # "<" and "[" that start no special keep the fast path; a run that spells a special does not
    assert tok.encode_between(["a < b [x] </thin", "y"], [im_end]) == tok.encode_known("a < b [x] </thin<|im_end|>y")
    assert tok.encode_between(["a <|im_end|>", ""], [im_end]) is None
    assert tok.encode_between(["\ud800"], []) is None  # a lone surrogate: the joined text takes tiktoken's way
    assert sample_tok.encode_between(["a"], []) is None  # a backend that cannot show it: the caller encodes


@SETTINGS
@given(text=TEXT)
def test_marker_search_finds_what_a_substring_search_finds(tiny_kimi, text):
    r = Reconstructor(KIMI, tiny_kimi)
    no_think = [m for m in KIMI.markers if m not in (KIMI.think_open, KIMI.think_close)]
    for words, spells in ((KIMI.markers, r._spells_marker), (no_think, r._spells_marker_no_think)):
        assert spells(text) == any(w in text for w in words), text


@SETTINGS
@given(ref_text=TEXT, rec_text=TEXT, cut=st.integers(0, 3), data=st.data())
def test_category_only_compare_is_compares_category(request, sample_tok, ref_text, rec_text, cut, data):
    # a probe's text-path measurement keeps only the category: it must be compare's, on every kind of pair
    from app.tokens.compare import compare, compare_category

    for tok in (*_tokenizers(request), sample_tok):
        end = [tok.special_id("<|im_end|>")]
        ref = tok.encode(ref_text) + data.draw(st.sampled_from([end, []]))
        rec = data.draw(
            st.sampled_from(
                [
                    list(ref),
                    tok.encode(rec_text) + end,
                    ref[: len(ref) - cut],
                    ref + end,
                    [i for k, i in enumerate(ref) if k != cut],
                ]
            )
        )
        assert compare_category(rec, ref, tok, KIMI) == compare(rec, ref, tok, KIMI).category, (rec, ref)


def test_category_only_compare_covers_every_category(tiny_kimi):
    from app.tokens.compare import compare, compare_category

    tok = tiny_kimi
    end, close = tok.special_id("<|im_end|>"), tok.special_id("</think>")
    hello = tok.encode("hello world")
    split = [tok.id_of_bytes(bytes([b])) for b in b"hello world"]  # the same bytes, a byte a token
    assert split != hello
    pairs = {
        "exact": (hello + [end], hello + [end]),
        "truncated": (hello + [end], hello),
        "bpe_equivalent": (split + [end], hello + [end]),
        "structure_mismatch": ([close] + hello + [end], hello + [end]),
        "text_mismatch": (tok.encode("hello there") + [end], hello + [end]),
    }
    for want, (rec, ref) in pairs.items():
        assert compare(rec, ref, tok, KIMI).category == want
        assert compare_category(rec, ref, tok, KIMI) == want


@SETTINGS
@given(c=completions())
def test_round_trip_shortcut_on_the_other_families(family_tokenizers, nfc_qwen_tokenizer, c):
    for name, tok in (*family_tokenizers.items(), ("qwen3", nfc_qwen_tokenizer)):
        profile = get_profile(name)
        assert Reconstructor(profile, tok).process(c) == Reconstructor(profile, _Unknowing(tok)).process(c), name


# ---- the fidelity profile's plan ---------------------------------------------------------------------------

EDGE_KEYS = [
    "reasoning.blank",
    "reasoning.lead",
    "reasoning.trail",
    "reasoning.trail@cut",
    "content.lead",
    "content.lead@noreason",
    "content.trail",
    "content.trail@tools",
    "content.trail@cut",
    *("content.blank" + _blank_ctx(r, t) for r in (True, False) for t in (True, False)),
    "tool.arguments.lead",
    "tool.arguments.trail",
    "tool.id.lead",
    "tool.id.trail",
]
CHANGES = st.dictionaries(
    st.sampled_from(["", "~", "=", "+ ", "-\n", "+  ", "- ", "+\n", "-*"]), st.integers(1, 3), min_size=1, max_size=2
)


@st.composite
def profiles(draw):
    obs = {f"edge:{k}": draw(CHANGES) for k in draw(st.lists(st.sampled_from(EDGE_KEYS), max_size=6, unique=True))}
    for key, values in (
        ("empty_reasoning", ["dropped", "kept", "absent"]),
        ("no_content", ["deleted", "kept", "absent"]),
        ("json", ["same", "irregular", *JSON_STYLES]),
        ("tool_ids", ["same", "other", "offset:0", "offset:2", "offset:-1"]),
    ):
        if draw(st.booleans()):
            obs[key] = draw(st.dictionaries(st.sampled_from(values), st.integers(1, 3), min_size=1, max_size=2))
    return FidelityProfile("e", None, KIMI.name, 5, obs)


WS_TEXT = st.lists(st.sampled_from(["", " ", "\n", "  ", "x", "Hello", " y ", "\n\n"]), max_size=4).map("".join)


@st.composite
def fields(draw):
    calls = tuple(
        ToolCall(
            draw(st.sampled_from(["functions.f:0", " functions.f:1\n", "f", "", " "])),
            "f",
            draw(st.sampled_from(['{"a": 1}', ' {"a":1} ', '{"b": [1, 2]}\n', "", "  ", "{bad"])),
            i,
        )
        for i in range(draw(st.integers(0, 2)))
    )
    return Fields(
        draw(st.one_of(st.none(), WS_TEXT)),
        draw(st.one_of(WS_TEXT, st.just(NO_CONTENT))),
        calls,
        draw(st.sampled_from(["stop", "length", "tool_calls"])),
    )


@settings(max_examples=400, deadline=None)
@given(fp=profiles(), f=fields())
def test_the_per_profile_plan_applies_what_the_released_apply_did(fp, f):
    assert apply(fp, f, KIMI) == _reference_apply(fp, f, KIMI)
    assert apply(fp, f, replace(KIMI, tool_id_in_stream=False)) == _reference_apply(
        fp, f, replace(KIMI, tool_id_in_stream=False)
    )


# ---- the oracle: app.tokens.fidelity_profile.apply as released ------------------------------------------------------


def _reference_apply(fp: FidelityProfile, f: Fields, profile) -> Applied:
    """app.tokens.fidelity_profile.apply as released (93048ae), before the per-profile plan: the oracle; since
    then, an edge whose whitespace was only ever removed (some of the times) is a strip, named in
    `Applied.strips` for the token count to decide, instead of flagged on every sample."""
    used: list[str] = []
    flags: list[str] = []
    strips: list[str] = []
    obs = fp.observations
    plan, strip_plan = _reference_edge_plan(fp)
    if not obs:
        return Applied(f, (), ())

    def edge(key: str, text: str, side: str) -> str:
        if key in strip_plan and (key.endswith(_BLANK_KEYS) or not (not text or text.isspace())):
            strips.append(key)
            return text
        step = plan.get(key)
        if step is None or ((not text or text.isspace()) and not key.endswith(_BLANK_KEYS)):
            return text
        name, change = step
        if change is None:
            flags.append(UNINVERTIBLE + name)
            return text
        ws = change[1:]
        if change.startswith("-"):
            used.append(name)
            return ws + text if side == "lead" else text + ws
        has = text.startswith(ws) if side == "lead" else text.endswith(ws)
        if not has:  # the server adds this always, so its absence means something else removed it
            flags.append(TEMPLATE_WHITESPACE_MISSING if name == "template_whitespace_kept" else UNINVERTIBLE + name)
            return text
        used.append(name)
        return text[len(ws) :] if side == "lead" else text[: len(text) - len(ws)]

    truncated = f.finish_reason == "length"
    reasoning, content, calls = f.reasoning, f.content, list(f.tool_calls)
    er = obs.get("empty_reasoning", {})
    if reasoning is None and er.get("dropped"):
        if er.get("absent") or er.get("kept"):
            flags.append(UNINVERTIBLE + "empty_reasoning_dropped")
        else:
            reasoning = ""
            used.append("empty_reasoning_dropped")
    if reasoning is not None and _blank(reasoning):
        reasoning = edge("reasoning.blank", reasoning, "lead")
    elif reasoning:
        last = truncated and not content and not calls
        reasoning = edge("reasoning.lead", reasoning, "lead")
        reasoning = edge("reasoning.trail" + ("@cut" if last else ""), reasoning, "trail")
    if not _blank(content):
        content = edge("content.lead" + ("" if reasoning is not None else "@noreason"), content, "lead")
        content = edge("content.trail" + ("@tools" if calls else "@cut" if truncated else ""), content, "trail")
    else:
        content = edge("content.blank" + _blank_ctx(reasoning is not None, bool(calls)), content, "lead")
    nc = obs.get("no_content", {})
    if calls and _blank(content) and nc.get("deleted"):
        if nc.get("absent") or nc.get("kept"):
            flags.append(UNINVERTIBLE + "no_content")
        else:
            content = content + NO_CONTENT
            used.append("no_content")
    js = {s: n for s, n in obs.get("json", {}).items() if s != "same"} if calls else {}
    ids = {s: n for s, n in obs.get("tool_ids", {}).items() if s != "same"} if calls else {}
    for k, call in enumerate(calls):
        args = call.arguments
        if not _blank(args):
            args = edge("tool.arguments.lead", args, "lead")
            args = edge("tool.arguments.trail", args, "trail")
        if js:
            style = next(iter(js))
            if len(js) == 1 and style in JSON_STYLES and not obs["json"].get("same"):
                redone = _redump(args, JSON_STYLES[style])
                if redone != args:
                    args = redone
                    used.append("json_reserialised")
            else:
                flags.append(UNINVERTIBLE + "json_reserialised")
        call_id = call.id
        if profile.tool_id_in_stream:
            if not _blank(call_id):
                call_id = edge("tool.id.lead", call_id, "lead")
                call_id = edge("tool.id.trail", call_id, "trail")
            if ids:
                offset = next(iter(ids))
                m = _KIMI_ID.fullmatch(call_id.strip())
                if len(ids) == 1 and offset.startswith("offset:") and not obs["tool_ids"].get("same") and m:
                    call_id = f"functions.{m.group(1)}:{int(m.group(2)) + int(offset[7:])}"
                    used.append("tool_ids_reindexed")
                else:
                    flags.append(UNINVERTIBLE + "tool_ids_reindexed")
        if (call_id, args) != (call.id, call.arguments):
            calls[k] = replace(call, id=call_id, arguments=args)
    if (reasoning, content) != (f.reasoning, f.content) or any(a is not b for a, b in zip(calls, f.tool_calls)):
        f = replace(f, reasoning=reasoning, content=content, tool_calls=tuple(calls))
    return Applied(
        f,
        tuple(dict.fromkeys(used)) if used else (),
        tuple(dict.fromkeys(flags)) if flags else (),
        tuple(dict.fromkeys(strips)) if strips else (),
    )


def _reference_edge_plan(fp: FidelityProfile) -> tuple[dict[str, tuple[str, str | None]], set[str]]:
    plan: dict[str, tuple[str, str | None]] = {}
    strips: set[str] = set()
    for key, counts in fp.observations.items():
        if not key.startswith("edge:"):
            continue
        changes = {c: n for c, n in counts.items() if c not in ("", "~", "=")}
        if changes:
            ok = len(changes) == 1 and not counts.get("", 0) and not counts.get("=", 0) and "-*" not in changes
            if not ok and all(c.startswith("-") for c in changes):
                strips.add(key[5:])
            else:
                plan[key[5:]] = (_edge_step_name(key[5:], changes), next(iter(changes)) if ok else None)
    return plan, strips


# ---- the one pass over a sample's fields -------------------------------------------------------------------------


@st.composite
def counted_completions(draw):
    """completions() with a token count: none, or any small number (the count check agrees with some)."""
    c = draw(completions())
    return replace(c, usage=Usage(completion_tokens=draw(st.integers(0, 40))))


@st.composite
def fidelity_profiles_drawn(draw):
    """profiles() as the engine holds them: probes' observations, a count relation, and sometimes a server prior
    (with a strip edge, whose samples the token count decides)."""
    fp = draw(profiles())
    obs = dict(fp.observations)
    if draw(st.booleans()):
        obs["count"] = {draw(st.sampled_from(["+0", "+1", "-1"])): 3}
    prior = draw(st.sampled_from([{}, {"count": {"+0": 1}}, {"count": {"+0": 1}, "edge:content.trail": {STRIPPED: 1}}]))
    return replace(fp, observations=obs, prior=prior)


@SETTINGS
@given(c=counted_completions(), fp=st.one_of(st.none(), fidelity_profiles_drawn()))
def test_one_pass_is_the_full_path(request, c, fp):
    # the one pass (inverses, suspect flags, layout by shape, encode, count check, round-trip by shape) gives what
    # the full path gives (Fields, apply, render, encode, count_flags, the round-trip) on every sample it takes
    for tok in _tokenizers(request):
        # a fresh Reconstructor with the drawn profile, and one without a profile kept across examples (its shapes'
        # answers reused, as in a run)
        shared = _SHAPED.setdefault(id(tok), (tok, Reconstructor(KIMI, tok)))[1]
        for r in (Reconstructor(KIMI, tok, fp, measure=False), shared):
            full = r._canonical(c, None, False)
            fast = r._one_pass(c)
            assert fast is None or fast == full, (c, fp)
            assert r.process(c) == full


_KIMI_CALL = ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}', 0)


def test_one_pass_is_taken_and_refused_where_it_must_be(tiny_kimi):
    # taken on the common samples (so the test above compares something); refused where the full path decides
    r = Reconstructor(KIMI, tiny_kimi, measure=False)
    for c in (
        Completion("Paris.", "Let me think."),
        Completion("", "x", (_KIMI_CALL,), "tool_calls"),
        Completion("Paris.", None),
        Completion("cut", "r", finish_reason="length"),
        Completion("Paris.", "Let me think.", usage=Usage(completion_tokens=3)),
    ):
        assert r._one_pass(c) is not None and r._one_pass(c) == r._canonical(c, None, False), c
    spelled = Completion("a <|im_end|> b", "r")  # a run that spells a special: the joined text is encoded
    renamed = Completion("", "x", (replace(_KIMI_CALL, name="lookup"),), "tool_calls")  # its id names another tool
    for c in (spelled, renamed):
        assert r._one_pass(c) is None
        assert r.process(c) == r._canonical(c, None, False)
    strips = FidelityProfile("e", None, KIMI.name, 0, {}, {"count": {"+0": 1}, "edge:content.trail": {STRIPPED: 1}})
    stripping = Reconstructor(KIMI, tiny_kimi, strips, measure=False)
    assert stripping._one_pass(Completion("Paris.", "r", usage=Usage(completion_tokens=5))) is None  # the count decides
    # a tokenizer that cannot encode a run at a time never takes it
    assert not Reconstructor(KIMI, _Unknowing(tiny_kimi))._one_pass_ok


@SETTINGS
@given(f=fields(), close=st.sampled_from([None]))
def test_layout_by_shape_is_the_rendered_layout(tiny_kimi, family_tokenizers, f, close):
    # where the field values go between the markers, from a layout worked out once per shape, against rendering
    # the fields and splitting the pieces at their markers
    cases = [(KIMI, tiny_kimi), *((get_profile(name), tok) for name, tok in family_tokenizers.items())]
    for profile, tok in cases:
        r = _LAYOUTS.setdefault(profile.name, Reconstructor(profile, tok))
        for g in (f, replace(f, tool_calls=()), replace(f, content=""), replace(f, reasoning="")):
            laid = r._layout(g.reasoning, g.content, g.tool_calls, g.finish_reason == "length")
            want = r._between_markers(r._pieces(g))
            if laid is None:  # only tool calls of another format, or ones whose names do not read back
                assert g.tool_calls and (
                    profile.tool_format != "kimi" or not tool_calls_read_back(profile, g.tool_calls)
                )
            else:
                assert laid == want, (profile.name, g)


_LAYOUTS: dict[str, Reconstructor] = {}

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def json_texts(draw):
    """JSON texts in every style, with whitespace around them, spoiled ones, and text that is no JSON."""
    value = draw(JSON_VALUES)
    text = json.dumps(value, **draw(st.sampled_from(list(JSON_STYLES.values()))))
    return (
        draw(st.sampled_from(["", " ", "\n", "\ufeff"]))
        + draw(st.sampled_from([text, text[:-1], text + "x", "{bad"]))
        + draw(st.sampled_from(["", " ", "\n"]))
    )


@settings(max_examples=300, deadline=None)
@given(text=json_texts(), style=st.sampled_from(list(JSON_STYLES.values())))
def test_redump_is_json_dumps_of_json_loads(text, style):
    # the scanner called directly and the cached C encoder give what json.loads / json.dumps give
    try:
        want = json.dumps(json.loads(text), **style)
    except (ValueError, TypeError):
        want = text
    assert _redump(text, style) == want
    assert _redumps(text) == [_redump(text, kw) for kw in JSON_STYLES.values()]


@settings(max_examples=100, deadline=None)
@given(
    values=st.tuples(
        st.tuples(st.integers(0, 9)),
        st.text(max_size=3),
        st.none() | st.text(max_size=3),
        st.none() | st.booleans(),
        st.tuples(st.text(max_size=3)),
        st.none() | st.text(max_size=3),
        st.tuples(st.text(max_size=3)),
    )
)
def test_positional_builder_builds_what_the_constructor_builds(values):
    from dataclasses import FrozenInstanceError

    from app.engine.fidelity.verify import Reconstructed
    from app.records import Reconstruction, Verdict, positional_builder

    built = positional_builder(Reconstruction)(*values)
    assert built == Reconstruction(*values) and type(built) is Reconstruction
    assert hash(built) == hash(Reconstruction(*values))
    with pytest.raises(FrozenInstanceError):
        built.strategy = "other"  # type: ignore[misc]
    assert positional_builder(Reconstructed)(built, None, "exact", None, None, ()) == Reconstructed(
        built, None, "exact", None, None, ()
    )
    call = positional_builder(ToolCall)("i", "n", values[1], 2, "function")
    assert call == ToolCall("i", "n", values[1], 2)
    assert _unchecked_verdict(len(values[0]), values[1]) == Verdict(
        "unchecked", rec_len=len(values[0]), explanation=values[1]
    )
    with pytest.raises(TypeError):
        positional_builder(FidelityProfile)  # not a slots dataclass
