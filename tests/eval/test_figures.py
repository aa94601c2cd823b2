"""The eval report's figures and guards over stored request rows (pure)."""

from __future__ import annotations

from app.config import EvalSection
from app.eval.acceptance import spec_figures
from app.eval.figures import acceptance_figures, eval_report, gate, is_loop
from app.store.rows import EvalRequestRow

EV = EvalSection(drafter="d", dead_after=5, bootstrap=200)


def row(accepted: int, steps: int, per_position: tuple[int, ...], *, endpoint: str = "ep", loop: bool = False):
    return EvalRequestRow(
        run_id=1, sample_pk=1, endpoint=endpoint, spec_source="vllm", accepted=accepted, drafted=steps * 3,
        steps=steps, per_position=per_position, loop=loop, completion_tokens=accepted + steps,
    )  # fmt: skip


def test_request_weighted_and_token_weighted_means_differ_on_unequal_lengths() -> None:
    rows = [row(3, 1, (1, 1, 1)), row(0, 9, (0, 0, 0))]  # a short perfect answer, a long dead one
    fig = acceptance_figures(rows)
    assert fig["mean_acceptance_length"] == (4.0 + 1.0) / 2
    assert fig["token_weighted_acceptance_length"] == 1.0 + 3 / 10
    assert fig["per_position_acceptance"] == [0.1, 0.1, 0.1]
    assert fig["histogram"] == [9, 0, 0, 1]  # steps by drafts accepted


def test_bootstrap_interval_is_seeded_and_brackets_the_mean() -> None:
    rows = [row(i % 4, 4, (min(1, i % 4), 0, 0)) for i in range(40)]
    a, b = acceptance_figures(rows, seed=3), acceptance_figures(rows, seed=3)
    lo, hi = a["mean_acceptance_length_ci95"]
    assert a["mean_acceptance_length_ci95"] == b["mean_acceptance_length_ci95"]
    assert lo < a["mean_acceptance_length"] < hi


def test_a_loop_is_a_repeated_cycle_covering_the_output() -> None:
    assert is_loop([5, 6] + [1, 2, 3] * 10)
    assert not is_loop(list(range(40)))
    assert not is_loop([1, 2, 3] * 2 + list(range(100, 140)))  # an early repeat is no loop


def test_dead_drafter_is_called_only_after_enough_requests() -> None:
    few = [row(0, 10, (0, 0, 0)) for _ in range(4)]
    report = eval_report(few, EV, drafter_endpoints=["ep"], baseline=None)
    assert report["verdicts"] == []
    report = eval_report(few + [row(0, 10, (0, 0, 0))], EV, drafter_endpoints=["ep"], baseline=None)
    assert [v["verdict"] for v in report["verdicts"]] == ["dead drafter"]
    assert "draft vocabulary" in report["verdicts"][0]["message"]
    assert gate(report, 1.5) is not None and gate(report, 1.0) is None


def test_loops_are_left_out_and_both_figures_shown() -> None:
    rows = [row(1, 4, (1, 0, 0)) for _ in range(5)] + [row(30, 10, (10, 10, 10), loop=True)]
    report = eval_report(rows, EV, drafter_endpoints=["ep"], baseline=None)
    ep = report["endpoints"]["ep"]
    assert ep["loops"] == 1
    assert ep["figures"]["mean_acceptance_length"] == 1.25
    assert ep["figures_with_loops"]["mean_acceptance_length"] > 1.25
    assert "repetition loops" in [v["verdict"] for v in report["verdicts"]]


def test_requests_without_figures_are_not_averaged_as_zero() -> None:
    silent = EvalRequestRow(run_id=1, sample_pk=2, endpoint="ep", completion_tokens=50)
    report = eval_report([row(2, 4, (1, 1, 0)), silent], EV, drafter_endpoints=["ep"], baseline=None)
    ep = report["endpoints"]["ep"]
    assert ep["figures"]["mean_acceptance_length"] == 1.5 and ep["no_acceptance"] == 1
    report = eval_report([silent], EV, drafter_endpoints=["ep"], baseline=None)
    assert [v["verdict"] for v in report["verdicts"]] == ["no acceptance"]
    assert "--per-request-spec-decode-metrics" in report["verdicts"][0]["message"]
    assert gate(report, 1.0) is not None


def test_vllm_figures_are_read_from_a_body_and_from_a_stream() -> None:
    spec = {
        "num_accepted_draft_tokens": 4, "num_spec_steps": 3, "num_draft_tokens": 9, "num_spec_tokens": 3,
        "acceptance_histogram": [1, 1, 0, 1],
    }  # fmt: skip
    got = spec_figures({"choices": [], "metrics": {"speculative_decoding": spec}})
    assert got is not None and (got.source, got.accepted, got.steps, got.drafted) == ("vllm", 4, 3, 9)
    assert got.per_position == (2, 1, 1)  # from the histogram
    detailed = dict(spec, per_step_accepted=[3, 1, 0])
    stream = [{"choices": [{"delta": {}}]}, {"choices": [], "metrics": {"speculative_decoding": detailed}}]
    assert spec_figures(stream).per_position == (2, 1, 1)  # type: ignore[union-attr]
    assert spec_figures({"choices": [{"message": {}}]}) is None


def test_sglang_meta_info_is_read() -> None:
    meta = {"spec_accept_token_num": 6, "spec_verify_ct": 4, "spec_accept_length": 2.5, "prompt_tokens": 3}
    got = spec_figures({"choices": [{"message": {}}], "meta_info": meta})
    assert got is not None and (got.source, got.accepted, got.steps, got.drafted) == ("sglang", 6, 4, None)
    assert "prompt_tokens" not in got.spec
