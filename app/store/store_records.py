"""Plain records that go in and out of the run store (frozen dataclasses; stdlib and app.records only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.records import Completion, Reconstruction, Verdict


@dataclass(frozen=True, slots=True)
class SampleInput:
    """One prompt to ingest: the messages up to (not including) the final assistant turn."""

    sample_id: str
    dataset: str
    messages: list[dict[str, Any]]
    tools: list[Any] | None = None
    reference_ids: tuple[int, ...] | None = None
    line: int = 0  # line number in its file (0 when not from a file): conflicts are reported as file:line
    category: str | None = None  # the row's category column, when the dataset maps one (else the dataset stands)
    language: str | None = None  # the prompt's script: Latin, CJK, Cyrillic, Arabic or other (app.datasets.script_of)


@dataclass(frozen=True, slots=True)
class ReferenceRecord:
    """One line of an SGLang-style reference file: ground-truth output ids for a sample id."""

    sample_id: str
    output_ids: tuple[int, ...]
    finish_reason: str | None = None
    messages: list[dict[str, Any]] | None = None
    line: int = 0


@dataclass(frozen=True, slots=True)
class IngestReport:
    """What one ingest did: rows added, identical rows already there, and conflicts (an id the run holds with
    different content), the first few as `file:line: ...` sentences."""

    added: int = 0
    already_present: int = 0
    conflicts: int = 0
    conflict_examples: tuple[str, ...] = ()

    def __add__(self, other: IngestReport) -> IngestReport:
        examples = (self.conflict_examples + other.conflict_examples)[:5]
        return IngestReport(
            self.added + other.added,
            self.already_present + other.already_present,
            self.conflicts + other.conflicts,
            examples,
        )


@dataclass(frozen=True, slots=True)
class LeasedSample:
    """A sample handed to a worker until `lease_expires`; `attempts` counts this lease."""

    pk: int
    sample_id: str
    dataset: str
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    attempts: int
    reference_ids: tuple[int, ...] | None
    lease_expires: float = 0.0
    tries: int = 0  # requests already sent for this sample, over every lease and restart
    tries_forgiven: int = 0  # of those, forgiven by an operator's retry of failed samples (not counted any more)
    conversation_id: str | None = None  # a conversation's turn (schema v8): its conversation, turn k of `turns`
    turn: int | None = None
    turns: int | None = None

    @property
    def turns_after(self) -> int:
        """How many turns of its conversation come after this one (0 for a single-turn sample)."""
        return (self.turns or 0) - (self.turn or 0) if self.conversation_id is not None else 0


@dataclass(frozen=True, slots=True)
class Command:
    """A control request from an attached viewer (row of `commands`)."""

    id: int
    verb: str
    args: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class ReconstructionLabels:
    """What a stored reconstruction carries beside its ids: the profile and tokenizer fingerprint that made it,
    where its ids came from and its flags (None: not recorded), and the prompt check (app.tokens.prompt_check:
    the server's prompt ids against the rendered prompt; None when not checked)."""

    profile: str = ""
    tokenizer: str = ""
    ids_source: str | None = None
    flags: tuple[str, ...] | None = None
    prompt_check: str | None = None
    prompt_first_diff: int | None = None


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """One paid response as settled, the single record `RunStore.record_result` stores.

    `attempt` is the request's number for this sample (over every lease); `state` the sample's state after it
    (`done`, or `failed` for a paid response whose sample still failed, naming why in `error_class` / `error`).
    `profile` / `tokenizer` (fingerprint) and the prompt check label the reconstruction; `keep_raw` stores the
    provider's parsed body too.
    """

    run_id: int
    sample_pk: int
    attempt: int
    endpoint: str
    completion: Completion
    cost_usd: float
    reconstruction: Reconstruction | None = None
    verdict: Verdict | None = None
    reference_ids: tuple[int, ...] | None = None
    state: str = "done"
    profile: str = ""
    tokenizer: str = ""
    keep_raw: bool = False
    error_class: str | None = None
    error: str | None = None
    prompt_check: str | None = None
    prompt_first_diff: int | None = None

    def labels(self) -> ReconstructionLabels:
        """The reconstruction's labels: its own ids source and flags, with this result's profile, tokenizer and
        prompt check."""
        rec = self.reconstruction
        return ReconstructionLabels(
            profile=self.profile,
            tokenizer=self.tokenizer,
            ids_source=rec.ids_source if rec is not None else None,
            flags=tuple(rec.flags) if rec is not None else None,
            prompt_check=self.prompt_check,
            prompt_first_diff=self.prompt_first_diff,
        )
