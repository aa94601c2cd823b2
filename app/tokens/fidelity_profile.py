"""Fidelity profiles: which server-side text steps one endpoint (or upstream provider) applies, learned
from probe samples that carry true ids, and their inverses applied in production without a reference.

Learning compares, per probe, the fields an ideal provider would return for the true ids (`split_output`)
with the fields this endpoint returned, and counts what changed at each edge of each field (whitespace
removed or added), whether the "(no content)" placeholder or empty thinking went missing, how tool
arguments were re-serialised and how tool ids were renumbered. A step is *invertible* when every probe
that could show it showed the same change: its inverse is then a constant. A step seen with different
changes cannot be inverted from text: `apply` flags the affected samples (`uninvertible:<step>`) and
leaves their text as returned, never guessing. A *strip* (an edge where the server removed whitespace some
times, or an unknown amount of it) is the exception: `apply` names the edge (`Applied.strips`) and the
reconstruction decides per sample, from the reconstructed token count against `usage.completion_tokens`, whether
whitespace could have been removed there (app.tokens.reconstruct); only such samples are flagged.

A profile has two sources of observations: `observations`, counted from probes (true ids), and `prior`, the
steps the server is known to apply (app.tokens.server_steps, from its software and version). Per key the
probes win once they saw something there; until then the prior stands. A profile with a prior and no probes is
"prior only"; `stream` says which path (streaming or not) it was learned on, since a server's steps differ.

Pure: no I/O. The store keeps a profile as `FidelityProfile.to_json()`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from json.encoder import c_make_encoder, encode_basestring, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any

from app.records import Completion, ToolCall, positional_builder
from app.tokens.flags import TEMPLATE_WHITESPACE_MISSING, UNINVERTIBLE
from app.tokens.profile import Profile
from app.tokens.template import Fields, ProviderView, split_output

if TYPE_CHECKING:
    from app.tokens.tokenizer import Tokenizer

NO_CONTENT = "(no content)"
STRIPPED = "-*"  # an edge change of unknown size: the server strips whatever whitespace is there (a prior)
KEPT = "="  # the true text had whitespace at this edge and the server returned it unchanged
_NO_CHANGE = ("", "~", KEPT)
_BLANK_KEYS = ("blank", "blank@noreason", "blank@tools", "blank@noreason@tools")
# json.dumps styles a model or server may write arguments in; the key names one in a profile
JSON_STYLES: dict[str, dict] = {
    "default": {"ensure_ascii": False},
    "ascii": {"ensure_ascii": True},
    "compact": {"separators": (",", ":"), "ensure_ascii": False},
    "compact_ascii": {"separators": (",", ":"), "ensure_ascii": True},
    "indent2": {"ensure_ascii": False, "indent": 2},
}
_tool_call = positional_builder(ToolCall)  # ToolCall(*every field), built per re-serialised call
_KIMI_ID = re.compile(r"(?:functions\.)?(.+?):(\d+)", re.S)


@dataclass(frozen=True, slots=True)
class LearnedStep:
    """One server-side text step as a profile knows it: where, what the inverse does, how often seen.

    invertible False: probes disagreed (e.g. a strip removed "\\n" in some, nothing in others), so the
    samples it may touch are flagged instead of repaired.
    """

    name: str
    where: str
    inverse: str
    invertible: bool
    seen: int
    of: int
    prior: bool = False  # known from the server's steps table, not yet seen by a probe


@dataclass(frozen=True)
class FidelityProfile:
    """Observation counts per key (see module doc) learned from `probes` samples of one endpoint/provider.

    observations: key -> {observed change -> probes}. Keys: "edge:<field>.<side>[@context]" with changes
    "" (no whitespace there), "=" (whitespace there, kept), "-X" (server removed X), "-*" (removes whatever is
    there: a prior), "+X" (server added X), "~" (the field's core text differed); "empty_reasoning" {dropped,
    kept, absent}; "no_content" {deleted, kept, absent}; "thinkless" {reasoning, content: where an answer with no
    think block came back}; "json" {<model style>|irregular|same}; "tool_ids"
    {offset:<k>|other|same}; "count" {"+k": usage.completion_tokens minus the true ids' length}; "other"
    {<field>: n}. `prior` has the same shape (app.tokens.server_steps); `source` names the table entry it came
    from, `server` its server kind; `stream` the path (True streaming, False not, None unknown).
    """

    endpoint: str
    provider: str | None
    profile: str
    probes: int
    observations: dict[str, dict[str, int]] = field(default_factory=dict)
    prior: dict[str, dict[str, int]] = field(default_factory=dict)
    source: str | None = None
    stream: bool | None = None
    server: str | None = None  # the server kind the prior comes from (app.tokens.server_steps)

    def to_json(self) -> str:
        """The stored form (a JSON object; `from_json` reads it back)."""
        body: dict = {
            "endpoint": self.endpoint,
            "provider": self.provider,
            "profile": self.profile,
            "probes": self.probes,
            "observations": self.observations,
        }
        if self.prior:
            body["prior"] = self.prior
        if self.source is not None:
            body["source"] = self.source
        if self.stream is not None:
            body["stream"] = self.stream
        if self.server is not None:
            body["server"] = self.server
        return json.dumps(body, ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FidelityProfile:
        """A profile from `to_json` output; ValueError naming the problem when the text is not one."""
        try:
            d = json.loads(text)
            stream = d.get("stream")
            return cls(
                str(d["endpoint"]),
                d.get("provider"),
                str(d["profile"]),
                int(d["probes"]),
                _counts(d["observations"]),
                _counts(d.get("prior") or {}),
                None if d.get("source") is None else str(d["source"]),
                None if stream is None else bool(stream),
                None if d.get("server") is None else str(d["server"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a stored fidelity profile ({exc})") from None

    @property
    def prior_only(self) -> bool:
        """A profile known from the server's steps table alone: no probe has confirmed or corrected it."""
        return self.probes == 0 and bool(self.prior or self.source)

    def merged(self) -> dict[str, dict[str, int]]:
        """The observations the plan uses: per key the probes' once they saw something there (a change, or
        whitespace kept), else the prior's."""
        out = {k: dict(v) for k, v in self.prior.items()}
        for key, counts in self.observations.items():
            if key.startswith("edge:") and key in out and not any(c != "" for c in counts):
                continue  # probes never had whitespace at this edge: they cannot tell, the prior stands
            out[key] = dict(counts)
        return out

    def steps(self) -> tuple[LearnedStep, ...]:
        """The steps this endpoint was seen (or is known) to apply; keys where nothing changed are left out."""
        out: list[LearnedStep] = []
        merged = self.merged()
        for key, counts in sorted(merged.items()):
            total = sum(counts.values())
            prior = key not in self.observations or (
                key.startswith("edge:") and not any(c != "" for c in self.observations.get(key, {}))
            )
            if key.startswith("edge:"):
                where = key[5:]
                changes = {c: n for c, n in counts.items() if c not in _NO_CHANGE}
                if not changes:
                    continue
                name = _edge_step_name(where, changes)
                kind = _edge_kind(counts)
                ok = kind == "constant"
                if kind == "strip":
                    inverse = "unknown whitespace removed: samples whose token count cannot rule it out are flagged"
                elif ok:
                    inverse = _edge_inverse_text(next(iter(changes)))
                else:
                    inverse = (
                        "mixed: "
                        + ", ".join(f"{_edge_inverse_text(c)} ×{n}" for c, n in sorted(changes.items()))
                        + f", none ×{counts.get('', 0) + counts.get(KEPT, 0)}"
                    )
                out.append(LearnedStep(name, where, inverse, ok, sum(changes.values()), total, prior))
            elif key == "empty_reasoning" and counts.get("dropped"):
                ok = not counts.get("absent") and not counts.get("kept")
                out.append(
                    LearnedStep(
                        "empty_reasoning_dropped",
                        "reasoning",
                        "no reasoning field -> empty thinking",
                        ok,
                        counts["dropped"],
                        total,
                        prior,
                    )
                )
            elif key == "thinkless" and counts.get("reasoning"):
                ok = not counts.get("content")
                out.append(
                    LearnedStep(
                        "reasoning_holds_answer",
                        "reasoning",
                        "reasoning without the template's opening whitespace and no content -> the "
                        "answer, with no think block",
                        ok,
                        counts["reasoning"],
                        total,
                        prior,
                    )
                )
            elif key == "no_content" and counts.get("deleted"):
                ok = not counts.get("absent") and not counts.get("kept")
                out.append(
                    LearnedStep(
                        "no_content",
                        "content",
                        f"blank content before tool calls -> {NO_CONTENT!r}",
                        ok,
                        counts["deleted"],
                        total,
                        prior,
                    )
                )
            elif key == "json":
                styles = {s: n for s, n in counts.items() if s != "same"}
                if styles:
                    ok = len(styles) == 1 and "irregular" not in styles and not counts.get("same")
                    style = next(iter(styles))
                    out.append(
                        LearnedStep(
                            "json_reserialised",
                            "tool.arguments",
                            f"re-dump in the model's style {style!r}" if ok else "model style unknown",
                            ok,
                            sum(styles.values()),
                            total,
                            prior,
                        )
                    )
            elif key == "tool_ids":
                offsets = {s: n for s, n in counts.items() if s != "same"}
                if offsets:
                    ok = len(offsets) == 1 and next(iter(offsets)).startswith("offset:") and not counts.get("same")
                    out.append(
                        LearnedStep(
                            "tool_ids_reindexed",
                            "tool.id",
                            f"index {next(iter(offsets))}" if ok else "model ids unknown",
                            ok,
                            sum(offsets.values()),
                            total,
                            prior,
                        )
                    )
        return tuple(out)

    def uninvertible(self) -> tuple[str, ...]:
        """Names of the steps seen that text cannot invert (samples they may touch get flagged)."""
        return tuple(dict.fromkeys(s.name for s in self.steps() if not s.invertible))

    def unexplained(self) -> dict[str, int]:
        """Fields whose core text differed from the true ids' text in ways no known step explains."""
        return dict(self.observations.get("other", {}))

    def count_offset(self) -> int | None:
        """usage.completion_tokens minus the true ids' length, when every observation (probes, else the prior)
        agrees on one; None when unknown or varying (the token-count check is then off)."""
        counts = self.merged().get("count") or {}
        if len(counts) != 1:
            return None
        try:
            return int(next(iter(counts)))
        except ValueError:
            return None


def _counts(value: dict) -> dict[str, dict[str, int]]:
    return {str(k): {str(a): int(b) for a, b in v.items()} for k, v in value.items()}


# ---- learning --------------------------------------------------------------------------------------------


def learn(
    probes: Iterable[tuple[Completion, Sequence[int]]],
    profile: Profile,
    tokenizer: Tokenizer,
    *,
    endpoint: str,
    provider: str | None = None,
    stream: bool | None = None,
    whole: bool = True,
    view: Callable[[Sequence[int]], ProviderView] | None = None,
) -> FidelityProfile:
    """Learn a profile from (returned completion, true output ids) pairs of one endpoint/provider. `whole` False:
    the ids' tool calls were reconstructed from the returned text (logprobs did not cover them), so nothing is learned
    of the tool calls or the token count. `view`: what an ideal provider returns for some ids (`split_output`
    by default; a Reconstructor passes its own, which has just split the same ids)."""
    obs: dict[str, Counter] = {}
    n = 0
    for completion, ids in probes:
        ideal = view(ids) if view is not None else split_output(list(ids), profile, tokenizer)
        _observe(
            obs,
            ideal.reasoning,
            ideal.content,
            ideal.tool_calls if whole else (),
            ideal.finish_reason,
            completion if whole else replace(completion, tool_calls=()),
            profile,
        )
        if whole and completion.usage.completion_tokens > 0:
            obs.setdefault("count", Counter())[f"{completion.usage.completion_tokens - len(ids):+d}"] += 1
        n += 1
    return FidelityProfile(
        endpoint, provider, profile.name, n, {k: dict(v) for k, v in sorted(obs.items())}, stream=stream
    )


def merge(a: FidelityProfile, b: FidelityProfile) -> FidelityProfile:
    """Both profiles' observations together (same endpoint/provider; a's names, prior and path are kept)."""
    obs = {k: dict(v) for k, v in a.observations.items()}
    for k, v in b.observations.items():
        slot = obs.setdefault(k, {})
        for c, m in v.items():
            slot[c] = slot.get(c, 0) + m
    return replace(
        a, probes=a.probes + b.probes, observations=obs, stream=a.stream if a.stream is not None else b.stream
    )


def with_prior(fp: FidelityProfile, prior: FidelityProfile | None) -> FidelityProfile:
    """`fp` (learned) resting on `prior` (the server table's profile of its endpoint): the prior's observations,
    label and server, its own probes. `fp` as it is when there is no prior or it has its own."""
    if prior is None or fp.prior:
        return fp
    return replace(
        fp,
        prior={k: dict(v) for k, v in prior.prior.items()},
        source=prior.source,
        server=prior.server,
        stream=fp.stream if fp.stream is not None else prior.stream,
    )


def plan_key(fp: FidelityProfile | None) -> tuple:
    """What `apply` would do with this profile, as a comparable value: two profiles with the same key reconstruct
    every sample alike (a learned profile is sent to the reconstruction workers only when its key changes)."""
    if fp is None:
        return ()
    plan = _plan_of(fp)
    return (
        tuple(sorted(plan.edges.items())),
        tuple(sorted(plan.strips.items())),
        plan.empty_reasoning,
        plan.no_content,
        tuple(sorted((plan.json or {}).items())) if plan.json is not None else None,
        plan.tool_ids,
        plan.count,
        plan.thinkless,
    )


def _observe(
    obs: dict[str, Counter],
    ir: str | None,
    ic: str,
    icalls: Sequence[ToolCall],
    finish: str,
    c: Completion,
    profile: Profile,
) -> None:
    def bump(key: str, change: str) -> None:
        counts = obs.get(key)
        if counts is None:  # (setdefault would build a Counter on every call)
            counts = obs[key] = Counter()
        counts[change] += 1

    truncated = finish == "length"
    gr: str | None = c.reasoning
    gc = c.content or ""
    if ir is None and ic.strip():
        # an answer with no think block: vLLM's qwen3 parser starts inside reasoning and returns it whole there
        if gr is not None and gr.strip() and not gc.strip() and _same_core(gr, ic):
            bump("thinkless", "reasoning")
            gc, gr = gr, None  # its edges are the content's, as returned
        elif gr is None:
            bump("thinkless", "content")
    # reasoning: empty thinking may come back as no field at all
    if gr is None:
        bump("empty_reasoning", "dropped" if ir == "" else "absent" if ir is None else "other")
    elif ir is not None and not ir.strip() and not gr.strip():
        if ir == "":
            bump("empty_reasoning", "kept")
        bump("edge:reasoning.blank", _change_lead(ir, gr))  # e.g. ' ' added around the tags of empty thinking
    elif ir is not None:
        last = truncated and not ic and not icalls
        _edges(bump, "reasoning", ir, gr, trail_ctx="@cut" if last else "")
    # content: the Kimi "(no content)" placeholder before tool calls may be deleted
    if icalls and NO_CONTENT in ic:
        if NO_CONTENT not in gc:
            bump("no_content", "deleted")
            ic = ic.replace(NO_CONTENT, "")
        else:
            bump("no_content", "kept")
    elif icalls and not gc.strip():
        bump("no_content", "absent")
    if ic.strip() or gc.strip():
        lead = "" if ir is not None else "@noreason"
        trail = "@tools" if icalls else "@cut" if truncated else ""
        _edges(bump, "content", ic, gc, lead_ctx=lead, trail_ctx=trail)
    else:
        bump("edge:content.blank" + _blank_ctx(ir is not None, bool(icalls)), _change_lead(ic, gc))
    # tool calls, pairwise
    for _k, (want, got) in enumerate(zip(icalls, c.tool_calls)):
        args_w, args_g = want.arguments, got.arguments
        if args_w != args_g and args_w.strip() == args_g.strip() and args_w.strip():
            _edges(bump, "tool.arguments", args_w, args_g)
            args_w, args_g = args_w.strip(), args_g.strip()
        elif args_w.strip():
            bump("edge:tool.arguments.lead", "")
            bump("edge:tool.arguments.trail", "")
        if args_w.strip() != args_g.strip():
            stripped = args_w.strip()
            forms = _redumps(stripped)  # the arguments parsed once, written in every style
            style = next((name for name, form in zip(JSON_STYLES, forms) if form == stripped), None)
            wanted = args_g.strip()
            redumped = any(form == wanted for form in (forms if stripped == args_w else _redumps(args_w)))
            if redumped:
                bump("json", style or "irregular")
            else:
                obs.setdefault("other", Counter())["tool.arguments"] += 1
        elif not any(form == args_w.strip() for form in _redumps(args_w.strip())):
            bump("json", "same")  # (arguments every style writes alike say nothing of a re-serialisation)
        if profile.tool_id_in_stream:
            id_w, id_g = want.id, got.id
            if id_w.strip() == id_g.strip() and id_w != id_g:
                _edges(bump, "tool.id", id_w, id_g)
            id_w, id_g = id_w.strip(), id_g.strip()
            if id_w == id_g:
                bump("tool_ids", "same")
            else:
                mw, mg = _KIMI_ID.fullmatch(id_w), _KIMI_ID.fullmatch(id_g)
                if mw and mg and mw.group(1) == mg.group(1):
                    # the server's index is `history + k`; the model's index relative to k is the offset
                    bump("tool_ids", f"offset:{int(mw.group(2)) - int(mg.group(2))}")
                else:
                    bump("tool_ids", "other")


def _edges(bump, name: str, want: str, got: str, lead_ctx: str = "", trail_ctx: str = "") -> None:
    """Count the whitespace change at both edges of one field (or "~" when its core text differs)."""
    if not want.strip() and not got.strip():
        return  # a blank field has no edges to tell apart
    if want.strip() != got.strip():
        bump(f"edge:{name}.lead{lead_ctx}", "~")
        bump(f"edge:{name}.trail{trail_ctx}", "~")
        bump("other", name)
        return
    wl, gl = _lead(want), _lead(got)
    wt, gt = _trail(want), _trail(got)
    bump(f"edge:{name}.lead{lead_ctx}", _change_lead(wl, gl))
    bump(f"edge:{name}.trail{trail_ctx}", _change_trail(wt, gt))


def _same_core(a: str, b: str) -> bool:
    """The two texts are one text but for whitespace at their edges."""
    return a.strip() == b.strip()


def _blank_ctx(has_reasoning: bool, has_calls: bool) -> str:
    return ("" if has_reasoning else "@noreason") + ("@tools" if has_calls else "")


def _lead(s: str) -> str:
    return s[: len(s) - len(s.lstrip())]


def _trail(s: str) -> str:
    return s[len(s.rstrip()) :]


def _change_lead(want: str, got: str) -> str:
    if want == got:
        return KEPT if want else ""
    if want.endswith(got):
        return "-" + want[: len(want) - len(got)]
    if got.endswith(want):
        return "+" + got[: len(got) - len(want)]
    return "~"


def _change_trail(want: str, got: str) -> str:
    if want == got:
        return KEPT if want else ""
    if want.startswith(got):
        return "-" + want[len(got) :]
    if got.startswith(want):
        return "+" + got[len(want) :]
    return "~"


def _redumps(text: str) -> list[str]:
    """`_redump(text, kw)` for each of JSON_STYLES, in order, parsing `text` once."""
    try:
        obj = _loads(text)
    except (ValueError, TypeError):
        return [text] * len(JSON_STYLES)
    out = []
    for kw in JSON_STYLES.values():
        try:
            out.append(_encoder(kw)(obj))
        except (ValueError, TypeError):
            out.append(text)
    return out


def _redump(arguments: str, kwargs: dict) -> str:
    try:
        return _encoder(kwargs)(_loads(arguments))
    except (ValueError, TypeError):
        return arguments


_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(text: str) -> Any:
    """`json.loads(text)`: where `text` is one JSON value with nothing around it (the usual tool-call arguments) the
    scanner is called directly (json.loads' own checks cost twice the scan of short arguments); anything else,
    an error included, goes through json.loads itself."""
    try:
        obj, end = _SCAN(text, 0)
    except (StopIteration, ValueError, TypeError):
        return json.loads(text)
    return obj if end == len(text) else json.loads(text)


_ENCODERS: dict[int, tuple[dict, Callable]] = {}


def _encoder(kwargs: dict) -> Callable:
    """`json.dumps(obj, **kwargs)` as one callable, its JSONEncoder built once per keywords dict (json.dumps builds
    one per call for any keywords but the defaults; applied per tool call of every reconstructed sample). Without an
    indent, an object or array goes straight to the C encoder JSONEncoder.encode would build for it (built once
    here; without the circular-reference check, which parsed JSON never needs)."""
    hit = _ENCODERS.get(id(kwargs))
    if hit is not None and hit[0] is kwargs:
        return hit[1]
    whole = json.JSONEncoder(**kwargs)
    encode: Callable = whole.encode
    if c_make_encoder is not None and whole.indent is None:
        chunks = c_make_encoder(
            None,
            whole.default,
            encode_basestring_ascii if whole.ensure_ascii else encode_basestring,
            None,
            whole.key_separator,
            whole.item_separator,
            whole.sort_keys,
            whole.skipkeys,
            whole.allow_nan,
        )

        def encode(obj: Any, _chunks=chunks, _whole=whole.encode) -> str:
            return "".join(_chunks(obj, 0)) if type(obj) is dict or type(obj) is list else _whole(obj)

    if len(_ENCODERS) > 64:
        _ENCODERS.clear()
    _ENCODERS[id(kwargs)] = (kwargs, encode)
    return encode


def _edge_step_name(where: str, changes: dict[str, int]) -> str:
    if where.startswith("tool."):
        return "tool_whitespace"
    if all(c == "+ " for c in changes):
        return "think_spaces"
    if all(c.startswith("+") for c in changes):
        return "template_whitespace_kept"
    return "strip_whitespace"


def _edge_kind(counts: dict[str, int]) -> str:
    """How an edge's observations can be inverted: "constant" (one change, always: its inverse is a constant),
    "strip" (whitespace removed some times or by an unknown amount, never added: decided per sample from the
    token count), "mixed" (added and removed: flagged), "none" (no change)."""
    changes = [c for c in counts if c not in _NO_CHANGE]
    if not changes:
        return "none"
    steady = not counts.get("", 0) and not counts.get(KEPT, 0)
    if len(changes) == 1 and steady and changes[0] != STRIPPED:
        return "constant"
    if all(c.startswith("-") for c in changes):
        return "strip"
    return "mixed"


def _edge_inverse_text(change: str) -> str:
    if change == STRIPPED:
        return "add back what was stripped (unknown)"
    if change.startswith("-"):
        return f"add back {change[1:]!r}"
    if change.startswith("+"):
        return f"remove {change[1:]!r}"
    return "none"


# ---- applying (production) -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """The fields after a profile's inverses, the step names used, the flags raised, and the strip edges
    (edge keys, e.g. "content.trail") where whitespace may have been removed: the caller decides from the
    token count whether each sample could have lost any there (app.tokens.reconstruct)."""

    fields: Fields
    used: tuple[str, ...]
    flags: tuple[str, ...]
    strips: tuple[str, ...] = ()


def apply(fp: FidelityProfile, f: Fields, profile: Profile) -> Applied:
    """Invert the learned steps on `f` (no reference): constant inverses applied, uninvertible ones flagged,
    strip edges named (`Applied.strips`)."""
    if not fp.observations and not fp.prior:
        return Applied(f, (), ())
    reasoning, content, calls, used, flags, strips = invert(
        _plan_of(fp),
        f.reasoning,
        f.content,
        f.tool_calls,
        f.finish_reason == "length",
        profile.tool_id_in_stream,
        profile.reasoning_prefix,
    )
    if reasoning != f.reasoning or content != f.content or calls is not f.tool_calls:
        f = type(f)(reasoning, content, calls, f.finish_reason, f.close_think)
    return Applied(f, used, flags, strips)


def invert(
    plan: _Plan,
    reasoning: str | None,
    content: str,
    calls: tuple[ToolCall, ...],
    truncated: bool,
    tool_id_in_stream: bool,
    reasoning_prefix: str = "",
) -> tuple[str | None, str, tuple[ToolCall, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """`apply`'s work on a sample's field values, without building records (the reconstruction's per-sample pass
    calls it): (reasoning, content, tool calls, steps used, flags raised, strip edges). The tool calls are
    `calls` itself when no call changed."""
    used: list[str] = []
    flags: list[str] = []
    strips: list[str] = []
    if plan.thinkless is not None and reasoning and not reasoning.isspace() and _blank(content):
        # reasoning and no content: the answer with no think block (returned as reasoning), unless the reasoning
        # opens with the whitespace the template puts after the think tag (then it is a think block)
        if not plan.thinkless or not reasoning_prefix:
            flags.append(UNINVERTIBLE + "reasoning_holds_answer")
        elif not reasoning.startswith(reasoning_prefix):
            content, reasoning = reasoning, None
            used.append("reasoning_holds_answer")
    if reasoning is None and plan.empty_reasoning is not None:
        if plan.empty_reasoning:
            reasoning = ""
            used.append("empty_reasoning_dropped")
        else:
            flags.append(UNINVERTIBLE + "empty_reasoning_dropped")
    # (an edge key absent from the plan leaves the text as it is: skipped without a call)
    known = plan.known
    if reasoning is not None and _blank(reasoning):
        if "reasoning.blank" in known:
            reasoning = _edge(plan, "reasoning.blank", reasoning, True, used, flags, strips)
    elif reasoning:
        if "reasoning.lead" in known:
            reasoning = _edge(plan, "reasoning.lead", reasoning, True, used, flags, strips)
        key = "reasoning.trail@cut" if truncated and not content and not calls else "reasoning.trail"
        if key in known:
            reasoning = _edge(plan, key, reasoning, False, used, flags, strips)
    if not _blank(content):
        key = "content.lead" if reasoning is not None else "content.lead@noreason"
        if key in known:
            content = _edge(plan, key, content, True, used, flags, strips)
        key = "content.trail@tools" if calls else "content.trail@cut" if truncated else "content.trail"
        if key in known:
            content = _edge(plan, key, content, False, used, flags, strips)
    else:
        key = "content.blank" + _blank_ctx(reasoning is not None, bool(calls))
        if key in known:
            content = _edge(plan, key, content, True, used, flags, strips)
    if calls and plan.no_content is not None and _blank(content):
        if plan.no_content:
            content = content + NO_CONTENT
            used.append("no_content")
        else:
            flags.append(UNINVERTIBLE + "no_content")
    if calls and (plan.tool_edges or plan.json is not None or (tool_id_in_stream and plan.tool_ids is not None)):
        out = list(calls)
        changed = False
        for k, call in enumerate(calls):
            args = call.arguments
            if not _blank(args) and plan.tool_edges:
                args = _edge(plan, "tool.arguments.lead", args, True, used, flags, strips)
                args = _edge(plan, "tool.arguments.trail", args, False, used, flags, strips)
            if plan.json is not None:
                if plan.json:
                    redone = _redump(args, plan.json)
                    if redone != args:
                        args = redone
                        used.append("json_reserialised")
                else:
                    flags.append(UNINVERTIBLE + "json_reserialised")
            call_id = call.id
            if tool_id_in_stream:
                if not _blank(call_id) and plan.tool_edges:
                    call_id = _edge(plan, "tool.id.lead", call_id, True, used, flags, strips)
                    call_id = _edge(plan, "tool.id.trail", call_id, False, used, flags, strips)
                if plan.tool_ids is not None:
                    m = _KIMI_ID.fullmatch(call_id.strip()) if plan.tool_ids is not False else None
                    if m:
                        call_id = f"functions.{m.group(1)}:{int(m.group(2)) + plan.tool_ids}"
                        used.append("tool_ids_reindexed")
                    else:
                        flags.append(UNINVERTIBLE + "tool_ids_reindexed")
            if call_id != call.id or args != call.arguments:
                # the constructor, not dataclasses.replace: this runs per sample in production
                out[k] = _tool_call(call_id, call.name, args, call.index, call.type)
                changed = True
        if changed:
            calls = tuple(out)
    return reasoning, content, calls, _distinct(used), _distinct(flags), _distinct(strips)


def _edge(plan: _Plan, key: str, text: str, lead: bool, used: list[str], flags: list[str], strips: list[str]) -> str:
    """`text` with the plan's step at edge `key` inverted (the step's name to `used`), or as it is with a flag raised
    or the edge named a strip (for the token count to decide)."""
    act = plan.actions.get(key)
    if act is None:
        if key in plan.strips and (key.endswith(_BLANK_KEYS) or not (not text or text.isspace())):
            strips.append(key)
        return text
    name, op, ws, blank_too, flag = act
    if not blank_too and (not text or text.isspace()):
        return text
    if op == _FLAG:
        flags.append(flag)
        return text
    if op == _ADD:
        used.append(name)
        return ws + text if lead else text + ws
    if not (text.startswith(ws) if lead else text.endswith(ws)):
        flags.append(flag)  # the server adds this always, so its absence means something else removed it
        return text
    used.append(name)
    return text[len(ws) :] if lead else text[: len(text) - len(ws)]


def _distinct(names: list[str]) -> tuple[str, ...]:
    """`names` without repeats, in order (most lists here hold none or one)."""
    return tuple(dict.fromkeys(names)) if len(names) > 1 else tuple(names)


# what apply does at an edge with a step (_Plan.actions): flag it, add the whitespace back, or remove it
_FLAG, _ADD, _REMOVE = 0, 1, 2


def _edge_action(key: str, name: str, change: str | None) -> tuple[str, int, str, bool, str]:
    """(step name, _FLAG / _ADD / _REMOVE, the whitespace, whether a blank text is acted on too, the flag raised:
    for _FLAG always, for _REMOVE when the whitespace is not there) for one edge of a plan."""
    blank_too = key.endswith(_BLANK_KEYS)
    if change is None:
        return name, _FLAG, "", blank_too, UNINVERTIBLE + name
    missing = TEMPLATE_WHITESPACE_MISSING if name == "template_whitespace_kept" else UNINVERTIBLE + name
    return name, _ADD if change.startswith("-") else _REMOVE, change[1:], blank_too, missing


def _blank(s: str) -> bool:
    return not s or s.isspace()  # no copy, unlike s.strip()


@dataclass(frozen=True, slots=True)
class _Plan:
    """What `apply` does for one profile, worked out once from its observations.

    edges: edge key -> (step name, the one change to invert, or None when probes disagreed); strips: edges where
    whitespace was removed some of the times or by an unknown amount (never added); tool_edges: any tool.* key
    among either. empty_reasoning / no_content: None (never seen), True (invert), False (flag).
    json: None (never re-serialised), the json.dumps keywords of the model's style, or {} (flag).
    tool_ids: None (never re-indexed), the index offset to add, or False (flag).
    """

    edges: dict[str, tuple[str, str | None]]
    tool_edges: bool
    empty_reasoning: bool | None
    no_content: bool | None
    json: dict | None
    tool_ids: int | bool | None
    strips: dict[str, str] = field(default_factory=dict)  # strip edge key -> step name (decided per sample)
    count: int | None = None  # usage.completion_tokens minus the true ids' length, when known and constant
    known: frozenset[str] = frozenset()  # every edge key with a step (edges and strips)
    actions: dict[str, tuple] = field(default_factory=dict)  # edge key -> _edge_action (the edges, worked out)
    thinkless: bool | None = None  # None: never seen; True: a think-less answer comes back as reasoning; False: flag


_PLANS: dict[int, tuple[FidelityProfile, _Plan]] = {}


def _plan_of(fp: FidelityProfile) -> _Plan:
    """The profile's plan (see _Plan), computed once per profile object."""
    hit = _PLANS.get(id(fp))
    if hit is not None and hit[0] is fp:
        return hit[1]
    obs = fp.merged() if fp.prior else fp.observations
    edges: dict[str, tuple[str, str | None]] = {}
    strips: dict[str, str] = {}
    for key, counts in obs.items():
        if not key.startswith("edge:"):
            continue
        kind = _edge_kind(counts)
        if kind == "none":
            continue
        changes = {c: n for c, n in counts.items() if c not in _NO_CHANGE}
        name = _edge_step_name(key[5:], changes)
        if kind == "strip":
            strips[key[5:]] = name
        else:
            edges[key[5:]] = (name, next(iter(changes)) if kind == "constant" else None)
    er, nc, tl = obs.get("empty_reasoning", {}), obs.get("no_content", {}), obs.get("thinkless", {})
    js = {s: n for s, n in obs.get("json", {}).items() if s != "same"}
    json_plan: dict | None = None
    if js:
        style = next(iter(js))
        ok = len(js) == 1 and style in JSON_STYLES and not obs["json"].get("same")
        json_plan = JSON_STYLES[style] if ok else {}
    ids = {s: n for s, n in obs.get("tool_ids", {}).items() if s != "same"}
    ids_plan: int | bool | None = None
    if ids:
        offset = next(iter(ids))
        ok = len(ids) == 1 and offset.startswith("offset:") and not obs["tool_ids"].get("same")
        ids_plan = int(offset[7:]) if ok else False
    plan = _Plan(
        edges,
        any(k.startswith("tool.") for k in (*edges, *strips)),
        (not er.get("absent") and not er.get("kept")) if er.get("dropped") else None,
        (not nc.get("absent") and not nc.get("kept")) if nc.get("deleted") else None,
        json_plan,
        ids_plan,
        strips,
        fp.count_offset(),
        frozenset(edges) | frozenset(strips),
        {key: _edge_action(key, name, change) for key, (name, change) in edges.items()},
        (not tl.get("content")) if tl.get("reasoning") else None,
    )
    if len(_PLANS) > 64:  # profiles are few and long-lived; keep the cache from growing without bound
        _PLANS.clear()
    _PLANS[id(fp)] = (fp, plan)
    return plan


def strip_edges_and_count(fp: FidelityProfile | None) -> tuple[bool, int | None]:
    """(whether the profile has strip edges, its token-count offset): what the reconstruction checks per sample."""
    if fp is None:
        return False, None
    plan = _plan_of(fp)
    return bool(plan.strips), plan.count
