"""The report's figures beyond the means (pure): EAL from per-position rates, paired speedup, A/B with its
interval, the gates per category, and the Markdown and SVG renderings."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from app.config import EvalSection
from app.eval.figures import ab_compare, acceptance_figures, eval_report, expected_length, gates, paired_speedup
from app.eval.render import render_markdown, render_svg
from app.store.rows import EvalRequestRow

EV = EvalSection(drafter="d", dead_after=5, bootstrap=200)


def row(pk: int, accepted: int, steps: int, per_position: tuple[int, ...], **kw) -> EvalRequestRow:
    kw.setdefault("endpoint", "ep")
    return EvalRequestRow(
        run_id=1, sample_pk=pk, spec_source="vllm", accepted=accepted, drafted=steps * 3, steps=steps,
        per_position=per_position, completion_tokens=accepted + steps, **kw,
    )  # fmt: skip


def test_eal_is_one_plus_the_sum_of_products_of_conditional_rates() -> None:
    rates, eal = expected_length([8, 4, 1], 10)
    assert rates == [0.8, 0.5, 0.25]
    assert eal == round(1 + 0.8 + 0.8 * 0.5 + 0.8 * 0.5 * 0.25, 4)
    fig = acceptance_figures([row(1, 13, 10, (8, 4, 1))])
    assert fig["expected_acceptance_length"] == eal and fig["conditional_acceptance"] == rates


def test_a_position_nobody_reached_has_no_conditional_rate() -> None:
    rates, eal = expected_length([0, 0], 5)
    assert rates == [0.0, None] and eal == 1.0


def test_speedup_is_paired_by_prompt_and_ignores_unpaired_answers() -> None:
    drafted = [row(i, 2, 4, (1, 1, 0), tokens_per_s=20.0 + i) for i in range(10)]
    baseline = [row(i, 0, 0, (), endpoint="base", tokens_per_s=10.0 + i / 2) for i in range(8)]
    baseline.append(row(99, 0, 0, (), endpoint="base", tokens_per_s=1000.0))  # no drafted twin: not paired
    got = paired_speedup(drafted, baseline, resamples=200, seed=0)
    assert got is not None and got["pairs"] == 8
    expected = sum(20.0 + i for i in range(8)) / sum(10.0 + i / 2 for i in range(8))
    assert got["speedup"] == round(expected, 3)
    lo, hi = got["speedup_ci95"]
    assert lo <= got["speedup"] <= hi


def test_the_report_carries_the_paired_speedup_of_each_drafter_endpoint() -> None:
    rows = [row(i, 2, 4, (1, 1, 0), tokens_per_s=30.0) for i in range(4)]
    rows += [row(i, 0, 0, (), endpoint="base", tokens_per_s=10.0) for i in range(4)]
    report = eval_report(rows, EV, drafter_endpoints=["ep"], baseline="base")
    assert report["endpoints"]["ep"]["speedup"]["speedup"] == 3.0
    assert report["endpoints"]["ep"]["speedup_vs_baseline"] == 3.0


def test_ab_pairs_by_prompt_and_its_interval_excludes_zero_for_a_clear_winner() -> None:
    a = [row(i, 1 + i % 2, 4, (1, 0, 0), endpoint="a") for i in range(30)]
    b = [row(i, 6 + i % 2, 4, (1, 1, 1), endpoint="b") for i in range(30)]
    ab = ab_compare(a, b, names=("a", "b"), resamples=200)
    assert ab["paired"] and ab["pairs"] == 30
    assert ab["difference"] == round(ab["mean_b"] - ab["mean_a"], 4) == 1.25
    lo, hi = ab["difference_ci95"]
    assert 0 < lo <= 1.25 <= hi


def test_ab_without_common_prompts_compares_the_two_sets_apart() -> None:
    a = [row(i, 2, 4, (1, 1, 0), endpoint="a") for i in range(10)]
    b = [row(100 + i, 4, 4, (1, 1, 1), endpoint="b") for i in range(10)]
    ab = ab_compare(a, b, names=("a", "b"), resamples=200)
    assert not ab["paired"] and ab["difference"] == 0.5 and ab["difference_ci95"] is not None


def test_two_drafter_endpoints_in_one_run_get_an_ab_row() -> None:
    rows = [row(i, 1, 4, (1, 0, 0), endpoint="a") for i in range(5)]
    rows += [row(i, 4, 4, (1, 1, 1), endpoint="b") for i in range(5)]
    report = eval_report(rows, EV, drafter_endpoints=["a", "b"], baseline=None)
    (ab,) = report["ab"]
    assert (ab["a"], ab["b"], ab["difference"], ab["paired"]) == ("a", "b", 0.75, True)


def test_category_gates_name_each_failing_category() -> None:
    rows = [row(i, 4, 4, (1, 1, 1), category="chat") for i in range(5)]
    rows += [row(10 + i, 1, 4, (1, 0, 0), category="code") for i in range(5)]
    report = eval_report(rows, EV, drafter_endpoints=["ep"], baseline=None)
    assert gates(report, {"chat": 1.9, "*": 1.5}) == []
    failures = gates(report, {"code": 2.0, "chat": 1.9, "math": 1.1})
    assert len(failures) == 2
    assert "category 'code': mean acceptance length 1.250 is below --min-acceptance code=2.0" in failures[0]
    assert "category 'math': no request carried acceptance figures" in failures[1]


def test_excluded_prompts_are_left_out_of_every_figure_and_counted() -> None:
    rows = [row(1, 4, 4, (1, 1, 1)), row(2, 0, 4, (0, 0, 0)), row(2, 0, 0, (), endpoint="base", tokens_per_s=5.0)]
    report = eval_report(rows, EV, drafter_endpoints=["ep"], baseline="base", excluded={1})
    assert report["overall"]["figures"]["mean_acceptance_length"] == 1.0
    assert report["overlap_excluded"] == 1


def test_markdown_and_svg_show_the_figures_and_verdicts() -> None:
    rows = [row(i, 0, 10, (0, 0, 0), category="code") for i in range(6)]
    report = eval_report(rows, EV, drafter_endpoints=["ep"], baseline=None)
    md = render_markdown(report)
    assert "| ep | code | 6 | 1.000 |" in md and "**dead drafter** (error)" in md
    svg = render_svg(report)
    root = ET.fromstring(svg)  # well-formed XML
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "acceptance length by category" in texts and "acceptance per draft position" in texts
    assert "code" in texts and "verdicts: dead drafter" in texts
