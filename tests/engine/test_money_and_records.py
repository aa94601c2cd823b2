"""Money cannot go backwards and no sample stays leased: what a response is charged, a budget run against a provider
that reports negative and NaN costs, an outcome the store cannot record, and failed samples put back to pending."""

from __future__ import annotations

import asyncio
import math
import sqlite3

import pytest

from app.engine.money.budget import CostNotes, charge, usd
from app.engine.run import Run
from app.providers.pricing import ModelPricing
from app.providers.retry import RetryPolicy
from app.records import Completion, Usage
from app.simulator.options import SimulatorOptions
from app.simulator.server import SimulatorServer
from tests.engine.conftest import make_config, open_ingested

PRICES = ModelPricing(0.6, 2.5, 0.6)


# ------------------------------------------------------------------------------------ the charge


def test_a_response_is_charged_the_larger_of_its_reported_cost_and_its_list_price():
    tokens = Usage(prompt_tokens=1000, completion_tokens=2000)
    priced = (1000 * 0.6 + 2000 * 2.5) / 1e6
    assert charge(tokens, PRICES).usd == pytest.approx(priced)
    assert charge(Usage(1000, 2000, cost_usd=0.5), PRICES).usd == 0.5  # billed above the list price
    assert charge(Usage(1000, 2000, cost_usd=0.0), PRICES).usd == pytest.approx(priced)  # never below it


