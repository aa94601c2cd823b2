"""One training row, as every export format receives it: token ids and the spans of them the model generated.

A row is "context ids + generated ids + loss mask": `input_ids` with `loss_spans`, the half-open ranges the loss
covers (each one a generation of the target model), in order and disjoint. A single-turn sample has one span
(the output after the rendered prompt); a multi-turn row has one per regenerated assistant turn, and every
writer carries them all (the mask, or alternating context / generated text chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TrainingRow:
    """One row to write: ids, the generated spans, where the ids came from, and the stored sample behind it
    (`source`: an `app.store.export_reads.ExportRow`, for the formats that also write messages)."""

    sample_id: str
    input_ids: list[int]
    loss_spans: tuple[tuple[int, int], ...]
    ids_source: str
    verdict: str | None
    source: Any = None
    split_key: str = ""  # what the eval split hashes: the prompt's opening (app.export.eval_overlap.split_key)

    @classmethod
    def single_turn(
        cls, row: Any, prompt_ids: list[int], output_ids: tuple[int, ...] | list[int], ids_source: str
    ) -> TrainingRow:
        """The row of one stored sample: its rendered prompt, then its output ids in the loss; split by its
        prompt's opening, so equal prompts and a conversation's turns fall on one side of the eval split."""
        from app.export.eval_overlap import split_key

        n = len(prompt_ids)
        return cls(
            row.sample_id,
            [*prompt_ids, *output_ids],
            ((n, n + len(output_ids)),),
            ids_source,
            row.category,
            row,
            split_key(row.messages),
        )

    def __post_init__(self) -> None:
        at = 0
        for start, end in self.loss_spans:
            if not at <= start < end <= len(self.input_ids):
                raise ValueError(
                    f"sample {self.sample_id!r}: loss spans {self.loss_spans} are not ordered, "
                    f"disjoint, non-empty ranges within its {len(self.input_ids)} ids"
                )
            at = end

    @property
    def loss_mask(self) -> list[int]:
        """0 for context ids, 1 for generated ids."""
        mask = [0] * len(self.input_ids)
        for start, end in self.loss_spans:
            mask[start:end] = [1] * (end - start)
        return mask

    @property
    def loss_tokens(self) -> int:
        """How many ids are in the loss."""
        return sum(end - start for start, end in self.loss_spans)

    @property
    def prompt_ids(self) -> list[int]:
        """The ids before the last generated span (for a single-turn row: the rendered prompt)."""
        return self.input_ids[: self.loss_spans[-1][0]] if self.loss_spans else list(self.input_ids)

    @property
    def output_ids(self) -> list[int]:
        """The ids of the last generated span (for a single-turn row: the whole output)."""
        return self.input_ids[slice(*self.loss_spans[-1])] if self.loss_spans else []

    def chunks(self) -> list[tuple[bool, list[int]]]:
        """The ids cut at span edges, in order: (generated?, ids); empty chunks left out."""
        out: list[tuple[bool, list[int]]] = []
        at = 0
        for start, end in self.loss_spans:
            if start > at:
                out.append((False, self.input_ids[at:start]))
            out.append((True, self.input_ids[start:end]))
            at = end
        if at < len(self.input_ids):
            out.append((False, self.input_ids[at:]))
        return out
