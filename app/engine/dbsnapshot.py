"""Build a MetricsSnapshot from the run database alone, for attached viewers and `eaglewatch status`.

Reads through a plain read-only `sqlite3` connection (safe from a thread, WAL lets it run beside the
engine). Totals (states, cost, errors, verdicts, per-endpoint sums) come from the maintained tallies of
`app.store.tallies`, so they cost the same at a million rows as at ten. Rates (trailing 10 s / 1 min /
5 min), percentiles (latest 1,024 responses) and the throughput history come from ONE index range over
`responses (run_id, created_at)`: the last five minutes. Rows may be tuples or `sqlite3.Row`s.
In-flight, waiting, the concurrency limits, the per-endpoint metrics, the ETA and the projected cost come
from the engine's heartbeat (`app.store.heartbeat`: its live snapshot, written about once a second) while
that engine is alive, so an attached viewer shows the numbers the in-process face shows; when it is gone,
stopped or never ran they show as 0 (leased is close) and `engine` / `engine_text` say which.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time

from app.engine.budget import cost_per_hour, projected_total
from app.engine.metrics import HISTORY_BUCKET_S, WINDOW_S, percentile
from app.engine.snapshot import EndpointSnapshot, MetricsSnapshot, Rate
from app.engine.snapshot_codec import snapshot_from_json
from app.store.db import connect_readonly  # noqa: F401  (the one connect_readonly; callers import it from here)
from app.store.heartbeat import Heartbeat, Liveness, liveness, read_heartbeat
from app.store.queries import resolve_run
from app.store.tallies import failed_by_class, final_failures_by_endpoint, response_tallies, sample_counts, strategy_counts, verdict_counts

# A stored attempt succeeded when it carries no error class (failed attempts always carry one); the same
# test the response tallies use, so windowed rates and totals agree.
_SUCCESS = "error_class IS NULL"


def _window(conn: sqlite3.Connection, run_id: int, now: float) -> list[tuple]:
    """The run's successful responses of the trailing window in created order: (id, endpoint, ts, tokens, latency, ttft).

    One index range over `responses (run_id, created_at)`; rates, percentiles and the history (overall and
    per endpoint) are all computed from it.
    """
    rows = conn.execute(
        "SELECT id, endpoint, created_at, completion_tokens, latency_ms, ttft_ms FROM responses "
        f"WHERE run_id = ? AND created_at >= ? AND {_SUCCESS}",
        (run_id, now - WINDOW_S),
    ).fetchall()
    return [tuple(r) for r in rows]


def _rate(rows: list[tuple], now: float, age: float) -> Rate:
    vals = {}
    for span in (10, 60, 300):
        n = tok = 0
        for _, _, ts, ct, _, _ in rows:
            if ts >= now - span:
                n += 1
                tok += ct or 0
        d = max(1.0, min(float(span), age))
        vals[span] = (n / d, tok / d)
    return Rate(vals[10][0], vals[60][0], vals[300][0], vals[10][1], vals[60][1], vals[300][1])


def _quantiles(rows: list[tuple], column: int):
    """p50 / p95 of `column` (4: latency, 5: ttft) over the latest 1,024 rows (by id) that have it."""
    latest = []
    for r in sorted(rows, key=lambda r: r[0], reverse=True):
        if r[column] is not None:
            latest.append(r[column])
            if len(latest) == 1024:
                break
    values = sorted(latest)
    return percentile(values, 0.5), percentile(values, 0.95)


_LATENCY, _TTFT = 4, 5


def snapshot_from_db(conn: sqlite3.Connection, run_name: str | None = None, *, now: float | None = None) -> MetricsSnapshot:
    """The snapshot of run `run_name` (the only run when None) as the database records it."""
    now = time.time() if now is None else now
    run = resolve_run(conn, run_name)
    run_id, name, state, reason, created = run.id, run.name, run.state, run.reason, run.created_at
    counts = sample_counts(conn, run_id)
    first = conn.execute("SELECT MIN(created_at) FROM responses WHERE run_id = ?", (run_id,)).fetchone()[0]
    started = first or created
    age = max(1.0, now - started)
    tallies = response_tallies(conn, run_id)
    spent = sum(t.cost_usd for t in tallies)
    truncated = sum(t.truncated for t in tallies)
    errors: dict[str, int] = {}
    for t in tallies:
        if not t.ok:
            errors[t.error_class or ""] = errors.get(t.error_class or "", 0) + t.n
    err = dict(errors)
    for k, v in failed_by_class(conn, run_id).items():
        err[k] = max(err.get(k, 0), v)
    verdicts = list(verdict_counts(conn, run_id).items())
    strategies = list(strategy_counts(conn, run_id).items())
    window = _window(conn, run_id, now)
    rate = _rate(window, now, age)
    lat = _quantiles(window, _LATENCY)
    ttft = _quantiles(window, _TTFT)
    n_buckets = WINDOW_S // HISTORY_BUCKET_S
    hist = [0.0] * n_buckets
    for _, _, ts, ct, _, _ in window:
        b = n_buckets - 1 - int((now - ts) // HISTORY_BUCKET_S)
        if 0 <= b < n_buckets:
            hist[b] += (ct or 0) / HISTORY_BUCKET_S
    endpoints = []
    # one meaning per column in both faces (app.engine.metrics): `failed` counts samples that failed for good at
    # the endpoint of their last request, `retried` the failed requests that were tried again
    finals = final_failures_by_endpoint(conn, run_id)
    for ep_name in sorted({t.endpoint for t in tallies}):
        mine = [t for t in tallies if t.endpoint == ep_name]
        done_n = sum(t.n for t in mine if t.ok)
        failed_n = finals.get(ep_name, 0)
        cost = sum(t.cost_usd for t in mine)
        ep_window = [r for r in window if r[1] == ep_name]
        l50, l95 = _quantiles(ep_window, _LATENCY)
        t50, t95 = _quantiles(ep_window, _TTFT)
        ep_errors = [(t.error_class or "", t.n) for t in mine if not t.ok]
        endpoints.append(EndpointSnapshot(
            name=ep_name, completed=done_n, failed=failed_n, retried=max(0, sum(t.n for t in mine if not t.ok) - failed_n),
            rate=_rate(ep_window, now, age),
            latency_p50_ms=l50, latency_p95_ms=l95, ttft_p50_ms=t50, ttft_p95_ms=t95,
            errors_by_class=tuple(sorted(ep_errors)), cost_usd=cost,
        ))
    pending, leased = counts.get("pending", 0), counts.get("leased", 0)
    remaining = pending + leased
    speed = rate.req_s_1m or rate.req_s_10s
    budget = (run.config.get("limits") or {}).get("budget_usd")
    retried = max(0, sum(errors.values()) - sum(finals.values()))  # the engine's `retried`: tried again
    hb = _heartbeat(conn, run_id)
    live = liveness(hb, now)
    end = now
    if state == "done":  # numbers freeze at DONE: the run ended with its last response
        end = conn.execute("SELECT MAX(created_at) FROM responses WHERE run_id = ?", (run_id,)).fetchone()[0] or now
        end = max(started, min(end, now))
    snap = MetricsSnapshot(
        run_name=name, state=state, state_reason=reason, started_at=started, elapsed_s=end - started,
        eta_s=(remaining / speed if speed > 0 else None) if remaining else 0.0,
        total=sum(counts.values()), pending=pending, leased=leased, done=counts.get("done", 0),
        failed=counts.get("failed", 0), skipped=counts.get("skipped", 0), truncated=truncated,
        retried=retried, in_flight=0, concurrency_limit=0, rate=rate, throughput_history=tuple(hist),
        latency_p50_ms=lat[0], latency_p95_ms=lat[1], ttft_p50_ms=ttft[0], ttft_p95_ms=ttft[1],
        errors_by_class=tuple(sorted(err.items())), cost_usd=spent,
        cost_per_hour=cost_per_hour(spent, end - started),
        projected_cost_usd=projected_total(spent, counts.get("done", 0), remaining), budget_usd=budget,
        verdicts=tuple(sorted(verdicts)), strategies=tuple(sorted(strategies)), endpoints=tuple(endpoints),
        engine=live.state, engine_text=live.short,
    )
    return with_engine(snap, hb, live)


def _heartbeat(conn: sqlite3.Connection, run_id: int) -> Heartbeat | None:
    try:
        return read_heartbeat(conn, run_id)
    except sqlite3.OperationalError:  # a database from before heartbeats (schema < 5), opened without upgrade
        return None


# What only the engine knows, taken from its heartbeat snapshot while it is alive; everything else (counts,
# cost, verdicts) stays the database's, which is never older than the beat.
_LIVE_FIELDS = ("in_flight", "waiting", "concurrency_limit", "eta_s", "projected_cost_usd")


def with_engine(snap: MetricsSnapshot, hb: Heartbeat | None, live: Liveness) -> MetricsSnapshot:
    """`snap` (from the database) with the live engine's in-flight, limits, endpoints, ETA and projection."""
    if not live.alive or hb is None or not hb.snapshot_json:
        return snap
    try:
        beat = snapshot_from_json(hb.snapshot_json)
    except (ValueError, TypeError, KeyError):  # a torn or foreign row: show the database's numbers
        return snap
    endpoints = beat.endpoints
    if beat.state == "done" or snap.state == "done":
        endpoints = tuple(dataclasses.replace(e, in_flight=0, waiting=0) for e in endpoints)
    return dataclasses.replace(
        snap, endpoints=endpoints or snap.endpoints, **{f: getattr(beat, f) for f in _LIVE_FIELDS})
