"""Adaptive in-flight limit per endpoint: find the provider's capacity fast, hold it, re-probe it.

The rule, per endpoint (pure and synchronous: the caller passes the clock reading):

- **Levels.** `take(now)` returns a `Ticket` with the request's *level* (how many requests were on the wire to
  the endpoint with it: a slot still held by an answered request whose result is being stored, `mark_answered`,
  is no longer at the provider and does not count), its start time and the limiter's *epoch* (cuts so far). A
  success at level n shows the provider served n at once; a 429 at level n says it would not. Counting the
  slots instead proved levels the provider never admitted (results being stored add to them), and the 429s at
  those levels then read as capacity falling. The ceiling (`capacity_estimate`) is the level proven since the
  last cut; two successes above it are needed to raise it (one alone may have
  slipped in while a refused request was still on its way back: the client counted it, the server did not).
- **Slots.** The limit bounds the requests on the wire, as the levels count them: a request whose answer is
  being reconstructed and stored keeps its slot (`in_flight`), but the next request may already go to the provider
  (`has_room`). All slots together stay under `maximum`, which bounds the answers a crash can lose before they
  are stored. Holding the provider's slot through the client's own reconstruction and store left a hidden cap of 24
  about 5-10 % idle when each turn of a conversation waits for its parent's store (`bench/conversations.py`).
- **The start.** By default the limit starts at the maximum (`concurrency_initial` unset = `concurrency_max`),
  what a fixed-concurrency client sends: a hidden cap below it costs one refusal per excess request, once
  (the first wave's 429s come back within a network round trip and end slow start at the cap), while a
  lower start costs round trips of slow start on every run (1.06-1.13x a naive fixed 64 at 2 % random 429s
  from 8). A configured `concurrency_initial` starts slow start there.
- **Slow start** (TCP slow start, RFC 5681 3.1): until an overload, each success while the limit was the
  bottleneck adds one, so the limit doubles per round trip. The first 429 at level n ends it with
  limit = ceiling = n - 1, the level the server demonstrably admitted, not a blind multiplicative cut.
- **Recovery and probing** (CUBIC, RFC 9438: grow fast back to the last maximum, probe gently above it):
  below the ceiling the limit grows by one per success; at the ceiling it probes above it once per gap
  (step 1, 2, 4, ... while probes are served). A 429 above the ceiling fails the probe: back to the ceiling,
  and the gap doubles (up to `max_probe_gap_s`), so a hard cap costs one 429 per probe and probes thin out.
- **A single random 429 is forgotten.** A 429 that set the ceiling stays *suspect*: when a deeper request
  sent no earlier is served, it was noise and the limiter goes back to where it was (slow start resumes).
  A 429 at a level already proven is noise too, unless overloads exceed `noise_tolerance` of the last
  max(2 x limit, 50) outcomes (three at least): then the capacity fell (a cap that drops mid-run, a quota run
  dry), the limit is cut by `reduce_factor` (CUBIC's beta, 0.7) and rediscovered from there by slow start.
  Only requests started since the last cut count (their epoch): one burst cuts once, and the successes of
  requests from before a cut do not grow the limit (TCP's one reduction per window; ACKs of new data only).
- **Retry-After** is honoured per endpoint (`cooldown_until`: nothing new starts there) when the limit cannot
  answer the overload itself: on a cut for falling capacity, at the minimum limit, and when pinned. A 429
  answered by the level (slow start's end, a failed probe) or forgiven as noise only delays its own retry.
- **Latency** (HyStart's delay-increase exit; Netflix concurrency-limits `Gradient2Limit`; Envoy's adaptive
  concurrency gradient controller): queueing servers (SGLang, vLLM) never answer 429, their latency grows.
  Latencies (TTFT when streaming) gather in rounds, sized when they start: half of `round_min` in slow
  start (so a queue ends it within a round trip or two), max(`round_min`, limit) after. The floor is the
  lowest round median of the last `floor_window_s`, the first round left out (it holds the fastest of the
  first wave). Two rounds in a row over `latency_tolerance` x floor (and `latency_slack_s` past it, so a
  fast server's floor of a few ms does not read the client's own CPU jitter as a queue) multiply the limit by tolerance
  x floor /
  median (at least 0.5); while latency holds the limit, each round within tolerance adds sqrt(limit)
  (Gradient2's queue allowance), never past the proven ceiling + 1. A tolerance of 2 keeps a queueing
  server's batch slots full (its throughput is flat beyond them) and keeps a lognormal latency's noise
  from reading as a queue. A server that queues from the first wave on (a start at the maximum) shows no
  unqueued latency to take a floor from: the limit stays, which keeps its slots full as a naive client does.
- `set_limit` pins the limit (operator): nothing adapts it until the next `set_limit`.

The engine gives every signal: `EndpointSlots` takes slots with `take(now)` on the loop's clock and keeps
the ticket on the request's Flight; `Settler` answers with `on_success(saturated, ticket=, latency_s=, now=)`
(`limiter_latency`: TTFT when streamed) and `on_overload(now, retry_after_s, ticket=)`. Calls without
tickets or a clock still work, with the in-flight count standing for the level and success rounds for the
clock.

References: RFC 5681 (TCP congestion control), RFC 9438 (CUBIC), Ha & Rhee, "Taming the elephants: new TCP
slow start" (HyStart, 2011), Netflix concurrency-limits `concurrency-limits-core/.../limit/Gradient2Limit.java`,
Envoy `source/extensions/filters/http/adaptive_concurrency/controller/gradient_controller.cc`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from app.records import Completion

REASONS = ("growing", "at ceiling", "cooling down after 429", "latency rising", "pinned")


def limiter_latency(completion: Completion) -> float:
    """The latency signal of one success: its time to first token when streamed (what a queueing server
    delays), else its whole latency."""
    ttft = completion.ttft_s
    return float(ttft) if ttft is not None else float(completion.total_s)


@dataclass(frozen=True, slots=True)
class LimitChange:
    """A change of the limit worth an operator event ("concurrency reduced from 20 to 15 ...")."""

    old: int
    new: int
    cooldown_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class Ticket:
    """What `take` hands out and the caller gives back with the outcome: the request's level and epoch."""

    level: int  # requests in flight on this endpoint with this one, when it started
    started: float  # clock reading when it started (the caller's clock; 0.0 when not given)
    epoch: int  # cuts before it started: overloads of requests from before a cut do not cut again


