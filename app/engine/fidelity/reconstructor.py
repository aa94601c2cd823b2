"""The engine's seam to the tokens package: what it needs of a reconstructor, and nothing it probes for.

`CompletionReconstructor` is everything the engine calls on one: `process` (reconstruct a response's ids and judge
them), `measured_category` (the text-only reconstruction's verdict category against true ids), and the `profile`,
`tokenizer`
and `fidelity`
profile it was built with (the engine's `app.engine.fidelity.verify.EndpointReconstructor` builds one more per learned
fidelity
profile
from them, and `app.engine.fidelity.pool.ReconstructorRecipe` reconstructs it in a worker process from the tokenizer's
folder). `app.tokens.Reconstructor` is the implementation (`app.engine.fidelity.pool.build_reconstructor`); a Run
given none stores text only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.records import Completion, Reconstruction, Verdict
from app.tokens.fidelity_profile import FidelityProfile
from app.tokens.profile import Profile
from app.tokens.tokenizer import Tokenizer


class CompletionReconstructor(Protocol):
    """What the engine needs to reconstruct a response's token ids (`app.tokens.Reconstructor`)."""

    profile: Profile
    tokenizer: Tokenizer
    fidelity: FidelityProfile | None  # the learned server-side text steps it inverts (None: none)

    def process(
        self, completion: Completion, reference_ids: Sequence[int] | None = None
    ) -> tuple[Reconstruction, Verdict]:
        """Reconstruct `completion`'s output ids and compare them with `reference_ids` (None: unchecked)."""
        ...

    def measured_category(self, completion: Completion, true_ids: Sequence[int]) -> str:
        """The verdict category of the text-only reconstruction of `completion` against its true ids."""
        ...
