"""Which samples an export keeps, and which output ids it writes for each (true ids first)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.store.export_reads import ExportRow
from app.tokens.flags import is_suspect

# skip reasons, in the order they are checked (also the keys of ExportReport.skipped); `not_reproducible`:
# specforge-text only, the decoded text does not encode back to the sample's ids
SKIP_REASONS = ("no_reconstruction", "roundtrip", "unverified", "suspect", "prompt_unverified", "text_mismatch",
                "structure_mismatch", "bpe_equivalent", "truncated", "too_long", "not_reproducible")
# where a sample's exported output ids came from, best first
IDS_SOURCES = ("server", "logprobs", "reference", "text")


@dataclass(frozen=True)
class ExportPolicy:
    """Which samples to export: bpe_equivalent kept by default; mismatches, truncated, failed round-trips and
    suspect samples (app.tokens.flags.is_suspect) dropped by default; with `require_prompt_agreement` only samples
    whose server prompt ids agreed with the rendered prompt are kept."""

    keep_bpe_equivalent: bool = True
    keep_mismatches: bool = False
    keep_truncated: bool = False
    keep_roundtrip_failed: bool = False
    keep_suspect: bool = False
    # only samples whose server prompt ids agreed with the rendered prompt (app.tokens.prompt_check)
    require_prompt_agreement: bool = False
    max_length: int | None = None  # prompt + completion tokens; longer samples are skipped, never cut
    # ids rebuilt from text by an endpoint × provider that nothing verified (app.store.verification) are refused
    # unless accepted; `unverified` holds the (endpoint, provider or "") pairs to refuse (`with_verification`)
    accept_unverified: bool = False
    unverified: frozenset = frozenset()

    def as_dict(self) -> dict[str, Any]:
        """The policy as JSON-ready data (recorded in the manifest)."""
        return {
            "keep_bpe_equivalent": self.keep_bpe_equivalent,
            "keep_mismatches": self.keep_mismatches,
            "keep_truncated": self.keep_truncated,
            "keep_roundtrip_failed": self.keep_roundtrip_failed,
            "keep_suspect": self.keep_suspect,
            "require_prompt_agreement": self.require_prompt_agreement,
            "max_length": self.max_length,
            "accept_unverified": self.accept_unverified,
        }


def skip_reason(row: ExportRow, policy: ExportPolicy) -> str | None:
    """Why the policy drops this row before rendering (None: keep it so far). See SKIP_REASONS."""
    if row.output_ids is None or not row.output_ids:
        return "no_reconstruction"
    if row.roundtrip is False and not policy.keep_roundtrip_failed:
        return "roundtrip"
    if not policy.accept_unverified and policy.unverified and is_unverified_text(row, policy):
        return "unverified"
    if is_suspect(row.flags) and not policy.keep_suspect:  # text_path:<verdict> flags are informational
        return "suspect"
    if policy.require_prompt_agreement and row.prompt_check != "agree":
        return "prompt_unverified"
    if row.category in ("text_mismatch", "structure_mismatch") and not policy.keep_mismatches:
        return row.category
    if row.category == "bpe_equivalent" and not policy.keep_bpe_equivalent:
        return "bpe_equivalent"
    if (row.category == "truncated" or row.finish_reason == "length") and not policy.keep_truncated:
        return "truncated"
    return None


def true_ids(row: ExportRow) -> tuple[tuple[int, ...], str]:
    """The output ids to export and their source (one of IDS_SOURCES): the server's own ids when it returned
    them, the logprob-rebuilt ids, the sample's reference when the verdict says it is this very text
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
    """True when the row's exported ids would be a rebuild from text, unchecked by a reference, by an endpoint ×
    provider nothing verified."""
    return (row.category in (None, "unchecked") and true_ids(row)[1] == "text"
            and ((row.endpoint or "", row.provider or "") in policy.unverified
                 or ((row.endpoint or "", "") in policy.unverified and not row.provider)))


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
    """Sentences for endpoints whose rebuilds from text were mostly held back as suspect where the server table
    knows a path that keeps more (streaming vs not): the yield's cause and its fix."""
    out = []
    for s in statuses:
        n = skipped_suspect.get((s.endpoint, s.provider or ""), 0)
        if s.text_samples and n * 5 > 2 * s.text_samples and s.prior is not None and s.prior.other_path:
            out.append(f"{s.who} ({s.prior.label}): {n} of {s.text_samples} samples rebuilt from text held back as "
                       f"suspect (their text cannot prove their ids); {s.prior.other_path}")
    return out
