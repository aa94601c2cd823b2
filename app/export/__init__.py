"""Training-data export from a run store, one module per job:

- `app.store.export_reads`: the rows (SQL, paged);  `policy`: which samples, which ids (true ids first), and the
  one precedence of skip reasons;  `training_rows`: a row as ids + generated spans;
- `app.tokens.render_export` / `templates`: prompt ids (chat template or profile renderer);
- `conversations`: a whole conversation's turns as per-turn rows or one merged row (its prefix property proven);
- `writers`: one writer per format;  `parallel`: prompts rendered in a process pool;  `eval_split`: the held-out
  rows;  `trainer_routes`: how each trainer reads the export (settings, commands);  `draft_vocab`: the reduced
  draft vocabulary (`eaglewatch vocab`);
- `assemble`: `Export` (with its `ExportOptions`), the orchestrator (temporary folder renamed into place, manifest
last);  `report`: the
  summary counts and what each means.

Formats and their consumers: docs/jobs.md ("Train with it").
"""

from __future__ import annotations

from app.export.assemble import FORMATS, MANIFEST, SAMPLES, Export, ExportOptions
from app.export.conversation_rows import CONVERSATION_MODES, PER_TURN_REASONS
from app.export.eval_split import EVAL_DIR, held_out
from app.export.policy import IDS_SOURCES, SKIP_LABELS, SKIP_REASONS, SKIP_RULES, ExportPolicy, skip_reason, true_ids
from app.export.report import COUNT_MEANINGS, ExportReport, summary_counts, summary_line
from app.export.templates import load_chat_template
from app.export.training_rows import TrainingRow
from app.export.writers import DATA_DIR, SINGLE_FILE, assistant_turn
from app.store.export_reads import ExportRow, iter_rows
from app.tokens.render_export import ChatTemplate, PromptRenderer

__all__ = [
    "CONVERSATION_MODES",
    "COUNT_MEANINGS",
    "DATA_DIR",
    "EVAL_DIR",
    "FORMATS",
    "IDS_SOURCES",
    "MANIFEST",
    "PER_TURN_REASONS",
    "SAMPLES",
    "SINGLE_FILE",
    "SKIP_LABELS",
    "SKIP_REASONS",
    "SKIP_RULES",
    "ChatTemplate",
    "Export",
    "ExportOptions",
    "ExportPolicy",
    "ExportReport",
    "ExportRow",
    "PromptRenderer",
    "TrainingRow",
    "assistant_turn",
    "held_out",
    "iter_rows",
    "load_chat_template",
    "skip_reason",
    "summary_counts",
    "summary_line",
    "true_ids",
]
