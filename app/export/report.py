"""What an export wrote, as the CLI and `--json` report it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote: counts by outcome, token totals, ids sources, the files (relative to `out_dir`) and
    warnings about how its consumer reads them."""

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
            "exported": self.exported,
            "skipped": dict(self.skipped),
            "ids_sources": dict(self.ids_sources),
            "verified": self.verified,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "min_length": self.min_length,
            "max_length": self.max_length,
            "files": list(self.files),
            "seconds": round(self.seconds, 3),
            "warnings": list(self.warnings),
        }
