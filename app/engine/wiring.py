"""The bundles the composition root (`app.engine.run.Run._wire`) hands to the orchestration's parts.

Each is a frozen record of collaborators that travel together, built once per started run, so `Flights`,
`Scheduler` and `Steering` take a few named bundles instead of thirteen to fifteen arguments, and a part that
needs one more collaborator of a kind gets it without a new argument at every call:

- `Signals`: the run's state, the operator's event log, and the scheduler's wake event (whoever may have given
  the scheduler something to do sets it).
- `StoreSide`: the store, the run's row, the gate every write passes (`health.writes`), the work source (leases).
- `Capacity`: how much may be in flight and where: the endpoints, their slots, the requests/min and tokens/min
  buckets (None: no limit).
- `Money`: the ledger (budget, counts, tallies) and the forecast (ETA, projected cost).
- `Sending`: how one request goes out: the retry policy, the model's name, the endpoints' health guard.
- `Checking`: how an answer's ids are made and judged: the reconstruction pool (None: text stored as is) and the
  verifier (probes, learning, the quality gate).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.capacity.endpoints import Endpoint
    from app.engine.capacity.slots import EndpointSlots
    from app.engine.fidelity.pool import ReconstructionPool
    from app.engine.fidelity.verify import Verifier
    from app.engine.health.endpoint_health import EndpointGuard
    from app.engine.health.events import EventLog
    from app.engine.health.writes import StoreGate
    from app.engine.money.forecast import Forecast
    from app.engine.money.ledger import Ledger
    from app.engine.work.leases import WorkSource
    from app.engine.work.run_state import RunState
    from app.providers.retry import RetryPolicy
    from app.store.run_store import RunStore
    from app.token_bucket import TokenBucket


@dataclass(frozen=True)
class Signals:
    """The run's state, its event log, and the scheduler's wake event."""

    state: RunState
    events: EventLog
    wake: asyncio.Event


@dataclass(frozen=True)
class StoreSide:
    """The store, the run's row id, the gate of every write, and the work source over them."""

    store: RunStore
    run_id: int
    gate: StoreGate
    source: WorkSource


@dataclass(frozen=True)
class Capacity:
    """The endpoints, their in-flight slots, and the rate buckets (None: no limit)."""

    endpoints: list[Endpoint]
    slots: EndpointSlots
    requests: TokenBucket | None = None  # requests per minute
    tokens: TokenBucket | None = None  # prompt + max_tokens per minute


@dataclass(frozen=True)
class Money:
    """The ledger and the forecast."""

    ledger: Ledger
    forecast: Forecast


@dataclass(frozen=True)
class Sending:
    """How one request goes out: retry policy, model name, endpoint health guard."""

    policy: RetryPolicy
    model: str
    guard: EndpointGuard


@dataclass(frozen=True)
class Checking:
    """Where ids are reconstructed (None: the text is stored as is) and the verifier that judges them."""

    pool: ReconstructionPool | None
    verifier: Verifier
