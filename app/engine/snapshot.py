"""Immutable metrics snapshots that the engine publishes and every face polls.

The engine builds one on demand (cheap: no I/O); a face polls it at 1-4 Hz. An attached viewer
rebuilds an equivalent snapshot from the database (`app.store` read queries), so both faces render
the same type.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Rate:
    """Requests/s and output tokens/s over the trailing 10 s, 1 min and 5 min."""

    req_s_10s: float = 0.0
    req_s_1m: float = 0.0
    req_s_5m: float = 0.0
    tok_s_10s: float = 0.0
    tok_s_1m: float = 0.0
    tok_s_5m: float = 0.0


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    name: str
    completed: int = 0
    failed: int = 0
    retried: int = 0
    in_flight: int = 0
    concurrency_limit: int = 0
    rate: Rate = field(default_factory=Rate)
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    errors_by_class: tuple[tuple[str, int], ...] = ()
    cost_usd: float = 0.0
    # the adaptive limit: why it is where it is (app.engine.limiter.REASONS) and the capacity
    # measured so far (None while still growing); waiting: samples of this endpoint between requests (a
    # retry's wait) or being stored, which hold no request on the wire
    waiting: int = 0
    limit_reason: str | None = None
    capacity: int | None = None


@dataclass(frozen=True, slots=True)
class FidelitySnapshot:
    """Measured fidelity of the text path on one endpoint (provider None: all its upstream providers) or one
    upstream provider behind it: samples with true ids (`verified`) whose text-only rebuild was exact,
    benign (bpe_equivalent / truncated) or corrupt."""

    endpoint: str
    provider: str | None = None
    verified: int = 0
    exact: int = 0
    benign: int = 0
    corrupt: int = 0

@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One moment of a run, for dashboards and `status`.

    `state` is one of running | paused | done | stopped | failed; `state_reason` says why when paused
    or stopped (e.g. "402: out of credits", "budget reached", "operator").
    `verdicts` maps verdict category -> count, `strategies` maps strategy -> count.
    `throughput_history` is output tokens/s per recent 10 s bucket, oldest first (for a sparkline).
    `fidelity` is the live measured fidelity (probes with true ids), per endpoint then per upstream provider;
    `prompt_checks` maps agree | differ -> samples whose server prompt ids were compared.
    `in_flight` counts requests on the wire; `waiting` the samples between requests (waiting to retry) or
    waiting to be stored. `engine` is the engine's liveness as an attached reader judges it from the
    heartbeat (app.store.heartbeat: running | stopped | gone | never; None in-process, where the engine is
    this process) and `engine_text` says it in words ("ENGINE GONE (last seen 12 s ago, pid 4242 on gpu-1)").
    """

    run_name: str
    state: str
    state_reason: str | None = None
    started_at: float = 0.0  # unix time
    elapsed_s: float = 0.0
    eta_s: float | None = None
    total: int = 0
    pending: int = 0
    leased: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    truncated: int = 0
    retried: int = 0
    in_flight: int = 0
    concurrency_limit: int = 0
    rate: Rate = field(default_factory=Rate)
    throughput_history: tuple[float, ...] = ()
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    errors_by_class: tuple[tuple[str, int], ...] = ()
    cost_usd: float = 0.0
    cost_per_hour: float = 0.0
    projected_cost_usd: float | None = None
    budget_usd: float | None = None
    verdicts: tuple[tuple[str, int], ...] = ()
    strategies: tuple[tuple[str, int], ...] = ()
    endpoints: tuple[EndpointSnapshot, ...] = ()
    fidelity: tuple[FidelitySnapshot, ...] = ()
    prompt_checks: tuple[tuple[str, int], ...] = ()

    @property
    def measured(self) -> FidelitySnapshot:
        """The run's measured fidelity over every endpoint (the dashboard's match-rate tile)."""
        rows = [f for f in self.fidelity if f.provider is None]
        return FidelitySnapshot("all", None, sum(f.verified for f in rows), sum(f.exact for f in rows),
                                sum(f.benign for f in rows), sum(f.corrupt for f in rows))
    # requests waiting (not on the wire) and the engine's liveness (see the docstring)
    waiting: int = 0
    engine: str | None = None
    engine_text: str | None = None
