"""The adaptive limit on a fake clock: its rules one by one, then a whole run against each provider profile.

The profiles use the simulator's own `CapacityModel` as the server (tests/engine/limiter_sim.py), with the
bench's targets: within 1.15x of an oracle fixed at the true capacity, never slower than a naive fixed 64
where the naive client is not the oracle, and at most 3 % 429s under a hidden cap.
"""

from __future__ import annotations

import pytest

from app.engine.capacity.limiter import REASONS, AdaptiveLimit
from tests.engine.limiter_sim import FixedPolicy, run


def _fill(lim: AdaptiveLimit, now: float = 0.0) -> list:
    tickets = []
    while lim.can_start(now):
        tickets.append(lim.take(now))
    return tickets


# ---- rules --------------------------------------------------------------------------------------------


def test_slow_start_doubles_per_round_trip():
    lim = AdaptiveLimit(8, 1, 64)
    for rtt in range(3):
        tickets = _fill(lim, float(rtt))
        for t in tickets:
            lim.release()
            lim.on_success(True, ticket=t, now=rtt + 0.5)
    assert lim.limit == 64 and lim.reason() == "at ceiling"


def test_first_overload_sets_the_ceiling_at_the_level_the_server_admitted():
    lim = AdaptiveLimit(30, 1, 64)
    tickets = _fill(lim)
    lim.release()
    change = lim.on_overload(0.01, 1.0, ticket=tickets[24])  # the 25th request in flight was refused
    assert change is not None and lim.limit == 24 and lim.capacity_estimate == 24
    assert lim.can_start(0.01) is False  # 29 still in flight over a limit of 24
    # the other refusals of the same burst (started before the cut) do not cut again
    for t in tickets[25:]:
        lim.release()
        assert lim.on_overload(0.02, 1.0, ticket=t) is None
    assert lim.limit == 24
    assert lim.cooldown_until == 0.0  # one refusal above capacity is answered by the level, not a pause


def test_a_random_429_in_slow_start_is_forgotten_when_a_deeper_request_is_served():
    lim = AdaptiveLimit(8, 1, 64)
    tickets = _fill(lim)
    lim.release()
    lim.on_overload(0.002, 1.0, ticket=tickets[3])  # level 4 refused: noise
    assert lim.limit == 3
    for t in tickets[4:]:  # levels 5..8, sent alongside it, are served
        lim.release()
        lim.on_success(True, ticket=t, now=0.3)
    assert lim.capacity_estimate is None and lim.forgiven == 1  # back in slow start
    assert lim.limit >= 8


def test_random_429s_at_proven_levels_are_forgiven_but_a_storm_cuts_and_honours_retry_after():
    lim = AdaptiveLimit(40, 1, 64)
    lim.ceiling = 40  # proven
    tickets = _fill(lim)
    for t in tickets[:30]:
        lim.release()
        lim.on_success(True, ticket=t, now=0.3)
    lim.release()
    assert lim.on_overload(0.3, 1.0, ticket=tickets[30]) is None  # one in 31: noise
    assert lim.forgiven == 1 and lim.limit >= 40
    changes = []
    for t in tickets[31:]:  # then nine more in a row: the capacity fell
        lim.release()
        changes.append(lim.on_overload(0.31, 2.0, ticket=t))
    cut = [c for c in changes if c is not None]
    assert len(cut) == 1 and cut[0].new < 30 and cut[0].cooldown_s == 2.0  # x 0.7 of the refused level
    assert not lim.can_start(2.0) and lim.reason(2.0) == "cooling down after 429"
    assert lim.can_start(2.31)
    assert lim.capacity_estimate is None  # rediscovered from the cut value


def test_probe_above_the_ceiling_backs_off_while_it_fails_and_raises_the_ceiling_when_served():
    lim = AdaptiveLimit(24, 1, 64)
    lim.ceiling = 24
    now = 0.0
    gaps = []
    for _ in range(4):
        tickets = _fill(lim, now)
        for t in tickets:
            lim.release()
            lim.on_success(True, ticket=t, now=now)
        before = now
        while lim.limit == 24:  # wait for the next probe
            now += 0.05
            t = lim.take(now)
            lim.release()
            lim.on_success(True, ticket=t, now=now)
        gaps.append(now - before)
        probe = lim.take(now)
        probe = lim.take(now) if probe.level <= 24 else probe
        while probe.level <= 24:
            probe = lim.take(now)
        lim.release()
        lim.on_overload(now, 1.0, ticket=probe)  # a hard cap: the probe is refused
        assert lim.limit == 24
        while lim.in_flight:
            lim.release()
    assert gaps[-1] > gaps[0]  # probes thin out
    # now the capacity grew: two requests served above the ceiling prove it
    lim.ceiling, lim.limit = 24, 26
    a, b = [lim.take(now + 20) for _ in range(26)][-2:]
    for t in (a, b):
        lim.on_success(True, ticket=t, now=now + 20.3)
    assert lim.capacity_estimate in (25, 26)


