"""ETA and projected cost from the tokens still expected and the measured capacity (pure; the caller passes
the clock).

An average over finished samples is wrong early, because short samples finish first: at a concurrency of
64 the 64 samples in flight are the long ones. Here:

- prompt tokens of every sample are known up front (`add_pending`);
- the output length is learned per dataset, counting the samples in flight as *censored* observations: a
  sample running for t seconds has produced about (t - ttft) x the per-request token rate so far. The mean
  is the censored exponential estimate, (tokens finished + tokens so far in flight) / samples finished, and
  a sample in flight is expected to need one more mean (memoryless);
- the time is the work left (per request: the mean time to first token + its expected output tokens over
  the per-request token rate, measured on finished samples) divided by the concurrency held, a
  time-weighted mean of the requests in flight over the last `window_s` (or the caller's capacity figure);
- the cost is spent + the prompt tokens left at the prompt price + the output tokens left (in flight
  included, since nothing is billed before it ends) at the completion price. Without prices, the dollars
  per token of the finished samples are used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable

from app.engine.budget import Prices


@dataclass(frozen=True, slots=True)
class Projection:
    """What is left of a run: seconds, total dollars at the end, and the output tokens still expected."""

    eta_s: float | None  # None until a sample has finished
    projected_cost_usd: float | None
    output_tokens_left: float
    concurrency: float  # the concurrency the ETA assumes
    mean_output_tokens: tuple[tuple[str, float], ...]  # per dataset, learned so far


class _Dataset:
    __slots__ = ("pending", "pending_prompt", "done", "done_output")

    def __init__(self) -> None:
        self.pending = 0
        self.pending_prompt = 0
        self.done = 0
        self.done_output = 0


class Projector:
    """Accumulates a run's samples and outcomes; `project(now, spent)` gives the ETA and projected cost."""

    def __init__(self, prices: Prices | None = None, *, window_s: float = 60.0,
                 prior_output_tokens: float | None = None) -> None:
        self.prices = prices
        self.window_s = window_s
        self.prior_output_tokens = prior_output_tokens
        self._datasets: dict[str, _Dataset] = {}
        self._flight: dict[Hashable, tuple[str, int, float]] = {}  # key -> (dataset, prompt tokens, started)
        self._gen_tokens = 0  # output tokens of finished samples ...
        self._gen_s = 0.0  # ... over their generation time (latency - ttft)
        self._ttft_sum = 0.0
        self._done = 0
        self._done_prompt = 0
        self._done_cost = 0.0
        self._longest = 0.0  # longest output seen or expected (tokens)
        # time-weighted in-flight count: (clock, integral) marks for a trailing window
        self._area = 0.0
        self._at: float | None = None
        self._marks: list[tuple[float, float]] = []

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
            self._marks.append((now, self._area))
            cutoff = now - self.window_s
            while len(self._marks) > 2 and self._marks[1][0] <= cutoff:
                self._marks.pop(0)

    # ---- events ----------------------------------------------------------------------------------

    def seed(self, dataset: str, answered: int, output_tokens: int, gen_s: float, ttft_s: float,
             prompt_tokens: int, longest: int, cost_usd: float = 0.0) -> None:
        """Samples of `dataset` answered before this engine started (a resumed run): their count, output tokens,
        generation and first-token seconds, prompt tokens, longest output and cost, learned as if seen
        finishing (the cost only prices tokens when there is no price list: it is already in what was spent)."""
        if answered <= 0:
            return
        ds = self._ds(dataset)
        ds.done += answered
        ds.done_output += output_tokens
        self._done += answered
        self._gen_tokens += output_tokens
        self._gen_s += max(gen_s, 1e-6 * answered)
        self._ttft_sum += ttft_s
        self._done_prompt += prompt_tokens
        self._done_cost += cost_usd
        self._longest = max(self._longest, float(longest))

    def add_pending(self, dataset: str, prompt_tokens: int, count: int = 1) -> None:
        """`count` samples of `dataset` wait to be sent, `prompt_tokens` each (known from ingest)."""
        ds = self._ds(dataset)
        ds.pending += count
        ds.pending_prompt += prompt_tokens * count

    def started(self, key: Hashable, dataset: str, prompt_tokens: int, now: float) -> None:
        """A pending sample was sent (key: anything unique, e.g. the sample's primary key)."""
        self._tick(now)
        ds = self._ds(dataset)
        ds.pending = max(0, ds.pending - 1)
        ds.pending_prompt = max(0, ds.pending_prompt - prompt_tokens)
        self._flight[key] = (dataset, prompt_tokens, now)

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

    def finished(self, key: Hashable, output_tokens: int, latency_s: float, ttft_s: float | None,
                 cost_usd: float, now: float) -> None:
        """A sent sample was answered: its output tokens, latency, time to first token (None: unknown), cost."""
        self._tick(now)
        item = self._flight.pop(key, None)
        dataset, prompt = (item[0], item[1]) if item is not None else ("", 0)
        ds = self._ds(dataset)
        ds.done += 1
        ds.done_output += output_tokens
        ttft = min(latency_s, ttft_s) if ttft_s is not None else 0.0
        self._ttft_sum += ttft
        self._gen_tokens += output_tokens
        self._gen_s += max(1e-6, latency_s - ttft)
        self._done += 1
        self._done_prompt += prompt
        self._done_cost += cost_usd
        self._longest = max(self._longest, output_tokens)

    # ---- projection ------------------------------------------------------------------------------

    def concurrency(self, now: float) -> float:
        """Mean requests in flight over the trailing window (now, if nothing has been measured yet)."""
        self._tick(now)
        if not self._marks or now <= self._marks[0][0]:
            return float(len(self._flight))
        t0, a0 = self._marks[0]
        return (self._area - a0) / (now - t0)

    def project(self, now: float, spent_usd: float, *, concurrency: float | None = None) -> Projection:
        """The ETA and the projected total cost now (`concurrency`: the caller's capacity figure, else measured)."""
        held = self.concurrency(now) if concurrency is None else float(concurrency)
        if self._done == 0:
            prior = self.prior_output_tokens
            if prior is None:
                return Projection(None, None, math.nan, held, ())
        rate = self._gen_tokens / self._gen_s if self._gen_s > 0 else 0.0  # tokens/s of one request
        ttft = self._ttft_sum / self._done if self._done else 0.0
        flight: dict[str, list[float]] = {}
        flight_prompt = 0
        for dataset, prompt, started in self._flight.values():
            flight.setdefault(dataset, []).append(max(0.0, now - started - ttft) * rate)
            flight_prompt += prompt
        prior = float(self.prior_output_tokens or 0.0)
        pooled = self._mean(sum(ds.done_output for ds in self._datasets.values()),
                            sum(ds.done for ds in self._datasets.values()),
                            [x for xs in flight.values() for x in xs], prior)
        means: dict[str, float] = {}
        out_left = billed_out_left = 0.0
        work_s = 0.0
        longest_s = 0.0
        prompt_left = flight_prompt
        for name, ds in self._datasets.items():
            xs = flight.get(name, [])
            mean = self._mean(ds.done_output, ds.done, xs, pooled) if ds.done else pooled
            means[name] = mean
            residual = [max(mean, x) for x in xs]  # mean residual life grows with the age (heavy tail)
            out_left += ds.pending * mean + sum(residual)
            billed_out_left += ds.pending * mean + sum(residual) + sum(xs)
            prompt_left += ds.pending_prompt
            work_s += ds.pending * ttft
            if residual and rate > 0:
                longest_s = max(longest_s, max(residual) / rate)
                self._longest = max(self._longest, max(x + r for x, r in zip(xs, residual)))
        eta = None
        pending_any = any(ds.pending for ds in self._datasets.values())
        if rate > 0 and held > 0:
            work_s += out_left / rate
            # the work spread over the slots held, never sooner than the longest request in flight ends, plus
            # the tail of list scheduling: the last long request runs on while the other slots go idle
            # (Graham's bound W/c + (1 - 1/c) p_max, with p_max the longest request expected so far)
            tail = (1.0 - 1.0 / max(1.0, held)) * (ttft + self._longest / rate) if pending_any else 0.0
            eta = max(work_s / held + tail, longest_s)
        cost = spent_usd + self._cost_of(prompt_left, billed_out_left)
        return Projection(eta, cost, out_left, held, tuple(sorted(means.items())))

    @staticmethod
    def _mean(done_tokens: float, done: int, flight: list[float], fallback: float) -> float:
        """Mean output length with samples in flight as censored: a sample x tokens in is expected to end at
        x + max(mean, x) (a heavy tail's mean residual life grows with age); solved by fixed point."""
        n = done + len(flight)
        if n == 0:
            return fallback
        mean = (done_tokens + sum(flight)) / max(1, done) if done else max(fallback, max(flight) * 2)
        for _ in range(20):
            new = (done_tokens + sum(x + max(mean, x) for x in flight)) / n
            if abs(new - mean) < 1e-6 * max(1.0, mean):
                break
            mean = new
        return mean

    def _cost_of(self, prompt_tokens: float, output_tokens: float) -> float:
        if self.prices is not None:
            return (prompt_tokens * self.prices.prompt_per_m + output_tokens * self.prices.completion_per_m) / 1e6
        tokens_done = self._done_prompt + self._gen_tokens
        return self._done_cost / tokens_done * (prompt_tokens + output_tokens) if tokens_done else 0.0
