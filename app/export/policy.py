"""Which samples an export keeps, why it leaves each other one out, and which output ids it writes (true ids first).

A sample left out is counted once, under the first rule of `SKIP_RULES` (their order is the precedence) that
holds for it, so each count says what the samples are: a corrupt sample that also failed its round-trip is
"corrupt"; a truncated one flagged suspect is "truncated". Add a refusal by adding a `SkipRule` where its
precedence puts it (the rules are data; `skip_reason` only walks them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from app.records import CORRUPT_VERDICTS, Category
from app.store.export_reads import ExportRow
from app.tokens.flags import INTERVENED, is_suspect


@dataclass(frozen=True)
class ExportPolicy:
    """Which samples to export: bpe_equivalent kept by default; intervened, corrupt, truncated, round-trip-failed and
    suspect samples (app.tokens.flags.is_suspect) dropped by default; with `require_prompt_agreement` only samples
    whose server prompt ids agreed with the rendered prompt are kept."""

    keep_bpe_equivalent: bool = True
    keep_mismatches: bool = False
    keep_truncated: bool = False
    keep_roundtrip_failed: bool = False
    keep_suspect: bool = False
    # samples a server intervened on (app.engine.interventions: compressed prompt, fallback, forced </think>, ...)
    keep_intervened: bool = False
    # only samples whose server prompt ids agreed with the rendered prompt (app.tokens.prompt_check)
    require_prompt_agreement: bool = False
    max_length: int | None = None  # prompt + completion tokens; longer samples are skipped, never cut
    # ids reconstructed from text by an endpoint × provider that nothing verified (app.store.verification) are refused
    # unless accepted; `unverified` holds the (endpoint, provider or "") pairs to refuse (`with_verification`)
    accept_unverified: bool = False
    unverified: frozenset = frozenset()
    # a conversation's turns after a divergent tool call replayed with the recorded results (off-policy history)
    keep_off_policy: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The policy as JSON-ready data (recorded in the manifest)."""
        return {
            "keep_bpe_equivalent": self.keep_bpe_equivalent,
            "keep_mismatches": self.keep_mismatches,
            "keep_truncated": self.keep_truncated,
            "keep_roundtrip_failed": self.keep_roundtrip_failed,
            "keep_suspect": self.keep_suspect,
            "keep_intervened": self.keep_intervened,
            "require_prompt_agreement": self.require_prompt_agreement,
            "max_length": self.max_length,
            "accept_unverified": self.accept_unverified,
            "keep_off_policy": self.keep_off_policy,
        }


@dataclass(frozen=True)
class SkipRule:
    """One reason to leave a sample out: its key (manifest, `--json`), the label an operator reads, what the
    samples under it are, and the test (`applies(row, policy)`); None for reasons found while writing."""

    key: str
    label: str
    meaning: str
    applies: Callable[[ExportRow, ExportPolicy], bool] | None = None


def _truncated(row: ExportRow) -> bool:
    # cut at max_tokens: the verdict against a reference, or the finish reason where no reference judged it
    return row.category == Category.TRUNCATED or row.finish_reason == "length"


# in precedence order: the first that holds names the sample
SKIP_RULES: tuple[SkipRule, ...] = (
    SkipRule(
        "not_rebuilt",
        "not reconstructed",
        "no output ids were reconstructed for the sample (no reconstruction stored)",
        lambda row, p: not row.output_ids,
    ),
    SkipRule(
        "intervened",
        "server intervened",
        "the server did something the model did not (a compressed or cut prompt, a fallback to another provider, "
        "a healed answer, a thinking-budget or repetition stop: app.engine.interventions; the sample's "
        "intervened:<kind> flags say which); first, as it explains any mismatch after it; kept with --keep-intervened",
        lambda row, p: not p.keep_intervened and any(f.startswith(INTERVENED) for f in row.flags),
    ),
    SkipRule(
        "corrupt",
        "corrupt",
        "the verdict against its reference ids is a corrupt one (text_mismatch, "
        "structure_mismatch: app.records.CORRUPT_VERDICTS); kept with --keep-mismatches",
        lambda row, p: row.category in CORRUPT_VERDICTS and not p.keep_mismatches,
    ),
    SkipRule(
        "truncated",
        "truncated",
        "the response stopped at max_tokens (verdict truncated, or finish_reason "
        "length where no reference judged it): no end-of-turn; kept with --keep-truncated",
        lambda row, p: _truncated(row) and not p.keep_truncated,
    ),
    SkipRule(
        "suspect",
        "suspect",
        "the reconstruction flagged signs its ids may be wrong (app.tokens.flags.is_suspect); kept with --keep-suspect",
        lambda row, p: is_suspect(row.flags) and not p.keep_suspect,
    ),
    SkipRule(
        "roundtrip_failed",
        "round-trip failed",
        "the reconstructed ids do not decode back to the returned text; kept with --keep-roundtrip-failed",
        lambda row, p: row.roundtrip is False and not p.keep_roundtrip_failed,
    ),
    SkipRule(
        "unverified",
        "unverified endpoint",
        "ids reconstructed from text by an endpoint that nothing verified (no "
        "probe with true ids, no reference, not the server table alone); kept with --accept-unverified",
        lambda row, p: not p.accept_unverified and bool(p.unverified) and is_unverified_text(row, p),
    ),
    SkipRule(
        "prompt_unverified",
        "prompt unverified",
        "--require-prompt-agreement: the server's prompt ids did not "
        "agree with the rendered prompt, or the server returned none",
        lambda row, p: p.require_prompt_agreement and row.prompt_check != "agree",
    ),
    SkipRule(
        "off_policy",
        "off-policy turn",
        "--drop-off-policy: a conversation's turn whose history holds recorded "
        'tool results replayed after the model\'s own calls diverged (on_tool_divergence = "replay")',
        lambda row, p: row.off_policy and not p.keep_off_policy,
    ),
    SkipRule(
        "bpe_equivalent",
        "BPE-equivalent",
        "--drop-bpe-equivalent: same text as the reference, another token split",
        lambda row, p: row.category == Category.BPE_EQUIVALENT and not p.keep_bpe_equivalent,
    ),
    SkipRule(
        "eval_overlap",
        "eval prompt",
        "its prompt equals an eval prompt after whitespace normalisation "
        "([export] eval_prompts, --eval-prompts; app.export.eval_overlap); kept with keep_eval_overlap",
    ),
    # found while writing
    SkipRule("too_long", "too long", "prompt + completion longer than --max-length (never cut)"),
    SkipRule(
        "not_reproducible",
        "not reproducible as text",
        "a text format (specforge-text, modelopt) cannot hold "
        "the sample: its text does not tokenize back to its ids, or the consumer's mask of it would differ",
    ),
)
SKIP_REASONS: tuple[str, ...] = tuple(rule.key for rule in SKIP_RULES)
SKIP_LABELS: dict[str, str] = {rule.key: rule.label for rule in SKIP_RULES}
# where a sample's exported output ids came from, best first
IDS_SOURCES = ("server", "logprobs", "reference", "text")


