"""An eval run's report read back from its database (`eaglewatch eval report`, and `eval` at its end).

The guards that need more than the stored requests run here: with `[eval] training` (an export folder) the eval's
sampling is compared with the training data's and eval prompts also trained on are left out of the figures
(`app.eval.training`); with `[eval] d2t` the draft vocabulary's coverage of the eval outputs is said. A training
folder or d2t that cannot be read at report time is a verdict of its own, not a failed report.
`against_report` compares two eval runs (drafter A and B), paired by normalised prompt hash.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from app.config import EvalSection
from app.errors import InputError
from app.eval import training as guards
from app.eval.figures import ab_compare, eval_report
from app.export.eval_overlap import prompt_hash
from app.store import eval_ops, queries
from app.store.rows import EvalRequestRow, RunRow


def _section(conn: sqlite3.Connection, run: RunRow) -> EvalSection:
    if queries.run_kind(conn, run.id) != "eval":
        raise InputError(f"run {run.name!r} is a generation run, not an eval run; `eaglewatch status` reports it")
    section = run.config.get("eval")
    if not isinstance(section, dict):
        raise InputError(f"run {run.name!r}: its stored config has no [eval] table; run `eaglewatch eval` on it again")
    return EvalSection.model_validate(section)


def _drafters(run: RunRow, ev: EvalSection) -> list[str]:
    names = [ep["name"] for ep in run.config.get("endpoints", [])]
    return list(ev.endpoints) or [n for n in names if n != ev.baseline]


def _unreadable(name: str, exc: InputError) -> dict[str, str]:
    return {"verdict": name, "level": "warning", "message": f"{exc}; the guard that needs it did not run"}


def stored_report(conn: sqlite3.Connection, run: RunRow) -> dict[str, Any]:
    """The report of the eval run `run`, from its stored requests and the config stored with it."""
    ev = _section(conn, run)
    drafters = _drafters(run, ev)
    rows = queries.eval_requests(conn, run.id)
    prompts = eval_ops.eval_prompts(conn, run.id)
    found: list[dict[str, str]] = []
    excluded: dict[int, str] = {}
    training_block: dict[str, Any] | None = None
    if ev.training is not None:
        try:
            data = guards.TrainingData.load(ev.training)
        except InputError as exc:
            found.append(_unreadable("training data unreadable", exc))
        else:
            excluded = guards.overlapping({pk: m for pk, (_, m) in prompts.items()}, data)
            said = guards.overlap_verdict(excluded, {pk: sid for pk, (sid, _) in prompts.items()}, len(prompts))
            sampling = guards.sampling_verdict((r.sampling for r in rows if r.error is None), data)
            found += [v for v in (said, sampling) if v is not None]
            training_block = {
                "folder": str(data.folder),
                "sampling": data.sampling,
                "training_prompts": len(data.prompt_hashes),
                "overlapping_prompts": len(excluded),
            }
    report = eval_report(rows, ev, drafter_endpoints=drafters, baseline=ev.baseline, excluded=set(excluded))
    coverage_block: dict[str, Any] | None = None
    if ev.d2t is not None:
        try:
            vocab = guards.read_d2t(ev.d2t)
        except InputError as exc:
            found.append(_unreadable("draft vocabulary unreadable", exc))
        else:
            kept = [
                r.output_ids
                for r in rows
                if r.endpoint in drafters and r.error is None and not r.loop and r.sample_pk not in excluded
            ]
            inside, total = guards.vocabulary_coverage(kept, vocab)
            coverage_block = {
                "d2t": str(ev.d2t),
                "draft_vocab_size": len(vocab),
                "output_tokens": total,
                "inside": inside,
                "coverage": round(inside / total, 4) if total else None,
            }
            said = guards.coverage_verdict(inside, total, ev.min_vocab_coverage, ev.d2t)
            if said is not None:
                found.append(said)
    report["verdicts"] = report["verdicts"] + found
    return {
        "run": run.name,
        "state": run.state,
        **report,
        "training": training_block,
        "draft_vocabulary": coverage_block,
    }


def against_report(conn: sqlite3.Connection, a: RunRow, b: RunRow) -> dict[str, Any]:
    """Drafter B's eval run against drafter A's: their drafter endpoints' mean acceptance lengths and the
    difference (B − A) with its interval, paired by normalised prompt hash where the prompts are the same."""
    ev_a, ev_b = _section(conn, a), _section(conn, b)
    sides = []
    for run, ev in ((a, ev_a), (b, ev_b)):
        drafters = set(_drafters(run, ev))
        hashes = {pk: prompt_hash(m) for pk, (_, m) in eval_ops.eval_prompts(conn, run.id).items()}
        rows: list[EvalRequestRow] = [
            r for r in queries.eval_requests(conn, run.id) if r.endpoint in drafters and r.error is None
        ]
        sides.append((rows, hashes))
    (rows_a, hash_a), (rows_b, hash_b) = sides
    out = ab_compare(
        rows_a,
        rows_b,
        names=(f"{a.name} ({ev_a.drafter})", f"{b.name} ({ev_b.drafter})"),
        key_a=lambda r: hash_a.get(r.sample_pk, r.sample_pk),
        key_b=lambda r: hash_b.get(r.sample_pk, r.sample_pk),
        resamples=ev_a.bootstrap,
        seed=ev_a.seed,
    )
    return {**out, "run_a": a.name, "run_b": b.name, "drafter_a": ev_a.drafter, "drafter_b": ev_b.drafter}
