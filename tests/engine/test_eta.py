"""The ETA and projected cost are right early: a fake-clock run over the demo's real per-sample lengths."""

from __future__ import annotations

import heapq
import json
import math
import random
from pathlib import Path

import pytest

from app.engine.budget import Prices, projected_total
from app.engine.eta import Projector

ROOT = Path(__file__).resolve().parents[2]
PRICES = Prices(prompt_per_m=0.60, completion_per_m=2.50)  # sample_data/demo.toml's pricing
_Z95 = 1.6448536269514722


def demo_samples() -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) per sample of the demo reference, in the demo prompt file's order."""
    ref = {}
    for line in (ROOT / "sample_data" / "reference.jsonl").read_text().splitlines():
        row = json.loads(line)
        ref[row["id"]] = (row["meta_info"]["prompt_tokens"], len(row["output_ids"]))
    order = [json.loads(line)["id"] for line in (ROOT / "sample_data" / "prompts.openai.jsonl").read_text().splitlines()]
    return [ref[i] for i in order]


def fake_run(samples, concurrency: int, *, seed: int, tokens_per_s: float = 200.0, median_s: float = 0.3,
             p95_s: float = 1.5, check_at: float = 0.25):
    """Run `samples` at a fixed concurrency on a fake clock (the demo simulator's latency: lognormal time to
    first token + output / tokens_per_s). Returns (new projection, old projection, final) at `check_at` done."""
    rng = random.Random(seed)
    mu, sigma = math.log(median_s), (math.log(p95_s) - math.log(median_s)) / _Z95
    proj = Projector(PRICES)
    for prompt, _ in samples:
        proj.add_pending("demo", prompt)
    heap, nxt, t, spent, done = [], 0, 0.0, 0.0, 0
    snap = None
    while done < len(samples):
        while nxt < len(samples) and len(heap) < concurrency:
            ttft = rng.lognormvariate(mu, sigma)
            end = t + ttft + samples[nxt][1] / tokens_per_s
            heapq.heappush(heap, (end, nxt, t, ttft))
            proj.started(nxt, "demo", samples[nxt][0], t)
            nxt += 1
        t, i, started, ttft = heapq.heappop(heap)
        prompt, out = samples[i]
        cost = (prompt * PRICES.prompt_per_m + out * PRICES.completion_per_m) / 1e6
        spent += cost
        done += 1
        proj.finished(i, out, t - started, ttft, cost, t)
        if snap is None and done >= check_at * len(samples):
            p = proj.project(t, spent)
            old_eta_total = t / done * len(samples)  # elapsed scaled by the fraction done
            snap = (t + p.eta_s, p.projected_cost_usd, old_eta_total, projected_total(spent, done, len(samples) - done))
    return snap, (t, spent)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_projection_is_within_15_percent_by_a_quarter_done_at_the_demo_concurrency(seed):
    # 8 is the demo's concurrency_initial (the issue measured the demo holding 9-12); 4 % of the demo samples
    # carry 55 % of its output tokens, every 25th one, so short samples finish first
    samples = demo_samples()
    (end, cost, old_end, old_cost), (final_t, final_cost) = fake_run(samples, 8, seed=seed)
    assert abs(cost / final_cost - 1) <= 0.15, (cost, final_cost)
    assert abs(end / final_t - 1) <= 0.15, (end, final_t)
    assert abs(old_cost / final_cost - 1) > 0.40  # the average over finished samples is far off (48 % low)


@pytest.mark.parametrize("concurrency", [12, 16, 24, 64])
def test_projection_beats_the_average_over_finished_samples_at_higher_concurrency(concurrency):
    # at 64 a quarter of the samples is done 1.5 s into a 30 s run: the long samples in flight are no
    # longer than the short ones yet, so no estimate is within 15 % there; it is still much closer
    samples = demo_samples()
    (end, cost, old_end, old_cost), (final_t, final_cost) = fake_run(samples, concurrency, seed=1)
    assert abs(cost / final_cost - 1) < abs(old_cost / final_cost - 1) - 0.15
    assert abs(end / final_t - 1) < abs(old_end / final_t - 1)


