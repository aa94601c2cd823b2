"""The per-sample ledger of server interventions: every token the model did not sample, and every prompt token it
did not see, that the run can know of.

Two sources, one list per answer (`Reconstructed.interventions`, stored in the `interventions` table, schema v10):
- what the server reports (`Completion.interventions`, read at the boundary: app.providers.interventions —
  OpenRouter's context compression, provider fallback, response healing and other pipeline stages);
- what the run measures against what it asked (`measured`): vLLM's `thinking_token_budget` stops the reasoning
  with a forced `</think>` and an ordinary finish_reason, so an answer whose reasoning holds exactly the budget
  (or more: the forced close) is one it cut; where the server returned prompt ids (checked against the rendered
  prompt: app.tokens.prompt_check), ids that are a shorter head or tail of the rendered ones mean the server cut
  the prompt, and a `usage.prompt_tokens` that disagrees with them means it counted (fed) another one; ids that
  differ otherwise are another chat template, which the prompt check reports as `differ` (not the server's
  doing); without server prompt ids, `truncate_prompt_tokens` sent and the prompt counted at exactly that many
  tokens means the server may have cut it (a prompt of exactly that length cannot be told apart: it is flagged,
  never kept silently); a finish or stop reason that names repetition detection.

Each kind becomes the reconstruction flag `intervened:<kind>`; the export leaves such samples out unless
`--keep-intervened` (app.export.policy, skip reason `intervened`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from app.providers import interventions as reported
from app.records import Completion, Intervention
from app.tokens.flags import INTERVENED
from app.tokens.prompt_check import PromptCheck

THINKING_BUDGET = "thinking_budget"  # vLLM thinking_token_budget forced </think>
PROMPT_TRUNCATED = "prompt_truncated"  # the server cut the prompt (truncate_prompt_tokens)
PROMPT_TOKENS_DIFFER = "prompt_tokens_differ"  # usage.prompt_tokens is not the rendered prompt's length
REPETITION_STOP = "repetition_stop"  # the server stopped the answer for repeating itself

KINDS = (
    reported.CONTEXT_COMPRESSION,
    reported.PROVIDER_FALLBACK,
    reported.RESPONSE_HEALING,
    reported.PIPELINE_STAGE,
    reported.METADATA_UNREADABLE,
    THINKING_BUDGET,
    PROMPT_TRUNCATED,
    PROMPT_TOKENS_DIFFER,
    REPETITION_STOP,
)
# short labels for the faces (a TUI tile's line, the headless line)
KIND_LABELS = {
    reported.CONTEXT_COMPRESSION: "compressed",
    reported.PROVIDER_FALLBACK: "fallback",
    reported.RESPONSE_HEALING: "healed",
    reported.PIPELINE_STAGE: "pipeline",
    reported.METADATA_UNREADABLE: "unread",
    THINKING_BUDGET: "think budget",
    PROMPT_TRUNCATED: "prompt cut",
    PROMPT_TOKENS_DIFFER: "prompt count",
    REPETITION_STOP: "repetition",
}
FLAG_PREFIX = INTERVENED  # + kind: the reconstruction flag of a sample with that intervention

# request fields that ask the server to stop or cut on its own (vLLM SamplingParams / its OpenAI protocol)
BUDGET_FIELD = "thinking_token_budget"
TRUNCATE_FIELD = "truncate_prompt_tokens"


def ledger_words(intervened: int, by_kind: Iterable[tuple[str, int]], *, short: bool = False) -> str:
    """`intervened 5 (compressed 2 · think budget 3)` in the faces' words ("" with none); `short` drops the kinds."""
    if not intervened:
        return ""
    if short:
        return f"intervened {intervened}"
    kinds = " · ".join(f"{KIND_LABELS.get(k, k)} {n}" for k, n in by_kind)
    return f"intervened {intervened} ({kinds})"


def flag_of(kind: str) -> str:
    """The reconstruction flag that marks a sample with an intervention of `kind`."""
    return FLAG_PREFIX + kind


def intervened_kinds(flags: Iterable[str]) -> tuple[str, ...]:
    """The intervention kinds among a sample's flags, in order."""
    return tuple(f[len(FLAG_PREFIX) :] for f in flags if f.startswith(FLAG_PREFIX))


def _field_int(fields: Mapping[str, Any] | None, name: str) -> int | None:
    value = (fields or {}).get(name)
    return value if type(value) is int and value > 0 else None