def test_latency_rising_against_its_floor_cuts_and_says_so():
    lim = AdaptiveLimit(32, 1, 64, round_min=16)
    lim.ceiling = 64
    now = 0.0
    for _ in range(3):  # rounds at the floor
        for _ in range(32):
            t = lim.take(now)
            lim.release()
            lim.on_success(False, ticket=t, latency_s=0.3, now=now)
        now += 0.3
    changes = []
    for _ in range(2):  # two rounds at 3x the floor: the server queues (one slow round is not enough)
        change = None
        for _ in range(32):
            t = lim.take(now)
            lim.release()
            change = lim.on_success(False, ticket=t, latency_s=0.9, now=now) or change
        changes.append(change)
    assert changes[0] is None
    change = changes[1]
    assert change is not None and change.reason == "latency rising"
    assert lim.limit == 21  # 32 x 2 x 0.3 / 0.9
    assert lim.reason() == "latency rising"
    st = lim.state()
    assert st.latency_floor_ms == pytest.approx(300.0) and st.latency_recent_ms == pytest.approx(900.0)


def test_operator_pin_holds_against_growth_and_overloads():
    lim = AdaptiveLimit(8, 1, 64)
    lim.set_limit(5)
    for _ in range(100):
        t = lim.take(0.0)
        lim.release()
        lim.on_success(True, ticket=t, now=0.0)
    lim.on_overload(1.0, 3.0)
    assert lim.limit == 5 and lim.reason(1.0) == "pinned"
    assert not lim.can_start(2.0) and lim.can_start(4.0)  # Retry-After still honoured
    assert lim.set_limit(100) == 64 and lim.set_limit(0) == 1


def test_limits_stay_in_bounds_and_reasons_are_known():
    lim = AdaptiveLimit(8, 2, 12)
    for i in range(300):
        t = lim.take(float(i))
        lim.release()
        if i % 3:
            lim.on_success(True, ticket=t, latency_s=0.1 * (1 + i % 7), now=float(i))
        else:
            lim.on_overload(float(i), 0.5, ticket=t)
        assert 2 <= lim.limit <= 12
        assert lim.reason(float(i)) in REASONS


def test_the_engine_starts_at_the_maximum_unless_an_initial_limit_is_configured(tmp_path, sample_data):
    from app.engine.capacity.endpoints import share_limits
    from tests.engine.conftest import make_config

    two = [{"name": "a", "simulator": {}, "weight": 3.0}, {"name": "b", "simulator": {}, "weight": 1.0}]
    config = make_config(
        tmp_path, sample_data, endpoints=two, limits={"concurrency_initial": None, "concurrency_max": 64}
    )
    assert [lim.limit for lim in share_limits(config)] == [48, 16]  # concurrency_max split by weight
    config = make_config(tmp_path, sample_data, endpoints=two, limits={"concurrency_initial": 8})
    assert [lim.limit for lim in share_limits(config)] == [6, 2]


def test_calls_without_tickets_still_work():  # the engine's current call sites
    lim = AdaptiveLimit(4, 1, 10)
    lim.take()
    lim.release()
    lim.on_success(True)
    assert lim.limit == 5
    assert lim.on_overload(0.0, 1.0) is not None
    assert 1 <= lim.limit <= 5


# ---- whole runs against each provider profile (fake clock) ----------------------------------------------

PROFILES = {
    "noise": (dict(noise_429=0.02), lambda: FixedPolicy(64)),
    "cap24": (dict(concurrency_cap=24), lambda: FixedPolicy(24)),
    "rpm": (dict(requests_per_min=3600.0), None),
    "queue16": (dict(batch_slots=16), lambda: FixedPolicy(16)),
    "drop": (dict(concurrency_cap=48, cap_changes=[(7.0, 16)]), lambda: FixedPolicy(48, [(7.0, 16)])),
}


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("seed", [1, 2])
def test_a_run_reaches_the_capacity_of_each_profile(profile, seed):
    # the engine's default start: concurrency_max (64), what the naive fixed client sends
    capacity, oracle = PROFILES[profile]
    adaptive = run(AdaptiveLimit(64, 1, 64), 2000, seed=seed, **capacity)
    naive = run(FixedPolicy(64), 2000, seed=seed, **capacity)
    if oracle is None:  # rpm: the best is the quota itself, 60 requests/s
        best = 2000 / 60.0
    else:
        best = run(oracle(), 2000, seed=seed, **capacity).wall_s
    assert adaptive.wall_s <= 1.15 * best, (adaptive.wall_s, best)
    # never slower than the naive client, the noise profile included (there the naive client is the oracle)
    assert adaptive.wall_s <= naive.wall_s * 1.01, (adaptive.wall_s, naive.wall_s)
    if profile in ("cap24", "drop"):
        # the start's one refusal per request over the cap (40 of 2,000 under cap 24) included
        assert adaptive.overload_rate <= 0.03, adaptive.overload_rate
    if profile == "cap24":
        assert adaptive.limit_at(adaptive.wall_s) in (24, 25)
    if profile == "drop":
        assert adaptive.limit_at(6.5) >= 40 and adaptive.limit_at(12.0) in (16, 17)
    if profile == "queue16":
        # a queue from the first wave on leaves no unqueued latency to measure a floor from: the limit stays
        # where it started, which costs a queueing server nothing in throughput (its batch slots stay full)
        assert adaptive.overloads == 0


