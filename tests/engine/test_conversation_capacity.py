"""Whole conversations at the endpoint's limit, over a real simulator that records every request as it arrived:
the turns of different conversations interleave so the endpoint stays at its limit although each conversation is
a chain, and each later turn's request begins with its earlier turn's request byte for byte, so the provider's
prompt cache serves it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.config import parse_config
from app.engine.run import Run
from app.engine.work.config_ingest import ingest_config
from app.providers.client import ChatClient
from app.providers.wire import WireLimits
from app.simulator.options import SimulatorOptions
from app.simulator.server import SimulatorServer
from app.store.run_store import RunStore
from tests.engine.conftest import config_data

LIMIT = 8
PRICES = {"prompt_per_m": 0.6, "completion_per_m": 2.5, "cached_prompt_per_m": 0.15}  # the simulator's own list


def _config(tmp_path: Path, sample_data: Path):
    """The sample conversations (16, 68 turns) at a fixed concurrency of LIMIT."""
    data = config_data(
        tmp_path,
        sample_data,
        simulator={"prompt_cache": True},
        limits={"concurrency_initial": LIMIT, "concurrency_min": LIMIT, "concurrency_max": LIMIT},
        pricing={"moonshotai/kimi-k2.5": PRICES},
    )
    data["data"] = {
        "datasets": [
            {"path": str(sample_data / "conversations.openai.jsonl"), "format": "openai-messages", "regenerate": "all"},
            {"path": str(sample_data / "conversations.sharegpt.jsonl"), "format": "sharegpt", "regenerate": "all"},
        ],
        "reference": str(sample_data / "conversations.reference.jsonl"),
    }
    return parse_config(data, base_dir=tmp_path)


async def _run_recorded(config, sample_data: Path, options: SimulatorOptions) -> SimulatorServer:
    """Run `config` to its end against a simulator started here with `options`, recording each request."""
    sim = SimulatorServer(options, tokenizer_dir=sample_data / "tokenizer", model=config.model.name, record=True)
    await sim.start()
    # the configured endpoint is a simulator (so each turn names its reference sample); its client talks to `sim`
    ep = config.endpoints[0].model_copy(update={"base_url": sim.base_url, "simulator": None, "server": "openrouter"})
    client = ChatClient(ep, config.generation, None, limits=WireLimits())
    store = await RunStore.open(config.run.database)
    try:
        await ingest_config(store, config)
        run = Run(config, store, clients={ep.name: client})
        try:
            await run.start()
            await run.wait()
        finally:
            await run.close()
    finally:
        await store.close()
        await client.aclose()
        await sim.close()
    return sim


def _messages_text(body: bytes) -> str:
    """The JSON text of a request's `messages`, exactly as it was sent."""
    text = body.decode()
    start = text.index('"messages":') + len('"messages":')
    while text[start] == " ":
        start += 1
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end]


def _turn(sample_id: str) -> tuple[str, int]:
    conversation, _, k = sample_id.rpartition("#")
    return conversation, int(k)


async def test_each_later_turn_extends_its_parents_request_byte_for_byte_and_hits_the_prompt_cache(
    tmp_path, sample_data_dir
):
    config = _config(tmp_path, sample_data_dir)
    sim = await _run_recorded(
        config,
        sample_data_dir,
        SimulatorOptions(
            reference=sample_data_dir / "conversations.reference.jsonl", prompt_cache=True, logprobs=False, seed=3
        ),
    )
    sent = {r.sample_id: _messages_text(r.body) for r in sim.received}
    later = [sid for sid in sent if _turn(sid)[1] > 1]
    assert len(later) >= 40  # 68 turns in 16 conversations, one conversation ends at its divergent call
    for sid in later:
        conversation, k = _turn(sid)
        parent = sent[f"{conversation}#{k - 1}"]
        assert sent[sid].startswith(parent[:-1] + ","), sid  # the parent's list, its closing bracket reopened
    db = sqlite3.connect(config.run.database)
    try:
        rows = db.execute(
            "SELECT s.sample_id, s.turn, r.cached_tokens, r.prompt_tokens, r.completion_tokens, "
            "r.cost_usd FROM responses r JOIN samples s ON s.pk = r.sample_pk "
            "WHERE r.content IS NOT NULL"
        ).fetchall()
    finally:
        db.close()
    assert {row[0] for row in rows if row[1] > 1} == set(later)
    for sid, turn, cached, prompt, completion, cost in rows:
        if turn > 1:  # served from the cache up to the parent's prompt
            assert 0 < cached <= prompt, sid
        else:
            assert cached == 0, sid
        # the cached prompt tokens are charged at the cached price
        assert cost == pytest.approx(
            (
                (prompt - cached) * PRICES["prompt_per_m"]
                + cached * PRICES["cached_prompt_per_m"]
                + completion * PRICES["completion_per_m"]
            )
            / 1e6,
            rel=1e-9,
        ), sid


async def test_the_endpoint_stays_at_its_limit_while_more_conversations_are_open_than_slots(
    tmp_path, sample_data_dir, monkeypatch
):
    from app.engine.flights import Flights

    started: list[tuple[str, int]] = []  # (turn, slots held with it) at each start, as the engine counted them
    original = Flights.start

    def start(self, flight):
        original(self, flight)
        started.append((flight.sample.sample_id, self._slots.limits[flight.index].in_flight))

    monkeypatch.setattr(Flights, "start", start)
    config = _config(tmp_path, sample_data_dir)
    sim = await _run_recorded(
        config,
        sample_data_dir,
        SimulatorOptions(
            reference=sample_data_dir / "conversations.reference.jsonl",
            logprobs=False,
            seed=3,
            latency_median_ms=150.0,
            latency_p95_ms=300.0,
        ),
    )
    assert len({r.sample_id for r in sim.received}) == len(sim.received) == len(started)  # one request a turn
    assert max(r.in_flight for r in sim.received) <= LIMIT  # the provider never held more than the limit
    # at each start: the conversations that still have this turn or a later one to send; while more of them are
    # open than there are slots, a turn of another conversation is ready whenever a slot frees, so each start
    # fills the endpoint again (one that follows two answers at once starts one short, the next fills it)
    busy = []
    for i, (_, in_flight) in enumerate(started[LIMIT:], LIMIT):
        if len({_turn(later)[0] for later, _ in started[i:]}) > LIMIT:
            busy.append(in_flight)
    assert len(busy) >= 20
    # a starved event loop (a loaded CI host) can deliver several answers in one tick, so one start in twenty may
    # find the endpoint low for a moment; more than that is a scheduler that does not refill
    assert sum(b < LIMIT - 2 for b in busy) <= max(1, len(busy) // 20), busy
    assert sum(b == LIMIT for b in busy) >= 0.8 * len(busy), busy
    # the longest chains start first: the first LIMIT requests are turn 1 of the conversations with most turns
    db = sqlite3.connect(config.run.database)
    try:
        turns = dict(db.execute("SELECT conversation_id, MAX(turns) FROM samples GROUP BY conversation_id"))
    finally:
        db.close()
    assert all(_turn(sid)[1] == 1 for sid, _ in started[:LIMIT])
    assert sorted(turns[_turn(sid)[0]] for sid, _ in started[:LIMIT]) == sorted(turns.values())[-LIMIT:]
