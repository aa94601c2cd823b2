"""A whole engine in its own process, for the crash-safety tests:
`python engine_process.py CONFIG.json [--reconstruct]`.

Runs the config's run to the end (the database must already hold the samples) and exits 0; prints the
engine's in-memory spent figure as `spent=<usd>` on the way out. `--reconstruct` reconstructs token ids with the
config's tokenizer (the reconstruction pool in the path, as in a real run).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.config import parse_config  # noqa: E402
from app.engine.run import Run  # noqa: E402
from app.store.run_store import RunStore  # noqa: E402


async def main(path: str, reconstruct: bool) -> int:
    from app.engine.fidelity.pool import build_reconstructor

    config = parse_config(json.loads(Path(path).read_text()), base_dir=Path(path).parent)
    store = await RunStore.open(config.run.database)
    run = Run(config, store, resume_paused=True, reconstructor=build_reconstructor(config) if reconstruct else None)
    try:
        await run.start()
        print("started", flush=True)
        outcome = await run.wait()
        # the budget guard's figure (what the engine counted as it settled), not the record's: that is the ledger
        print(f"spent={run.budget.spent_usd!r}", flush=True)
    finally:
        await run.close()
        await store.close()
    return 0 if outcome.state == "done" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], "--reconstruct" in sys.argv[2:])))
