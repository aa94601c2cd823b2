"""Reconstruct the output ids of a Completion: server ids, logprob bytes, or canonical encoding with repairs.

True ids (server ids, logprob tokens) are kept as they are, whatever the server did to the text: that change
is named in `Reconstruction.notes` (`<field>_text_differs`) and leaves the round-trip unjudged (None), while the
text-only reconstruction measured against the true ids (`text_path:<verdict>`) is the endpoint's fidelity.

Canonical (production): render the returned fields into the output string (markers as text), after the
inverses of the server-side text steps the endpoint's *fidelity profile* learned (app.tokens.fidelity_profile),
and encode it once; `Reconstruction.repair` names the inverses used and `Reconstruction.flags` the
suspect signs (app.tokens.flags). A reference, when given, only judges the result.

Reference-assisted (`assisted=True`, the upper bound `validate --assisted` shows): when the plain
reconstruction does not match the reference, the inverse of each known server-side text step (reference
section 7) is tried, some reading the lost whitespace from the reference; the first variant that
matches is kept. The search compares text bytes and encodes only a variant whose bytes agree, so an
unrepairable sample costs little more than one encode. What text cannot recover is named in
`Reconstruction.notes`, never guessed.

The per-sample path without a reference is kept cheap without changing a result (tests/tokens/test_fast_paths.py
compares each shortcut with the full path): the text between the rendered markers is encoded a run at a time
where no run spells a special (`Tokenizer.encode_between`: the text is not searched for specials again); a
lossless encode (`Tokenizer.encode_known`) lets the round-trip parse the text just encoded instead of decoding
the ids, and a sample whose runs hold no special is judged by a stand-in of its shape, parsed once per shape;
Reconstructions are built directly, verdict sentences looked up, and the fidelity profile's plan is worked
out once per profile (app.tokens.fidelity_profile). A probe's production fields and the split of its true ids
are computed once for its reconstruction, its learning and its measurement. With a tokenizer that encodes a run at a
time losslessly (tiktoken), the common sample takes one pass over its field values (`_one_pass`: the learned
inverses, the suspect flags, the runs laid out between the markers by the sample's shape, one encode, the count
check, the round-trip by shape), building no Fields, Applied or piece list; whatever that pass cannot decide (a
strip edge for the count, a run that spells a special, a shape that does not round-trip) takes the full path.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from itertools import product
from typing import cast, overload

from app.records import (
    AGREEING_VERDICTS,
    Completion,
    Reconstruction,
    TokenLogprob,
    ToolCall,
    Verdict,
    positional_builder,
)
from app.tokens import flags as fl
from app.tokens.align import common_prefix, common_suffix
from app.tokens.compare import UNCHECKED, compare, compare_category
from app.tokens.fidelity_profile import Applied, FidelityProfile, _plan_of, _redump, invert, strip_edges_and_count
from app.tokens.fidelity_profile import apply as apply_fidelity
from app.tokens.profile import Profile
from app.tokens.template import (
    Fields,
    Piece,
    ProviderView,
    kimi_stream_ids,
    kimi_tool_id,
    parse_output,
    render_output,
    tool_calls_read_back,
)
from app.tokens.tokenizer import Tokenizer, holds_at

REGIONS_FROM_TEXT = "regions_from_text"  # note: logprob ids whose uncovered regions (tool calls) came from text
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
_UNCHECKED_OK = f"{UNCHECKED}; round-trip ok"
MAX_REINDEX = 32
MAX_CHAIN = 3  # server-side steps inverted on top of each other, at most
# whitespace a stripping server may have removed at an edge: if adding any of these leaves the token count as it
# was, the count cannot tell whether it was there (" increasing" and "increasing" are one token each; "\n\n\n"
# is one token like "\n\n"), so the sample is flagged
STRIP_CANDIDATES = (" ", "\n", "\n\n", "\t", "  ", " \n", "\n ", "\n\n\n")
_WINDOW = 256  # characters each side of an edge that a windowed token count looks at (long runs only)


class Reconstructor:
    """Reconstructs output ids for one profile and tokenizer. Thread-safe: its only mutable state is a one-entry memo
    of the last completion's production fields and of the last true ids' split (each a (key, value) tuple
    replaced whole and matched by identity: a probe's reconstruct, measurement and learning share them), and the
    round-trip and the layout of each sample shape (dicts that only gain entries, each the same whoever computes
    it)."""

    # The assisted search judges variants by text bytes (False: encode every variant, the old way; kept
    # so that bench/reconstruct.py can show the difference in the same run).
    search_by_text = True

    def __init__(
        self, profile: Profile, tokenizer: Tokenizer, fidelity: FidelityProfile | None = None, *, measure: bool = True
    ) -> None:
        self.profile = profile
        self.tokenizer = tokenizer
        self.fidelity = fidelity  # the endpoint's learned server-side steps (None: none known)
        # per-sample proof without a reference: strip edges to decide and the token-count relation (None: off)
        self._has_strips, self._count_offset = strip_edges_and_count(fidelity)
        # the profile's inverses, worked out once (None: nothing to invert; see fidelity_profile.apply)
        self._plan = _plan_of(fidelity) if fidelity is not None and (fidelity.observations or fidelity.prior) else None
        # measure the text path of every sample with true ids (one more encode each); False leaves it to
        # callers that measure only a probe fraction (measured_category)
        self.measure = measure
        self._marker_ids = profile.marker_ids(tokenizer)  # InputError when the tokenizer lacks a marker
        self._think_close_id = self._marker_ids[profile.think_close]
        self._stop_text = {i: t for t in profile.stop_tokens if (i := tokenizer.special_id(t)) is not None}
        self._stop_ids = frozenset(self._stop_text)
        self._markers = tuple(profile.markers)
        # whether a field's text spells a marker (the raw-layout variant leaves out the think tags, which a
        # server without a reasoning parser returns inside content)
        self._spells_marker = _spells_any(self._markers)
        self._spells_marker_no_think = _spells_any(
            [m for m in self._markers if m not in (profile.think_open, profile.think_close)]
        )
        self._marker_set = frozenset(self._markers)
        self._last_production: tuple[Completion, Applied] | None = None
        self._tool_marker_bytes = tuple(m.encode() for m in profile.tool_markers.values())
        self._shape_ok: dict[tuple, bool] = {}  # _roundtrip_fields: shape -> its stand-in round-trips
        self._last_view: tuple[tuple[int, ...], ProviderView] | None = None
        # _layout: a sample shape -> where its field values go between the rendered markers (empty: not by shape)
        self._layouts: dict[tuple, tuple] = {}
        # the one pass (_one_pass) needs a tokenizer that encodes a run at a time and knows what its ids decode to
        # (tiktoken on a lossless pattern); any other takes the full path from the start
        between = tokenizer.encode_between([""], [])
        self._one_pass_ok = between is not None and between[1]

    # --- public -------------------------------------------------------------------------------------

    def process(
        self, completion: Completion, reference_ids: Sequence[int] | None = None, *, assisted: bool = False
    ) -> tuple[Reconstruction, Verdict]:
        """Reconstruct `completion`'s output ids and compare them with `reference_ids` (None: unchecked).

        A response with true ids (server ids, else logprob tokens this vocabulary knows: `ground_truth`) is
        stored with them, whatever the server did to its text; where the returned text differs from the text
        of those ids, `notes` name the fields (`<field>_text_differs`) and `roundtrip` is None (not a failure).
        Otherwise canonical with the fidelity profile's inverses. The reference only judges, unless `assisted`
        (the reference-informed repair search, an upper bound production never has). With `measure`, a sample
        with true ids also gets its text path measured (`text_path:` flag).
        """
        if (
            reference_ids is None
            and self._one_pass_ok
            and not completion.token_ids
            and completion.content_logprobs is None
            and completion.reasoning_logprobs is None
        ):
            return self._one_pass(completion) or self._canonical(completion, None, assisted)
        ref = list(reference_ids) if reference_ids is not None else None
        found = (
            self.truth_of(completion)
            if (
                completion.token_ids
                or completion.content_logprobs is not None
                or completion.reasoning_logprobs is not None
            )
            else None
        )
        if found is None:
            rec, verdict = self._canonical(completion, ref, assisted)
            if completion.token_ids:  # the server's ids lack text it returned: reconstructed from the text instead
                rec = replace(rec, flags=(*rec.flags, fl.SERVER_IDS_INCOMPLETE))
            return rec, verdict
        ids, source, covered = found
        flags: tuple[str, ...] = ()
        notes: tuple[str, ...] = ()
        if self.measure:
            flags = (fl.text_path_flag(self.measured_category(completion, ids)),)
        reported, offset = completion.usage.completion_tokens, self._count_offset
        if not covered:
            # logprobs did not cover every region (tool calls, most often): those ids are a reconstruction from text,
            # which only the token count can check here
            notes = (REGIONS_FROM_TEXT,)
            if offset is None or reported <= 0:
                flags += (fl.TEXT_REGIONS_UNCHECKED,)
        if source == fl.IDS_LOGPROBS and offset is not None and reported > 0 and len(ids) + offset != reported:
            flags += (fl.TOKEN_COUNT,)  # not as many ids as the model generated: the layout or a region is off
        rec = Reconstruction(
            ids, "server_ids" if source == fl.IDS_SERVER else "logprobs", notes=notes, ids_source=source, flags=flags
        )
        return self._finish_true(rec, completion, ref)

    def ground_truth(self, c: Completion) -> tuple[tuple[int, ...], str] | None:
        """The true output ids of `c` and their source (`truth_of` without its coverage)."""
        found = self.truth_of(c)
        return None if found is None else (found[0], found[1])

    def truth_of(self, c: Completion) -> tuple[tuple[int, ...], str, bool] | None:
        """The true output ids of `c`, their source and whether they cover the whole output, trusting server ids
        or logprob tokens over the text.

        Logprobs are used even where the server changed the field's text (that change is what calibration
        learns and the text path measures); regions without logprobs (tool sections, most often) are encoded
        from the fields production reconstructs (the fidelity profile's inverses applied), and then the ids do not
        cover the whole output (False); content logprobs that hold the think-close token, or spell the returned
        reasoning, hold the whole output (vLLM's `logprobs.content` covers every output token; app.providers.parse
        keeps a vLLM stream's so too). Where the markers go follows the same fields (a stream sends no reasoning for
        empty thinking: the profile says whether the think block was closed), checked against
        `usage.completion_tokens` when the count relation is known. None when `c` carries neither ids nor logprobs
        this vocabulary knows. Server ids that lack text the server returned (`ids_carry_text`) are not trusted.
        """
        if c.token_ids:
            ids = self._server_ids(c).output_ids
            if self.ids_carry_text(ids, c):
                return ids, fl.IDS_SERVER, True
        if c.content_logprobs is None and c.reasoning_logprobs is None:
            return None
        lp = {
            "reasoning": self._lp_ids(c.reasoning_logprobs) if c.reasoning_logprobs is not None else None,
            "content": self._lp_ids(c.content_logprobs) if c.content_logprobs is not None else None,
        }
        if lp["reasoning"] is None and lp["content"] is None:
            return None  # tokens this vocabulary does not know: no ground truth here
        returned = Fields.of(c)
        fields = self._production(c).fields if self.fidelity is not None else returned
        whole = lp["content"]
        if (
            whole is not None
            and lp["reasoning"] is None
            and (self._think_close_id in whole or self._holds_reasoning(whole, returned))
        ):
            out = list(whole)
            if not (out and out[-1] in self._stop_ids) and fields.finish_reason != "length":
                out.append(self._marker_ids[self.profile.end_token(bool(fields.tool_calls))])
            return tuple(out), fl.IDS_LOGPROBS, True
        layout, covered = self._logprob_layout(fields, lp)
        reported, offset = c.usage.completion_tokens, self._count_offset
        if offset is not None and reported > 0 and len(layout) + offset != reported:
            # whether an empty think block was there is not in the logprobs (a stream sends nothing for it): the
            # token count decides between the layouts with and without it
            if fields.reasoning != returned.reasoning:
                other: str | None = returned.reasoning
            elif fields.reasoning is None and fields.finish_reason != "length":
                other = ""
            else:
                other = None if fields.reasoning == "" else fields.reasoning
            if other != fields.reasoning:
                alt, alt_covered = self._logprob_layout(
                    Fields(other, fields.content, fields.tool_calls, fields.finish_reason, fields.close_think), lp
                )
                if len(alt) + offset == reported:
                    layout, covered = alt, alt_covered
        return tuple(layout), fl.IDS_LOGPROBS, covered

    def ids_carry_text(self, ids: Sequence[int], c: Completion) -> bool:
        """Whether `c`'s returned text can have come from these ids: every character of its fields but whitespace
        (reasoning, content, then each tool call's name and arguments, arguments compared in one JSON form where
        they parse) appears in the same order in the ids' own fields. A server deletes text (template whitespace,
        a repeated `</think>`, a lossy U+FFFD it printed for a split character) but never makes it up, so ids that
        lack returned text lost tokens on the way: vLLM #27482 drops the token ids of streamed tool calls."""
        view = self.decoded_view(ids)
        calls = c.tool_calls
        same_calls = len(calls) == len(view.tool_calls) and all(
            a.name == b.name and a.arguments == b.arguments for a, b in zip(calls, view.tool_calls)
        )
        if same_calls and c.content == view.content and _same_text(c.reasoning, view.reasoning):
            return True  # the ideal fields themselves
        theirs = _squeezed(c.reasoning, c.content, calls, view.tool_calls).replace("\ufffd", "")
        mine = _squeezed(view.reasoning, view.content, view.tool_calls, calls)
        if theirs in mine:  # the common case, in C
            return True
        at = 0
        for ch in theirs:
            at = mine.find(ch, at) + 1
            if at == 0:
                return False
        return True

    def _holds_reasoning(self, ids: Sequence[int], returned: Fields) -> bool:
        """Content logprob ids that spell the returned reasoning, where no content was returned, hold the whole
        output: vLLM's, whose qwen3 parser returns an answer with no think block (so no `</think>`) as reasoning
        and its logprobs under content."""
        reasoning = returned.reasoning
        if not reasoning or reasoning.isspace() or returned.content.strip():
            return False
        return self.tokenizer.decode(ids).startswith(reasoning)

    def _logprob_layout(self, fields: Fields, lp: dict) -> tuple[list[int], bool]:
        """The ids of `fields`' layout with each run taken from its logprobs where there are some, and whether
        every run of the model's own text had them (template text is known text)."""
        out: list[int] = []
        covered = True
        for kind, text in _runs(self._pieces(fields)):
            if kind == "marker":
                out.append(self._marker_ids[text])
            elif lp.get(kind) is not None:
                ids = lp[kind]
                out.extend(ids)
                if kind == "content" and self._spans_tools(ids):
                    # these logprobs cover the tool section too: the rest is theirs, then the end token
                    if not (ids and ids[-1] in self._stop_ids) and fields.finish_reason != "length":
                        out.append(self._marker_ids[self.profile.end_token(bool(fields.tool_calls))])
                    break
            else:
                if kind != "template" and text:
                    covered = False
                out.extend(self.tokenizer.encode(text))
        return out, covered

    def _spans_tools(self, ids: Sequence[int]) -> bool:
        """True when these content logprob tokens spell a tool-call marker (they cover the tool section too)."""
        tail = self.tokenizer.decode_bytes(ids)
        return any(m in tail for m in self._tool_marker_bytes)

    def measured_category(self, completion: Completion, true_ids: Sequence[int]) -> str:
        """The verdict category of the text-only reconstruction (fidelity profile applied, no reference help) against
        true
        ids: what a probe records (`text_path:` flag). Only the category: a diff's spans and sentence go unused."""
        return compare_category(
            self._encoded(self.production_fields(completion)[0])[1], list(true_ids), self.tokenizer, self.profile
        )

    def production_fields(self, completion: Completion) -> tuple[Fields, tuple[str, ...], tuple[str, ...]]:
        """The fields production encodes (learned inverses applied), the inverses used and the flags raised."""
        a = self._production(completion)
        return a.fields, a.used, a.flags

    def _production(self, completion: Completion) -> Applied:
        """`production_fields` with the strip edges the profile leaves to the token count (Applied.strips)."""
        last = self._last_production
        if last is not None and last[0] is completion:
            return last[1]
        fields = Fields.of(completion)
        if self.fidelity is not None:
            out = apply_fidelity(self.fidelity, fields, self.profile)
            suspects = self.suspect_flags(out.fields)
            if suspects:
                out = Applied(
                    out.fields,
                    out.used,
                    tuple(dict.fromkeys(out.flags + suspects)) if out.flags else suspects,
                    out.strips,
                )
        else:
            out = Applied(fields, (), self.suspect_flags(fields), ())
        self._last_production = (completion, out)
        return out

    def count_flags(
        self, fields: Fields, ids: Sequence[int], completion: Completion, strips: Sequence[str] = ()
    ) -> tuple[str, ...]:
        """The proof a text reconstruction gets without a reference, from `usage.completion_tokens` (the number of
        tokens the model generated, by the endpoint's count relation learned from probes or known of its server):
        `token_count` when the reconstructed ids are not that many (a non-canonical split, or text changed on the way),
        and `uninvertible:<step>` for each strip edge where adding whitespace would keep the count (or the count
        is unknown): the server may have removed whitespace there and the count cannot tell."""
        out: list[str] = []
        reported = completion.usage.completion_tokens
        offset = self._count_offset
        agrees = offset is not None and reported > 0 and len(ids) + offset == reported
        if offset is not None and reported > 0 and not agrees:
            out.append(fl.TOKEN_COUNT)
        if strips:
            names = _strip_names(self.fidelity, strips)
            if not agrees:
                out.extend(fl.UNINVERTIBLE + n for n in names.values())
            else:
                base = self._pieces(fields)
                runs = [t for _, t in _runs(base)]
                counts: dict[int, int] = {}
                windows: dict[tuple[int, int], tuple[int, int, int]] = {}
                for key, name in names.items():
                    if fl.UNINVERTIBLE + name not in out and self._strip_ambiguous(fields, key, runs, counts, windows):
                        out.append(fl.UNINVERTIBLE + name)
        return tuple(dict.fromkeys(out)) if out else ()

    def _strip_ambiguous(
        self,
        fields: Fields,
        key: str,
        runs: list[str],
        counts: dict[int, int],
        windows: dict[tuple[int, int], tuple[int, int, int]],
    ) -> bool:
        """True when some whitespace of STRIP_CANDIDATES added at edge `key` leaves the token count unchanged."""
        for w in STRIP_CANDIDATES:
            variant = _with_edge(fields, key, w)
            if variant is None:
                return False  # no such edge in this sample
            new = [t for _, t in _runs(self._pieces(variant))]
            if len(new) != len(runs):
                delta = len(self.encode_fields(variant)) - sum(
                    self._run_count(runs, i, counts) for i in range(len(runs))
                )
            else:
                k = next((i for i, (a, b) in enumerate(zip(runs, new)) if a != b), None)
                if k is None:
                    continue
                delta = self._insert_delta(runs[k], new[k], runs, k, counts, windows)
            if delta == 0:
                return True
        return False

    def _run_count(self, runs: list[str], i: int, counts: dict[int, int]) -> int:
        n = counts.get(i)
        if n is None:
            text = runs[i]
            n = counts[i] = 1 if text in self._marker_set else len(self.tokenizer.encode(text))
        return n

    def _insert_delta(
        self,
        old: str,
        new: str,
        runs: list[str],
        k: int,
        counts: dict[int, int],
        windows: dict[tuple[int, int], tuple[int, int, int]],
    ) -> int:
        """Tokens `new` (`old` with whitespace inserted) has more than `old`. A long run is counted in a window of
        lines around the insertion, once (per run and place) the window's edges are shown to be token
        boundaries of `old`: its parts' counts add up to the run's."""
        enc = self.tokenizer.encode
        if len(old) <= 2 * _WINDOW:
            return len(enc(new)) - self._run_count(runs, k, counts)
        p = common_prefix(old, new)
        width = len(new) - len(old)
        key = (k, p)
        window = windows.get(key)
        if window is None:
            a = _line_start(old, p - _WINDOW, backwards=True)
            b = _line_start(old, p + _WINDOW, backwards=False)
            inner = len(enc(old[a:b]))
            ok = len(enc(old[:a])) + inner + len(enc(old[b:])) == self._run_count(runs, k, counts)
            window = windows[key] = (a, b, inner) if ok else (-1, -1, 0)
        a, b, inner = window
        if a < 0:  # not boundaries here: count the whole run
            return len(enc(new)) - self._run_count(runs, k, counts)
        return len(enc(new[a : b + width])) - inner

    def suspect_flags(self, f: Fields) -> tuple[str, ...]:
        """Cheap signs, without ground truth, that these fields may not carry the model's ids (app.tokens.flags)."""
        return self._suspects(f.reasoning, f.content, f.tool_calls, f.finish_reason)

    def _suspects(
        self, reasoning: str | None, content: str, calls: Sequence[ToolCall], finish_reason: str | None
    ) -> tuple[str, ...]:
        # suspect_flags on the field values (the per-sample pass has no Fields)
        p = self.profile
        # one string, one scan per sign ("\x00" cannot join two halves of a marker or a character)
        parts = [reasoning or "", content]
        if calls:
            parts += [t.arguments for t in calls]
            if p.tool_id_in_stream:
                parts += [t.id for t in calls]
        blob = "\x00".join(parts)
        out: list[str] = []
        if "\ufffd" in blob:
            out.append(fl.REPLACEMENT_CHAR)
        # raw layout (no reasoning field, think tags inside content) is read as markers, not as spelled text
        if (self._spells_marker if reasoning is not None else self._spells_marker_no_think)(blob):
            out.append(fl.MARKER_AS_TEXT)
        if self.tokenizer.changes_text(blob):
            out.append(fl.NORMALISER)
        if (
            not p.output_opens_with_think
            and reasoning is None
            and p.think_close not in content
            and (content or calls or finish_reason != "length")
        ):
            # The prompt opens the think block, so the answer either closed it with empty thinking (a stream never
            # sends an empty field; some servers drop it) or ended inside it: text cannot tell which. A fidelity
            # profile that learned `empty_reasoning_dropped` has already filled reasoning="" here.
            out.append(fl.REASONING_MISSING)
        if reasoning is not None and (
            (
                p.reasoning_prefix
                and p.reasoning_suffix
                and len(reasoning) >= len(p.reasoning_prefix + p.reasoning_suffix)
                and reasoning.startswith(p.reasoning_prefix)
                and reasoning.endswith(p.reasoning_suffix)
            )
            or (p.content_prefix and content.startswith(p.content_prefix))
        ):
            # the fields already carry the whitespace the template puts around the think tags (a server that
            # returns the raw regions, e.g. a stream): rendering adds it again unless a fidelity profile learned
            # `template_whitespace_kept` (which strips it before this check)
            out.append(fl.TEMPLATE_WHITESPACE_DOUBLED)
        # raw layout inside content (no reasoning field): the template's whitespace after the tags must be there
        if reasoning is None and p.think_close in content:
            head, _, tail = content.partition(p.think_close)
            opened = head.startswith(p.think_open)
            if (opened and p.reasoning_prefix and not head[len(p.think_open) :].startswith(p.reasoning_prefix)) or (
                p.content_prefix and tail and not tail.startswith(p.content_prefix)
            ):
                out.append(fl.TEMPLATE_WHITESPACE_MISSING)
        return tuple(out)

    def encode_fields(self, fields: Fields) -> list[int]:
        """Canonical ids of `fields`: the output string with markers as text, encoded once."""
        text = "".join([t for _, t in self._pieces(fields)])
        return self.tokenizer.encode(text)

    def _encode_cached(self, fields: Fields, cache: dict[str, list[int]]) -> list[int]:
        # Same ids as encode_fields (every tokenizer here splits at marker tokens before BPE, so text between
        # markers is encoded on its own), but a run seen before is not encoded again: repair variants change
        # one or two runs of a long output.
        split = self._between_markers(self._pieces(fields))
        if split is None:  # a marker this tokenizer lacks is text: encode the whole
            return self.encode_fields(fields)
        segments, between = split
        out: list[int] = []
        for k, text in enumerate(segments):
            if text:
                ids = cache.get(text)
                if ids is None:
                    ids = cache[text] = self.tokenizer.encode(text)
                out.extend(ids)
            if k < len(between):
                out.append(between[k])
        return out

    def roundtrip(self, ids: Sequence[int], completion: Completion) -> bool:
        """True when these ids, returned by an ideal provider, give back the completion's fields."""
        return self._roundtrip_fields(ids, Fields.of(completion))

    def _roundtrip_fields(self, ids: Sequence[int], f: Fields, text: str | None = None, split: bool = False) -> bool:
        # With learned repairs the ids must give back the repaired fields (what the model is taken to have said).
        # `split`: the ids were encoded a run at a time between the rendered markers (no run spells a special, see
        # _encoded) and `text` is what they decode to. Then a parse of `text` finds the markers where the
        # rendering put them, and what it does depends only on which fields are empty: the sample is judged by a
        # stand-in of the same shape, parsed once per shape (_shape_roundtrips), where its tool calls read back
        # as they were rendered (template.tool_calls_read_back; a format that cannot say is parsed).
        if split and text is not None and (not f.tool_calls or tool_calls_read_back(self.profile, f.tool_calls)):
            key = (
                f.reasoning is None,
                not f.reasoning,
                not f.content,
                f.finish_reason == "length",
                f.close_think,
                not f.tool_calls,
            )
            ok = self._shape_ok.get(key)
            if ok is None:
                ok = self._shape_ok[key] = self._shape_roundtrips(f)
            if ok:
                return True
        view = self._decoded_view(ids, text)
        return (
            _same_text(view.reasoning, f.reasoning)
            and view.content == f.content
            and [(c.name, c.arguments) for c in view.tool_calls] == [(c.name, c.arguments) for c in f.tool_calls]
        )

    def _shape_roundtrips(self, f: Fields) -> bool:
        """The round-trip of a stand-in for `f`: each non-empty text field replaced by a letter no marker or
        template text holds, tool calls by one call, encoded and parsed the full way. True means every sample of
        this shape round-trips when its runs hold no special and its tool calls read back (see _roundtrip_fields);
        False decides nothing (the sample is parsed itself)."""
        calls = (ToolCall("", "T", "A", 0),) if f.tool_calls else ()
        stand_in = Fields(
            None if f.reasoning is None else ("R" if f.reasoning else ""),
            "C" if f.content else "",
            calls,
            f.finish_reason,
            f.close_think,
        )
        text, ids, known, split = self._encoded(stand_in)
        return split and known and self._roundtrip_fields(ids, stand_in, text)

    def _text_differs(self, ids: Sequence[int], f: Fields) -> tuple[str, ...]:
        """The returned fields (reasoning, content, tool_calls) whose text is not what these ids decode to."""
        view = self.decoded_view(ids)
        out = []
        if not _same_text(view.reasoning, f.reasoning):
            out.append("reasoning")
        if view.content != f.content:
            out.append("content")
        if [(c.name, c.arguments) for c in view.tool_calls] != [(c.name, c.arguments) for c in f.tool_calls]:
            out.append("tool_calls")
        return tuple(out)

    def decoded_view(self, ids: Sequence[int]) -> ProviderView:
        """What an ideal provider returns for these output ids (`split_output`); the split of true ids (a tuple)
        is kept for the next call with the same ids (a probe's reconstruct, then its learning)."""
        last = self._last_view
        if last is not None and last[0] is ids:
            return last[1]
        view = self._decoded_view(ids)
        if type(ids) is tuple:
            self._last_view = (ids, view)
        return view

    def _decoded_view(self, ids: Sequence[int], text: str | None = None) -> ProviderView:
        # split_output's steps with this reconstructor's stop ids (computed once, not per call). `text`: what
        # the ids are known to decode to (Tokenizer.encode_known said so for the text they were encoded from),
        # so it is not decoded again.
        has_end = bool(ids) and ids[-1] in self._stop_ids
        if text is not None:
            end = self._stop_text[ids[-1]] if has_end else ""
            decoded = text[: len(text) - len(end)] if text.endswith(end) else self.tokenizer.decode(ids[:-1])
        else:
            decoded = self.tokenizer.decode(ids[:-1] if has_end else ids)
        return parse_output(decoded, self.profile, has_end)

    # --- strategies ---------------------------------------------------------------------------------

    def _server_ids(self, c: Completion) -> Reconstruction:
        ids = list(c.token_ids or ())
        if c.finish_reason in ("stop", "tool_calls") and (not ids or ids[-1] not in self._stop_ids):
            ids.append(self._marker_ids[self.profile.end_token(bool(c.tool_calls))])
        return Reconstruction(output_ids=tuple(ids), strategy="server_ids", ids_source=fl.IDS_SERVER)

    def _lp_ids(self, logprobs: Sequence[TokenLogprob]) -> list[int] | None:
        # Fast path: no token is a marker's text and every token's bytes are an ordinary token (the usual case):
        # one lookup per token in C. Otherwise the loop below decides each token (markers first, then bytes, then
        # an added token spelled by its text), as before.
        if self._marker_set.isdisjoint([lp.token for lp in logprobs]):
            ids = self.tokenizer.ids_of_bytes(
                [bytes(lp.bytes) if lp.bytes is not None else _token_str_bytes(lp.token) for lp in logprobs]
            )
            if None not in ids:
                return cast(list[int], ids)
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

    def _one_pass(self, c: Completion) -> tuple[Reconstruction, Verdict] | None:
        """`_canonical(c, None, False)` in one pass over the field values, for the common sample (a reconstruction from
        text without a reference): the learned inverses, the suspect flags, the text between the rendered markers
        laid out by the sample's shape and encoded a run at a time, the count check and the round-trip by shape,
        with no Fields, Applied or piece list built. None where a step needs the full path: a strip edge for the
        count to decide, a run that spells a special or ids not known to decode to their text, a shape whose
        stand-in does not round-trip, tool calls that do not read back (tests/tokens/test_fast_paths.py holds
        the two paths equal)."""
        reasoning, content, calls = c.reasoning, c.content or "", c.tool_calls
        truncated = c.finish_reason == "length"
        plan = self._plan
        if plan is not None:
            reasoning, content, calls, used, flags, strips = invert(
                plan,
                reasoning,
                content,
                calls,
                truncated,
                self.profile.tool_id_in_stream,
                self.profile.reasoning_prefix,
            )
            if strips:
                return None
        else:
            used = flags = ()
        suspects = self._suspects(reasoning, content, calls, c.finish_reason)
        if suspects:
            flags = tuple(dict.fromkeys(flags + suspects)) if flags else suspects
        laid = self._layout(reasoning, content, calls, truncated)
        if laid is None:
            return None
        found = self.tokenizer.encode_between(laid[0], laid[1])  # known to decode to the text (_one_pass_ok)
        if found is None:
            return None
        n = len(found[0])
        offset = self._count_offset
        if offset is not None:
            reported = c.usage.completion_tokens
            if reported > 0 and n + offset != reported:
                flags = tuple(dict.fromkeys(flags + (fl.TOKEN_COUNT,)))
        # the round-trip by shape (_roundtrip_fields): only a "yes" is taken here
        key = (reasoning is None, not reasoning, not content, truncated, None, not calls)
        ok = self._shape_ok.get(key)
        if ok is None:
            ok = self._shape_ok[key] = self._shape_roundtrips(Fields(reasoning, content, tuple(calls), c.finish_reason))
        if not ok:
            return None
        repair = "+".join(used) or None
        return (
            _reconstruction(tuple(found[0]), "canonical", repair, True, (), fl.IDS_TEXT, flags),
            _unchecked_verdict(n, _unchecked_sentence(True, repair, flags)),
        )

    def _layout(
        self, reasoning: str | None, content: str, calls: Sequence[ToolCall], truncated: bool
    ) -> tuple[list[str], list[int]] | None:
        """`_between_markers(self._pieces(...))` of these field values (the text between the rendered markers, the
        markers' ids), from a layout worked out once per shape (`_layout_of`); None where the shape has none (tool
        calls of a format other than Kimi's, tool calls whose names do not read back from their ids, a marker the
        tokenizer lacks)."""
        key = (reasoning is None, not reasoning, not content, truncated, len(calls))
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = self._layout_of(*key)
        if not layout:
            return None
        slots, literals, between = layout
        values = [reasoning, content, *literals]
        if calls:
            stream_ids, read_back = kimi_stream_ids(self.profile, calls)
            if not read_back:
                return None
            for tid, call in zip(stream_ids, calls):
                values += (tid, call.arguments)
        return [values[k] if k.__class__ is int else "".join([values[i] for i in k]) for k in slots], between

    def _layout_of(
        self, no_reasoning: bool, no_thinking: bool, no_content: bool, truncated: bool, n_calls: int
    ) -> tuple:
        """Where a shape's field values go: a stand-in of the shape rendered (render_output puts each field's text
        in one piece of its role, a Kimi tool call's stream id and arguments in one piece each), as (per text
        between markers: the index of its one value, or a tuple of indexes to join, in [reasoning, content,
        *literals, id, arguments of each call]; the literals (template text, ""); the markers' ids). Empty
        where this does not hold."""
        if n_calls and self.profile.tool_format != "kimi":
            return ()
        stand_in = self._pieces(
            Fields(
                None if no_reasoning else "" if no_thinking else "R",
                "" if no_content else "C",
                tuple(ToolCall("", "T", "A", i) for i in range(n_calls)),
                "length" if truncated else "stop",
            )
        )
        literals: list[str] = [""]
        runs: list[list] = [[]]
        between: list[int] = []
        calls_seen = {"tool_id": 0, "tool_args": 0}
        for kind, text in stand_in:
            if kind == "marker":
                i = self._marker_ids.get(text)
                if i is None:
                    return ()
                between.append(i)
                runs.append([])
            elif kind in ("reasoning", "content"):
                runs[-1].append(0 if kind == "reasoning" else 1)
            elif kind in calls_seen:
                runs[-1].append(("call", 2 * calls_seen[kind] + (kind == "tool_args")))
                calls_seen[kind] += 1
            elif kind == "template":
                runs[-1].append(("literal", text))
            else:
                return ()
        for run in runs:
            for part in run:
                if isinstance(part, tuple) and part[0] == "literal" and part[1] not in literals:
                    literals.append(part[1])
        base = 2 + len(literals)  # reasoning, content, the literals, then each call's id and arguments

        def index(part) -> int:
            if isinstance(part, int):
                return part
            return base + part[1] if part[0] == "call" else 2 + literals.index(part[1])

        slots = [2 if not run else index(run[0]) if len(run) == 1 else tuple(map(index, run)) for run in runs]
        return slots, literals, between

    def _canonical(self, c: Completion, ref: list[int] | None, assisted: bool) -> tuple[Reconstruction, Verdict]:
        applied = self._production(c)
        fields, used, flags = applied.fields, applied.used, applied.flags
        text, ids, known, split = self._encoded(fields)  # the same ids as encode_fields
        if self._count_offset is not None or applied.strips:
            proof = self.count_flags(fields, ids, c, applied.strips)
            if proof:
                flags = tuple(dict.fromkeys(flags + proof))
        repair = "+".join(used) or None
        # Reconstructions built directly (no dataclasses.replace) on the per-sample paths
        if ref is None:
            return self._finish_unchecked(tuple(ids), repair, flags, c, fields, text if known else None, split)
        # an exact reconstruction never decodes; otherwise each side is decoded once for everything below
        ref_bytes = rec_bytes = None
        if ids != ref:
            ref_bytes = self.tokenizer.decode_bytes(ref)
            rec_bytes = text.encode("utf-8") if known else self.tokenizer.decode_bytes(ids)
        verdict = compare(ids, ref, self.tokenizer, self.profile, ref_bytes=ref_bytes, rec_bytes=rec_bytes)
        if verdict.category in AGREEING_VERDICTS:
            return (
                Reconstruction(tuple(ids), "canonical", repair, True, (), fl.IDS_TEXT, flags),
                _with_repair(verdict, repair) if repair else verdict,
            )
        plain = Reconstruction(tuple(ids), "canonical", repair, None, (), fl.IDS_TEXT, flags)
        if not assisted:
            return replace(plain, roundtrip=False, notes=self._notes(Fields.of(c), ref, verdict, ref_bytes)), verdict
        assert rec_bytes is not None and ref_bytes is not None  # ids != ref: an exact reconstruction agreed above
        found = self._assisted_search(fields, ids, rec_bytes, ref, ref_bytes, list(used))
        if found is not None:
            key, label, v2 = found
            return replace(plain, output_ids=key, repair=label, roundtrip=True), _with_repair(v2, label)
        return replace(plain, roundtrip=False, notes=self._notes(Fields.of(c), ref, verdict, ref_bytes)), verdict

    def _assisted_search(
        self, fields: Fields, ids: list[int], ids_bytes: bytes, ref: list[int], ref_bytes: bytes, used: list[str]
    ) -> tuple[tuple[int, ...], str, Verdict] | None:
        """The reference-informed repair search: (ids, repair label, verdict) of the first benign variant."""
        ref_truncated = not ref or ref[-1] not in self._stop_ids
        # the reference as text, once: surrogateescape keeps stray bytes (a cut inside a character) distinct
        ref_text = ref_bytes.decode("utf-8", "surrogateescape")
        end = b"" if ref_truncated else self.tokenizer.token_bytes(ref[-1])
        ref_view = parse_output(
            ref_bytes[: len(ref_bytes) - len(end)].decode("utf-8", "replace"), self.profile, not ref_truncated
        )
        # Variants are judged by their text and encoded only when it agrees with the reference, which is
        # exact when encoding keeps bytes (byte-level BPE, tiktoken; normaliser bypassed): a sample no repair
        # fixes then costs string joins, not encodes. Otherwise every variant is encoded, as before.
        texts = self._texts(fields)
        by_text = self.search_by_text and ids_bytes == "".join(texts).encode("utf-8", "surrogatepass")
        # A variant is its tuple of piece texts: unchanged pieces are the same str objects in every
        # variant, so hashing (cached per str) and comparing them (identity first) costs nothing, and
        # agreement with the reference walks the pieces (startswith/endswith, no joined copy).
        seen = {tuple(texts)}
        seen_bytes: set[bytes] = set()
        cache: dict[str, list[int]] = {}
        near = max(0, len(ref_text) - 3)  # a truncated reference may end inside a character
        # Greedy: servers apply several steps at once (vLLM: think_spaces + no_content + tool_whitespace),
        # so after a round without a match, keep the variant that agrees with the most reference text at
        # both ends and invert the next step on top of it (at most MAX_CHAIN steps).
        current = fields
        best = _piece_agreement(texts, ref_text)[0] if by_text else _agreement(ids_bytes, ref_bytes)
        for _ in range(MAX_CHAIN):
            step: tuple[str, Fields, int] | None = None
            for name, variant in self._repair_candidates(current, ref_view):
                if name in used:
                    continue
                key = tuple(self._texts(variant))
                if key in seen:
                    continue
                seen.add(key)
                if by_text:
                    score, equal = _piece_agreement(key, ref_text)
                    close = equal or (ref_truncated and score >= near)
                    ids2 = self._encode_cached(variant, cache) if close else None
                else:
                    ids2 = self._encode_cached(variant, cache)
                    got = self.tokenizer.decode_bytes(ids2)
                    if got in seen_bytes:
                        continue
                    seen_bytes.add(got)
                    score = _agreement(got, ref_bytes)
                    close = ref_truncated or got == ref_bytes
                if close and ids2 is not None:
                    v2 = compare(ids2, ref, self.tokenizer, self.profile, ref_bytes=ref_bytes)
                    if v2.category in AGREEING_VERDICTS:
                        label = "+".join(sorted(dict.fromkeys([*used, name]), key=_repair_order))
                        return tuple(ids2), label, v2
                if score > best and (step is None or score > step[2]):
                    step = (name, variant, score)
            if step is None:
                return None
            used.append(step[0])
            current, best = step[1], step[2]
        return None

    def _text(self, f: Fields) -> str:
        return "".join([t for _, t in self._pieces(f)])  # a list: join sizes it once

    def _encoded(self, f: Fields) -> tuple[str, list[int], bool, bool]:
        """The output string of `f`, its ids (encode_fields' ids), whether they are known to decode to it
        (Tokenizer.encode_known), and whether they were encoded a run at a time between the rendered markers. That
        is done where the tokenizer can show it gives the same ids (Tokenizer.encode_between: no run spells a
        special), so the text need not be searched for specials again."""
        pieces = self._pieces(f)
        text = "".join([t for _, t in pieces])
        split = self._between_markers(pieces)
        if split is not None:
            found = self.tokenizer.encode_between(*split)
            if found is not None:
                return text, found[0], found[1], True
        ids, known = self.tokenizer.encode_known(text)
        return text, ids, known, False

    def _between_markers(self, pieces: list[Piece]) -> tuple[list[str], list[int]] | None:
        """The text between the markers of a rendering and the markers' ids (one more text than markers, "" where
        two markers meet); None when a marker is not a token of this tokenizer."""
        segments: list[str] = []
        between: list[int] = []
        run: list[str] = []
        marker_ids = self._marker_ids
        for kind, piece in pieces:
            if kind == "marker":
                i = marker_ids.get(piece)
                if i is None:
                    return None
                segments.append("".join(run))
                between.append(i)
                run = []
            else:
                run.append(piece)
        segments.append("".join(run))
        return segments, between

    def _texts(self, f: Fields) -> list[str]:
        return [t for _, t in self._pieces(f)]

    def _finish_unchecked(
        self,
        ids: tuple[int, ...],
        repair: str | None,
        flags: tuple[str, ...],
        c: Completion,
        fields: Fields,
        text: str | None = None,
        split: bool = False,
    ) -> tuple[Reconstruction, Verdict]:
        # A reconstruction from text without a reference: the round-trip is the check (`text`: see _decoded_view;
        # `split`:
        # see _roundtrip_fields). This is the per-sample hot path of a run without references: one Reconstruction
        # and one Verdict built directly, the verdict's sentence looked up (few distinct ones in a run).
        ok = self._roundtrip_fields(ids, fields, text, split)
        notes = () if ok else self._notes(Fields.of(c), None, None)
        explanation = _unchecked_sentence(ok, repair, flags)
        return (
            Reconstruction(ids, "canonical", repair, ok, notes, fl.IDS_TEXT, flags),
            Verdict("unchecked", rec_len=len(ids), explanation=explanation),
        )

    def _finish_true(self, rec: Reconstruction, c: Completion, ref: list[int] | None) -> tuple[Reconstruction, Verdict]:
        # True ids are the model's whatever the server did to the text: a difference between the returned text
        # and their text is a server-side step (what the text path measures), named in the notes, and leaves
        # the round-trip unjudged (None) rather than failed.
        f = Fields.of(c)
        differs = self._text_differs(rec.output_ids, f)
        notes = rec.notes + tuple(f"{k}_text_differs" for k in differs)
        if ref is None:
            if differs:
                sentence = (
                    f"the returned {', '.join(differs)} text differs from the text of these ids (a server-side "
                    "text step, not a round-trip failure)"
                )
            else:
                sentence = "round-trip ok"
            out = Reconstruction(
                rec.output_ids, rec.strategy, None, None if differs else True, notes, rec.ids_source, rec.flags
            )
            return out, Verdict(
                "unchecked",
                rec_len=len(rec.output_ids),
                explanation=f"{UNCHECKED}; {sentence}; ids from {rec.ids_source} (ground truth)",
            )
        verdict = compare(rec.output_ids, ref, self.tokenizer, self.profile)
        ok = verdict.category in AGREEING_VERDICTS
        notes += () if ok else self._notes(f, ref, verdict)
        return Reconstruction(rec.output_ids, rec.strategy, None, ok, notes, rec.ids_source, rec.flags), verdict

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
            r is not None and r.startswith(" "),
            r is not None and r.endswith(" "),
            c.startswith(" "),
            c.endswith(" "),
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
            for kwargs in (
                {"ensure_ascii": True},
                {"separators": (",", ":"), "ensure_ascii": False},
                {"separators": (",", ":"), "ensure_ascii": True},
                {"ensure_ascii": False, "indent": 2},
            ):
                calls = tuple(replace(t, arguments=_redump(t.arguments, kwargs)) for t in f.tool_calls)
                yield "json_reserialised", replace(f, tool_calls=calls)
            # tool_ids_reindexed: the server synthesised functions.NAME:IDX instead of passing the model's id.
            if p.tool_id_in_stream:
                for offset in range(MAX_REINDEX):
                    calls = tuple(
                        replace(t, id=kimi_tool_id(p, replace(t, id=""), i + offset))
                        for i, t in enumerate(f.tool_calls)
                    )
                    yield "tool_ids_reindexed", replace(f, tool_calls=calls)

    def _notes(
        self, f: Fields, ref: list[int] | None, verdict: Verdict | None, ref_bytes: bytes | None = None
    ) -> tuple[str, ...]:
        """What text cannot recover, found in the returned fields or the reference (never guessed)."""
        notes: list[str] = []
        blob = "\x00".join(
            [f.reasoning or "", f.content, *(t.arguments for t in f.tool_calls), *(t.id for t in f.tool_calls)]
        )
        if ref is not None and ref_bytes is None:
            ref_bytes = self.tokenizer.decode_bytes(ref)
        ref_text = ref_bytes.decode("utf-8", "replace") if ref_bytes is not None else ""
        if "\ufffd" in blob or "\ufffd" in ref_text:
            notes.append("replacement_char")
        if any(m in blob for m in self._markers) or (ref is not None and self._marker_spelled(ref, ref_text)):
            notes.append("marker_as_text")
        if self.tokenizer.changes_text(blob) or (ref_text and self.tokenizer.changes_text(ref_text)):
            notes.append("normaliser")
        return tuple(notes)

    def _marker_spelled(self, ref: list[int], ref_text: str) -> bool:
        # A marker string inside a run of ordinary tokens: the model spelled it out; text cannot tell.
        # The decoded text holds every marker token's text plus any spelled one, so more occurrences of a
        # marker than marker tokens means spelled (markers never contain one another).
        counts = Counter(filter(self.tokenizer.special_ids.__contains__, ref))
        return any(ref_text.count(m) > counts.get(self._marker_ids.get(m, -1), 0) for m in self._markers)


