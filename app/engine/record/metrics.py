"""Rolling-window metrics for one endpoint (and the run as a whole): bounded memory, cheap snapshots.

Rates use one bucket per second over the last five minutes (a ring of 300 slots), so recording is O(1)
and a 10 s / 1 min / 5 min rate is a sum over at most 300 numbers. Latency and TTFT percentiles come from
the most recent `sample_cap` observations that are under five minutes old (a bounded ring, sorted only
when a snapshot is taken). Pure: the caller passes the clock reading (monotonic seconds).
"""

from __future__ import annotations

from collections import Counter, deque

from app.engine.record.snapshot import EndpointLive, Rate
from app.store.count_records import percentile

WINDOW_S = 300
HISTORY_BUCKET_S = 10


class RateWindow:
    """Counts and output tokens per second for the trailing five minutes."""

    def __init__(self, started: float) -> None:
        self.started = started
        self._sec = [-1] * WINDOW_S
        self._n = [0] * WINDOW_S
        self._tok = [0] * WINDOW_S

    def add(self, now: float, tokens: int) -> None:
        """Count one completed request with `tokens` output tokens at time `now`."""
        s = int(now)
        i = s % WINDOW_S
        if self._sec[i] != s:
            self._sec[i] = s
            self._n[i] = 0
            self._tok[i] = 0
        self._n[i] += 1
        self._tok[i] += tokens

    def _sums(self, now: float, span: int) -> tuple[int, int]:
        s_now = int(now)
        n = tok = 0
        for s in range(s_now - span + 1, s_now + 1):
            i = s % WINDOW_S
            if self._sec[i] == s:
                n += self._n[i]
                tok += self._tok[i]
        return n, tok

    def rate(self, now: float) -> Rate:
        """Requests/s and output tokens/s over 10 s, 1 min and 5 min (young runs divide by their age)."""
        age = max(1.0, now - self.started)
        out = []
        for span in (10, 60, 300):
            n, tok = self._sums(now, span)
            d = min(float(span), age)
            out.append((n / d, tok / d))
        return Rate(
            req_s_10s=out[0][0],
            req_s_1m=out[1][0],
            req_s_5m=out[2][0],
            tok_s_10s=out[0][1],
            tok_s_1m=out[1][1],
            tok_s_5m=out[2][1],
        )

    def history(self, now: float, buckets: int = WINDOW_S // HISTORY_BUCKET_S) -> tuple[float, ...]:
        """Output tokens/s per 10 s bucket, oldest first, ending with the bucket that holds `now`."""
        s_now = int(now)
        end = s_now - s_now % HISTORY_BUCKET_S + HISTORY_BUCKET_S  # exclusive end of the current bucket
        out = []
        for b in range(buckets, 0, -1):
            lo = end - b * HISTORY_BUCKET_S
            tok = 0
            for s in range(lo, lo + HISTORY_BUCKET_S):
                i = s % WINDOW_S
                if self._sec[i] == s:
                    tok += self._tok[i]
            out.append(tok / HISTORY_BUCKET_S)
        return tuple(out)


class Observations:
    """The latest `cap` timed observations (e.g. latency in ms), for percentiles over the last five minutes."""

    def __init__(self, cap: int = 1024) -> None:
        self._items: deque[tuple[float, float]] = deque(maxlen=cap)

    def add(self, now: float, value: float) -> None:
        self._items.append((now, value))

    def quantiles(self, now: float, qs: tuple[float, ...] = (0.5, 0.95)) -> tuple[float | None, ...]:
        """The given quantiles of observations younger than five minutes."""
        cutoff = now - WINDOW_S
        values = sorted(v for t, v in self._items if t >= cutoff)
        return tuple(percentile(values, q) for q in qs)


class EndpointMetrics:
    """Everything the snapshot shows for one endpoint; the run's totals use one of these too."""

    def __init__(self, name: str, started: float) -> None:
        self.name = name
        self.completed = 0
        self.failed = 0
        self.retried = 0
        self.truncated = 0
        self.cost_usd = 0.0
        self.errors: Counter[str] = Counter()
        self.rates = RateWindow(started)
        self.latency_ms = Observations()
        self.ttft_ms = Observations()

    def record_completion(
        self, now: float, output_tokens: int, latency_s: float, ttft_s: float | None, cost_usd: float, truncated: bool
    ) -> None:
        """Count one stored response."""
        self.completed += 1
        if truncated:
            self.truncated += 1
        self.cost_usd += cost_usd
        self.rates.add(now, output_tokens)
        self.latency_ms.add(now, latency_s * 1000.0)
        if ttft_s is not None:
            self.ttft_ms.add(now, ttft_s * 1000.0)

    def record_error(self, error_class: str, *, final: bool, retried: bool) -> None:
        """Count one failed attempt: by class, as a retry, and as a failed sample when final."""
        self.errors[str(error_class)] += 1  # a plain str key: orjson refuses a StrEnum key
        if retried:
            self.retried += 1
        if final:
            self.failed += 1

    def snapshot(
        self,
        now: float,
        in_flight: int,
        limit: int,
        *,
        waiting: int = 0,
        limit_reason: str | None = None,
        capacity: int | None = None,
    ) -> EndpointLive:
        """This endpoint's live figures now (in_flight: requests on the wire; the limiter's state); its counts
        over the run are the store's (app.store.queries.run_counts)."""
        lat50, lat95 = self.latency_ms.quantiles(now)
        t50, t95 = self.ttft_ms.quantiles(now)
        return EndpointLive(
            name=self.name,
            in_flight=in_flight,
            waiting=waiting,
            concurrency_limit=limit,
            limit_reason=limit_reason,
            capacity=capacity,
            rate=self.rates.rate(now),
            latency_p50_ms=lat50,
            latency_p95_ms=lat95,
            ttft_p50_ms=t50,
            ttft_p95_ms=t95,
        )
