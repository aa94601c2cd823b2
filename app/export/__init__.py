"""Training-data export from a run store, one module per job:

- `app.store.export_reads`: the rows (SQL, paged);  `policy`: which samples, which ids (true ids first);
- `app.tokens.render_export` / `templates`: prompt ids (chat template or profile renderer);
- `writers`: one writer per format;  `parallel`: prompts rendered in a process pool;
- `run`: `export_run`, the orchestrator (temporary folder renamed into place, manifest last).

Formats are described in docs/contracts.md ("Export shards") and, per trainer, docs/jobs.md.
"""

from __future__ import annotations

from app.export.policy import IDS_SOURCES, SKIP_REASONS, ExportPolicy, skip_reason, true_ids
from app.export.report import ExportReport
from app.export.assemble import FORMATS, MANIFEST, SAMPLES, export_run
from app.export.templates import load_chat_template
from app.export.writers import DATA_DIR, SINGLE_FILE, assistant_turn
from app.store.export_reads import ExportRow, iter_rows
from app.tokens.render_export import ChatTemplate, PromptRenderer

__all__ = [
    "DATA_DIR", "FORMATS", "IDS_SOURCES", "MANIFEST", "SAMPLES", "SINGLE_FILE", "SKIP_REASONS", "ChatTemplate",
    "ExportPolicy", "ExportReport", "ExportRow", "PromptRenderer", "assistant_turn", "export_run", "iter_rows",
    "load_chat_template", "skip_reason", "true_ids",
]