def _strip_names(fp: FidelityProfile | None, strips: Sequence[str]) -> dict[str, str]:
    """Strip edge key -> its step name (strip_whitespace, tool_whitespace)."""
    from app.tokens.fidelity_profile import _plan_of

    plan = _plan_of(fp) if fp is not None else None
    return {k: (plan.strips.get(k, "strip_whitespace") if plan else "strip_whitespace") for k in strips}


def _with_edge(f: Fields, key: str, w: str) -> Fields | None:
    """`f` with whitespace `w` added at edge `key` (e.g. "content.trail@tools", "reasoning.lead"); None when the
    sample has no such field."""
    where, _, _ = key.partition("@")
    name, _, side = where.rpartition(".")
    lead = side in ("lead", "blank")
    if name == "reasoning":
        if f.reasoning is None:
            return None
        return replace(f, reasoning=w + f.reasoning if lead else f.reasoning + w)
    if name == "content":
        return replace(f, content=w + f.content if lead else f.content + w)
    if name in ("tool.arguments", "tool.id") and f.tool_calls:
        attr = "arguments" if name == "tool.arguments" else "id"
        calls = tuple(
            replace(t, **{attr: (w + getattr(t, attr)) if lead else (getattr(t, attr) + w)}) for t in f.tool_calls[:1]
        ) + tuple(f.tool_calls[1:])
        return replace(f, tool_calls=calls)
    return None