def reasoning_length(output_ids: Sequence[int], think_open: int | None, think_close: int | None) -> int | None:
    """How many tokens the reasoning holds in `output_ids`: those before the first think-close (after a leading
    think-open); None where the output has no think-close."""
    if think_close is None:
        return None
    try:
        close = output_ids.index(think_close)
    except ValueError:
        return None
    start = 1 if output_ids and think_open is not None and output_ids[0] == think_open else 0
    return close - start


def measured(
    completion: Completion,
    request_fields: Mapping[str, Any] | None,
    *,
    output_ids: Sequence[int] | None,
    think_open: int | None,
    think_close: int | None,
    prompt_check: PromptCheck | None,
) -> tuple[Intervention, ...]:
    """The interventions the run can tell from `completion` and the fields it sent (`request_fields`: the
    endpoint's and the call's extras), given the reconstructed output ids and, where the server returned prompt ids,
    their check against the rendered prompt."""
    found: list[Intervention] = []
    budget = _field_int(request_fields, BUDGET_FIELD)
    if budget is not None:
        # the ids hold the forced close where the server forced one; only an answer without ids is judged by
        # usage.reasoning_tokens (vLLM counts an answer with no think block, all of it parsed as reasoning, there)
        if output_ids:
            n = reasoning_length(output_ids, think_open, think_close)
        else:
            n = completion.usage.reasoning_tokens or None
        if n is not None and n >= budget:
            found.append(
                Intervention(
                    THINKING_BUDGET,
                    f"the reasoning holds {n} tokens, the thinking_token_budget of {budget} sent: the server "
                    f"closed the think block itself (finish_reason {completion.finish_reason!r})",
                )
            )
    counted = completion.usage.prompt_tokens
    truncate = _field_int(request_fields, TRUNCATE_FIELD)
    asked = f" (truncate_prompt_tokens {truncate} sent)" if truncate is not None else ""
    if prompt_check is not None and prompt_check.server_len is not None:
        if prompt_check.cut:  # the server's prompt ids are a shorter head or tail of the rendered ones
            found.append(
                Intervention(
                    PROMPT_TRUNCATED,
                    f"the server's {prompt_check.server_len} prompt ids are a cut of the rendered prompt's "
                    f"{prompt_check.rendered_len}{asked}",
                )
            )
        elif counted and counted != prompt_check.server_len:
            found.append(
                Intervention(
                    PROMPT_TOKENS_DIFFER,
                    f"usage.prompt_tokens is {counted}, the server's own prompt ids {prompt_check.server_len} "
                    f"(the rendered prompt {prompt_check.rendered_len} tokens)",
                )
            )
        # other differences are another template, which the prompt check reports (`differ`), not the server's doing
    elif truncate is not None and counted == truncate:
        found.append(
            Intervention(
                PROMPT_TRUNCATED,
                f"truncate_prompt_tokens {truncate} sent and the prompt counted at exactly {counted} tokens: "
                "the server may have cut it (no server prompt ids to tell)",
            )
        )
    stop = _repetition_reason(completion)
    if stop is not None:
        found.append(Intervention(REPETITION_STOP, stop))
    return tuple(found)


def _repetition_reason(completion: Completion) -> str | None:
    """A sentence when the answer's finish reason, or a choice's stop/native finish reason, names repetition."""
    if completion.finish_reason and "repetit" in completion.finish_reason.lower():
        return f"finish_reason {completion.finish_reason!r}"
    raw = completion.raw
    choices: list = []
    if isinstance(raw, dict) and isinstance(raw.get("choices"), list):
        choices = raw["choices"]
    elif isinstance(raw, list):  # stream chunks: the finish chunk carries the reasons
        for chunk in raw[-4:]:
            if isinstance(chunk, dict) and isinstance(chunk.get("choices"), list):
                choices.extend(chunk["choices"])
    for choice in choices[:8]:
        if not isinstance(choice, dict):
            continue
        for key in ("stop_reason", "native_finish_reason"):
            value = choice.get(key)
            if isinstance(value, str) and "repetit" in value.lower():
                return f"{key} {value[:80]!r}: the server stopped the answer for repeating itself"
    return None


def ledger(reported_by_server: Iterable[Intervention], found: Iterable[Intervention]) -> tuple[Intervention, ...]:
    """One answer's interventions: the server's report first, then what the run measured."""
    return (*reported_by_server, *found)