def test_projection_converges_as_the_run_goes_on():
    samples = demo_samples()
    (end, cost, _, _), (final_t, final_cost) = fake_run(samples, 24, seed=2, check_at=0.6)
    assert abs(cost / final_cost - 1) <= 0.15 and abs(end / final_t - 1) <= 0.15


def test_nothing_is_projected_before_a_sample_finishes_and_prices_are_learned_without_a_price_list():
    proj = Projector(None)
    proj.add_pending("a", 100, count=10)
    proj.started(1, "a", 100, 0.0)
    p = proj.project(1.0, 0.0)
    assert p.eta_s is None and p.projected_cost_usd is None
    proj.finished(1, 200, 1.0, 0.2, 0.003, 1.0)  # 300 tokens for $0.003: $1e-5 per token
    p = proj.project(1.0, 0.003)
    assert p.mean_output_tokens == (("a", 200.0),)
    assert p.projected_cost_usd == pytest.approx(0.003 + 9 * 300 * 1e-5)
    assert p.eta_s is not None and p.eta_s > 0


def test_a_seeded_projector_projects_as_one_that_saw_the_samples_finish():
    """A resumed run's projector is seeded with the stored stats; it projects as if it had seen them finish."""
    samples = demo_samples()
    seen, seeded = Projector(PRICES), Projector(PRICES)
    stats = [0, 0, 0.0, 0.0, 0, 0, 0.0]
    for i, (prompt, out) in enumerate(samples[:100]):
        seen.started(i, "demo", prompt, 0.0)
        latency, ttft = 0.3 + out / 200.0, 0.3
        seen.finished(i, out, latency, ttft, out * 2.5e-6, latency)
        for k, v in enumerate((1, out, latency - ttft, ttft, prompt, 0, out * 2.5e-6)):
            stats[k] += v
        stats[5] = max(stats[5], out)
    seeded.seed("demo", *stats)
    for p in (seen, seeded):
        for prompt, _ in samples[100:]:
            p.add_pending("demo", prompt)
    a, b = seen.project(10.0, 0.1, concurrency=16), seeded.project(10.0, 0.1, concurrency=16)
    assert b.eta_s is not None and b.eta_s == pytest.approx(a.eta_s, rel=1e-9)
    assert b.projected_cost_usd == pytest.approx(a.projected_cost_usd, rel=1e-9)
    assert dict(b.mean_output_tokens) == pytest.approx(dict(a.mean_output_tokens))


async def test_a_resumed_run_has_an_eta_before_its_first_new_answer(tmp_path, sample_data):
    """The engine seeds its projector from the run's stored answers: no blank ETA after a restart."""
    from app.engine.run import Run
    from tests.engine.conftest import make_config, sample_inputs
    from app.store.run_store import RunStore

    config = make_config(tmp_path, sample_data, simulator={"latency_median_ms": 300.0, "latency_p95_ms": 400.0})
    store = await RunStore.open(config.run.database)
    run_id = await store.ensure_run(config.run.name, config.redacted())
    inputs = sample_inputs(sample_data, 40)
    await store.ingest(run_id, inputs[:20])
    first = Run(config, store)
    try:
        await first.start()
        await first.wait()
    finally:
        await first.close()
    assert first.snapshot().done == 20
    await store.ingest(run_id, inputs[20:])
    stats = await store.finished_output_stats(run_id)
    assert sum(v[0] for v in stats.values()) == 20
    second = Run(config, store)
    try:
        await second.start()
        snap = second.snapshot()  # the first answer is 300 ms away
        assert snap.done == 20 and snap.eta_s is not None and snap.eta_s > 0
    finally:
        await second.close()
        await store.close()