def _line_start(text: str, at: int, *, backwards: bool) -> int:
    """A position near `at` right after a newline and before a non-space character (a token boundary of the
    byte-level pre-tokenisers used here), searching backwards (or forwards); the text's start (or end) if none."""
    if backwards:
        i = text.rfind("\n", 0, max(0, at))
        while i >= 0 and (i + 1 >= len(text) or text[i + 1].isspace()):
            i = text.rfind("\n", 0, i)
        return 0 if i < 0 else i + 1
    i = text.find("\n", max(0, at))
    while i >= 0 and (i + 1 >= len(text) or text[i + 1].isspace()):
        i = text.find("\n", i + 1)
    return len(text) if i < 0 else i + 1


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


def _agreement(a: Sequence, b: Sequence) -> int:
    """Items (bytes or characters) that a and b share at the start plus at the end (at most the shorter length)."""
    prefix = common_prefix(a, b)
    return prefix + common_suffix(a, b, min(len(a), len(b)) - prefix)


def _piece_agreement(texts: Sequence[str], ref: str) -> tuple[int, bool]:
    """(_agreement of "".join(texts) with ref, whether they are equal), without joining the texts."""
    total = sum(map(len, texts))
    n = len(texts)
    pos = k = 0
    while k < n and ref.startswith(texts[k], pos):
        pos += len(texts[k])
        k += 1
    if k == n:
        if total == len(ref):
            return total, True
        prefix = total
    else:
        piece = texts[k]
        prefix = pos + common_prefix(piece, ref[pos : pos + len(piece)])
    limit = min(total, len(ref)) - prefix  # the shared end never overlaps the shared start
    end, j = len(ref), n - 1
    while j >= 0 and len(ref) - end + len(texts[j]) <= limit and ref.endswith(texts[j], 0, end):
        end -= len(texts[j])
        j -= 1
    suffix = len(ref) - end
    if j >= 0 and suffix < limit:
        piece = texts[j]
        suffix += common_suffix(piece, ref[max(0, end - len(piece)) : end], limit - suffix)
    return prefix + suffix, False


