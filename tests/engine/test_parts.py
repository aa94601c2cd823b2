"""The engine's parts at their own seams: the scheduler over a work source that orders and gates its items (what
a conversation source will do), and the Settler built with every collaborator named."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3

import pytest

from app.engine.attempt import Flight, Outcome
from app.engine.capacity.endpoints import close_endpoints, open_endpoints
from app.engine.capacity.limiter import AdaptiveLimit
from app.engine.capacity.slots import EndpointSlots
from app.engine.fidelity.verify import Verifier
from app.engine.health.events import EventLog
from app.engine.health.writes import StoreGate
from app.engine.money.forecast import Forecast
from app.engine.money.ledger import Ledger
from app.engine.scheduler import Scheduler
from app.engine.settle import Settler
from app.engine.wiring import Capacity, Money, Signals, StoreSide
from app.engine.work.run_state import RunState
from app.store.run_store import RunStore
from app.store.store_records import LeasedSample
from tests.engine.conftest import make_config, open_ingested


@dataclasses.dataclass
class _Turn:
    pk: int
    after: int | None  # the item that must be done before this one is ready (None: ready at once)
    chain_left: int  # items of its chain still to run, this one included
    state: str = "pending"


class ChainSource:
    """A work source whose items wait on their parent (turn k on turn k-1) and are leased longest chain first."""

    def __init__(self, turns: list[_Turn]) -> None:
        self.turns = {t.pk: t for t in turns}

    def _ready(self, t: _Turn) -> bool:
        return t.state == "pending" and (t.after is None or self.turns[t.after].state == "done")

    async def lease(self, n: int) -> list[LeasedSample]:
        ready = sorted((t for t in self.turns.values() if self._ready(t)), key=lambda t: (-t.chain_left, t.pk))[:n]
        for t in ready:
            t.state = "leased"
        return [
            LeasedSample(t.pk, f"s{t.pk}", "chains", [{"role": "user", "content": f"turn {t.pk}"}], None, 1, None)
            for t in ready
        ]

    async def release(self, pks) -> None:
        for pk in pks:
            self.turns[pk].state = "pending"

    async def keep(self, held) -> int:
        return 0

    async def counts(self) -> dict[str, int]:
        out = dict.fromkeys(("pending", "leased", "done", "failed", "skipped"), 0)
        for t in self.turns.values():
            out[t.state] += 1
        return out


class RecordingFlights:
    """Flights that answer on the next turn of the loop: record the start order, give back the slot and the
    reservation, mark the item done at the source."""

    def __init__(self, source: ChainSource, slots: EndpointSlots, ledger: Ledger, wake: asyncio.Event) -> None:
        self.source, self.slots, self.ledger, self.wake = source, slots, ledger, wake
        self.started: list[int] = []
        self.in_flight: set[int] = set()
        self.settled = asyncio.Event()

    def __len__(self) -> int:
        return len(self.in_flight)

    def start(self, flight: Flight) -> None:
        self.started.append(flight.sample.pk)
        self.in_flight.add(flight.sample.pk)
        asyncio.get_running_loop().call_later(0.01, self._end, flight)

    def _end(self, flight: Flight) -> None:
        self.slots.release(flight.index)
        self.ledger.budget.settle(flight.reserved_usd, 0.0)
        self.source.turns[flight.sample.pk].state = "done"
        self.in_flight.discard(flight.sample.pk)
        self.settled.set()
        if not self.in_flight:
            self.wake.set()


async def test_the_scheduler_starts_work_in_the_sources_order_and_as_it_becomes_ready(tmp_path, sample_data):
    """Conversation A has three turns, each ready once the one before is done; B has one. Leased longest chain
    first, A's first turn starts before B's although B is older, and A's later turns start as their parents end."""
    config = make_config(tmp_path, sample_data)
    b1, a1, a2, a3 = _Turn(1, None, 1), _Turn(2, None, 3), _Turn(3, 2, 2), _Turn(4, 3, 1)
    source = ChainSource([b1, a1, a2, a3])
    store = await RunStore.open(config.run.database)
    try:
        state = RunState(store=store)
        state.run_id = await store.ensure_run(config.run.name, config.redacted())
        await state.set("running", None)
        gate = StoreGate(lambda error: None)
        events = EventLog(store, gate)
        ledger = Ledger(config=config, started_m=state.started_m)
        slots = EndpointSlots([AdaptiveLimit(2, 1, 2)], [1.0])
        wake = asyncio.Event()
        flights = RecordingFlights(source, slots, ledger, wake)

        async def no_pause(reason: str) -> None:
            raise AssertionError(f"nothing should pause this run: {reason}")

        scheduler = Scheduler(
            config=config,
            store=StoreSide(store, state.run_id, gate, source),
            flights=flights,
            capacity=Capacity([], slots),
            money=Money(ledger, Forecast(prices=None, max_tokens=64, stream=False)),
            signals=Signals(state, events, wake),
            pause=no_pause,
            lease_batch=2,
        )
        task = asyncio.create_task(scheduler.run())
        try:
            await asyncio.wait_for(state.finished.wait(), 20)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await store.close()
    assert flights.started == [2, 1, 3, 4]
    assert state.current == "done" and ledger.counts["done"] == 4
    assert any(e.message == "run finished: 4 done, 0 failed" for e in events.since(0))


async def test_the_settler_takes_every_collaborator_by_name_at_construction(tmp_path, sample_data):
    config = make_config(tmp_path, sample_data)
    store, run_id = await open_ingested(config, sample_data, 2)
    endpoints = await open_endpoints(config, started=0.0)  # the built-in simulator on loopback
    try:
        gate = StoreGate(lambda error: None)
        events = EventLog(store, gate)
        events.run_id = run_id
        ledger = Ledger(config=config, started_m=0.0)
        await ledger.load(store, run_id)
        decided = []
        parts = dict(
            config=config,
            store=store,
            run_id=run_id,
            gate=gate,
            events=events,
            ledger=ledger,
            endpoints=endpoints.items,
            slots=EndpointSlots([e.limit for e in endpoints.items], [1.0]),
            verifier=Verifier.of(config),
            attempts=config.generation.attempts,
            on_decision=decided.append,
        )
        with pytest.raises(TypeError):
            Settler(*parts.values())  # positional: refused, so no argument lands in the wrong place
        settler = Settler(**parts)
        with pytest.raises(dataclasses.FrozenInstanceError):
            settler.verifier = Verifier.of(config)  # nothing is patched in after construction
        sample = (await store.lease(run_id, 1, 60.0, "test:1"))[0]
        ledger.counts.leased(1)
        flight = Flight(sample, 0.0, None)
        await settler.settle(flight, Outcome("failed", 0, error_class="attempts_exhausted", message="4 requests sent"))
    finally:
        await close_endpoints(endpoints)
        await store.close()
    assert (ledger.counts["failed"], ledger.counts["leased"], ledger.counts["pending"]) == (1, 0, 1)
    db = sqlite3.connect(config.run.database)
    assert db.execute("SELECT state, error_class FROM samples WHERE pk = ?", (sample.pk,)).fetchone() == (
        "failed",
        "attempts_exhausted",
    )
    assert decided == []