@pytest.mark.parametrize("problem", ["usage.cost is NaN", "usage.cost is -1, negative", "usage.cost is +inf"])
def test_a_cost_that_is_not_believed_is_charged_at_the_list_price_or_zero_without_one(problem):
    u = Usage(1000, 2000, cost_problem=problem)
    priced = charge(u, PRICES)
    assert priced.usd == pytest.approx((1000 * 0.6 + 2000 * 2.5) / 1e6) and priced.problem == problem
    unpriced = charge(u, None)
    assert unpriced.usd == 0.0 and unpriced.priced is None
    notes = CostNotes()
    assert "list price" in notes.note(priced, "s1", "ep") and "no list price is known" in notes.note(
        unpriced, "s2", "ep"
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_a_failed_attempts_reported_cost_that_is_not_finite_or_negative_is_never_charged(value):
    c = charge(None, PRICES, reported_usd=value)
    assert c.usd == 0.0 and c.problem is not None


def test_no_face_prints_nan_or_inf():
    assert usd(float("nan")) == usd(float("inf")) == "$(not a number)"
    assert usd(None) == "-" and usd(0.01234) == "$0.0123" and usd(1234.5) == "$1,234.50"


# ------------------------------------------------------------------------------------ a budget against bad costs


class CostServer:
    """A real loopback provider whose every answer reports the cost `cost_text` (a JSON literal: -1.0, NaN) for
    1,000 prompt and 2,000 completion tokens."""

    def __init__(self, cost_texts: list[str]) -> None:
        self.cost_texts = cost_texts
        self.requests = 0

    async def __aenter__(self) -> CostServer:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

    async def _chat(self, request):
        from aiohttp import web

        await request.read()
        cost = self.cost_texts[self.requests % len(self.cost_texts)]
        self.requests += 1
        body = (
            '{"id":"g","choices":[{"index":0,"message":{"role":"assistant","content":"An answer."},'
            '"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":2000,"cost":' + cost + "}}"
        )
        return web.Response(body=body.encode(), content_type="application/json")


async def test_a_budget_run_against_negative_and_nan_costs_stops_at_its_budget(tmp_path, sample_data):
    priced = (1000 * 0.6 + 2000 * 2.5) / 1e6  # $0.0056 a response at [pricing]
    async with CostServer(["-1.0", "NaN"]) as srv:
        config = make_config(
            tmp_path,
            sample_data,
            endpoints=[{"name": "cheat", "base_url": srv.base_url, "timeout_s": 5.0}],
            limits={"concurrency_initial": 2, "concurrency_max": 2, "budget_usd": 0.05},
        )
        store, _ = await open_ingested(config, sample_data, 60)
        run = Run(config, store)
        try:
            await run.start()
            outcome = await asyncio.wait_for(run.wait(), 60)
            spent = run.snapshot().cost_usd
        finally:
            await run.close()
            await store.close()
    assert outcome.state == "paused" and outcome.reason == "budget reached"
    conn = sqlite3.connect(config.run.database)
    answered = conn.execute("SELECT COUNT(*) FROM samples WHERE state = 'done'").fetchone()[0]
    ledger = conn.execute("SELECT SUM(cost_usd), MIN(cost_usd) FROM responses").fetchone()
    assert 0 < answered < 60 and srv.requests == answered
    assert math.isfinite(ledger[0]) and ledger[1] >= 0 and ledger[0] == pytest.approx(spent)
    assert ledger[0] == pytest.approx(answered * priced) and ledger[0] <= 0.05
    events = [m for (m,) in conn.execute("SELECT message FROM events WHERE kind = 'budget'")]
    assert any("usage.cost is -1, negative" in m for m in events) and any("usage.cost is NaN" in m for m in events)


# ------------------------------------------------------------------------------------ never left leased


class UnstorableClient:
    """A real ChatClient whose answers carry a lone surrogate past the boundary (what a bug in a parser would let
    through): the store's row codec refuses such text."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def complete(self, *args, **kwargs) -> Completion:
        from dataclasses import replace

        completion = await self.inner.complete(*args, **kwargs)
        return replace(completion, content=completion.content + "\ud83d")


async def test_an_outcome_the_store_cannot_record_is_retried_then_failed_with_the_reason_and_never_left_leased(
    tmp_path, sample_data
):
    from app.providers.client import ChatClient

    async with SimulatorServer(
        SimulatorOptions(seed=3), tokenizer_dir=sample_data / "tokenizer", reference=sample_data / "reference.jsonl"
    ) as sim:
        config = make_config(
            tmp_path, sample_data, endpoints=[{"name": "sim", "base_url": sim.base_url, "timeout_s": 5.0}]
        )
        store, _ = await open_ingested(config, sample_data, 5)
        client = ChatClient(config.endpoints[0], config.generation, None)
        run = Run(
            config,
            store,
            clients={"sim": UnstorableClient(client)},
            retry_policy=RetryPolicy(attempts=2, base_s=0.01, cap_s=0.02),
        )
        try:
            await run.start()
            outcome = await asyncio.wait_for(run.wait(), 60)
        finally:
            await run.close()
            await store.close()
            await client.aclose()
    assert outcome.state == "done"
    conn = sqlite3.connect(config.run.database)
    rows = conn.execute("SELECT state, error_class, last_error, tries FROM samples").fetchall()
    assert len(rows) == 5 and all(r[0] == "failed" and r[1] == "unrecordable" for r in rows), rows
    assert all("responses.content holds a lone surrogate" in r[2] and r[3] == 2 for r in rows)
    # both paid attempts of each sample are in the ledger, priced
    costs = conn.execute("SELECT COUNT(*), MIN(cost_usd) FROM responses WHERE error_class = 'unrecordable'").fetchone()
    assert costs[0] == 10 and costs[1] > 0
    events = [m for (m,) in conn.execute("SELECT message FROM events WHERE level = 'error'")]
    assert len(events) == 10 and all("could not be recorded" in m for m in events)
    assert "goes back to pending" in events[0] and any("it is failed" in m for m in events)


# ------------------------------------------------------------------------------------ retry failed


async def test_retry_failed_puts_failed_samples_back_with_a_fresh_allowance_and_keeps_the_ledger(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data, faults={"500": 1.0})
    store, run_id = await open_ingested(config, sample_data, 6)
    policy = RetryPolicy(attempts=2, base_s=0.01, cap_s=0.02)
    run = Run(config, store, retry_policy=policy)
    try:
        await run.start()
        await asyncio.wait_for(run.wait(), 60)
        assert run.snapshot().failed == 6
        before = {k: v for k, v in (await store.counts(run_id)).items() if v}
        n = await run.retry_failed()  # the faults still answer 500: each gets two new attempts and fails again
        assert n == 6 and run.snapshot().counts.samples.pending + run.snapshot().counts.samples.leased == 6
        await asyncio.wait_for(run.wait_finished(), 60)
    finally:
        await run.close()
        await store.close()
    assert before == {"failed": 6}
    conn = sqlite3.connect(config.run.database)
    assert conn.execute("SELECT state, tries, tries_forgiven FROM samples").fetchall() == [("failed", 4, 2)] * 6
    attempts = [a for (a,) in conn.execute("SELECT attempt FROM responses WHERE sample_pk = 1 ORDER BY id")]
    assert attempts == [1, 2, 3, 4]  # numbering goes on; nothing was forgotten
    tallies = dict(conn.execute("SELECT state, SUM(n) FROM sample_tallies GROUP BY state").fetchall())
    assert tallies.get("failed") == 6 and not tallies.get("pending")
    assert (
        conn.execute("SELECT COUNT(*) FROM events WHERE message LIKE '6 failed samples put back%'").fetchone()[0] == 1
    )
