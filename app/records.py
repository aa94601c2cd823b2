"""Plain data records that cross package boundaries.

Everything here is a frozen dataclass built from the standard library only, so that every
package (the pure `app.tokens`, the httpx-based `app.providers`, the store, the faces) can
share them without importing each other's dependencies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

_R = TypeVar("_R")


def positional_builder(cls: type[_R]) -> Callable[..., _R]:
    """A constructor of frozen slots dataclass `cls` taking every field positionally, in order, that builds what
    `cls(*values)` builds at about half the cost (each slot set through its own descriptor, where the generated
    `__init__` looks `object.__setattr__` and the field up by name per field). For records built per sample on
    a hot path (app.tokens.reconstruct); the class keeps its `__init__`, and stays frozen."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    if not names or any(not hasattr(getattr(cls, n, None), "__set__") for n in names):
        raise TypeError(f"{cls.__name__} is not a slots dataclass: positional_builder needs one")
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    scope.update({f"set{k}": getattr(cls, n).__set__ for k, n in enumerate(names)})
    params = ", ".join(f"v{k}" for k in range(len(names)))
    sets = "".join(f"    set{k}(o, v{k})\n" for k in range(len(names)))
    exec(f"def build_{cls.__name__}({params}):\n    o = new(cls)\n{sets}    return o\n", scope)  # noqa: S102 (as dataclasses does)
    return scope[f"build_{cls.__name__}"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One structured tool call as the provider returned it (arguments kept byte-exact)."""

    id: str
    name: str
    arguments: str
    index: int = 0
    type: str = "function"


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One sampled token from a `logprobs.content` (or reasoning) list."""

    token: str
    bytes: tuple[int, ...] | None
    logprob: float


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts and cost of one completion, as reported (or computed from pricing)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None  # None: the API reported no cost (or one that could not be used)
    # why a reported cost could not be used (NaN, infinite, negative, past the cap): app.providers.wire.cost;
    # the engine then charges the list price and tells the operator
    cost_problem: str | None = None


@dataclass(frozen=True, slots=True)
class Intervention:
    """One thing the server did to a sample that the model did not: `kind` is one of
    app.engine.interventions.KINDS (context_compression, provider_fallback, response_healing, thinking_budget, ...),
    `detail` one sentence of what the server said or what eaglewatch measured."""

    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class Completion:
    """Everything one chat-completion call produced, streamed or not.

    `content_logprobs` / `reasoning_logprobs` are None when the provider returned none.
    `token_ids` holds server-returned output ids (vLLM / SGLang `choices[].token_ids`);
    `prompt_token_ids` the server's prompt ids when it returned them (vLLM, SGLang non-streaming).
    `wire_flags`: what the body boundary had to do to the answer (app.providers.wire: text replaced because it
    was not valid Unicode, an answer with no finish_reason kept as truncated).
    `interventions`: what the server reported doing to the request or answer (OpenRouter's `openrouter_metadata`:
    app.providers.interventions); the engine adds what it measures itself (app.engine.interventions).
    """

    content: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    content_logprobs: tuple[TokenLogprob, ...] | None = None
    reasoning_logprobs: tuple[TokenLogprob, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    ttft_s: float | None = None
    total_s: float = 0.0
    provider: str | None = None
    model: str | None = None
    generation_id: str | None = None
    raw: Any = None  # parsed JSON body (non-streaming) or list of chunk dicts (streaming)
    wire_flags: tuple[str, ...] = ()
    interventions: tuple[Intervention, ...] = ()

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass(frozen=True, slots=True)
class Reconstruction:
    """Output ids reconstructed from a Completion, and how.

    strategy: server_ids | logprobs | canonical | none (nothing to reconstruct from).
    repair: the inverse server-side step(s) that made the canonical reconstruction round-trip, if any
    (e.g. "strip_whitespace", "think_spaces", "think_close", "no_content", "tool_whitespace",
    "json_reserialised", "tool_ids_reindexed"); several chained steps are joined with "+".
    roundtrip: decoding output_ids gives back the returned text.
    notes: what text could not recover ("replacement_char", "marker_as_text", "normaliser") and
    on true ids, the fields whose returned text is not the text of those ids ("<field>_text_differs": a
    server-side text step; roundtrip is then None, not judged).
    ids_source: server | logprobs | text (app.tokens.flags.IDS_SOURCES; server and logprobs are ground truth).
    flags: suspect signs and measurements, names from app.tokens.flags (`is_suspect` tells the export).
    """

    output_ids: tuple[int, ...]
    strategy: str
    repair: str | None = None
    roundtrip: bool | None = None
    notes: tuple[str, ...] = ()
    ids_source: str | None = None
    flags: tuple[str, ...] = ()


class Category(StrEnum):
    """The six verdict categories (`Verdict.category`, the `reconstructions.category` column).

    A StrEnum: each member equals its string ("exact" == Category.EXACT), so rows read back from
    SQLite, JSON reports and dict keys need no conversion. Faces call UNCHECKED "no reference"
    (VERDICT_LABELS): the word "unchecked" alone is the verification class below.
    """

    EXACT = "exact"  # the reconstructed ids equal the reference ids
    BPE_EQUIVALENT = "bpe_equivalent"  # same text, a different BPE split
    TEXT_MISMATCH = "text_mismatch"  # the decoded text differs
    STRUCTURE_MISMATCH = "structure_mismatch"  # the special-token layout differs (a reconstruction logic bug)
    TRUNCATED = "truncated"  # the response stopped at max_tokens: agrees with the reference up to there
    UNCHECKED = "unchecked"  # no reference to compare against


VERDICTS: tuple[Category, ...] = tuple(Category)
# The verdict sets, defined here once; every package and face counts with these.
# Benign: the ids are a faithful encoding of the WHOLE response, fit to train on as they are.
# `truncated` is not benign: the sample has no end-of-turn (exports leave it out unless asked) even
# though its ids agree with the reference as far as they go; nor is it corrupt.
BENIGN_VERDICTS: tuple[Category, ...] = (Category.EXACT, Category.BPE_EQUIVALENT)
CORRUPT_VERDICTS: tuple[Category, ...] = (Category.TEXT_MISMATCH, Category.STRUCTURE_MISMATCH)
# The reconstruction agrees with the reference as far as both go (benign, or cut short): what a reconstruction check
# that asks "did I reproduce the reference?" accepts.
AGREEING_VERDICTS: tuple[Category, ...] = (*BENIGN_VERDICTS, Category.TRUNCATED)
# What each verdict is, in the words every face uses (a verdict's class: exact, benign, corrupt, truncated,
# or no reference to judge it).
VERDICT_CLASSES: dict[str, str] = {
    Category.EXACT: "exact",
    Category.BPE_EQUIVALENT: "benign",
    Category.TEXT_MISMATCH: "corrupt",
    Category.STRUCTURE_MISMATCH: "corrupt",
    Category.TRUNCATED: "truncated",
    Category.UNCHECKED: "no reference",
}
VERDICT_LABELS: dict[str, str] = {**{str(v): str(v) for v in VERDICTS}, Category.UNCHECKED: "no reference"}

# Where stored ids came from when they are the model's own, never a reconstruction (Reconstruction.ids_source: the
# server's ids; logprob tokens with bytes). The third source, "text", is a reconstruction from the returned text.
TRUE_ID_SOURCES: tuple[str, ...] = ("server", "logprobs")


class Verification(StrEnum):
    """How a stored answer's ids are known: every answer is in exactly one class, and every face (the TUI,
    `status`, `fidelity`, the export) uses these words with these meanings.

    - VERIFIED ("verified"): true ids, the model's own: the server returned them, or logprob tokens with bytes
      gave them (ids source server | logprobs), whatever the returned text says.
    - CHECKED ("checked against a reference"): ids reconstructed from text that a reference judged; the verdict says
      how it came out (exact, benign, corrupt, truncated).
    - UNCHECKED ("unchecked"): ids reconstructed from text with neither true ids nor a reference to judge them;
      the round-trip and the suspect flags are the only signs.

    An endpoint's own state (verified by probes, prior only, unverified) is app.store.verification's word for
    the endpoint, not for an answer.
    """

    VERIFIED = "verified"
    CHECKED = "checked_against_reference"
    UNCHECKED = "unchecked"


VERIFICATION_WORDS: dict[str, str] = {
    Verification.VERIFIED: "verified",
    Verification.CHECKED: "checked against a reference",
    Verification.UNCHECKED: "unchecked",
}


def verification_of(ids_source: str | None, category: str) -> Verification:
    """The verification class of an answer whose ids came from `ids_source` and whose verdict is `category`."""
    if ids_source in TRUE_ID_SOURCES:
        return Verification.VERIFIED
    if category == Category.UNCHECKED:
        return Verification.UNCHECKED
    return Verification.CHECKED


class ErrorClass(StrEnum):
    """Why a request (or a sample) failed: the one vocabulary of `ProviderError.error_class`, the engine's
    outcomes, the `samples.error_class` / `responses.error_class` columns and the faces' error counts.

    A StrEnum: each member equals the string databases already hold ("429" == ErrorClass.RATE_LIMITED). Every
    member is produced somewhere (tests/providers/test_error_class.py): a ProviderError subclass's default, the
    HTTP classifier (app.providers.parse.classify_status), the transport classifier, or the engine's attempt. An
    HTTP status this vocabulary has no name for (a 400, 413, 422 ... that rejected a sample) is stored as its
    number (`http_error_class`). A conversation turn that was skipped carries app.conversation's ENDED_CLASSES.
    """

    # the ProviderError hierarchy's defaults (app.providers.exceptions)
    PROVIDER = "provider"
    RETRYABLE = "retryable"
    FATAL = "fatal"
    STOPPING = "stopping"
    MALFORMED = "malformed"
    UNREACHABLE = "unreachable"
    # HTTP statuses (app.providers.parse.classify_status)
    REQUEST_TIMEOUT = "408"
    CONFLICT = "409"
    RATE_LIMITED = "429"
    SERVER = "5xx"
    AUTH = "auth"
    CREDITS = "credits"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    FILTERED = "filtered"
    # the transport and the stream (app.providers.client, app.providers.parse)
    TIMEOUT = "timeout"
    NETWORK = "network"
    STREAM = "stream"
    # the engine's own ends of an attempt (app.engine.attempt; ERROR when an outcome named none)
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    INTERNAL = "internal"
    RECONSTRUCT = "reconstruct"
    ERROR = "error"


def http_error_class(status: int) -> str:
    """The error class of a request an HTTP `status` ended: its member when the vocabulary names it (408, 409,
    429), else the status number as text, which is what databases hold for a rejecting 4xx."""
    text = str(status)
    return ErrorClass(text) if text in ErrorClass._value2member_map_ else text


@dataclass(frozen=True, slots=True)
class DiffSpan:
    """One differing region: ref[ref_start:ref_end] vs rec[rec_start:rec_end]."""

    ref_start: int
    ref_end: int
    rec_start: int
    rec_end: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """How reconstructed ids compare with reference ids; `category` is one of `Category` (see VERDICTS)."""

    category: str
    first_diff: int | None = None
    ref_len: int | None = None
    rec_len: int = 0
    spans: tuple[DiffSpan, ...] = ()
    explanation: str = ""


@dataclass(frozen=True, slots=True)
class AlignedToken:
    """A token for display: its id and its text made visible (spaces, newlines, control chars)."""

    id: int
    text: str
    special: bool = False


@dataclass(frozen=True, slots=True)
class AlignBlock:
    """A run of equal tokens (equal=True: ref and rec hold the same ids) or one differing region."""

    equal: bool
    ref_start: int
    rec_start: int
    ref: tuple[AlignedToken, ...]
    rec: tuple[AlignedToken, ...]


@dataclass(frozen=True, slots=True)
class Alignment:
    """What a side-by-side view needs: blocks in order covering both sequences completely."""

    blocks: tuple[AlignBlock, ...]
    ref_len: int
    rec_len: int

    @property
    def diff_blocks(self) -> tuple[int, ...]:
        """Indexes of the differing blocks (for n / N navigation)."""
        return tuple(i for i, b in enumerate(self.blocks) if not b.equal)