@dataclass(frozen=True, slots=True)
class LimiterState:
    """One endpoint's limit for dashboards: `limit`, why it is there, and the capacity measured so far."""

    limit: int
    in_flight: int
    reason: str  # one of REASONS
    capacity_estimate: int | None  # highest level proven since the last cut; None while still growing
    cooldown_s: float  # seconds of Retry-After left (0 when none)
    latency_floor_ms: float | None
    latency_recent_ms: float | None
    overloads: int  # 429/503/529 seen
    forgiven: int  # of those, taken for random noise
    cuts: int


class AdaptiveLimit:
    """In-flight limit for one endpoint; `take`/`release` count slots, `on_*` adapt the limit."""

    def __init__(
        self,
        initial: int,
        minimum: int,
        maximum: int,
        *,
        reduce_factor: float = 0.7,
        noise_tolerance: float = 0.10,
        latency_tolerance: float = 2.0,
        latency_slack_s: float = 0.025,
        round_min: int = 32,
        floor_window_s: float = 300.0,
        min_probe_gap_s: float = 0.25,
        max_probe_gap_s: float = 8.0,
        default_cooldown_s: float = 1.0,
        max_cooldown_s: float = 60.0,
    ) -> None:
        if minimum < 1 or maximum < minimum:
            raise ValueError(f"concurrency bounds must satisfy 1 <= min <= max, got min={minimum} max={maximum}")
        self.minimum = minimum
        self.maximum = maximum
        self.limit = min(max(initial, minimum), maximum)
        self.in_flight = 0
        self.answered = 0  # of the slots in flight, those whose request was answered (its result being stored)
        self.reduce_factor = reduce_factor
        self.noise_tolerance = noise_tolerance
        self.latency_tolerance = latency_tolerance
        # a queue must add at least this much too: on a fast server (a floor of a few ms) the client's own CPU
        # jitter doubles the latency without any queue behind it
        self.latency_slack_s = latency_slack_s
        self.round_min = round_min
        self.floor_window_s = floor_window_s
        self.min_probe_gap_s = min_probe_gap_s
        self.max_probe_gap_s = max_probe_gap_s
        self.default_cooldown_s = default_cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.cooldown_until = 0.0
        self.ceiling: int | None = None  # None: slow start (no overload or queue seen yet)
        self.operator_cap: int | None = None  # set_limit pins the limit
        self.cuts = 0
        self.overloads = 0
        self.forgiven = 0
        self._epoch = 0
        self._outcomes: deque[bool] = deque(maxlen=512)  # True: overload
        self._probe_step = 1
        self._probe_gap_s = min_probe_gap_s
        self._next_probe = 0.0
        self._round: list[float] = []
        self._round_size = round_min
        self._rounds = 0
        self._slow_rounds = 0  # consecutive rounds over tolerance x floor
        self._round_medians: deque[tuple[float, float]] = deque()  # (clock, median latency s)
        self._recent_latency: float | None = None
        self._latency_held = False  # the last cut came from latency
        # the 429 that last set the ceiling: (level, its epoch, ceiling, probe step and limit before it, when
        # it was sent); a request as deep sent no earlier and served proves it was noise
        self._suspect: tuple[int, int, int | None, int, int, float] | None = None
        self._deep: list[int] = []  # levels of successes above the ceiling, not yet a proof
        self._since_probe = 0
        self._fresh_epoch = 0  # successes of requests started in this epoch or later may grow the limit
        self._now = 0.0

    # ---- slots -----------------------------------------------------------------------------------

    @property
    def on_wire(self) -> int:
        """Requests at the provider now: the slots held, less those answered and being stored."""
        return self.in_flight - self.answered

    def has_room(self) -> bool:
        """A slot is free: fewer than `limit` requests on the wire (an answered request whose result is being
        stored is no longer at the provider, so its slot does not keep the provider below its limit) and fewer
        than `maximum` slots held in all (answered ones included: what bounds the answers a crash can lose)."""
        return self.on_wire < self.limit and self.in_flight < self.maximum

    def can_start(self, now: float) -> bool:
        """True when a request may start now (`has_room` and no cooldown)."""
        return self.has_room() and now >= self.cooldown_until

    def take(self, now: float | None = None) -> Ticket:
        """Count one request as started (call only after `can_start`); give the ticket back with its outcome."""
        self.in_flight += 1
        if now is not None:
            self._now = max(self._now, now)
        return Ticket(max(1, self.in_flight - self.answered), 0.0 if now is None else now, self._epoch)

    def mark_answered(self) -> None:
        """One request in flight has its answer (or its final error): it keeps its slot until its result is
        stored, but the provider no longer holds it, so it is left out of the levels of the requests after it."""
        self.answered = min(self.in_flight, self.answered + 1)

    def release(self, answered: bool = False) -> None:
        """Count one request as ended (success, failure or cancellation); `answered`: it was marked answered."""
        self.in_flight = max(0, self.in_flight - 1)
        if answered:
            self.answered = max(0, self.answered - 1)
        self.answered = min(self.answered, self.in_flight)

    # ---- signals ---------------------------------------------------------------------------------

    def _cap(self) -> int:
        return self.maximum if self.operator_cap is None else min(self.maximum, self.operator_cap)

    def _level(self, ticket: Ticket | None) -> int:
        return ticket.level if ticket is not None else max(1, self.in_flight)

    def on_success(
        self,
        saturated: bool = True,
        *,
        ticket: Ticket | None = None,
        latency_s: float | None = None,
        now: float | None = None,
    ) -> LimitChange | None:
        """Record a success (its ticket, latency — TTFT when streaming — and clock); may grow or, on a
        rising latency, cut the limit. `saturated`: the limit was the bottleneck (work was waiting)."""
        clocked = now is not None
        if now is not None:
            self._now = max(self._now, now)
        now = self._now
        self._outcomes.append(False)
        if self.operator_cap is not None and self.limit >= self.operator_cap:
            return None  # pinned: nothing adapts until the next set_limit
        level = self._level(ticket)
        if latency_s is not None:
            change = self.on_latency(latency_s, now, ticket=ticket)
            if change is not None:
                return change
        old = self.limit
        suspect = self._suspect
        if suspect is not None and level > suspect[0] and (ticket is None or ticket.started >= suspect[5]):
            # a request as deep as the refused one was served (sent alongside it, or a later probe): the
            # 429 was noise — back to where the limiter was (slow start resumes if it was slow start)
            self._suspect = None
            self.ceiling = suspect[2] if suspect[2] is None else max(suspect[2], level)
            self._probe_step, self._probe_gap_s = suspect[3], self.min_probe_gap_s
            self.limit = max(self.limit, min(self._cap(), suspect[4]))
            self._fresh_epoch = suspect[1]  # requests started alongside it count for growth again
            self.forgiven += 1
        if self.ceiling is not None and level > self.ceiling:
            # served above the ceiling: a successful probe (or a random 429 set the ceiling). Two such
            # successes prove the lower of their levels: one alone may have slipped in while a refused
            # request was still on its way back (the client counted it, the server did not)
            self._deep.append(level)
            if len(self._deep) >= 2:
                self.ceiling = min(self._deep)
                self._deep.clear()
                if self.ceiling >= self.limit:  # the whole probe is proven: probe further, sooner
                    self._probe_step = min(self._probe_step * 2, 64)
                    self._probe_gap_s = self.min_probe_gap_s
        if (
            not saturated
            or (clocked and now < self.cooldown_until)
            or (ticket is not None and ticket.epoch < self._fresh_epoch)
        ):
            return None  # grow only on requests started since the last cut (TCP: ACKs of new data)
        cap = self._cap()
        if self._latency_held:
            return None  # latency rounds move the limit now (on_latency)
        if self.ceiling is None or self.limit < self.ceiling:
            self.limit = min(cap, self.limit + 1)  # slow start, or recovery back to the ceiling
        elif (now >= self._next_probe) if clocked else self._since_probe >= self.limit:
            # (without a clock reading, a round of successes as large as the limit stands for the gap)
            self.limit = min(cap, self.ceiling + self._probe_step)
            self._next_probe = now + self._probe_gap_s
            self._since_probe = 0
        else:
            self._since_probe += 1
        if self.limit != old:
            self._latency_held = False
            return LimitChange(old, self.limit, 0.0, "growing")
        return None

    def on_latency(self, latency_s: float, now: float, *, ticket: Ticket | None = None) -> LimitChange | None:
        """Record one success's latency; at the end of a round, cut when its median is past tolerance x floor."""
        self._now = max(self._now, now)
        if ticket is not None and ticket.epoch < self._epoch:
            return None  # started before the last cut: says nothing about the current limit
        if not self._round:  # a round's size is fixed when it starts (slow start would stretch the first one)
            # (in slow start short rounds, so a queue ends it within a round trip or two, as in HyStart)
            self._round_size = max(8, self.round_min // 2) if self.ceiling is None else max(self.round_min, self.limit)
        self._round.append(latency_s)
        if len(self._round) < self._round_size:
            return None
        values = sorted(self._round)
        self._round = []
        median = values[len(values) // 2]
        self._recent_latency = median
        while self._round_medians and self._round_medians[0][0] < now - self.floor_window_s:
            self._round_medians.popleft()
        self._rounds += 1
        if self._rounds == 1:
            return None  # the first round is the fastest of the first wave: too low for a floor
        self._round_medians.append((now, median))
        floor = min(m for _, m in self._round_medians)
        if self.operator_cap is not None or floor <= 0:
            return None
        if median <= max(self.latency_tolerance * floor, floor + self.latency_slack_s):
            if self._latency_held and self.limit < self._cap():
                # held by latency: grow by Gradient2's queue allowance, sqrt(limit), per round within tolerance
                # (never more than one past the proven ceiling: a hard cap may sit there too)
                old = self.limit
                grown = self.limit + max(1, math.isqrt(self.limit))
                self.limit = min(self._cap(), grown if self.ceiling is None else min(grown, self.ceiling + 1))
                self._slow_rounds = 0
                return LimitChange(old, self.limit, 0.0, "growing") if self.limit != old else None
            self._slow_rounds = 0
            return None
        self._slow_rounds += 1
        if self._slow_rounds < 2:
            return None  # two rounds in a row: one slow round is the lognormal tail, not a queue
        gradient = max(0.5, self.latency_tolerance * floor / median)
        old = self.limit
        self.limit = max(self.minimum, min(self.limit, math.floor(self.limit * gradient)))
        self.ceiling = self.limit
        self._epoch += 1
        self._fresh_epoch = self._epoch
        self.cuts += 1
        self._latency_held = True
        self._probe_step = 1
        self._next_probe = now + self._probe_gap_s
        return LimitChange(old, self.limit, 0.0, "latency rising") if self.limit != old else None

    def on_overload(
        self, now: float, retry_after_s: float | None = None, *, ticket: Ticket | None = None
    ) -> LimitChange | None:
        """Record a 429/503/529: above the ceiling it ends slow start or a probe; at a proven level it is
        forgiven as noise unless such overloads are frequent, which cuts the limit and honours Retry-After."""
        self._now = max(self._now, now)
        self.overloads += 1
        level = self._level(ticket)
        stale = ticket is not None and ticket.epoch < self._epoch
        if not stale:
            self._outcomes.append(True)  # a burst from before a cut is already answered by that cut
        if (self.operator_cap is not None and self.limit >= self.operator_cap) or self.limit <= self.minimum:
            # the limit cannot answer this overload itself (pinned, or already at its minimum): wait out the
            # server's Retry-After on this endpoint before starting anything else
            self.cooldown_until = max(self.cooldown_until, now + self._cooldown(retry_after_s))
            if self.operator_cap is not None:
                return None
        old = self.limit
        window = list(self._outcomes)[-max(2 * self.limit, 50) :]
        bad = sum(window)
        at_proven = self.ceiling is not None and level <= self.ceiling
        if not stale and self.ceiling is not None and level == self.ceiling > self.minimum:
            # the top proven level refused: its proof may have come from a count ahead of the server's (an
            # answer still on its way back when the request was sent), so step down one, as a failed probe
            # would, rather than read a cap that held as capacity falling (the next overloads are stale)
            self._suspect = None
            self._hold_at(self.ceiling - 1, now)
            return LimitChange(old, self.limit, 0.0, "overloaded at the top proven level")
        if at_proven and not stale and bad >= 3 and bad > self.noise_tolerance * len(window):
            # frequent overloads: the capacity fell (or a quota ran dry). Cut, wait out Retry-After, and
            # rediscover the capacity from the cut value (the next fresh 429's level says what is admitted)
            cooldown = self._cooldown(retry_after_s)
            self.cooldown_until = max(self.cooldown_until, now + cooldown)
            self.limit = max(self.minimum, math.floor(min(self.limit, level) * self.reduce_factor))
            self.ceiling = None
            self._suspect = None
            self._epoch += 1
            self._fresh_epoch = self._epoch
            self.cuts += 1
            self._outcomes.clear()
            self._probe_step = 1
            self._latency_held = False
            return LimitChange(old, self.limit, cooldown, "overloaded")
        if self.ceiling is None or level > self.ceiling:
            if stale:
                return None
            # slow start (or rediscovery after a cut) ends, or a probe failed: back to what the server
            # demonstrably admitted — one fewer than this request's level. Suspect until a request as deep
            # is served (then it was noise: forgotten, and the limiter goes back to where it was)
            before = (self.ceiling, self._probe_step, self.limit) if self._suspect is None else self._suspect[2:5]
            self._suspect = (
                level,
                ticket.epoch if ticket is not None else self._epoch,
                *before,
                ticket.started if ticket is not None else now,
            )
            proven = level - 1 if self.ceiling is None else self.ceiling
            self._hold_at(max(self.minimum, min(proven, self.limit)), now)
            return LimitChange(old, self.limit, 0.0, "overloaded above capacity") if self.limit != old else None
        self.forgiven += 1  # a random 429 at a proven level
        return None

    def _hold_at(self, ceiling: int, now: float) -> None:
        """Hold the limit at `ceiling`, the level the server admitted, after a refusal above it (or at it): a new
        epoch, and the next probe after a doubled gap."""
        self.ceiling = self.limit = ceiling
        self._epoch += 1
        self._fresh_epoch = self._epoch
        self._deep.clear()
        self._probe_step = 1
        self._probe_gap_s = min(self.max_probe_gap_s, self._probe_gap_s * 2)
        self._next_probe = now + self._probe_gap_s
        self._latency_held = False

    def _cooldown(self, retry_after_s: float | None) -> float:
        cooldown = self.default_cooldown_s if retry_after_s is None else max(0.0, retry_after_s)
        return min(cooldown, self.max_cooldown_s)

    def set_limit(self, limit: int) -> int:
        """Operator override, clamped to min/max: pins the limit there (nothing adapts it until the next
        set_limit; overloads still set the cooldown). Returns the new limit."""
        self.limit = min(max(int(limit), self.minimum), self.maximum)
        self.operator_cap = self.limit
        return self.limit

    # ---- what the dashboard shows ----------------------------------------------------------------

    @property
    def capacity_estimate(self) -> int | None:
        """Highest level proven since the last cut (None while still in slow start)."""
        return self.ceiling

    def reason(self, now: float | None = None) -> str:
        """Why the limit is where it is: growing | at ceiling | cooling down after 429 | latency rising | pinned."""
        now = self._now if now is None else now
        if self.operator_cap is not None:
            return "pinned"
        if now < self.cooldown_until:
            return "cooling down after 429"
        if self._latency_held:
            return "latency rising"
        if self.limit >= self.maximum or (self.ceiling is not None and self.limit >= self.ceiling):
            return "at ceiling"
        return "growing"

    def state(self, now: float | None = None) -> LimiterState:
        """An immutable record of the limit for the run record (`app.engine.record.snapshot.EndpointLive`)."""
        now = self._now if now is None else now
        floor = min((m for _, m in self._round_medians), default=None)
        return LimiterState(
            limit=self.limit,
            in_flight=self.in_flight,
            reason=self.reason(now),
            capacity_estimate=self.ceiling,
            cooldown_s=max(0.0, self.cooldown_until - now),
            latency_floor_ms=None if floor is None else floor * 1000.0,
            latency_recent_ms=None if self._recent_latency is None else self._recent_latency * 1000.0,
            overloads=self.overloads,
            forgiven=self.forgiven,
            cuts=self.cuts,
        )
