"""A few thousand seeded hostile bodies through the real engine (bench/fuzz.py): nothing hangs, stays leased or breaks,
no garbage is stored as good, and the ledger is what was charged."""

from __future__ import annotations

import bench.fuzz as fuzz


async def test_a_few_thousand_seeded_hostile_bodies_leave_no_violation(tmp_path):
    report = await fuzz.run_fuzz(2500, seed=7, samples_per_round=400, folder=tmp_path)
    assert report.violations == 0, fuzz.render(report)
    assert report.rounds >= 4 and 0 < report.streamed < report.bodies  # plain and streamed, both shapes
    served = {name for name, n in report.by_mutation.items() if n}
    assert len(served - {"clean"}) >= 40, sorted(served)
    # the run did real work: most samples stored good, the refused bodies retried
    assert report.done_good > report.samples // 2 and report.done_other and report.failed < report.samples // 10
    assert report.ledger_usd > 0 and abs(report.ledger_usd - report.charged_usd) < 1e-9
