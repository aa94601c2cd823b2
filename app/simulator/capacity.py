"""A simulated provider's capacity: what makes a real endpoint answer 429 or slow down under load.

Random faults (`faults."429"`) are noise: they hit any request whatever the load. The capacity here depends
on load, the way real providers do:

- `concurrency_cap`: at most this many requests at once; one more is refused with 429 and Retry-After
  (OpenRouter's upstream providers, a per-key concurrency limit). `cap_changes` changes it mid-run:
  `[[30.0, 16]]` = from 30 s after the server started the cap is 16 (another tenant arrived).
- `requests_per_min`, `tokens_per_min`: quotas as token buckets holding `quota_burst_s` seconds' worth
  (OpenAI and OpenRouter upstreams: 429 with `retry-after-ms` when the bucket is empty). Tokens are charged
  at admission (prompt + output of the sample asked for).
- `batch_slots`: a queueing server (SGLang, vLLM): this many requests run at once, the rest wait in a FIFO
  queue for a slot, so latency grows with the queue; it never answers 429.

`CapacityModel` is pure (the caller passes the clock, so it is tested on a fake clock); `CapacityGate` puts
it in front of the aiohttp handler (`await gate.admit(tokens)`, then `gate.release()` when done).
Options are read with getattr from the simulator's or the config's `SimulatorOptions`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.errors import InputError
from app.token_bucket import TokenBucket

CAPACITY_FIELDS = ("concurrency_cap", "cap_changes", "requests_per_min", "tokens_per_min", "batch_slots")


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to one request: admitted, or refused with a 429 after `retry_after_s`."""

    admitted: bool
    retry_after_s: float = 0.0
    reason: str = ""  # "concurrency" | "rpm" | "tpm" when refused


def has_capacity(options: object) -> bool:
    """True when any capacity option is set (otherwise the simulator behaves as before: faults only)."""
    return bool(
        getattr(options, "concurrency_cap", 0)
        or getattr(options, "cap_changes", None)
        or getattr(options, "requests_per_min", 0)
        or getattr(options, "tokens_per_min", 0)
        or getattr(options, "batch_slots", 0)
    )


def check_capacity(options: object) -> None:
    """Raise InputError naming the bad capacity option."""
    for name in ("concurrency_cap", "batch_slots"):
        value = getattr(options, name, 0) or 0
        if int(value) != value or value < 0:
            raise InputError(f"simulator {name}: {value!r}; it must be a whole number >= 0 (0 = none)")
    for name in ("requests_per_min", "tokens_per_min"):
        value = getattr(options, name, 0) or 0
        if value < 0:
            raise InputError(f"simulator {name}: {value!r}; it must be >= 0 (0 = no quota)")
    last = -1.0
    for i, change in enumerate(getattr(options, "cap_changes", None) or ()):
        try:
            at, cap = float(change[0]), int(change[1])
            if len(change) != 2:
                raise ValueError
        except (TypeError, ValueError, IndexError):
            raise InputError(f"simulator cap_changes[{i}]: {change!r}; write [seconds, cap], e.g. [30.0, 16]") from None
        if at < 0 or cap < 0 or at <= last:
            raise InputError(f"simulator cap_changes[{i}]: {change!r}; times must be >= 0 and increasing, caps >= 0")
        last = at


def parse_cap_changes(text: str) -> list[tuple[float, int]]:
    """'30:16,60:48' -> [(30.0, 16), (60.0, 48)] (InputError naming the bad item)."""
    out: list[tuple[float, int]] = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        at, sep, cap = item.partition(":")
        try:
            if not sep:
                raise ValueError
            out.append((float(at), int(cap)))
        except ValueError:
            raise InputError(f"--cap-changes: {item!r} should look like SECONDS:CAP, e.g. 30:16") from None
    return out


