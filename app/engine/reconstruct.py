"""The Reconstructor the engine uses: `app.tokens.Reconstructor` for the run's tokenizer and profile, wrapped
at start in `app.engine.verify.Rebuilder` with the endpoints' learned fidelity profiles.

`PassThroughReconstructor` is what a `Run` built without one uses (benchmarks of the request path alone, tests
of scheduling): the response text is stored as is and no reconstruction row is written.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from pathlib import Path
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


async def open_rebuilder(reconstructor: Any, config: Any, db_path: Path) -> tuple[Any, list[str]]:
    """The engine's Rebuilder over `reconstructor` with the stored fidelity profiles of the config's endpoints
    (app.store.fidelity), and one sentence per profile loaded. A PassThroughReconstructor (or anything that is
    not a tokens Reconstructor) is returned as is."""
    from app.engine.verify import Rebuilder

    if isinstance(reconstructor, Rebuilder) or not hasattr(reconstructor, "measure_text_path"):
        return reconstructor, []
    from app.store.fidelity import load_profiles

    names = {e.name for e in config.endpoints}
    stored = await asyncio.to_thread(load_profiles, db_path, config.model.profile) if db_path.exists() else []
    profiles = [p for p in stored if p.endpoint in names]
    notes = [f"{p.endpoint}{f' / {p.provider}' if p.provider else ''}: applying the learned fidelity profile "
             f"({p.probes} probes) to rebuilds from text" for p in profiles]
    return Rebuilder(reconstructor, profiles), notes


async def rebuild(pool: Executor | None, reconstructor: Any, completion: Completion, flight: Any, endpoint: str) -> Any:
    """Rebuild one result in `pool` (off the event loop; inline without one) as an `app.engine.verify.Rebuilt`:
    a Rebuilder measures the text path of probes and checks the prompt ids; any other reconstructor just
    processes."""
    from app.engine.verify import Rebuilder, Rebuilt

    s = flight.sample
    if isinstance(reconstructor, Rebuilder):
        def call() -> Rebuilt:
            return reconstructor.rebuild(completion, s.reference_ids, s.messages, s.tools, endpoint=endpoint,
                                         measure=flight.probe)
    else:
        def call() -> Rebuilt:
            return Rebuilt(*reconstructor.process(completion, s.reference_ids))
    if pool is None:
        return call()
    return await asyncio.get_running_loop().run_in_executor(pool, call)
