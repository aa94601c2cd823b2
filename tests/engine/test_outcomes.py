"""Every request ends in a recorded outcome: bad data, bad config, tries across restarts, leases that expire
while the engine runs, raw bodies kept when configured, the control interface, the budget without prices."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from app.config import parse_config
from app.engine.control import RunControl
from app.engine.fidelity.pool import build_reconstructor
from app.engine.run import Run
from app.errors import InputError
from app.providers.retry import RetryPolicy
from app.store.run_store import RunStore
from app.store.store_records import SampleInput
from tests.engine.conftest import config_data, make_config, open_ingested, run_to_end, sample_inputs
from tests.engine.conftest import until as _until


async def test_a_reference_id_beyond_the_vocabulary_fails_that_sample_and_keeps_its_paid_response(
    tmp_path, sample_data
):
    config = make_config(tmp_path, sample_data)
    store = await RunStore.open(config.run.database)
    run_id = await store.ensure_run(config.run.name, config.redacted())
    good = sample_inputs(sample_data, 6)
    bad = SampleInput(good[0].sample_id, good[0].dataset, good[0].messages, good[0].tools, (1, 2, 10**9))
    await store.ingest(run_id, [bad, *good[1:]])
    run = Run(config, store, reconstructor=build_reconstructor(config))
    try:
        await run.start()
        outcome = await asyncio.wait_for(run.wait(), 30)  # never hangs on the bad sample
    finally:
        await run.close()
        await store.close()
    assert outcome.state == "done"
    db = sqlite3.connect(config.run.database)
    row = db.execute(
        "SELECT state, error_class, last_error FROM samples WHERE sample_id = ?", (bad.sample_id,)
    ).fetchone()
    assert row[0] == "failed" and row[1] == "reconstruct" and "outside the vocabulary" in row[2]
    # the paid response is stored, priced, once
    paid = db.execute(
        "SELECT COUNT(*), SUM(cost_usd) FROM responses r JOIN samples s ON s.pk = r.sample_pk "
        "WHERE s.sample_id = ? AND r.content IS NOT NULL",
        (bad.sample_id,),
    ).fetchone()
    assert paid[0] == 1 and paid[1] > 0
    assert db.execute("SELECT COUNT(*) FROM samples WHERE state = 'done'").fetchone()[0] == 5
    errors = [r[0] for r in db.execute("SELECT message FROM events WHERE level = 'error' AND kind = 'sample'")]
    assert len(errors) == 1 and bad.sample_id in errors[0] and "outside the vocabulary" in errors[0]
    assert db.execute("SELECT ledger.spent FROM (SELECT SUM(cost_usd) AS spent FROM responses) AS ledger").fetchone()[
        0
    ] == pytest.approx(run.snapshot().cost_usd)


async def test_credentials_in_a_base_url_built_in_code_are_refused_before_anything_is_leased(tmp_path, sample_data):
    # the config refuses such a URL at load (tests/config/test_url_secrets.py); an endpoint built in code, past
    # the loader, is refused by the engine before a request is made
    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[{"name": "api", "base_url": "https://openrouter.example/api/v1", "timeout_s": 5}],
    )
    endpoint = config.endpoints[0].model_copy(update={"base_url": "https://user:sk-secret@openrouter.example/api/v1"})
    config = config.model_copy(update={"endpoints": [endpoint]})
    store, _ = await open_ingested(config, sample_data, 3)
    run = Run(config, store)
    try:
        with pytest.raises(InputError, match="api_key_env") as info:
            await run.start()
        assert "sk-secret" not in str(info.value)
    finally:
        await run.close()
        await store.close()
    db = sqlite3.connect(config.run.database)
    assert db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall() == [("pending", 3)]


async def test_a_budget_without_prices_is_refused_with_what_to_add(tmp_path, sample_data, monkeypatch):
    # no [pricing] and no endpoint that lists the model in GET /models
    from app.engine.money import ledger
    from app.providers.pricing import PriceQuote

    async def nowhere(model, table, clients):
        return PriceQuote(model, None, "none")

    monkeypatch.setattr(ledger, "prices_at_start", nowhere)
    config = make_config(tmp_path, sample_data, pricing={}, limits={"budget_usd": 0.005})
    store, _ = await open_ingested(config, sample_data, 3)
    try:
        with pytest.raises(InputError, match=r"\[pricing"):
            await Run(config, store).start()
    finally:
        await store.close()


async def test_a_budget_without_config_prices_takes_the_endpoints_models_prices(tmp_path, sample_data):
    # the built-in simulator serves GET /v1/models with pricing, as OpenRouter does
    config = make_config(tmp_path, sample_data, pricing={}, limits={"budget_usd": 5.0})
    store, _ = await open_ingested(config, sample_data, 3)
    run = Run(config, store)
    try:
        await run.start()
        assert run.budget.prices is not None and run.budget.prices.completion_per_m > 0
        await run.events.flush()
    finally:
        await run.close()
        await store.close()
    db = sqlite3.connect(config.run.database)
    messages = [m for (m,) in db.execute("SELECT message FROM events WHERE kind = 'budget'")]
    assert any("GET /models" in m or "/models" in m for m in messages), messages


async def test_attempts_are_counted_per_sample_across_restarts(tmp_path, sample_data):
    config = make_config(
        tmp_path,
        sample_data,
        simulator={"faults": {"500": 1.0}},
        limits={"concurrency_initial": 4, "concurrency_max": 4},
    )
    store, run_id = await open_ingested(config, sample_data, 4)
    db = sqlite3.connect(config.run.database)
    slow = RetryPolicy(attempts=3, base_s=5.0, cap_s=5.0)  # the first failure waits long: the kill comes then
    run = Run(config, store, retry_policy=slow)
    try:
        await run.start()
        await _until(lambda: db.execute("SELECT COUNT(DISTINCT sample_pk) FROM responses").fetchone()[0] == 4)
        await run.pause(now=True)
    finally:
        await run.close()
    run = Run(config, store, retry_policy=RetryPolicy(attempts=3, base_s=0.001, cap_s=0.002), resume_paused=True)
    try:
        await run.start()
        await asyncio.wait_for(run.wait(), 30)
    finally:
        await run.close()
        await store.close()
    rows = db.execute("SELECT sample_pk, GROUP_CONCAT(attempt) FROM responses GROUP BY sample_pk").fetchall()
    assert len(rows) == 4
    # three requests per sample in all (not three per lease), numbered by the sample's real request count
    assert all(sorted(int(a) for a in attempts.split(",")) == [1, 2, 3] for _, attempts in rows)
    assert db.execute("SELECT state, tries, COUNT(*) FROM samples GROUP BY state, tries").fetchall() == [
        ("failed", 3, 4)
    ]


async def test_leases_expire_while_the_engine_runs_and_its_own_are_renewed(tmp_path, sample_data):
    # lease_s shorter than one request: the engine's own leases must be extended, another holder's must expire
    config = make_config(
        tmp_path,
        sample_data,
        simulator={"latency_median_ms": 700.0, "latency_p95_ms": 700.0},
        limits={"concurrency_initial": 2, "concurrency_max": 2, "lease_s": 0.5},
    )
    store, run_id = await open_ingested(config, sample_data, 6)
    run = Run(config, store, lease_batch=1)
    try:
        await run.start()
        stolen = await store.lease(run_id, 2, 0.3, owner="another-host:4242")  # an engine elsewhere that then died
        assert len(stolen) == 2
        outcome = await asyncio.wait_for(run.wait(), 30)
    finally:
        await run.close()
        await store.close()
    assert outcome.state == "done"
    db = sqlite3.connect(config.run.database)
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT sample_pk) FROM responses").fetchone() == (6, 6)
    expired = [r[0] for r in db.execute("SELECT message FROM events WHERE message LIKE '%leases expired%'")]
    assert expired == [
        "2 leases expired (held longer than lease_s = 0.5s by an engine that stopped); their samples return to pending"
    ]


async def test_a_start_returns_this_hosts_dead_leases_and_leaves_another_hosts_live_ones(tmp_path, sample_data):
    import socket

    config = make_config(tmp_path, sample_data)
    store, run_id = await open_ingested(config, sample_data, 4)
    try:
        await store.lease(run_id, 1, 600, owner=f"{socket.gethostname()}:1")
        await store.lease(run_id, 1, 600, owner="another-host:1")
        assert await store.recover_leases(run_id, socket.gethostname()) == 1
        assert (await store.counts(run_id))["leased"] == 1
    finally:
        await store.close()


@pytest.mark.parametrize("cap", [None, 64])
async def test_keep_raw_stores_every_streamed_chunk_up_to_the_cap(tmp_path, sample_data, cap):
    config = make_config(tmp_path, sample_data, stream=True)
    run_cfg = {"keep_raw": True} if cap is None else {"keep_raw": True, "keep_raw_max_bytes": cap}
    config = config.model_copy(update={"run": config.run.model_copy(update=run_cfg)})
    await run_to_end(config, sample_data, 5)
    raws = [json.loads(r[0]) for r in sqlite3.connect(config.run.database).execute("SELECT raw FROM responses")]
    assert len(raws) == 5
    if cap is None:
        assert all(isinstance(r, list) and len(r) > 1 and all("choices" in c or "usage" in c for c in r) for r in raws)
    else:
        assert all(set(r) == {"omitted", "bytes"} and r["bytes"] > cap for r in raws)


async def test_without_keep_raw_no_body_is_stored(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, stream=True)
    await run_to_end(config, sample_data, 3)
    assert sqlite3.connect(config.run.database).execute("SELECT COUNT(raw) FROM responses").fetchone()[0] == 0


async def test_the_engine_is_the_run_control_and_set_concurrency_sticks(tmp_path, sample_data):
    # 8 at a time for 100 ms each: 4 s of work, several of the engine's command polls (once a second)
    config = make_config(
        tmp_path,
        sample_data,
        simulator={"latency_median_ms": 100.0, "latency_p95_ms": 100.0},
        limits={"concurrency_initial": 8, "concurrency_max": 8},
    )
    store, run_id = await open_ingested(config, sample_data, 300)
    run = Run(config, store)
    assert isinstance(run, RunControl)
    try:
        await run.start()
        await store.enqueue_command(run_id, "set_concurrency", {"limit": 2})
        await _until(lambda: run.snapshot().live.concurrency_limit == 2, 5)
        # set_concurrency holds new requests back and cancels none: the ones above the limit finish first
        await _until(lambda: run.snapshot().live.in_flight <= 2, 10)
        seen, done = [], run.snapshot().counts.samples.done  # then watch the wire while ten more answers come back

        def watch() -> bool:
            snap = run.snapshot()
            seen.append(snap.live.in_flight)
            return snap.counts.samples.done >= done + 10

        await _until(watch, 20)
        assert max(seen) <= 2
        await store.enqueue_command(run_id, "set_concurrency", {"limit": "many"})
        await _until(lambda: any("set_concurrency needs a limit" in e.message for e in run.events_since(0)), 10)
        assert run.snapshot().live.concurrency_limit == 2  # the refused command changed nothing
    finally:
        await run.close()
        await store.close()
    db = sqlite3.connect(config.run.database)
    assert (
        db.execute("SELECT COUNT(*) FROM events WHERE message LIKE 'set_concurrency needs a limit%'").fetchone()[0] == 1
    )


async def test_prices_below_the_bill_are_reported_as_an_overshoot_not_as_reached(tmp_path, sample_data):
    from app.simulator.options import SimulatorOptions
    from app.simulator.server import SimulatorServer

    billed = make_config(tmp_path, sample_data).pricing["moonshotai/kimi-k2.5"]  # what the provider charges
    sim = SimulatorServer(
        SimulatorOptions(seed=2),
        tokenizer_dir=sample_data / "tokenizer",
        reference=sample_data / "reference.jsonl",
        pricing=billed,
    )
    await sim.start()
    try:
        # the config's prices are 10x too low, so each reservation is 10x too small
        config = make_config(
            tmp_path,
            sample_data,
            limits={"budget_usd": 0.01},
            generation={"max_tokens": 512},
            pricing={"moonshotai/kimi-k2.5": {"prompt_per_m": 0.06, "completion_per_m": 0.25}},
            endpoints=[{"name": "sim", "base_url": sim.base_url, "timeout_s": 5}],
        )
        run, outcome = await run_to_end(config, sample_data, 300)
    finally:
        await sim.close()
    assert outcome.state == "paused" and outcome.reason == "budget reached"
    messages = [e.message for e in run.events_since(0) if e.kind == "budget"]
    assert any("more than its reserved worst case" in m for m in messages)
    final = messages[-1]
    assert final.startswith("budget $0.0100 passed") and "beyond what was reserved" in final
    assert run.budget.overshoot_usd > 0


async def test_a_model_variant_is_billed_at_its_base_models_config_price(tmp_path, sample_data):
    data = config_data(
        tmp_path, sample_data, pricing={"moonshotai/kimi-k2.5": {"prompt_per_m": 0.6, "completion_per_m": 2.5}}
    )
    data["model"]["name"] = "moonshotai/kimi-k2.5:floor"
    config = parse_config(data, base_dir=tmp_path)
    store, _ = await open_ingested(config, sample_data, 3)
    run = Run(config, store)
    try:
        await run.start()
        await run.wait()
        assert run.pricing is not None and run.pricing.completion_per_m == 2.5
    finally:
        await run.close()
        await store.close()
    db = sqlite3.connect(config.run.database)
    tokens, cost = db.execute(
        "SELECT SUM(prompt_tokens), SUM(cost_usd) FROM responses WHERE error_class IS NULL"
    ).fetchone()
    completion = db.execute("SELECT SUM(completion_tokens) FROM responses WHERE error_class IS NULL").fetchone()[0]
    assert cost == pytest.approx((tokens * 0.6 + completion * 2.5) / 1e6, rel=1e-6)