def skip_reason(row: ExportRow, policy: ExportPolicy) -> str | None:
    """Why the policy drops this row before rendering (None: keep it so far): the key of the first SKIP_RULES
    rule that holds."""
    for rule in SKIP_RULES:
        if rule.applies is not None and rule.applies(row, policy):
            return rule.key
    return None


def true_ids(row: ExportRow) -> tuple[tuple[int, ...], str]:
    """The output ids to export and their source (one of IDS_SOURCES): the server's own ids when it returned
    them, the logprob-reconstructed ids, the sample's reference when the verdict says it is this very text
    (`exact` / `bpe_equivalent`), and the re-encoded text only otherwise."""
    ids = row.output_ids or ()
    if row.ids_source in ("server", "logprobs", "reference"):
        # the stored reconstruction of true ids: the server's ids plus the end token a server that stops on it
        # may leave out (`Reconstructor._server_ids`), so what the trainer gets ends as the template's turn does
        return ids, row.ids_source
    if row.server_ids:  # a row stored before reconstructions kept true ids: the server's ids as they came
        return row.server_ids, "server"
    if row.strategy in ("server_ids", "logprobs"):
        return ids, "server" if row.strategy == "server_ids" else "logprobs"
    if row.reference_ids and row.category in ("exact", "bpe_equivalent"):
        return row.reference_ids, "reference"
    return ids, "text"


def is_unverified_text(row: ExportRow, policy: ExportPolicy) -> bool:
    """True when the row's exported ids would be a reconstruction from text, unchecked by a reference, by an endpoint ×
    provider nothing verified."""
    return (
        row.category in (None, "unchecked")
        and true_ids(row)[1] == "text"
        and (
            (row.endpoint or "", row.provider or "") in policy.unverified
            or ((row.endpoint or "", "") in policy.unverified and not row.provider)
        )
    )


@dataclass(frozen=True)
class Verification:
    """What the export learned of the run's endpoints: their statuses (app.store.verification), the policy with
    the unverified ones to refuse, and the advice for the manifest and the operator."""

    policy: ExportPolicy
    statuses: tuple
    advice: tuple[str, ...]


def with_verification(conn, run_id: int, policy: ExportPolicy) -> Verification:
    """The policy with the run's unverified endpoint × provider pairs to refuse, and what would verify them."""
    from app.store.verification import UNVERIFIED, read_verification

    statuses = tuple(read_verification(conn, run_id))
    refused = frozenset((s.endpoint, s.provider or "") for s in statuses if s.state == UNVERIFIED and s.text_samples)
    advice = tuple(a for s in statuses if s.state == UNVERIFIED and s.text_samples and (a := s.advice()))
    return Verification(replace(policy, unverified=refused), statuses, advice)


def held_back_advice(statuses, skipped_suspect: dict[tuple[str, str], int]) -> list[str]:
    """Sentences for endpoints whose reconstructions from text were mostly held back as suspect where the server table
    knows a path that keeps more (streaming vs not): the yield's cause and its fix."""
    out = []
    for s in statuses:
        n = skipped_suspect.get((s.endpoint, s.provider or ""), 0)
        if s.text_samples and n * 5 > 2 * s.text_samples and s.prior is not None and s.prior.other_path:
            out.append(
                f"{s.who} ({s.prior.label}): {n} of {s.text_samples} samples reconstructed from text held back as "
                f"suspect (their text cannot prove their ids); {s.prior.other_path}"
            )
    return out
