"""The run's ETA and projected cost as the snapshot shows them: `app.engine.money.eta.Projector`, fed by every flight.

`Forecast` seeds the Projector at start with the samples still to run (their prompt sizes, `RunStore.open_prompt_sizes`,
~4 JSON characters a token; a conversation's turns waiting on their parents and its open conversations' chains,
`RunStore.open_turn_work`) and what the run's newest stored answers tell (`finished_output_stats` and
`finished_output_lengths`: a resumed run projects at once), tells it how each flight starts, gets its first token,
is sent again and ends, and projects at most once a second (a projection costs 2-20 ms; faces poll at 4 Hz) over
the concurrency held (the endpoints' limit while none is held, e.g. paused), told where the limits are headed
while one still grows (`growth_ceiling`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from app.engine.capacity.endpoints import Endpoint, total_limit
from app.engine.money.budget import Prices
from app.engine.money.eta import Projector
from app.providers.pricing import ModelPricing, cost_of
from app.store.run_store import RunStore
from app.store.store_records import LeasedSample

if TYPE_CHECKING:  # type hints only: money sits below the engine's top, which feeds it flights
    from app.engine.attempt import Flight, Outcome

CHARS_PER_TOKEN = 4  # prompt JSON characters per token, for the projection (not for the budget)
PROJECT_EVERY_S = 1.0  # the ETA is projected afresh at most this often


class Forecast:
    """The Projector of a run and its last projection (when, ETA, cost)."""

    def __init__(self, *, prices: Prices | None, max_tokens: int, stream: bool) -> None:
        self.projector = Projector(prices, max_tokens=max_tokens, stream=stream)
        self._last: tuple[float, float | None, float | None] | None = None

    @property
    def prices(self) -> Prices | None:
        return self.projector.prices

    @prices.setter
    def prices(self, prices: Prices | None) -> None:
        self.projector.prices = prices

    async def load(self, store: RunStore, run_id: int) -> None:
        """Seed the projection with the samples still to run (a conversation's turns waiting on their parents
        included, and its open conversations' chains) and what the stored answers tell."""
        for dataset, (n, chars) in (await store.open_prompt_sizes(run_id)).items():
            # ~4 JSON characters per prompt token (estimate_prompt_tokens' 2 is a deliberate worst case)
            self.projector.add_pending(dataset, chars // max(1, n) // CHARS_PER_TOKEN, n)
        work = await store.open_turn_work(run_id)
        for dataset, (n, chars, outputs) in work.waiting.items():
            self.projector.add_waiting(dataset, chars // max(1, n) // CHARS_PER_TOKEN, outputs // max(1, n), n)
        self.projector.set_chains(work.chains)
        lengths = await store.finished_output_lengths(run_id)
        for dataset, stats in (await store.finished_output_stats(run_id)).items():
            # a resumed run projects from what it learned before
            self.projector.seed(dataset, *stats, lengths=lengths.get(dataset, ()))

    # ---- what the flights tell ---------------------------------------------------------------------

    async def recount_pending(self, store: RunStore, run_id: int) -> None:
        """Take the store's pending samples (and a conversation's turns waiting on their parents, and its open
        chains) as the work to send: after failed samples were put back to pending they are work to come again."""
        sizes = await store.open_prompt_sizes(run_id, leased=False)
        work = await store.open_turn_work(run_id)
        for dataset in {*sizes, *work.waiting, *self.projector.datasets()}:
            n, chars = sizes.get(dataset, (0, 0))
            self.projector.set_pending(dataset, chars // max(1, n) // CHARS_PER_TOKEN, n)
            n, chars, outputs = work.waiting.get(dataset, (0, 0, 0))
            self.projector.set_waiting(dataset, chars // max(1, n) // CHARS_PER_TOKEN, outputs // max(1, n), n)
        self.projector.set_chains(work.chains)

    def started(self, sample: LeasedSample, prompt_est: int) -> None:
        """A sample was sent; `prompt_est` is the budget's worst-case prompt estimate (2 characters a token)."""
        self.projector.started(
            sample.pk,
            sample.dataset,
            2 * (prompt_est - 16) // CHARS_PER_TOKEN,
            time.monotonic(),
            waited=(sample.turn or 0) > 1,
        )

    def followed(self, sample: LeasedSample, ready: int, skipped: int) -> None:
        """A conversation's turn ended, making the next turn ready or ending the conversation (`skipped` turns
        will never run): its chain is one turn shorter, or over."""
        left = sample.turns_after + 1
        self.projector.chain_moved(left, left - 1 if ready else 0)
        if skipped:
            self.projector.unneeded(sample.dataset, skipped)

    def first_token(self, f: Flight) -> None:
        self.projector.first_token(f.sample.pk, time.monotonic())

    def resent(self, f: Flight) -> None:
        """A request of the flight failed and is sent again: its output counts again from nothing."""
        self.projector.resent(f.sample.pk, time.monotonic())

    def requeued(self, f: Flight) -> None:
        """The flight's sample went back to pending unanswered (cancelled, released)."""
        self.projector.requeued(f.sample.pk, time.monotonic())

    def ended(self, f: Flight, o: Outcome, pricing: ModelPricing | None) -> None:
        """How a settled flight ended: answered (its tokens, time and cost), failed, or back to pending."""
        now = time.monotonic()
        c = o.completion
        if c is not None:
            self.projector.finished(
                f.sample.pk,
                c.usage.completion_tokens,
                c.total_s,
                c.ttft_s,
                cost_of(c.usage, pricing),
                now,
                prompt_tokens=c.usage.prompt_tokens,
                cached_tokens=c.usage.cached_tokens,
            )
        elif o.kind == "failed":
            self.projector.dropped(f.sample.pk, now)
        else:
            self.projector.requeued(f.sample.pk, now)

    # ---- the projection ----------------------------------------------------------------------------

    def eta_and_cost(
        self, now: float, spent: float, remaining: int, endpoints: Sequence[Endpoint]
    ) -> tuple[float | None, float | None]:
        """ETA and projected total cost from the tokens still expected over the concurrency held (the limit
        while nothing is held); (0, spent) once nothing remains."""
        if not remaining:
            return 0.0, spent
        last = self._last
        if last is not None and 0.0 <= now - last[0] < PROJECT_EVERY_S:
            eta = None if last[1] is None else max(0.0, last[1] - (now - last[0]))
            return eta, last[2]
        held = self.projector.concurrency(now)
        p = self.projector.project(
            now,
            spent,
            concurrency=held if held >= 1.0 else float(total_limit(endpoints)),
            ceiling=growth_ceiling(endpoints),
        )
        self._last = (now, p.eta_s, p.projected_cost_usd)
        return p.eta_s, p.projected_cost_usd


def loop_now() -> float | None:
    """The event loop's clock (the limiter's), or None off the loop (the limiter then uses its last)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return None


def growth_ceiling(endpoints: Sequence[Endpoint]) -> int | None:
    """Where the endpoints' limits are headed while one still grows (slow start: its maximum; recovery: its
    proven ceiling), the others at their limit; None when none grows (the ETA then holds what is in flight)."""
    now = loop_now()
    total, growing = 0, False
    for ep in endpoints:
        lim = ep.limit
        if lim.reason(now) == "growing":
            growing = True
            total += lim.maximum if lim.capacity_estimate is None else max(lim.limit, lim.capacity_estimate)
        else:
            total += lim.limit
    return total if growing else None