@overload
def _restore_edges(got: str, truth: str | None) -> str: ...
@overload
def _restore_edges(got: None, truth: str | None) -> None: ...
@overload
def _restore_edges(got: str | None, truth: str | None) -> str | None: ...
def _restore_edges(got: str | None, truth: str | None) -> str | None:
    """`got` with the leading/trailing whitespace of `truth`, when the two differ only there."""
    if got is None or truth is None or got == truth or got.strip() != truth.strip() or not got.strip():
        return got
    core = truth.strip()
    start = truth.index(core)
    return truth[:start] + got.strip() + truth[start + len(core) :]


@functools.lru_cache(maxsize=1024)
def _unchecked_sentence(ok: bool, repair: str | None, flags: tuple[str, ...]) -> str:
    """The verdict sentence of a text reconstruction without a reference (see Reconstructor._finish_unchecked)."""
    if ok and not repair and not flags:
        return _UNCHECKED_OK  # the common case of a run without references: nothing to add
    sentence = "round-trip ok" if ok else "round-trip FAILED: decoding the ids does not give back the returned text"
    if repair:
        sentence += f" (after learned repair {repair})"
    suspects = fl.suspect_flags(flags)
    if suspects:
        sentence += f"; suspect: {', '.join(suspects)}"
    return f"{UNCHECKED}; {sentence}"