@pytest.mark.parametrize("profile", list(PROFILES))
def test_slow_start_from_a_low_initial_limit_still_reaches_the_capacity(profile):
    # concurrency_initial = 8 (the demo's): slow start costs a few round trips, so only the oracle bound holds
    capacity, oracle = PROFILES[profile]
    adaptive = run(AdaptiveLimit(8, 1, 64), 2000, seed=1, **capacity)
    best = 2000 / 60.0 if oracle is None else run(oracle(), 2000, seed=1, **capacity).wall_s
    assert adaptive.wall_s <= 1.15 * best, (adaptive.wall_s, best)
    if profile in ("cap24", "drop"):
        assert adaptive.overload_rate <= 0.03, adaptive.overload_rate
    if profile == "cap24":
        assert adaptive.limit_at(adaptive.wall_s) in (24, 25)
    if profile == "queue16":  # slow start sees the latency rise against its floor and holds below 64
        assert adaptive.overloads == 0 and adaptive.limit_at(adaptive.wall_s) < 64


def test_a_hidden_cap_costs_one_refusal_per_excess_request_at_the_start():
    # starting at the maximum over a cap of 24: the first wave's 40 refusals end slow start at 24 at once
    out = run(AdaptiveLimit(64, 1, 64), 400, seed=3, concurrency_cap=24)
    early = [t for t in out.overload_times if t < 0.01]
    assert len(early) == 40 and out.limit_at(0.01) == 24


def test_a_slot_held_while_its_answer_is_stored_is_left_out_of_the_next_requests_level():
    # the level says how many requests the provider held with this one: an answered request whose result is
    # still being stored keeps its slot (the in-flight bound) but is no longer at the provider
    lim = AdaptiveLimit(8, 1, 8)
    for _ in range(3):
        lim.take(0.0)
    lim.mark_answered()
    ticket = lim.take(0.0)
    assert (ticket.level, lim.in_flight) == (3, 4)
    lim.release(answered=True)  # stored: its slot is free
    lim.release()  # an unanswered one ended (a failure to retry)
    assert lim.take(0.0).level == 3 and lim.in_flight == 3


def test_an_answered_request_being_stored_frees_its_place_on_the_wire_but_not_past_the_maximum():
    # the limit bounds the requests at the provider: a result being reconstructed and stored keeps its slot, yet the
    # next request may go out; the slots in all stay under the maximum (what a crash can lose before storing)
    lim = AdaptiveLimit(4, 1, 6)
    lim.ceiling = 4
    for _ in range(4):
        lim.take(0.0)
    assert not lim.can_start(0.0)
    lim.mark_answered()
    assert lim.can_start(0.0) and lim.take(0.0).level == 4 and lim.on_wire == 4
    lim.mark_answered()
    lim.take(0.0)
    assert lim.in_flight == 6 and lim.on_wire == 4
    lim.mark_answered()
    assert lim.on_wire == 3 and not lim.can_start(0.0)  # 6 slots held: the maximum, though one place is free
    lim.release(answered=True)
    assert lim.can_start(0.0)


def test_a_refusal_at_the_top_proven_level_steps_down_one_instead_of_reading_capacity_falling():
    # two successes counted at level 25 while an answer was still on its way back (the client's count ahead of
    # the server's) raise the ceiling to 25 over a cap of 24; the refusals that follow at level 25 step the
    # ceiling back down one, with no cooldown and no multiplicative cut
    lim = AdaptiveLimit(25, 1, 64)
    lim.ceiling = 25
    refused = []
    for t in _fill(lim)[:4]:  # each answer makes room for one more request at level 25
        lim.mark_answered()
        lim.release(answered=True)
        lim.on_success(True, ticket=t, now=0.3)
        refused.append(lim.take(0.3))
    assert {t.level for t in refused} == {25}
    changes = []
    for t in refused:
        lim.release()
        changes.append(lim.on_overload(0.31, 1.0, ticket=t))
    stepped = [c for c in changes if c is not None]
    assert len(stepped) == 1 and (stepped[0].new, stepped[0].cooldown_s) == (24, 0.0)
    assert lim.limit == 24 and lim.capacity_estimate == 24 and lim.cuts == 0 and lim.cooldown_until == 0.0
    # a fall of the capacity still cuts: refusals below the top proven level, frequent
    lim2 = AdaptiveLimit(40, 1, 64)
    lim2.ceiling = 40
    tickets = _fill(lim2)
    for t in tickets[:20]:
        lim2.release()
        lim2.on_success(True, ticket=t, now=0.3)
    for t in tickets[20:39]:
        lim2.release()
        lim2.on_overload(0.31, 1.0, ticket=t)
    assert lim2.cuts == 1 and lim2.cooldown_until > 0.31
