"""The Reconstructor the engine uses: the real one from `app.tokens` when it is available, else a pass-through.

The pass-through keeps the engine useful before (or without) token reconstruction: the response text is
stored as is and the verdict is `unchecked`, with no reconstruction row written.
"""

from __future__ import annotations

from typing import Any

from app.records import Completion, Reconstruction, Verdict


class PassThroughReconstructor:
    """Stores text only: no reconstruction, verdict `unchecked`."""

    def process(self, completion: Completion, reference_ids: tuple[int, ...] | None) -> tuple[Reconstruction | None, Verdict | None]:
        """Return (None, None): nothing rebuilt, nothing compared."""
        return None, None


def build_reconstructor(config: Any) -> Any:
    """The tokens package's Reconstructor for the config's tokenizer and profile, or the pass-through
    when `app.tokens` does not provide one yet. A tokenizer that fails to load is an operator error."""
    try:
        from app.tokens import Reconstructor, get_profile, load_tokenizer  # type: ignore[attr-defined]
    except ImportError:
        return PassThroughReconstructor()
    return Reconstructor(get_profile(config.model.profile), load_tokenizer(config.model.tokenizer))
