"""What an export wrote, as the CLI and `--json` report it, and the one definition of its summary counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.export.policy import SKIP_LABELS, SKIP_REASONS, SKIP_RULES


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote: counts by outcome, token totals, ids sources, the files (relative to `out_dir`),
    how each trainer reads them (`train`: manifest.json's record) and warnings about its consumer."""

    run: str
    format: str
    out_dir: Path
    exported: int
    skipped: dict[str, int]
    tokens: int
    loss_tokens: int
    min_length: int | None
    max_length: int | None
    files: tuple[str, ...]
    seconds: float
    ids_sources: dict[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # what the consumer will do differently (also in the manifest)
    seen: int = 0
    eval_exported: int = 0  # of `exported`, the rows in the eval split (OUT/eval)
    eval_fraction: float = 0.0
    # whole conversations (app.export.conversation_rows.ConversationTally.as_dict); None when the run has none
    conversations: dict[str, Any] | None = None
    # eval prompts kept out (app.export.eval_overlap.OverlapTally.as_dict); None when none were given
    eval_overlap: dict[str, Any] | None = None
    train: dict[str, Any] = field(default_factory=dict)

    @property
    def verified(self) -> int:
        """Exported samples whose ids are verified, in the words of every face (app.records.Verification): true
        ids from the server or from logprobs (app.records.TRUE_ID_SOURCES)."""
        from app.records import TRUE_ID_SOURCES

        return sum(n for source, n in self.ids_sources.items() if source in TRUE_ID_SOURCES)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (`export --json`)."""
        return {
            "run": self.run,
            "format": self.format,
            "out_dir": str(self.out_dir),
            "counts": summary_counts(self),
            "exported": self.exported,
            "skipped": dict(self.skipped),
            "ids_sources": dict(self.ids_sources),
            "verified": self.verified,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "min_length": self.min_length,
            "max_length": self.max_length,
            "eval": {"fraction": self.eval_fraction, "exported": self.eval_exported},
            "conversations": self.conversations,
            "eval_overlap": self.eval_overlap,
            "files": list(self.files),
            "seconds": round(self.seconds, 3),
            "train": self.train,
            "warnings": list(self.warnings),
        }


# what each summary count means; `skipped.<reason>`: one per SKIP_RULES entry
COUNT_MEANINGS: dict[str, str] = {
    "seen": "samples of the run read from the store: those whose state is done (pending, leased, failed and "
    "skipped samples are never exported, so they are not seen)",
    "exported": "rows written, the train and eval splits together (exported + every skipped count = seen, "
    "except that a merged conversation's row holds several of the samples seen: "
    "exported - conversations.merged + conversations.merged_turns + every skipped count = seen)",
    "train": "rows written under OUT/data (exported minus eval)",
    "eval": "rows held out under OUT/eval by --eval-fraction (a stable hash of the prompt's opening: rows with "
    "the same prompt on the same side)",
    **{f"skipped.{rule.key}": f"{rule.label}: {rule.meaning}" for rule in SKIP_RULES},
}


def summary_counts(report: ExportReport) -> dict[str, Any]:
    """The export summary's numbers (COUNT_MEANINGS says what each is): seen, exported, train, eval and the
    skipped samples, each counted once under the first reason of the policy's precedence (corrupt, truncated,
    suspect, round-trip failed, ...), every reason present with 0 when none."""
    return {
        "seen": report.seen,
        "exported": report.exported,
        "train": report.exported - report.eval_exported,
        "eval": report.eval_exported,
        "skipped": {key: report.skipped.get(key, 0) for key in SKIP_REASONS},
    }


def summary_line(report: ExportReport) -> str:
    """The one-line summary `eaglewatch export` prints: what was written, from which ids, what was left out."""
    counts = summary_counts(report)
    skipped = ", ".join(f"{n} {SKIP_LABELS[k]}" for k, n in counts["skipped"].items() if n) or "none"
    sources = ", ".join(f"{n} {k}" for k, n in report.ids_sources.items()) or "none"
    split = (
        f" ({counts['train']} train, {counts['eval']} eval in {report.out_dir}/eval)" if report.eval_fraction else ""
    )
    talk = ""
    if report.conversations:
        c = report.conversations
        why = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in c["per_turn"].items() if n)
        merged = (
            f", {c['merged']} merged into one row each ({c['merged_prefix']} of them the done prefix of a "
            f"conversation that ended early), per-turn: {why or 'none'}"
            if c["mode"] == "merged"
            else ""
        )
        talk = (
            f"; conversations: {c['conversations']} ({c['exported_turns']} of {c['turns']} turns written"
            f"{merged}; {c['off_policy_turns']} off-policy turns)"
        )
    return (
        f"exported {report.exported} of {counts['seen']} samples of run {report.run!r} as {report.format} to "
        f"{report.out_dir}/data{split} ({report.tokens} tokens, {report.loss_tokens} in the loss, longest "
        f"{report.max_length}) in {report.seconds:.1f}s; ids from: {sources}; skipped: {skipped}{talk}"
    )
