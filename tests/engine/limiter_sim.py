"""A discrete-event run on a fake clock: a client policy against the simulator's pure `CapacityModel`.

The server side is `app.simulator.capacity.CapacityModel` (the same code the HTTP simulator runs) plus a FIFO
queue for batch slots; latency is lognormal per request; random 429s are drawn per request. The client side
is the bench's loop: start while the policy allows, a refused request waits out its own Retry-After.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

from app.simulator.capacity import CapacityModel

_Z95 = 1.6448536269514722


@dataclass
class Outcome:
    wall_s: float
    requests: int
    overloads: int
    limits: list[tuple[float, int]] = field(default_factory=list)  # (time, limit) after every event
    overload_times: list[float] = field(default_factory=list)

    @property
    def overload_rate(self) -> float:
        return self.overloads / max(1, self.requests)

    def limit_at(self, t: float) -> int:
        last = self.limits[0][1]
        for at, limit in self.limits:
            if at > t:
                break
            last = limit
        return last


class FixedPolicy:
    """A fixed concurrency (the oracle / the naive client)."""

    def __init__(self, limit: int, schedule=()) -> None:
        self.limit, self.in_flight, self.schedule = limit, 0, list(schedule)

    def can_start(self, now):
        for at, cap in self.schedule:
            if now >= at:
                self.limit = cap
        return self.in_flight < self.limit

    def take(self, now=None):
        self.in_flight += 1

    def release(self):
        self.in_flight -= 1

    def on_success(self, saturated=True, *, ticket=None, latency_s=None, now=None):
        return None

    def on_overload(self, now, retry_after_s=None, *, ticket=None):
        return None


def run(
    policy,
    n: int = 2000,
    *,
    seed: int = 1,
    median_s: float = 0.3,
    p95_s: float = 0.6,
    noise_429: float = 0.0,
    reject_s: float = 0.002,
    **capacity,
) -> Outcome:
    """n requests through `policy` against a server with `capacity` (CapacityModel options)."""
    rng = random.Random(seed)
    mu, sigma = math.log(median_s), (math.log(p95_s) - math.log(median_s)) / _Z95
    model = CapacityModel(SimpleNamespace(**capacity), start=0.0, retry_after_s=1.0)
    slots = model.batch_slots
    running = 0
    waiting: deque = deque()
    heap: list = []
    seq = 0
    pending: deque[int] = deque(range(n))
    retries: list[tuple[float, int]] = []
    t = 0.0
    done = requests = overloads = 0
    out = Outcome(0.0, 0, 0, [(0.0, policy.limit)])

    def push(at, kind, data):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (at, seq, kind, data))

    def serve(req):
        nonlocal running
        running += 1
        push(t + rng.lognormvariate(mu, sigma), "ok", req)

    while done < n:
        while retries and retries[0][0] <= t:
            pending.appendleft(heapq.heappop(retries)[1])
        while pending and policy.can_start(t):
            i = pending.popleft()
            ticket = policy.take(t)
            requests += 1
            req = (i, ticket, t)
            if noise_429 and rng.random() < noise_429:
                push(t + reject_s, "429", (req, 1.0))
                continue
            admission = model.try_admit(t, 0)
            if not admission.admitted:
                push(t + reject_s, "429", (req, admission.retry_after_s))
            elif slots and running >= slots:
                waiting.append(req)
            else:
                serve(req)
        # next moment something can change: an answer, a retry becoming due, a cooldown ending
        nexts = [heap[0][0]] if heap else []
        if retries:
            nexts.append(retries[0][0])
        cooldown = getattr(policy, "cooldown_until", 0.0)
        if cooldown > t and pending:
            nexts.append(cooldown)
        t = max(t, min(nexts)) if nexts else t + 0.01
        while heap and heap[0][0] <= t:
            _, _, kind, data = heapq.heappop(heap)
            if kind == "ok":
                (i, ticket, sent) = data
                running -= 1
                model.finish()
                if waiting:
                    serve(waiting.popleft())
                policy.release()
                done += 1
                policy.on_success(bool(pending) or bool(retries), ticket=ticket, latency_s=t - sent, now=t)
            else:
                (i, ticket, sent), retry_after = data
                policy.release()
                overloads += 1
                out.overload_times.append(t)
                policy.on_overload(t, retry_after, ticket=ticket)
                heapq.heappush(retries, (t + retry_after, i))
            if out.limits[-1][1] != policy.limit:
                out.limits.append((t, policy.limit))
    out.wall_s, out.requests, out.overloads = t, requests, overloads
    return out
