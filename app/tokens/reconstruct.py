"""Rebuild the output ids of a Completion: server ids, logprob bytes, or canonical encoding with repairs.

Canonical: render the returned fields into the output string (markers as text) and encode it once. When a
reference is given and the plain rebuild does not match it (neither exact nor a benign re-split), the
inverse of each known server-side text step (reference section 7) is tried in turn; the first variant that
matches is kept and its name recorded in `Reconstruction.repair`. What text cannot recover is named in
`Reconstruction.notes`, never guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from itertools import product
from typing import Iterator, Sequence

from app.records import Completion, Reconstruction, TokenLogprob, ToolCall, Verdict
from app.tokens.compare import compare
from app.tokens.profile import Profile
from app.tokens.template import Piece, ProviderView, kimi_tool_id, render_output, split_output
from app.tokens.tokenizer import Tokenizer

BENIGN = ("exact", "bpe_equivalent", "truncated")
REPAIRS = (
    "think_close",
    "think_spaces",
    "strip_whitespace",
    "no_content",
    "tool_whitespace",
    "json_reserialised",
    "tool_ids_reindexed",
)
NO_CONTENT = "(no content)"
MAX_REINDEX = 32
MAX_CHAIN = 3  # server-side steps inverted on top of each other, at most


@dataclass(frozen=True, slots=True)
class Fields:
    """The returned fields a rebuild starts from (a repair yields changed copies)."""

    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    close_think: bool | None = None  # None: the layout decides (see render_output)

    @classmethod
    def of(cls, c: Completion) -> "Fields":
        return cls(c.reasoning, c.content or "", tuple(c.tool_calls), c.finish_reason)


class Reconstructor:
    """Rebuilds output ids for one profile and tokenizer; holds no mutable state (thread-safe)."""

    def __init__(self, profile: Profile, tokenizer: Tokenizer) -> None:
        self.profile = profile
        self.tokenizer = tokenizer
        self._marker_ids = profile.marker_ids(tokenizer)  # InputError when the tokenizer lacks a marker
        self._stop_ids = frozenset(i for t in profile.stop_tokens if (i := tokenizer.special_id(t)) is not None)
        self._markers = tuple(profile.markers)
        self._marker_set = frozenset(self._markers)

    # --- public -------------------------------------------------------------------------------------

    def process(self, completion: Completion, reference_ids: Sequence[int] | None = None) -> tuple[Reconstruction, Verdict]:
        """Rebuild `completion`'s output ids and compare them with `reference_ids` (None: unchecked).

        Strategy order: server ids, then logprobs, then canonical (with repairs when a reference disagrees).
        """
        ref = list(reference_ids) if reference_ids is not None else None
        if completion.token_ids:
            rec = self._server_ids(completion)
        elif completion.content_logprobs is not None or completion.reasoning_logprobs is not None:
            rec = self._from_logprobs(completion)
        else:
            rec = None
        if rec is None:
            return self._canonical(completion, ref)
        return self._finish(rec, completion, ref)

    def encode_fields(self, fields: Fields) -> list[int]:
        """Canonical ids of `fields`: the output string with markers as text, encoded once."""
        text = "".join(t for _, t in self._pieces(fields))
        return self.tokenizer.encode(text)

    def _encode_cached(self, fields: Fields, cache: dict[str, list[int]]) -> list[int]:
        # Same ids as encode_fields (every tokenizer here splits at marker tokens before BPE, so text between
        # markers is encoded on its own), but a run seen before is not encoded again: repair variants change
        # one or two runs of a long output.
        out: list[int] = []
        text = ""
        for kind, piece in self._pieces(fields):
            if kind != "marker":
                text += piece
                continue
            if text:
                ids = cache.get(text)
                if ids is None:
                    ids = cache[text] = self.tokenizer.encode(text)
                out.extend(ids)
                text = ""
            out.append(self._marker_ids[piece])
        if text:
            ids = cache.get(text)
            if ids is None:
                ids = cache[text] = self.tokenizer.encode(text)
            out.extend(ids)
        return out

    def roundtrip(self, ids: Sequence[int], completion: Completion) -> bool:
        """True when these ids, returned by an ideal provider, give back the completion's fields."""
        view = split_output(ids, self.profile, self.tokenizer)
        return _same_text(view.reasoning, completion.reasoning) and view.content == (completion.content or "") and [
            (c.name, c.arguments) for c in view.tool_calls
        ] == [(c.name, c.arguments) for c in completion.tool_calls]

    # --- strategies ---------------------------------------------------------------------------------

    def _server_ids(self, c: Completion) -> Reconstruction:
        ids = list(c.token_ids or ())
        if c.finish_reason in ("stop", "tool_calls") and (not ids or ids[-1] not in self._stop_ids):
            ids.append(self._marker_ids[self.profile.end_token(bool(c.tool_calls))])
        return Reconstruction(output_ids=tuple(ids), strategy="server_ids")

    def _from_logprobs(self, c: Completion) -> Reconstruction | None:
        fields = Fields.of(c)
        pieces = self._pieces(fields)
        runs = _runs(pieces)
        reasoning_ids = self._lp_ids(c.reasoning_logprobs) if c.reasoning_logprobs is not None else None
        content_ids = self._lp_ids(c.content_logprobs) if c.content_logprobs is not None else None
        tb = self.tokenizer.decode_bytes
        out: list[int] = []
        used = False
        notes: list[str] = []
        k = 0
        while k < len(runs):
            kind, text = runs[k]
            if kind == "marker":
                out.append(self._marker_ids[text])
                k += 1
                continue
            if kind == "reasoning" and reasoning_ids is not None and tb(reasoning_ids) == text.encode("utf-8"):
                out.extend(reasoning_ids)
                used = True
            elif kind == "content" and content_ids is not None and tb(content_ids) == text.encode("utf-8"):
                out.extend(content_ids)
                used = True
            elif kind == "content" and content_ids is not None and self._tail_matches(runs, k, content_ids):
                # The provider's content logprobs cover everything after the reasoning (tool markers too).
                out.extend(content_ids)
                if not (content_ids and content_ids[-1] in self._stop_ids) and fields.finish_reason != "length":
                    out.append(self._marker_ids[self.profile.end_token(bool(fields.tool_calls))])
                used = True
                break
            else:
                if kind in ("reasoning", "content") and (reasoning_ids if kind == "reasoning" else content_ids) is not None:
                    notes.append(f"{kind}_logprobs_mismatch")
                out.extend(self.tokenizer.encode(text))
            k += 1
        if not used:
            return None
        return Reconstruction(output_ids=tuple(out), strategy="logprobs", notes=tuple(notes))

    def _tail_matches(self, runs: list[Piece], k: int, ids: list[int]) -> bool:
        tail = "".join(t for _, t in runs[k:]).encode("utf-8")
        got = self.tokenizer.decode_bytes(ids)
        if got == tail:
            return True
        end = self.profile.end_token(True).encode(), self.profile.end_of_turn.encode()
        return any(tail.endswith(e) and got == tail[: -len(e)] for e in end)

    def _lp_ids(self, logprobs: Sequence[TokenLogprob]) -> list[int] | None:
        out: list[int] = []
        for lp in logprobs:
            special = self.tokenizer.special_id(lp.token) if lp.token in self._marker_set else None
            if special is not None:
                out.append(special)
                continue
            data = bytes(lp.bytes) if lp.bytes is not None else _token_str_bytes(lp.token)
            i = self.tokenizer.id_of_bytes(data)
            if i is None:
                i = self.tokenizer.special_id(lp.token)
            if i is None:
                return None
            out.append(i)
        return out

    def _canonical(self, c: Completion, ref: list[int] | None) -> tuple[Reconstruction, Verdict]:
        fields = Fields.of(c)
        ids = self.encode_fields(fields)
        if ref is None:
            return self._finish(Reconstruction(output_ids=tuple(ids), strategy="canonical"), c, None)
        verdict = compare(ids, ref, self.tokenizer, self.profile)
        if verdict.category in BENIGN:
            return Reconstruction(output_ids=tuple(ids), strategy="canonical", roundtrip=True), verdict
        plain = Reconstruction(output_ids=tuple(ids), strategy="canonical")
        ref_bytes = self.tokenizer.decode_bytes(ref)
        ref_truncated = not ref or ref[-1] not in self._stop_ids
        ref_view = split_output(ref, self.profile, self.tokenizer)
        seen = {tuple(ids)}
        cache: dict[str, list[int]] = {}
        # Greedy: servers apply several steps at once (vLLM: think_spaces + no_content + tool_whitespace),
        # so after a round without a match, keep the variant that agrees with the most reference bytes at
        # both ends and invert the next step on top of it (at most MAX_CHAIN steps).
        used: list[str] = []
        current = fields
        best = _agreement(self.tokenizer.decode_bytes(ids), ref_bytes)
        for _ in range(MAX_CHAIN):
            step: tuple[str, Fields, int] | None = None
            for name, variant in self._repair_candidates(current, ref_view):
                if name in used:
                    continue
                ids2 = self._encode_cached(variant, cache)
                key = tuple(ids2)
                if key in seen:
                    continue
                seen.add(key)
                got = self.tokenizer.decode_bytes(ids2)
                if ref_truncated or got == ref_bytes:
                    v2 = compare(ids2, ref, self.tokenizer, self.profile)
                    if v2.category in BENIGN:
                        label = "+".join(sorted([*used, name], key=REPAIRS.index))
                        rec = Reconstruction(output_ids=key, strategy="canonical", repair=label, roundtrip=True)
                        return rec, _with_repair(v2, label)
                score = _agreement(got, ref_bytes)
                if score > best and (step is None or score > step[2]):
                    step = (name, variant, score)
            if step is None:
                break
            used.append(step[0])
            current, best = step[1], step[2]
        return replace(plain, roundtrip=False, notes=self._notes(fields, ref, verdict)), verdict

    def _finish(self, rec: Reconstruction, c: Completion, ref: list[int] | None) -> tuple[Reconstruction, Verdict]:
        if ref is None:
            ok = self.roundtrip(rec.output_ids, c)
            notes = rec.notes + (() if ok else self._notes(Fields.of(c), None, None))
            verdict = compare(rec.output_ids, None, self.tokenizer, self.profile)
            sentence = "round-trip ok" if ok else "round-trip FAILED: decoding the ids does not give back the returned text"
            return replace(rec, roundtrip=ok, notes=notes), replace(verdict, explanation=f"{verdict.explanation}; {sentence}")
        verdict = compare(rec.output_ids, ref, self.tokenizer, self.profile)
        ok = verdict.category in BENIGN
        notes = rec.notes + (() if ok else self._notes(Fields.of(c), ref, verdict))
        return replace(rec, roundtrip=ok, notes=notes), verdict

    # --- pieces, repairs, notes ---------------------------------------------------------------------

    def _pieces(self, f: Fields) -> list[Piece]:
        return render_output(self.profile, f.reasoning, f.content, f.tool_calls, f.finish_reason, f.close_think)

    def _repair_candidates(self, f: Fields, ref_view: ProviderView | None = None) -> Iterator[tuple[str, Fields]]:
        """Variants of the fields, one server-side step inverted at a time (reference section 7).

        `ref_view` (the reference split as an ideal provider would) only supplies how much whitespace a
        strip removed at a field's edges; no other text is ever taken from it.
        """
        p = self.profile
        # think_close: reasoning None vs "" decides whether `</think>` was emitted.
        if f.reasoning is None and p.think_close not in f.content:
            yield "think_close", replace(f, reasoning="")
        elif f.reasoning == "":
            yield "think_close", replace(f, reasoning=None)
        if f.finish_reason == "length" and f.reasoning is not None and not f.content and not f.tool_calls:
            yield "think_close", replace(f, close_think=True)  # cut right after the think-close tag
        # think_spaces: a detokenizer put ' ' on both sides of every added token.
        r, c = f.reasoning, f.content
        options = [
            bool(r) and r.startswith(" "), bool(r) and r.endswith(" "), c.startswith(" "), c.endswith(" ")
        ]
        for mask in product((False, True), repeat=4):
            if not any(mask) or any(m and not o for m, o in zip(mask, options)):
                continue
            r2 = r
            if r2 is not None:
                r2 = r2[1:] if mask[0] else r2
                r2 = r2[:-1] if mask[1] else r2
            c2 = c[1:] if mask[2] else c
            c2 = c2[:-1] if mask[3] and c2.endswith(" ") else c2
            calls = tuple(replace(t, id=t.id.strip(), arguments=t.arguments.strip(" ")) for t in f.tool_calls)
            yield "think_spaces", replace(f, reasoning=r2, content=c2, tool_calls=calls)
        # strip_whitespace: reasoning and content were .strip()ped. How much whitespace went is read from
        # the reference, and only where the field's text is otherwise identical (nothing else is copied).
        if ref_view is not None:
            r2 = _restore_edges(r, ref_view.reasoning)
            c2 = _restore_edges(c, ref_view.content)
            if (r2, c2) != (r, c):
                yield "strip_whitespace", replace(f, reasoning=r2, content=c2)
        for r_end, c_start in (("\n", ""), ("", "\n"), ("\n", "\n"), ("\n\n", ""), ("", "\n\n"), (" ", ""), ("", " ")):
            if r_end and r is None:
                continue
            yield "strip_whitespace", replace(f, reasoning=(r + r_end) if r is not None else None, content=c_start + c)
        # no_content: vLLM's Kimi parser deleted the "(no content)" placeholder before tool calls.
        if f.tool_calls and not f.content.strip():
            yield "no_content", replace(f, content=NO_CONTENT)
            yield "no_content", replace(f, content=f.content + NO_CONTENT)
        if f.tool_calls:
            # tool_whitespace: the tool parser's \s* ate whitespace around ids and arguments.
            if ref_view is not None and len(ref_view.tool_calls) == len(f.tool_calls):
                calls = tuple(
                    replace(t, id=_restore_edges(t.id, g.id), arguments=_restore_edges(t.arguments, g.arguments))
                    for t, g in zip(f.tool_calls, ref_view.tool_calls)
                )
                if calls != f.tool_calls:
                    yield "tool_whitespace", replace(f, tool_calls=calls)
            for pre, post in (("", "\n"), ("\n", ""), ("\n", "\n"), (" ", ""), ("", " "), (" ", " ")):
                calls = tuple(replace(t, arguments=pre + t.arguments + post) for t in f.tool_calls)
                yield "tool_whitespace", replace(f, tool_calls=calls)
            # json_reserialised: the arguments were json.loads/json.dumps'ed by the server.
            for kwargs in ({"ensure_ascii": True}, {"separators": (",", ":"), "ensure_ascii": False},
                           {"separators": (",", ":"), "ensure_ascii": True}, {"ensure_ascii": False, "indent": 2}):
                calls = tuple(replace(t, arguments=_redump(t.arguments, kwargs)) for t in f.tool_calls)
                yield "json_reserialised", replace(f, tool_calls=calls)
            # tool_ids_reindexed: the server synthesised functions.NAME:IDX instead of passing the model's id.
            if p.tool_id_in_stream:
                for offset in range(MAX_REINDEX):
                    calls = tuple(
                        replace(t, id=kimi_tool_id(p, replace(t, id=""), i + offset)) for i, t in enumerate(f.tool_calls)
                    )
                    yield "tool_ids_reindexed", replace(f, tool_calls=calls)

    def _notes(self, f: Fields, ref: list[int] | None, verdict: Verdict | None) -> tuple[str, ...]:
        """What text cannot recover, found in the returned fields or the reference (never guessed)."""
        notes: list[str] = []
        texts = [f.reasoning or "", f.content, *(t.arguments for t in f.tool_calls), *(t.id for t in f.tool_calls)]
        ref_text = self.tokenizer.decode(ref) if ref is not None else ""
        if any("\ufffd" in t for t in texts) or "\ufffd" in ref_text:
            notes.append("replacement_char")
        if any(m in t for t in texts for m in self._markers) or (ref is not None and self._marker_spelled(ref)):
            notes.append("marker_as_text")
        normalize = getattr(self.tokenizer, "normalize", None)
        if normalize is not None and getattr(self.tokenizer, "has_normalizer", False):
            if any(normalize(t) != t for t in texts if t) or (ref_text and normalize(ref_text) != ref_text):
                notes.append("normaliser")
        return tuple(notes)

    def _marker_spelled(self, ref: list[int]) -> bool:
        # A marker string inside a run of ordinary tokens: the model spelled it out; text cannot tell.
        run: list[int] = []
        for i in [*ref, -1]:
            if i >= 0 and not self.tokenizer.is_special(i):
                run.append(i)
                continue
            if run:
                text = self.tokenizer.decode(run)
                if any(m in text for m in self._markers):
                    return True
                run = []
        return False


