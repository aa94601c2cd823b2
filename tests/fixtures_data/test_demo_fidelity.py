"""The demo as shipped proves its own fidelity: every endpoint gets verified probe samples, the match rate has
data from the first results on, and the clean endpoint has no text or structure mismatch (its empty-reasoning
answers, which a stream returns without a reasoning field, are reconstructed with their closed think block).

The shipped config runs with its latency, pacing and hangs taken out (the same samples, faults and endpoints:
only the clock is faster), as `eaglewatch run --headless sample_data/demo.toml` does at full length."""

from __future__ import annotations

import asyncio
import sqlite3

from app.config import load_config
from app.engine.fidelity.pool import build_reconstructor


async def test_every_demo_endpoint_is_verified_and_the_clean_one_has_no_mismatch(sample_data_dir, tmp_path):
    from app.engine.run import Run
    from app.engine.work.config_ingest import ingest_config
    from app.store.run_store import RunStore

    config = load_config(sample_data_dir / "demo.toml")
    fast = []
    for ep in config.endpoints:
        faults = {k: v for k, v in ep.simulator.faults.items() if k != "hang"}
        sim = ep.simulator.model_copy(
            update={"latency_median_ms": 0.0, "latency_p95_ms": 0.0, "tokens_per_s": 0.0, "faults": faults}
        )
        fast.append(ep.model_copy(update={"simulator": sim, "timeout_s": 10.0}))
    config = config.model_copy(
        update={"endpoints": fast, "run": config.run.model_copy(update={"database": tmp_path / "demo.db"})}
    )
    store = await RunStore.open(config.run.database)
    first_rate_at = None
    try:
        await ingest_config(store, config)
        run = Run(config, store, reconstructor=build_reconstructor(config))
        try:
            await run.start()
            deadline = asyncio.get_running_loop().time() + 120
            while run.state == "running" and asyncio.get_running_loop().time() < deadline:
                snap = run.snapshot()  # the match rate has data while the run is young
                if first_rate_at is None and snap.counts.answers.measured:
                    first_rate_at = snap.done
                await asyncio.sleep(0.05)
            outcome = await asyncio.wait_for(run.wait(), 120)
        finally:
            await run.close()
    finally:
        await store.close()
    assert outcome.state == "done", outcome
    assert first_rate_at is not None and first_rate_at <= 30, first_rate_at
    with sqlite3.connect(config.run.database) as conn:
        rows = conn.execute(
            "SELECT p.endpoint, r.category, r.flags FROM reconstructions r JOIN responses p ON p.id = r.response_id"
        ).fetchall()
    by_endpoint: dict[str, list] = {}
    for endpoint, category, flags in rows:
        by_endpoint.setdefault(endpoint, []).append((category, flags or ""))
    assert set(by_endpoint) == {"simulator", "quirky-upstream"}
    for endpoint, got in by_endpoint.items():
        assert sum("text_path:" in f for _, f in got) > 0, endpoint  # verified probe samples on every endpoint
    clean = [c for c, _ in by_endpoint["simulator"]]
    assert not [c for c in clean if c in ("text_mismatch", "structure_mismatch")], clean
    states = {(s.endpoint, s.state) for s in run._verifier.statuses()}
    assert {state for _, state in states} == {"verified"}, states