_reconstruction = positional_builder(Reconstruction)  # Reconstruction(*every field), built per sample
_VERDICTS: dict[tuple[int, str], Verdict] = {}


def _unchecked_verdict(rec_len: int, explanation: str) -> Verdict:
    """Verdict("unchecked", rec_len=rec_len, explanation=explanation), one shared record per pair (a record is
    immutable; most samples of a run share a sentence, and their lengths repeat)."""
    key = (rec_len, explanation)
    v = _VERDICTS.get(key)
    if v is None:
        if len(_VERDICTS) >= 4096:
            _VERDICTS.clear()
        v = _VERDICTS[key] = Verdict("unchecked", rec_len=rec_len, explanation=explanation)
    return v


def _spells_any(words: Sequence[str]) -> Callable[[str], bool]:
    """A test of whether a text holds one of `words`: tried only where a word's first character is
    (tokenizer.holds_at), where one scan of an alternation (or an `in` per word) reads every character."""
    words = [w for w in words if w]
    if not words:
        return lambda text: False
    return functools.partial(
        holds_at, tuple(dict.fromkeys(w[0] for w in words)), re.compile("|".join(map(re.escape, words))).match
    )


def _squeezed(reasoning: str | None, content: str | None, calls: Sequence[ToolCall], others: Sequence[ToolCall]) -> str:
    """The fields' text without whitespace (`ids_carry_text`); tool arguments in one JSON form where they parse,
    unless they are the other side's arguments at that place as they stand."""
    parts = [reasoning or "", content or ""]
    for k, call in enumerate(calls):
        parts.append(call.name)
        same = k < len(others) and others[k].arguments == call.arguments
        parts.append(call.arguments if same else _redump(call.arguments, _ONE_JSON_FORM))
    return "".join("".join(parts).split())


_ONE_JSON_FORM = {"ensure_ascii": False, "separators": (",", ":")}


def _same_text(a: str | None, b: str | None) -> bool:
    return (a or "") == (b or "")


def _token_str_bytes(token: str) -> bytes:
    # vLLM writes undecodable tokens as "bytes:\xe4\xbd"; everything else is the token's UTF-8.
    if token.startswith("bytes:"):
        try:
            return token[6:].encode("latin-1").decode("unicode_escape").encode("latin-1")
        except (UnicodeDecodeError, UnicodeEncodeError):
            pass
    return token.encode("utf-8")


def _repair_order(name: str) -> int:
    return REPAIRS.index(name) if name in REPAIRS else len(REPAIRS) + fl.STEPS.index(name) if name in fl.STEPS else 99


def _with_repair(v: Verdict, name: str) -> Verdict:
    return Verdict(v.category, v.first_diff, v.ref_len, v.rec_len, v.spans, f"{v.explanation} (after repair {name})")