def _runs(pieces: list[Piece]) -> list[Piece]:
    """Adjacent non-marker pieces joined; a run keeps the role of its field (template text joins it)."""
    out: list[Piece] = []
    for kind, text in pieces:
        if kind == "marker":
            out.append((kind, text))
        elif out and out[-1][0] != "marker":
            prev_kind, prev = out[-1]
            role = prev_kind if prev_kind != "template" else kind
            if kind != "template" and prev_kind not in ("template", kind):
                role = "mixed"
            out[-1] = (role, prev + text)
        else:
            out.append((kind, text))
    return out


def _agreement(a: bytes, b: bytes) -> int:
    """Bytes that a and b share at the start plus at the end (binary search over memoryview slices)."""
    ma, mb = memoryview(a), memoryview(b)
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ma[:mid] == mb[:mid]:
            lo = mid
        else:
            hi = mid - 1
    prefix = lo
    lo, hi = 0, n - prefix
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ma[len(a) - mid:] == mb[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return prefix + lo


def _restore_edges(got: str | None, truth: str | None) -> str | None:
    """`got` with the leading/trailing whitespace of `truth`, when the two differ only there."""
    if got is None or truth is None or got == truth or got.strip() != truth.strip() or not got.strip():
        return got
    core = truth.strip()
    start = truth.index(core)
    return truth[:start] + got.strip() + truth[start + len(core):]


def _same_text(a: str | None, b: str | None) -> bool:
    return (a or "") == (b or "")


def _redump(arguments: str, kwargs: dict) -> str:
    try:
        return json.dumps(json.loads(arguments), **kwargs)
    except (json.JSONDecodeError, TypeError):
        return arguments


def _token_str_bytes(token: str) -> bytes:
    # vLLM writes undecodable tokens as "bytes:\xe4\xbd"; everything else is the token's UTF-8.
    if token.startswith("bytes:"):
        try:
            return token[6:].encode("latin-1").decode("unicode_escape").encode("latin-1")
        except (UnicodeDecodeError, UnicodeEncodeError):
            pass
    return token.encode("utf-8")


def _with_repair(verdict: Verdict, name: str) -> Verdict:
    return replace(verdict, explanation=f"{verdict.explanation} (after repair {name})")
