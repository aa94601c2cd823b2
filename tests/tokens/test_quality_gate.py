"""The pure quality gate (app/engine/fidelity/quality.py) and its [limits] fields."""

from __future__ import annotations

import pytest

from app.config import parse_config
from app.engine.fidelity.quality import judge, tally
from app.errors import InputError


def _rows(endpoint, provider, exact, corrupt, start_pk=1, kind="text_mismatch"):
    rows = [(endpoint, provider, "exact", start_pk + i) for i in range(exact)]
    rows += [(endpoint, provider, kind, start_pk + exact + i) for i in range(corrupt)]
    return rows


def test_tally_counts_per_endpoint_and_provider():
    rows = _rows("or", "A", 8, 2) + _rows("or", "B", 3, 0, 100) + [("or", "B", "bpe_equivalent", 200)]
    a, b = tally(rows)
    assert (a.provider, a.verified, a.exact, a.corrupt, a.example_pk) == ("A", 10, 8, {"text_mismatch": 2}, 9)
    assert (b.provider, b.verified, b.exact, b.benign, b.corrupt_rate) == ("B", 4, 3, 1, 0.0)


def test_a_provider_over_the_limit_pauses_naming_rate_count_and_example():
    (d,) = judge(tally(_rows("or", "Bad", 15, 5) + _rows("or", "Good", 20, 0, 100)), 0.1, 20)
    assert (d.action, d.provider, d.corrupt, d.verified, d.example_pk) == ("pause", "Bad", 5, 20, 16)
    assert d.rate == pytest.approx(0.25)
    assert "'Bad'" in d.message and "25.0%" in d.message and "5 of 20" in d.message and "pk 16" in d.message


def test_too_few_verified_samples_are_not_judged():
    assert judge(tally(_rows("or", "Bad", 0, 19)), 0.1, 20) == ()
    assert len(judge(tally(_rows("or", "Bad", 0, 20)), 0.1, 20)) == 1


def test_at_the_limit_is_not_over_it_and_no_limit_means_no_gate():
    assert judge(tally(_rows("e", None, 9, 1)), 0.1, 5) == ()
    assert judge(tally(_rows("e", None, 0, 50)), None, 5) == ()


def test_route_around_ignores_a_named_provider_and_pauses_without_one():
    decisions = judge(tally(_rows("or", "Bad", 0, 30) + _rows("sglang", None, 0, 30, 100)), 0.05, 10, "route_around")
    assert [(d.provider, d.action) for d in decisions] == [("Bad", "route_around"), (None, "pause")]
    assert "provider.ignore" in decisions[0].message


def test_limits_fields_are_validated(tmp_path):
    base = {
        "run": {"name": "r"},
        "data": {"datasets": [{"path": "p.jsonl"}]},
        "model": {"name": "m", "tokenizer": "t"},
        "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}],
    }
    cfg = parse_config({**base, "limits": {"max_corrupt_rate": 0.02, "min_verified_samples": 30}}, base_dir=tmp_path)
    assert (cfg.limits.max_corrupt_rate, cfg.limits.min_verified_samples, cfg.limits.on_corrupt) == (0.02, 30, "pause")
    with pytest.raises(InputError, match="max_corrupt_rate"):
        parse_config({**base, "limits": {"max_corrupt_rate": 2}}, base_dir=tmp_path)


def test_a_truncated_text_path_is_counted_apart_from_benign_and_corrupt():
    (t,) = tally([("e", None, "bpe_equivalent", 1), ("e", None, "truncated", 2), ("e", None, "exact", 3)])
    assert (t.verified, t.exact, t.benign, t.truncated, t.corrupt_total) == (3, 1, 1, 1, 0)
