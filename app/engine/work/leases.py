"""Where the scheduler takes its work from, and the upkeep of what it holds.

`WorkSource` is the seam between the scheduler and what there is to send: it leases up to n items that are ready
now, in the order they should start, takes unused ones back, and keeps the leases of the items this engine holds.
The source is `SampleLeases`, the samples of one run in the store (`RunStore.lease`). Whole conversations go
through it too: a conversation's turn is pending only once the turn before it is stored (its request is the
conversation so far with the model's own earlier answers, written in the transaction that stored the parent), and
the lease order is the scheduling policy: the turns with the longest chain of turns after them first, then oldest
first, so the turns of many conversations interleave and the endpoints stay at their limit to the end. After a
turn with turns after it has settled, `after_turn` says what its end made of the next one (ready, or the
conversation ended with its later turns skipped), so the engine's counts follow and the scheduler leases a ready
turn at once. The scheduler itself never looks inside an item beyond what a request needs (`LeasedSample`: its
messages, tools, dataset, reference ids and tries).

`LeaseKeeper` is the lease heartbeat: every lease_s/3 it extends the leases this engine holds and returns any lease
past its expiry (an engine elsewhere that stopped) to pending, through `WorkSource.keep`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from app.engine.health.events import EventLog
from app.engine.health.writes import StoreGate
from app.engine.work.counts import SampleCounts
from app.store.conversation_ops import next_turn_state
from app.store.run_store import RunStore, StoreWriteError
from app.store.store_records import LeasedSample


class WorkSource(Protocol):
    """What the scheduler leases work from (module doc). Each call is one store transaction; a write the store
    refuses raises `StoreWriteError` (the caller retries it through the `StoreGate`, or leaves it)."""

    async def lease(self, n: int) -> list[LeasedSample]:
        """Up to n items ready to send, in the order they should start, leased to this engine (none: nothing
        is ready now)."""
        ...

    async def release(self, pks: Sequence[int]) -> None:
        """Give leased items back unused: ready again, the lease not counted as an attempt."""
        ...

    async def keep(self, held: Sequence[int]) -> int:
        """Extend the leases of the items this engine holds (`held`) and return every expired lease of the run
        to ready; returns how many expired."""
        ...

    async def counts(self) -> dict[str, int]:
        """Items per state (pending, waiting, leased, done, failed, skipped): the run has ended when none is
        pending or leased."""
        ...

    async def after_turn(self, item: LeasedSample) -> TurnFollow:
        """What the settled end of a conversation's turn (one with turns after it) made of the turns after it."""
        ...


@dataclass(frozen=True, slots=True)
class TurnFollow:
    """What a turn's end made of the turns after it: the next one `ready` (pending, or already leased again),
    `skipped` of them skipped (the conversation ended: diverged, a failed or truncated parent), or neither (the
    turn went back to pending)."""

    ready: int = 0
    skipped: int = 0


class SampleLeases:
    """The samples of one run in the store, leased for `lease_s` seconds at a time by `owner` (host:pid)."""

    def __init__(self, *, store: RunStore, run_id: int, lease_s: float, owner: str) -> None:
        self._store = store
        self._run_id = run_id
        self._lease_s = lease_s
        self._owner = owner

    async def lease(self, n: int) -> list[LeasedSample]:
        """Up to n pending samples: the turns with the longest chain of turns after them first, then oldest first."""
        return await self._store.lease(self._run_id, n, self._lease_s, self._owner)

    async def release(self, pks: Sequence[int]) -> None:
        await self._store.release(self._run_id, pks)

    async def keep(self, held: Sequence[int]) -> int:
        return await self._store.keep_leases(self._run_id, held, self._lease_s, self._owner)

    async def counts(self) -> dict[str, int]:
        return await self._store.counts(self._run_id)

    async def after_turn(self, item: LeasedSample) -> TurnFollow:
        conversation_id, turn = item.conversation_id, item.turn
        if conversation_id is None or turn is None:
            return TurnFollow()
        state, skipped = await self._store.read(lambda conn: next_turn_state(conn, self._run_id, conversation_id, turn))
        return TurnFollow(ready=int(state not in ("", "waiting", "skipped")), skipped=skipped)


class LeaseKeeper:
    """The lease heartbeat of one engine (module doc). `held()` lists the items it holds (in flight and queued);
    `on_returned()` tells the scheduler that expired leases made work ready again."""

    def __init__(
        self,
        *,
        source: WorkSource,
        lease_s: float,
        held: Callable[[], list[int]],
        on_returned: Callable[[], None],
        gate: StoreGate,
        counts: SampleCounts,
        events: EventLog,
    ) -> None:
        self._source = source
        self._lease_s = lease_s
        self._held = held
        self._on_returned = on_returned
        self._gate = gate
        self._counts = counts
        self._events = events

    @property
    def period_s(self) -> float:
        """How often the leases are kept: a third of their length (between 0.05 and 30 s)."""
        return max(0.05, min(self._lease_s / 3.0, 30.0))

    async def run(self) -> None:
        """Keep the leases until cancelled; a store that refuses writes skips a round (the next one tries again)."""
        while True:
            await asyncio.sleep(self.period_s)
            if self._gate.blocked is not None:
                continue
            try:
                expired = await self._source.keep(self._held())
            except StoreWriteError:
                continue
            if expired:
                self._counts.released(expired)
                self._on_returned()
                await self._events.add(
                    "warning",
                    "run",
                    f"{expired} leases expired (held longer than lease_s = {self._lease_s:g}s by "
                    "an engine that stopped); their samples return to pending",
                )
