"""An eval run's report read back from its database (`eaglewatch eval-report`, and `eval` at its end)."""

from __future__ import annotations

import sqlite3
from typing import Any

from app.config import EvalSection
from app.errors import InputError
from app.eval.figures import eval_report
from app.store import queries
from app.store.rows import RunRow


def stored_report(conn: sqlite3.Connection, run: RunRow) -> dict[str, Any]:
    """The report of the eval run `run`, from its stored requests and the config stored with it."""
    if queries.run_kind(conn, run.id) != "eval":
        raise InputError(f"run {run.name!r} is a generation run, not an eval run; `eaglewatch status` reports it")
    section = run.config.get("eval")
    if not isinstance(section, dict):
        raise InputError(f"run {run.name!r}: its stored config has no [eval] table; run `eaglewatch eval` on it again")
    ev = EvalSection.model_validate(section)
    names = [ep["name"] for ep in run.config.get("endpoints", [])]
    drafters = list(ev.endpoints) or [n for n in names if n != ev.baseline]
    report = eval_report(queries.eval_requests(conn, run.id), ev, drafter_endpoints=drafters, baseline=ev.baseline)
    return {"run": run.name, "state": run.state, **report}
