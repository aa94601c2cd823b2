"""The check on ground truth: ids -> provider text -> reconstructed ids -> verdict, and its summary.

By default the reconstruction is what production does (the reference only judges); `assisted` gives the
reference-assisted upper bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from app.records import CORRUPT_VERDICTS, VERDICTS, Completion, Reconstruction, Verdict
from app.tokens.flags import TEXT_PATH, is_suspect
from app.tokens.reconstruct import Reconstructor
from app.tokens.template import split_output

_SEVERITY = {
    "structure_mismatch": 0,
    "text_mismatch": 1,
    "truncated": 3,
    "bpe_equivalent": 2,
    "unchecked": 4,
    "exact": 5,
}


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """One reference sample: the provider view it was turned into, the reconstruction and its verdict."""

    sample_id: str
    reference_ids: tuple[int, ...]
    completion: Completion
    reconstruction: Reconstruction
    verdict: Verdict


@dataclass(frozen=True)
class ValidationSummary:
    """Counts per verdict (every verdict present), rates, strategy/repair/notes/flag counts, worst examples.

    suspects: samples with a suspect flag; wrong_kept: corrupt samples that are *not* suspect (what a
    default export would keep).
    """

    total: int
    verdicts: dict[str, int]
    repairs: dict[str, int] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)
    worst: tuple[ValidationResult, ...] = ()
    flags: dict[str, int] = field(default_factory=dict)
    suspects: int = 0
    wrong_kept: int = 0

    def rate(self, category: str) -> float:
        """Share of samples with this verdict (0.0 for an empty set)."""
        return self.verdicts.get(category, 0) / self.total if self.total else 0.0

    def as_json(self) -> dict:
        """The `--json` shape: {"total": N, "verdicts": {...}, "rates": {...}, "repairs": ..., "worst": [...]}."""
        return {
            "total": self.total,
            "verdicts": dict(self.verdicts),
            "rates": {k: round(self.rate(k), 6) for k in self.verdicts},
            "repairs": dict(self.repairs),
            "notes": dict(self.notes),
            "flags": dict(self.flags),
            "suspects": self.suspects,
            "wrong_kept": self.wrong_kept,
            "worst": [
                {
                    "sample_id": r.sample_id,
                    "category": r.verdict.category,
                    "first_diff": r.verdict.first_diff,
                    "explanation": r.verdict.explanation,
                }
                for r in self.worst
            ],
        }


Serve = Callable[[Sequence[int]], Completion]  # reference ids -> what a server returns for them


def ideal_view(reconstructor: Reconstructor) -> Serve:
    """The provider view of an ideal server: the reference ids split, no server-side text steps."""
    return lambda ids: split_output(ids, reconstructor.profile, reconstructor.tokenizer).to_completion(
        provider="reference"
    )


def validate_sample(
    reconstructor: Reconstructor,
    sample_id: str,
    reference_ids: Sequence[int],
    *,
    serve: Serve | None = None,
    assisted: bool = False,
) -> ValidationResult:
    """Turn the reference ids into provider text (`serve`, default the ideal split), reconstruction, and compare.

    The reference only judges, as in production; `assisted` lets the repair search read it (upper bound).
    """
    completion = (serve or ideal_view(reconstructor))(reference_ids)
    rec, verdict = reconstructor.process(completion, reference_ids, assisted=assisted)
    return ValidationResult(sample_id, tuple(reference_ids), completion, rec, verdict)


def validate_all(
    reconstructor: Reconstructor,
    samples: Iterable[tuple[str, Sequence[int]]],
    workers: int = 1,
    *,
    serve: Serve | None = None,
    assisted: bool = False,
) -> list[ValidationResult]:
    """validate_sample over many (sample_id, ids) pairs, in order, on `workers` threads."""
    one = lambda s: validate_sample(reconstructor, s[0], s[1], serve=serve, assisted=assisted)  # noqa: E731
    if workers <= 1:
        return [one(s) for s in samples]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eaglewatch-validate") as pool:
        return list(pool.map(one, samples))


def summarize(results: Sequence[ValidationResult], n_worst: int = 8) -> ValidationSummary:
    """Counts per verdict, repairs used, notes seen, and the worst examples (corrupt first)."""
    verdicts: dict[str, int] = dict.fromkeys(VERDICTS, 0)
    verdicts.update(Counter(r.verdict.category for r in results))
    repairs = Counter(r.reconstruction.repair for r in results if r.reconstruction.repair)
    notes = Counter(n for r in results for n in r.reconstruction.notes)
    flags = Counter(f for r in results for f in r.reconstruction.flags if not f.startswith(TEXT_PATH))
    suspect = [is_suspect(r.reconstruction.flags) for r in results]
    wrong_kept = sum(1 for r, s in zip(results, suspect) if not s and r.verdict.category in CORRUPT_VERDICTS)
    ordered = sorted(
        (r for r in results if r.verdict.category in (*CORRUPT_VERDICTS, "bpe_equivalent")),
        key=lambda r: (_SEVERITY.get(r.verdict.category, 9), r.sample_id),
    )
    return ValidationSummary(
        len(results),
        verdicts,
        dict(repairs),
        dict(notes),
        tuple(ordered[:n_worst]),
        dict(flags),
        sum(suspect),
        wrong_kept,
    )
