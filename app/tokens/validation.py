"""The classic check on ground truth: ids -> provider text -> rebuilt ids -> verdict, and its summary."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from app.records import CORRUPT_VERDICTS, VERDICTS, Completion, Reconstruction, Verdict
from app.tokens.reconstruct import Reconstructor
from app.tokens.template import split_output

_SEVERITY = {"structure_mismatch": 0, "text_mismatch": 1, "truncated": 3, "bpe_equivalent": 2, "unchecked": 4, "exact": 5}


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """One reference sample: the provider view it was turned into, the rebuild and its verdict."""

    sample_id: str
    reference_ids: tuple[int, ...]
    completion: Completion
    reconstruction: Reconstruction
    verdict: Verdict


@dataclass(frozen=True)
class ValidationSummary:
    """Counts per verdict (every verdict present), rates, strategy/repair/notes counts, worst examples."""

    total: int
    verdicts: dict[str, int]
    repairs: dict[str, int] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)
    worst: tuple[ValidationResult, ...] = ()

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
            "worst": [
                {"sample_id": r.sample_id, "category": r.verdict.category, "first_diff": r.verdict.first_diff,
                 "explanation": r.verdict.explanation}
                for r in self.worst
            ],
        }


def validate_sample(reconstructor: Reconstructor, sample_id: str, reference_ids: Sequence[int]) -> ValidationResult:
    """Split the reference ids as a provider would, rebuild them from that text, and compare."""
    view = split_output(reference_ids, reconstructor.profile, reconstructor.tokenizer)
    completion = view.to_completion(provider="reference")
    rec, verdict = reconstructor.process(completion, reference_ids)
    return ValidationResult(sample_id, tuple(reference_ids), completion, rec, verdict)


def validate_all(
    reconstructor: Reconstructor, samples: Iterable[tuple[str, Sequence[int]]], workers: int = 1
) -> list[ValidationResult]:
    """validate_sample over many (sample_id, ids) pairs, in order, on `workers` threads."""
    if workers <= 1:
        return [validate_sample(reconstructor, sid, ids) for sid, ids in samples]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eaglewatch-validate") as pool:
        return list(pool.map(lambda s: validate_sample(reconstructor, s[0], s[1]), samples))


def summarize(results: Sequence[ValidationResult], n_worst: int = 8) -> ValidationSummary:
    """Counts per verdict, repairs used, notes seen, and the worst examples (corrupt first)."""
    verdicts = dict.fromkeys(VERDICTS, 0)
    verdicts.update(Counter(r.verdict.category for r in results))
    repairs = Counter(r.reconstruction.repair for r in results if r.reconstruction.repair)
    notes = Counter(n for r in results for n in r.reconstruction.notes)
    ordered = sorted(
        (r for r in results if r.verdict.category in (*CORRUPT_VERDICTS, "bpe_equivalent")),
        key=lambda r: (_SEVERITY.get(r.verdict.category, 9), r.sample_id),
    )
    return ValidationSummary(len(results), verdicts, dict(repairs), dict(notes), tuple(ordered[:n_worst]))
