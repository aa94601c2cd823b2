"""The names written into `Reconstruction.flags` / `reconstructions.flags`, in one place.

A *suspect* sample is one whose ids were reconstructed from text and whose text shows a cheap, honest sign that
it may not carry the model's ids (no ground truth needed). The export drops suspects by default:
`is_suspect(flags)` is the test it calls. Informational flags (`text_path:<verdict>`) record the measured
fidelity of the text path on a sample that has true ids; they never make a sample suspect.

`ids_source` (Reconstruction.ids_source, reconstructions.ids_source) says where the stored ids came from:
IDS_SOURCES. Only "server" and "logprobs" are ground truth ("verified"); "text" ids are a reconstruction.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.records import TRUE_ID_SOURCES

# ---- ids_source ------------------------------------------------------------------------------------------
IDS_SERVER = "server"  # server-returned output ids (vLLM token_ids, SGLang output_ids / logprob token_id)
IDS_LOGPROBS = "logprobs"  # logprob tokens with bytes, mapped to ids
IDS_TEXT = "text"  # canonical reconstruction from the returned text (with learned repairs, if any)
IDS_SOURCES = (IDS_SERVER, IDS_LOGPROBS, IDS_TEXT)
VERIFIED_SOURCES = TRUE_ID_SOURCES  # (IDS_SERVER, IDS_LOGPROBS): app.records defines them once

# ---- suspect flags (text-path reconstructions only) -------------------------------------------------------------
REPLACEMENT_CHAR = "replacement_char"  # U+FFFD in the text: bytes were lost on the way (partial UTF-8)
MARKER_AS_TEXT = "marker_as_text"  # a special-token string of the profile spelled inside a field
NORMALISER = "normaliser"  # the tokenizer's normaliser would change the text (encoded raw; model ids unknown)
TEMPLATE_WHITESPACE_MISSING = "template_whitespace_missing"  # whitespace the template always emits is absent
TEMPLATE_WHITESPACE_DOUBLED = "template_whitespace_doubled"  # the fields already hold the template's whitespace
REASONING_MISSING = "reasoning_missing"  # no reasoning field where the prompt opened the think block: empty
# thinking dropped by the server, or an answer that ended inside the think block (text cannot tell)
UNINVERTIBLE = "uninvertible:"  # + a step of app.tokens.fidelity_profile.STEPS the endpoint's profile cannot invert
# (for a strip: only samples whose token count cannot rule out that whitespace was removed there)
TOKEN_COUNT = "token_count"  # the reconstructed ids are not as many as usage.completion_tokens says the model generated
# (with the endpoint's count relation known): a non-canonical split, or text changed on the way
SERVER_IDS_INCOMPLETE = "server_ids_incomplete"  # the server's ids lack text it returned (tokens dropped on the way,
# vLLM #27482: streamed tool calls): not ground truth; the sample is reconstructed from its text instead
TEXT_REGIONS_UNCHECKED = "text_regions_unchecked"  # logprob ids whose regions without logprobs (tool calls) were
# reconstructed from text, before the endpoint's count relation was known to check them

# the server-side text steps a fidelity profile knows (app.tokens.fidelity_profile learns them)
STEPS = (
    "template_whitespace_kept",  # the server returns the template's whitespace inside the fields
    "strip_whitespace",  # reasoning/content edges .strip()ped
    "think_spaces",  # ' ' around added tokens (vLLM slow detokenizer)
    "empty_reasoning_dropped",  # empty thinking returned as no reasoning field
    "no_content",  # "(no content)" placeholder deleted before tool calls
    "tool_whitespace",  # whitespace around tool ids / arguments eaten by the tool parser
    "json_reserialised",  # tool arguments re-serialised with json.dumps
    "tool_ids_reindexed",  # tool-call ids re-made by the server
    "reasoning_holds_answer",  # an answer with no think block returned as reasoning (vLLM's qwen3 parser)
)

SUSPECT_FLAGS = (
    REPLACEMENT_CHAR,
    MARKER_AS_TEXT,
    NORMALISER,
    TEMPLATE_WHITESPACE_MISSING,
    TEMPLATE_WHITESPACE_DOUBLED,
    REASONING_MISSING,
    TOKEN_COUNT,
    TEXT_REGIONS_UNCHECKED,
    SERVER_IDS_INCOMPLETE,
    *(UNINVERTIBLE + s for s in STEPS),
)

# ---- server interventions (app.engine.interventions) ------------------------------------------------------
INTERVENED = "intervened:"  # + a kind of app.engine.interventions.KINDS: the server did something the model did not
# (the export leaves such samples out unless --keep-intervened; they are not "suspect": the ids may be the server's)

# ---- informational --------------------------------------------------------------------------------------
TEXT_PATH = "text_path:"  # + the verdict of the text-only reconstruction against the true ids of this sample


def is_suspect(flags: Iterable[str]) -> bool:
    """True when any flag marks the sample suspect (the export drops such samples unless told to keep them)."""
    return any(f in SUSPECT_FLAGS for f in flags)


def suspect_flags(flags: Iterable[str]) -> tuple[str, ...]:
    """The suspect flags among `flags`, in order."""
    return tuple(f for f in flags if f in SUSPECT_FLAGS)


def text_path_flag(category: str) -> str:
    """The flag recording that the text-only reconstruction of a verified sample got verdict `category`."""
    return TEXT_PATH + category


def text_path_of(flags: Iterable[str]) -> str | None:
    """The text-path verdict recorded in `flags`, or None when the sample was not measured."""
    return next((f[len(TEXT_PATH) :] for f in flags if f.startswith(TEXT_PATH)), None)
