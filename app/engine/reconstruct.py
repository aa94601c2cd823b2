"""The Reconstructor the engine uses: `app.tokens.Reconstructor` for the run's tokenizer and profile.

`PassThroughReconstructor` is what a `Run` built without one uses (benchmarks of the request path alone, tests
of scheduling): the response text is stored as is and no reconstruction row is written.
"""

from __future__ import annotations

from typing import Any, Protocol

from app.records import Completion, Reconstruction, Verdict


class CompletionReconstructor(Protocol):
    """What the engine needs to rebuild a response's token ids (`app.tokens.Reconstructor`)."""

    def process(self, completion: Completion, reference_ids: tuple[int, ...] | None) -> tuple[Reconstruction | None, Verdict | None]: ...


class PassThroughReconstructor:
    """Stores text only: no reconstruction, verdict `unchecked`."""

    def process(self, completion: Completion, reference_ids: tuple[int, ...] | None) -> tuple[Reconstruction | None, Verdict | None]:
        """Return (None, None): nothing rebuilt, nothing compared."""
        return None, None


def build_reconstructor(config: Any) -> Any:
    """The tokens package's Reconstructor for the config's tokenizer and profile (a tiktoken model gets the
    profile's pre-tokeniser pattern). A tokenizer that fails to load is an operator error."""
    from app.tokens import Reconstructor, get_profile, load_tokenizer

    profile = get_profile(config.model.profile)
    return Reconstructor(profile, load_tokenizer(config.model.tokenizer, profile.pretokenizer_pattern))
