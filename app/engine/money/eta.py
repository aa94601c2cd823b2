"""ETA and projected cost from the tokens still expected and the measured capacity (pure; the caller passes
the clock).

An average over finished samples is wrong early, because short samples finish first: the samples still in
flight are the long ones. Here:

- prompt tokens of every sample are known up front (`add_pending`);
- the output length is learned per dataset as a survival curve: Kaplan-Meier over the finished lengths,
  with every sample in flight a right-censored observation at the tokens it has produced so far. Streaming,
  that is counted from its first token (`first_token`): one with no first token yet has produced nothing,
  however long it has waited (a slow queue, a hung request). Without streaming, its age less the mean time
  to first token, times the per-request token rate. Kaplan-Meier cannot say how long the samples run that
  outlived the longest finished one, g (the share it leaves unresolved): that share is spread
  log-uniformly between g and the cap (`max_tokens`; without one, 16 x the longest length seen), the
  scale-free prior for a length known only to lie between two bounds. Streaming, the tail starts where half
  of its samples already are (all of them still run; from age alone that would overstate it). A sample in
  flight at x tokens past that start is then expected to reach (cap - x) / ln(cap / x). As long samples
  finish, g moves past them and Kaplan-Meier takes over;
- the time is the expected end of the rest of the run, E[max over samples of their end]. The samples
  waiting are list-scheduled at their mean duration over the slots held (the requests in flight now, or
  their trailing mean if higher; a limit still growing adds a slot per answer up to where it is headed,
  `ceiling`) to give each a dispatch time; each sample's length is drawn from its dataset's curve (a
  sample in flight beyond what it has produced). The run's end is set by its longest few samples, whose
  lengths come from the same unknown tail: they are neither independent (the max of independent draws from
  a prior as wide as [g, cap] runs to the cap) nor one number. The joint law is the Frechet mixture of
  the two (`_ALIKE` = 1/2 each: all tail samples at one shared quantile, or independent), which keeps each
  sample's own distribution, so the expected tokens and cost do not depend on it;
- the cost is spent + the prompt tokens left at the prompt price (blended with the cached-prompt price at the
  share of prompt tokens the providers' caches served so far) + the output tokens left (in flight included,
  since nothing is billed before it ends) at the completion price. Without prices, the dollars per token of the
  finished samples are used;
- whole conversations: the turns waiting on their parents are work to come like pending samples, each prompt the
  tokens known now (the request of its conversation's current turn and the segments up to it) plus the model's
  answers before it at the dataset's mean length (prompts grow turn by turn); and the ETA is at least the
  critical path, the most turns any open conversation has after its current one, run one after the other at the
  mean time of a turn (`set_chains`, `chain_moved`).

A projection costs 2 ms at 64 in flight and 300 waiting, 21 ms at 1,024 in flight and 200,000 waiting
(alike samples in flight and dispatch times are grouped); the engine projects at most once a second.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from app.engine.money.budget import Prices

_BINS_PER_OCTAVE = 32  # finished lengths are kept in log-spaced bins about 2 % wide
_SINGLE_TAIL = 256  # the last samples of the queue are scheduled one by one (earlier ones in groups)
_GRID = 128  # points of the ETA's integral
_QUANTILES = 16  # points of the tail's shared quantile
_BUCKETS = 128  # dispatch times of the samples waiting, at most
_ALIKE = 0.5  # the weight of "the tail samples run alike" against "independently" (module docstring)
_PACE_S = 5.0  # the answer rate a growing limit is projected to grow at is measured over this long


def _by_dataset(flight: list[tuple[str, float, float]]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for dataset, x, wait in flight:
        out.setdefault(dataset, []).append((x, wait))
    return out


def _bin(tokens: float) -> int:
    return int(math.log2(1.0 + max(0.0, tokens)) * _BINS_PER_OCTAVE)


@dataclass(frozen=True, slots=True)
class Projection:
    """What is left of a run: seconds, total dollars at the end, and the output tokens still expected."""

    eta_s: float | None  # None until a sample has finished
    projected_cost_usd: float | None
    output_tokens_left: float
    concurrency: float  # the concurrency the ETA assumes
    mean_output_tokens: tuple[tuple[str, float], ...]  # per dataset, learned so far


class _Dataset:
    __slots__ = ("pending", "pending_prompt", "waiting", "waiting_prompt", "waiting_outputs", "done", "bins", "longest")

    def __init__(self) -> None:
        self.pending = 0
        self.pending_prompt = 0
        self.waiting = 0  # conversation turns whose parent is not stored yet
        self.waiting_prompt = 0  # their prompt tokens known now (the frontier's request and the segments after it)
        self.waiting_outputs = 0  # the model's answers their prompts will also hold, not generated yet
        self.done = 0
        self.bins: dict[int, list[float]] = {}  # bin -> [finished count, their output tokens]
        self.longest = 0

    def add(self, tokens: int, count: int = 1) -> None:
        cell = self.bins.setdefault(_bin(tokens), [0, 0.0])
        cell[0] += count
        cell[1] += float(tokens) * count
        self.done += count
        self.longest = max(self.longest, int(tokens))


class Survival:
    """One dataset's output-length distribution (module docstring): Kaplan-Meier over `finished`
    ({bin: [count, tokens]}) with `censored` (tokens so far of samples in flight); the share it leaves
    unresolved (samples that outlived the longest finished length g) log-uniform on [g, cap] (without a cap,
    16 x the longest length seen stands in for it)."""

    def __init__(
        self,
        finished: Iterable[dict[int, list[float]]],
        longest: float,
        censored: list[float],
        cap: float | None,
        *,
        measured: bool = False,
    ) -> None:
        cells: dict[int, list[float]] = {}
        for bins in finished:
            for b, (n, tokens) in bins.items():
                cell = cells.setdefault(b, [0, 0.0])
                cell[0] += n
                cell[1] += tokens
        cens: dict[int, int] = {}
        for x in censored:
            b = _bin(x)
            cens[b] = cens.get(b, 0) + 1
        at_risk = sum(c[0] for c in cells.values()) + len(censored)
        left = 1.0
        values, masses = [], []
        for b in sorted(cells.keys() | cens.keys()):
            got = cells.get(b)
            if got is not None and got[0]:
                mass = left * got[0] / at_risk
                values.append(got[1] / got[0])
                masses.append(mass)
                left -= mass
                at_risk -= got[0]
            at_risk -= cens.get(b, 0)
        self.g = max(1.0, float(longest))  # the tail's share: what outlived the longest finished length
        # ... and, where the tokens so far are `measured` (streamed), it starts where half the samples in it
        # have already got to, since all of them still run; an estimate from age alone would overstate it
        # (a slow first token reads as progress), so there it starts at g
        beyond = sorted(x for x in censored if x > self.g)
        self.a = max(self.g, beyond[(len(beyond) - 1) // 2]) if beyond and measured else self.g
        top = max([self.g, *censored])
        self.cap = max(float(cap) if cap else 16.0 * top, top)
        self.tail = max(0.0, left)
        self.values = np.asarray(values, dtype=float)
        m = np.asarray(masses, dtype=float)
        self._cum = np.concatenate(([0.0], np.cumsum(m)))
        self._sm = np.concatenate((np.cumsum(m[::-1])[::-1], [0.0]))  # mass above each value
        self._sv = np.concatenate((np.cumsum((m * self.values)[::-1])[::-1], [0.0]))

    def _tail_means(self, xs) -> np.ndarray:
        """E[L | L > x] for tail samples, elementwise: (cap - x0) / ln(cap / x0), x0 = max(x, the tail's start)."""
        x0 = np.maximum(self.a, np.asarray(xs, dtype=float))
        span = np.log(np.maximum(self.cap, x0) / x0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(span > 1e-9, (self.cap - x0) / np.maximum(span, 1e-300), x0)

    def tail_mean(self, x: float) -> float:
        """E[L | L > x] for a tail sample (x at or beyond g: the tail starts there): (cap - x) / ln(cap / x)."""
        return float(self._tail_means(x))

    def mean(self) -> float:
        """The expected output length of a sample not yet sent."""
        return float(self._sv[0]) + self.tail * self.tail_mean(self.a)

    def cond_mean(self, x: float) -> float:
        """E[L | L > x]: the expected length of a sample in flight that has produced x tokens."""
        return float(self.cond_means(np.asarray([x]))[0])

    def body(self, y: np.ndarray) -> np.ndarray:
        """P(L <= y, the measured part: no longer than the longest finished length), elementwise."""
        return self._cum[np.searchsorted(self.values, y, side="right")]

    def tail_cdf(self, x, y: np.ndarray) -> np.ndarray:
        """P(L <= y | a tail sample longer than x), elementwise (x a number or an array broadcast with y)."""
        x0 = np.maximum(self.a, x)
        y = np.asarray(y, dtype=float)
        span = np.log(np.maximum(self.cap, x0) / x0)
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(span > 1e-9, np.log(np.maximum(y, x0) / x0) / np.maximum(span, 1e-300), y >= x0)
        return np.clip(frac, 0.0, 1.0)

    def tail_quantile(self, x, u: np.ndarray) -> np.ndarray:
        """The length of a tail sample longer than x at quantile u of its tail, elementwise (broadcast)."""
        x0 = np.maximum(self.a, x)
        return x0 * (np.maximum(self.cap, x0) / x0) ** np.asarray(u)

    def cond_means(self, xs: np.ndarray) -> np.ndarray:
        """`cond_mean` of each of `xs`."""
        xs = np.asarray(xs, dtype=float)
        i = np.searchsorted(self.values, xs, side="right")
        mass = self._sm[i] + self.tail
        with np.errstate(divide="ignore", invalid="ignore"):
            out = (self._sv[i] + self.tail * self._tail_means(xs)) / mass
        return np.where(mass > 1e-12, out, xs)

    def cdf(self, y: np.ndarray) -> np.ndarray:
        """P(L <= y), elementwise."""
        y = np.asarray(y, dtype=float)
        return self.body(y) + self.tail * self.tail_cdf(0.0, y)


class Projector:
    """Accumulates a run's samples and outcomes; `project(now, spent)` gives the ETA and projected cost."""

    def __init__(
        self,
        prices: Prices | None = None,
        *,
        max_tokens: int | None = None,
        stream: bool = False,
        window_s: float = 60.0,
    ) -> None:
        self.prices = prices
        self.max_tokens = max_tokens
        self.stream = stream  # requests stream: one without a first token (`first_token`) has produced nothing
        self.window_s = window_s
        self._datasets: dict[str, _Dataset] = {}
        # key -> [dataset, prompt tokens, started, first token at (None: not yet / not streamed)]
        self._flight: dict[Hashable, list] = {}
        self._gen_tokens = 0  # output tokens of finished samples ...
        self._gen_s = 0.0  # ... over their generation time (latency - ttft)
        self._ttft_sum = 0.0
        self._done = 0
        self._done_prompt = 0
        self._done_cost = 0.0
        # time-weighted in-flight count: (clock, integral, in flight) marks for a trailing window
        self._area = 0.0
        self._at: float | None = None
        self._marks: list[tuple[float, float, int]] = []
        self._answered_at: deque[float] = deque()  # when samples were answered, the last `_PACE_S` seconds
        self._prompt_reported = 0  # prompt tokens the providers reported for finished samples ...
        self._cached_reported = 0  # ... and how many of them their prompt caches served
        self._chains: dict[int, int] = {}  # turns left (the turn in progress included) -> open conversations

    def _ds(self, name: str) -> _Dataset:
        ds = self._datasets.get(name)
        if ds is None:
            ds = self._datasets[name] = _Dataset()
        return ds

    def _tick(self, now: float) -> None:
        if self._at is not None and now > self._at:
            self._area += len(self._flight) * (now - self._at)
        self._at = now if self._at is None else max(self._at, now)
        if not self._marks or now - self._marks[-1][0] >= 1.0:
            self._marks.append((now, self._area, len(self._flight)))
            cutoff = now - self.window_s
            while len(self._marks) > 2 and self._marks[1][0] <= cutoff:
                self._marks.pop(0)

    # ---- events ----------------------------------------------------------------------------------

    def seed(
        self,
        dataset: str,
        answered: int,
        output_tokens: int,
        gen_s: float,
        ttft_s: float,
        prompt_tokens: int,
        longest: int,
        cost_usd: float = 0.0,
        *,
        lengths: Iterable[tuple[int, int]] = (),
    ) -> None:
        """Samples of `dataset` answered before this engine started (a resumed run): their count, output tokens,
        generation and first-token seconds, prompt tokens, longest output and cost, learned as if seen
        finishing (the cost only prices tokens when there is no price list: it is already in what was spent).
        `lengths`: (output tokens, count) pairs of those answers, for the length curve (without them, each
        answer counts at the mean length)."""
        if answered <= 0:
            return
        ds = self._ds(dataset)
        pairs = [(int(t), int(n)) for t, n in lengths if n > 0]
        if sum(n for _, n in pairs) == answered:
            for tokens, n in pairs:
                ds.add(tokens, n)
        else:
            ds.add(round(output_tokens / answered), answered)
        ds.longest = max(ds.longest, int(longest))
        self._done += answered
        self._gen_tokens += output_tokens
        self._gen_s += max(gen_s, 1e-6 * answered)
        self._ttft_sum += ttft_s
        self._done_prompt += prompt_tokens
        self._done_cost += cost_usd

    def add_pending(self, dataset: str, prompt_tokens: int, count: int = 1) -> None:
        """`count` samples of `dataset` wait to be sent, `prompt_tokens` each (known from ingest)."""
        ds = self._ds(dataset)
        ds.pending += count
        ds.pending_prompt += prompt_tokens * count

    def datasets(self) -> tuple[str, ...]:
        """The datasets the projector has heard of."""
        return tuple(self._datasets)

    def set_pending(self, dataset: str, prompt_tokens: int, count: int) -> None:
        """`dataset` has exactly `count` samples waiting to be sent now, `prompt_tokens` each (the store's count,
        e.g. after an operator put failed samples back)."""
        ds = self._ds(dataset)
        ds.pending = count
        ds.pending_prompt = prompt_tokens * count

    def set_waiting(self, dataset: str, prompt_tokens: int, outputs: int, count: int) -> None:
        """`dataset` has exactly `count` conversation turns waiting on their parents (as `add_waiting`)."""
        ds = self._ds(dataset)
        ds.waiting = ds.waiting_prompt = ds.waiting_outputs = 0
        self.add_waiting(dataset, prompt_tokens, outputs, count)

    def add_waiting(self, dataset: str, prompt_tokens: int, outputs: int, count: int = 1) -> None:
        """`count` conversation turns of `dataset` wait on their parents, each with `prompt_tokens` known now and
        `outputs` answers of the model still to come in its prompt (each priced at the dataset's mean length)."""
        ds = self._ds(dataset)
        ds.waiting += count
        ds.waiting_prompt += prompt_tokens * count
        ds.waiting_outputs += outputs * count

    def _take_waiting(self, ds: _Dataset, count: int) -> None:
        count = min(count, ds.waiting)
        if count <= 0:
            return
        ds.waiting_prompt -= ds.waiting_prompt * count // ds.waiting
        ds.waiting_outputs -= ds.waiting_outputs * count // ds.waiting
        ds.waiting -= count

    def unneeded(self, dataset: str, count: int) -> None:
        """`count` waiting turns of `dataset` will never run (their conversation ended before them)."""
        self._take_waiting(self._ds(dataset), count)

    def set_chains(self, lengths: dict[int, int]) -> None:
        """The open conversations by turns left, the turn in progress included ({turns left: conversations})."""
        self._chains = {int(k): int(v) for k, v in lengths.items() if v > 0 and k > 0}

    def chain_moved(self, before: int, after: int) -> None:
        """An open conversation went from `before` turns left to `after` (0: it ended)."""
        if self._chains.get(before, 0) > 0:
            self._chains[before] -= 1
            if not self._chains[before]:
                del self._chains[before]
        if after > 0:
            self._chains[after] = self._chains.get(after, 0) + 1

    @property
    def longest_chain(self) -> int:
        """The most turns any open conversation has left (0: none open)."""
        return max(self._chains, default=0)

    def started(self, key: Hashable, dataset: str, prompt_tokens: int, now: float, *, waited: bool = False) -> None:
        """A pending sample was sent (key: anything unique, e.g. the sample's primary key); `waited`: a
        conversation's later turn, counted as waiting until now."""
        self._tick(now)
        ds = self._ds(dataset)
        if waited and ds.waiting:
            self._take_waiting(ds, 1)
        else:
            ds.pending = max(0, ds.pending - 1)
            ds.pending_prompt = max(0, ds.pending_prompt - prompt_tokens)
        self._flight[key] = [dataset, prompt_tokens, now, None]

    def first_token(self, key: Hashable, now: float) -> None:
        """A streamed request of a sample in flight received its first token (its output is counted from now)."""
        item = self._flight.get(key)
        if item is not None and item[3] is None:
            item[3] = now

    def resent(self, key: Hashable, now: float) -> None:
        """A sample in flight is sent again (a retry within its lease): its output counts from nothing."""
        item = self._flight.get(key)
        if item is not None:
            item[2], item[3] = now, None

    def requeued(self, key: Hashable, now: float) -> None:
        """A sent sample went back to pending (a retry)."""
        self._tick(now)
        item = self._flight.pop(key, None)
        if item is not None:
            self.add_pending(item[0], item[1])

    def dropped(self, key: Hashable, now: float) -> None:
        """A sent sample failed for good (it needs no more tokens)."""
        self._tick(now)
        self._flight.pop(key, None)

    def finished(
        self,
        key: Hashable,
        output_tokens: int,
        latency_s: float,
        ttft_s: float | None,
        cost_usd: float,
        now: float,
        *,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
    ) -> None:
        """A sent sample was answered: its output tokens, latency, time to first token (None: unknown), cost, and
        the prompt tokens the provider reported with those its prompt cache served (the cost of the prompts
        left is priced at that mix)."""
        self._tick(now)
        self._prompt_reported += max(0, prompt_tokens)
        self._cached_reported += min(max(0, cached_tokens), max(0, prompt_tokens))
        item = self._flight.pop(key, None)
        dataset, prompt = (item[0], item[1]) if item is not None else ("", 0)
        self._ds(dataset).add(output_tokens)
        ttft = min(latency_s, ttft_s) if ttft_s is not None else 0.0
        self._ttft_sum += ttft
        self._gen_tokens += output_tokens
        self._gen_s += max(1e-6, latency_s - ttft)
        self._done += 1
        self._done_prompt += prompt
        self._done_cost += cost_usd
        self._answered_at.append(now)

    # ---- projection ------------------------------------------------------------------------------

    def concurrency(self, now: float) -> float:
        """The slots the rest of the run is expected to hold: the requests in flight now, or their mean over
        the trailing window when that is higher (a dip, e.g. a backoff, does not last)."""
        self._tick(now)
        if not self._marks or now <= self._marks[0][0]:
            return float(len(self._flight))
        t0, a0, _ = self._marks[0]
        return max(float(len(self._flight)), (self._area - a0) / (now - t0))

    def answer_rate(self, now: float) -> float:
        """Samples answered per second over the last `_PACE_S` seconds (or since the first answer)."""
        times = self._answered_at
        while times and times[0] < now - _PACE_S:
            times.popleft()
        if len(times) < 2:
            return 0.0
        return len(times) / max(now - times[0], 1e-3)

    def project(
        self, now: float, spent_usd: float, *, concurrency: float | None = None, ceiling: int | None = None
    ) -> Projection:
        """The ETA and the projected total cost now (`concurrency`: the caller's capacity figure, else measured;
        `ceiling`: where a limit still growing is headed; the limiter's rule adds a slot per success while it
        grows (slow start, recovery), so it is taken to get there one slot per answer at the recent pace)."""
        held = self.concurrency(now) if concurrency is None else float(concurrency)
        if self._done == 0:
            return Projection(None, None, math.nan, held, ())
        rate = self._gen_tokens / self._gen_s if self._gen_s > 0 else 0.0  # tokens/s of one request
        ttft = self._ttft_sum / self._done
        # per sample in flight: (dataset, tokens so far, seconds until its first token is expected)
        flight: list[tuple[str, float, float]] = []
        flight_prompt = 0
        for dataset, prompt, started, first in self._flight.values():
            if first is not None:
                flight.append((dataset, max(0.0, now - first) * rate, 0.0))
            elif self.stream:  # nothing yet: a slow first token (or a hung request) is no long answer
                flight.append((dataset, 0.0, max(0.0, ttft - (now - started))))
            else:
                age = now - started
                flight.append((dataset, max(0.0, age - ttft) * rate, max(0.0, ttft - age)))
            flight_prompt += prompt
        curves = self._curves(flight)
        means = {name: curve.mean() for name, curve in curves.items() if name in self._datasets}
        out_left = billed_out_left = 0.0
        ends: list[float] = []  # expected end of each sample in flight
        for dataset, rows in _by_dataset(flight).items():
            x = np.asarray([r[0] for r in rows])
            wait = np.asarray([r[1] for r in rows])
            full = curves[dataset].cond_means(x)
            out_left += float((full - x).sum())
            billed_out_left += float(full.sum())
            ends.extend((now + wait + (full - x) / rate).tolist() if rate > 0 else [now] * len(rows))
        pending = 0
        pending_s = 0.0
        waiting: list[tuple[float, Survival]] = []  # (samples waiting, their curve) per dataset
        prompt_left = float(flight_prompt)
        for name, ds in self._datasets.items():
            todo = ds.pending + ds.waiting  # a conversation's turns waiting on their parents are work to come
            if todo:
                out_left += todo * means[name]
                billed_out_left += todo * means[name]
                pending += todo
                pending_s += todo * (ttft + (means[name] / rate if rate > 0 else 0.0))
                waiting.append((float(todo), curves[name]))
            prompt_left += ds.pending_prompt + ds.waiting_prompt
            if ds.waiting_outputs:  # their prompts grow by the answers before them
                prompt_left += ds.waiting_outputs * means.get(name, curves[None].mean())
        eta: float | None = None
        if rate > 0 and (held > 0 or not pending):
            slots = max(1, round(held))
            pace = self.answer_rate(now) if ceiling is not None and ceiling > slots else 0.0
            extra = [now + (i + 1) / pace for i in range(int(ceiling) - slots)] if pace > 0 and ceiling else []
            eta = (
                self._expected_end(
                    now,
                    slots,
                    extra,
                    flight,
                    ends,
                    curves,
                    waiting,
                    pending_s / pending if pending else 0.0,
                    rate,
                    ttft,
                )
                - now
            )
            if self._chains:  # the critical path: the longest conversation's turns after its current one, in turn
                turn_s = ttft + curves[None].mean() / rate
                eta = max(eta, (self.longest_chain - 1) * turn_s)
        cost = spent_usd + self._cost_of(prompt_left, billed_out_left)
        return Projection(eta, cost, out_left, held, tuple(sorted(means.items())))

    def _curves(self, flight: list[tuple[str, float, float]]) -> dict[str | None, Survival]:
        """A length curve per dataset with a finished sample, and a pooled one (key None) for the others."""
        cap = self.max_tokens
        by_ds: dict[str, list[float]] = {}
        for dataset, x, _ in flight:
            by_ds.setdefault(dataset, []).append(x)
        datasets = self._datasets
        pooled = Survival(
            (ds.bins for ds in datasets.values()),
            max((ds.longest for ds in datasets.values()), default=0),
            [x for xs in by_ds.values() for x in xs],
            cap,
            measured=self.stream,
        )
        curves: dict[str | None, Survival] = {None: pooled}
        for name in set(datasets) | set(by_ds):
            ds = datasets.get(name)
            curves[name] = (
                Survival((ds.bins,), ds.longest, by_ds.get(name, []), cap, measured=self.stream)
                if ds is not None and ds.done
                else pooled
            )
        return curves

    @staticmethod
    def _expected_end(
        now: float,
        slots: int,
        extra: list[float],
        flight: list[tuple[str, float, float]],
        ends: list[float],
        curves: dict,
        waiting: list[tuple[float, Survival]],
        job_s: float,
        rate: float,
        ttft: float,
    ) -> float:
        """E[the time the last sample ends]: the waiting samples dispatched by list scheduling at their mean
        duration over `slots` (and the `extra` slots a growing limit adds at those times); each sample's end drawn
        from its curve, the samples in the tail sharing one quantile (their unknown scale is one number for the
        dataset, not one per sample); the integral of P(not all done by T), averaged over that quantile."""
        # dispatch times: a slot frees when its sample's expected end comes (the earliest ends free no slot
        # while more are in flight than `slots`)
        heap = sorted(ends)[-slots:] if len(ends) > slots else sorted(ends)
        heap = [now] * (slots - len(heap)) + heap + extra
        heapq.heapify(heap)
        groups: list[tuple[float, int]] = []  # (mean dispatch time, samples)
        left = pending = int(sum(n for n, _ in waiting))
        while left > 0:
            free_at = heapq.heappop(heap)
            batch = max(1, (left - _SINGLE_TAIL) // slots) if left > _SINGLE_TAIL else 1
            groups.append((free_at + (batch - 1) * job_s / 2, batch))
            heapq.heappush(heap, free_at + batch * job_s)
            left -= batch
        fluid_end = max([now, *ends, *heap])
        # the longest a sample can run: to max_tokens where a tail is left, else to the longest finished length
        longest = max(c.cap if c.tail > 0 else c.g for c in curves.values())
        horizon = (fluid_end - now) + ttft + longest / rate
        t = now + horizon * (np.arange(1, _GRID + 1) / _GRID) ** 2  # denser near now
        # P(all done by T): each sample's end drawn from its curve; the tail samples' draws are dependent, in
        # the Frechet family: with probability _ALIKE all at one shared quantile u (their unknown scale is one
        # number), else independent. Both keep every sample's own distribution, so only the end moves, not
        # the expected tokens or cost
        u = (np.arange(_QUANTILES) + 0.5) / _QUANTILES
        log_ind = np.zeros(_GRID)  # independent draws
        log_com = np.zeros((_QUANTILES, _GRID))  # the shared quantile u
        tiny = 1e-300
        # the samples in flight, alike ones counted together: (dataset, tokens-so-far bin, wait in 50 ms)
        alike: dict[tuple, list[float]] = {}
        for dataset, sofar, waited in flight:
            cell = alike.setdefault((dataset, _bin(sofar), round(waited * 20)), [0, 0.0, 0.0])
            cell[0] += 1
            cell[1] += sofar
            cell[2] += waited
        by_ds: dict[str, list[list[float]]] = {}
        for (dataset, _, _), (count, xs, ws) in alike.items():
            by_ds.setdefault(dataset, []).append([count, xs / count, ws / count])
        for dataset, rows in by_ds.items():
            curve = curves[dataset]
            n, x, wait = (np.asarray(col, dtype=float) for col in zip(*rows))
            above = 1.0 - curve.body(x)  # P(L > x)
            keep = above > 1e-12  # where every sample this long has ended, this one is about to
            n, x, wait, above = n[keep], x[keep], wait[keep], above[keep]
            if not len(n):
                continue
            y = x[:, None] + np.maximum(0.0, t[None, :] - now - wait[:, None]) * rate  # (samples, grid)
            body = np.maximum(curve.body(y) - (1.0 - above)[:, None], 0.0) / above[:, None]
            share = (curve.tail / above)[:, None]
            log_ind += (n[:, None] * np.log(np.maximum(body + share * curve.tail_cdf(x[:, None], y), tiny))).sum(axis=0)
            reached = curve.tail_quantile(x[:, None], u[None, :])[:, :, None] <= y[:, None, :]  # (samples, u, grid)
            p = body[:, None, :] + share[:, :, None] * reached
            log_com += (n[:, None, None] * np.log(np.maximum(p, tiny))).sum(axis=0)
        if groups:
            d = np.asarray([g[0] for g in groups])
            k = np.asarray([g[1] for g in groups], dtype=float)
            if len(d) > _BUCKETS:  # dispatch times close together count as one, weighted by their samples
                edges = np.linspace(d.min(), d.max(), _BUCKETS + 1)
                idx = np.clip(np.searchsorted(edges, d, side="right") - 1, 0, _BUCKETS - 1)
                ks = np.bincount(idx, weights=k, minlength=_BUCKETS)
                ds = np.bincount(idx, weights=d * k, minlength=_BUCKETS)
                d, k = ds[ks > 0] / ks[ks > 0], ks[ks > 0]
            y = np.maximum(0.0, t[None, :] - d[:, None] - ttft) * rate  # (groups, grid)
            p_ind: np.ndarray | float = 0.0
            p_com: np.ndarray | float = 0.0
            for n_waiting, curve in waiting:  # a waiting sample is of this dataset with probability n / pending
                w = n_waiting / pending
                body = curve.body(y)
                p_ind = p_ind + w * (body + curve.tail * curve.tail_cdf(0.0, y))
                reached = curve.tail_quantile(0.0, u)[:, None, None] <= y[None, :, :]
                p_com = p_com + w * (body[None, :, :] + curve.tail * reached)
            log_ind += (np.log(np.maximum(p_ind, tiny)) * k[:, None]).sum(axis=0)
            log_com += (np.log(np.maximum(p_com, tiny)) * k[None, :, None]).sum(axis=1)
        done_by = (1.0 - _ALIKE) * np.exp(log_ind) + _ALIKE * np.exp(log_com).mean(axis=0)
        grid = np.concatenate(([now], t))
        vals = np.concatenate(([1.0], 1.0 - done_by))
        return now + float(np.sum((vals[1:] + vals[:-1]) * np.diff(grid)) / 2)

    def _cost_of(self, prompt_tokens: float, output_tokens: float) -> float:
        if self.prices is not None:
            prompt_rate = self.prices.prompt_per_m
            cached_rate = getattr(self.prices, "cached_prompt_per_m", None)
            if cached_rate is not None and self._prompt_reported:  # at the share the caches served so far
                share = self._cached_reported / self._prompt_reported
                prompt_rate = (1.0 - share) * prompt_rate + share * cached_rate
            return (prompt_tokens * prompt_rate + output_tokens * self.prices.completion_per_m) / 1e6
        tokens_done = self._done_prompt + self._gen_tokens
        return self._done_cost / tokens_done * (prompt_tokens + output_tokens) if tokens_done else 0.0
