"""The run's mix: per dataset and category, prompts, answers, loss tokens and the shares of answers that reason or
call tools (one read over samples and their latest answered response)."""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class MixRow:
    """One (dataset, category) of a run: `prompts` ingested, `answers` reconstructed, `loss_tokens` (the output
    tokens a drafter trains on), and how many answers hold reasoning or tool calls."""

    dataset: str
    category: str
    prompts: int
    answers: int
    loss_tokens: int
    reasoning: int
    tool_calls: int
    languages: tuple[tuple[str, int], ...] = ()  # prompts per script (app.datasets.script_of), most first

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, with the shares of answers that reason and that call tools."""
        out = asdict(self)
        out["languages"] = dict(self.languages)
        out["reasoning_share"] = round(self.reasoning / self.answers, 4) if self.answers else None
        out["tool_call_share"] = round(self.tool_calls / self.answers, 4) if self.answers else None
        return out


# a sample's answer is its latest response with content (a retried sample has failed attempts before it); loss
# tokens are that answer's completion tokens
_MIX = (
    "SELECT s.dataset, COALESCE(s.category, s.dataset), COUNT(*), COUNT(p.id), "
    "COALESCE(SUM(p.completion_tokens), 0), "
    "COALESCE(SUM(p.reasoning_tokens > 0 OR COALESCE(p.reasoning, '') != ''), 0), "
    "COALESCE(SUM(COALESCE(p.tool_calls, '') NOT IN ('', '[]', 'null')), 0) "
    "FROM samples AS s "
    "LEFT JOIN (SELECT sample_pk, MAX(id) AS id FROM responses WHERE run_id = ?1 AND content IS NOT NULL "
    "           GROUP BY sample_pk) AS a ON a.sample_pk = s.pk "
    "LEFT JOIN responses AS p ON p.id = a.id "
    "WHERE s.run_id = ?1 GROUP BY 1, 2 ORDER BY 1, 2"
)


_LANGUAGES = (
    "SELECT dataset, COALESCE(category, dataset), COALESCE(language, 'unknown'), COUNT(*) FROM samples "
    "WHERE run_id = ? GROUP BY 1, 2, 3 ORDER BY 4 DESC"
)


def dataset_mix(conn: sqlite3.Connection, run_id: int) -> tuple[MixRow, ...]:
    """The run's mix by (dataset, category), in name order, with its prompts' scripts."""
    languages: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for dataset, category, language, n in conn.execute(_LANGUAGES, (run_id,)):
        languages.setdefault((dataset, category), []).append((language, n))
    return tuple(MixRow(*row, languages=tuple(languages.get((row[0], row[1]), ())))
                 for row in conn.execute(_MIX, (run_id,)))