class CapacityModel:
    """Concurrency cap (changing on a schedule), rpm/tpm quotas and batch slots of one simulated endpoint."""

    def __init__(
        self, options: object, *, start: float = 0.0, retry_after_s: float = 1.0, quota_burst_s: float = 1.0
    ) -> None:
        check_capacity(options)
        self.start = start
        self.retry_after_s = retry_after_s
        cap = int(getattr(options, "concurrency_cap", 0) or 0)
        self._schedule = [(0.0, cap)] + [(float(t), int(c)) for t, c in getattr(options, "cap_changes", None) or ()]
        rpm = float(getattr(options, "requests_per_min", 0) or 0)
        tpm = float(getattr(options, "tokens_per_min", 0) or 0)
        # quota_burst_s of the quota may go at once (a per-minute quota refilled continuously)
        self._rpm = TokenBucket(rpm, capacity=max(1.0, rpm / 60.0 * quota_burst_s), now=start) if rpm else None
        self._tpm = TokenBucket(tpm, capacity=max(1.0, tpm / 60.0 * quota_burst_s), now=start) if tpm else None
        self.batch_slots = int(getattr(options, "batch_slots", 0) or 0)
        self.active = 0  # admitted requests not yet finished (running or queued for a batch slot)
        self.peak = 0
        self.refused: dict[str, int] = {"concurrency": 0, "rpm": 0, "tpm": 0}

    @property
    def charges_tokens(self) -> bool:
        """True when a tokens/min quota is set (the caller must pass each request's tokens)."""
        return self._tpm is not None

    def cap_at(self, now: float) -> int | None:
        """The concurrency cap in force at `now` (None: no cap)."""
        cap = 0
        for at, c in self._schedule:
            if now - self.start >= at:
                cap = c
        return cap or None

    def try_admit(self, now: float, tokens: int = 0) -> Admission:
        """Admit one request now or refuse it (429) with the wait the server would announce."""
        cap = self.cap_at(now)
        if cap is not None and self.active >= cap:
            self.refused["concurrency"] += 1
            return Admission(False, self.retry_after_s, "concurrency")
        if self._rpm is not None:
            wait = self._rpm.wait_s(now)
            if wait > 0:
                self.refused["rpm"] += 1
                return Admission(False, wait, "rpm")
        if self._tpm is not None:
            wait = self._tpm.wait_s(now)
            if wait > 0:
                self.refused["tpm"] += 1
                return Admission(False, wait, "tpm")
        if self._rpm is not None:
            self._rpm.try_take(1, now)
        if self._tpm is not None:
            self._tpm.try_take(max(0, tokens), now)
        self.active += 1
        self.peak = max(self.peak, self.active)
        return Admission(True)

    def finish(self) -> None:
        """One admitted request ended (answered, failed or cancelled)."""
        self.active = max(0, self.active - 1)


class CapacityGate:
    """`CapacityModel` on the event loop: admission, then a FIFO wait for a batch slot when the server queues."""

    def __init__(
        self, options: object, *, retry_after_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self.model = CapacityModel(options, start=clock(), retry_after_s=retry_after_s)
        slots = self.model.batch_slots
        self._slots = asyncio.Semaphore(slots) if slots else None
        self.queued = 0  # waiting for a batch slot now

    async def admit(self, tokens: int = 0) -> Admission:
        """Admit (after waiting for a batch slot on a queueing server) or refuse; call `release` after an admit."""
        admission = self.model.try_admit(self.clock(), tokens)
        if not admission.admitted or self._slots is None:
            return admission
        self.queued += 1
        try:
            await self._slots.acquire()
        except BaseException:
            self.model.finish()
            raise
        finally:
            self.queued -= 1
        return admission

    def release(self) -> None:
        """The admitted request is done: free its batch slot and its place under the cap."""
        self.model.finish()
        if self._slots is not None:
            self._slots.release()


def retry_after_headers(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds (RFC 9110) plus OpenAI's `retry-after-ms` for sub-second waits."""
    return {"Retry-After": str(max(1, math.ceil(seconds))), "retry-after-ms": str(max(1, round(seconds * 1000)))}
