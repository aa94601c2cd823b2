"""`eaglewatch fidelity --db PATH`: how faithful the text path is, per endpoint and upstream provider.

Reads the run database (read-only): per endpoint and provider (responses.provider), the run record's counts
(`app.store.queries.run_counts`, the words of `app.records`): the answers by verification class (verified,
checked against a reference, unchecked), the measured ones (verified answers whose text-only rebuild was also
compared with their true ids, flag `text_path:<verdict>`) and how they came out (exact, benign, truncated,
corrupt by kind), the suspects; from the rows, which suspect flags and the first corrupt sample; the learned
fidelity profile's steps; then the advice ("pin provider X", "ignore Y", "measure more").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

EXAMPLE = """\
eaglewatch fidelity --db /tmp/eaglewatch-demo.db
eaglewatch fidelity --db run.db --run nightly --json | jq '.advice'
eaglewatch fidelity --db run.db --max-corrupt-rate 0.01 --min-verified 50"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, metavar="PATH", help="run database")
    parser.add_argument("--run", metavar="NAME", help="only this run (default: every run in the database)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--max-corrupt-rate", type=float, default=0.02, metavar="R",
                        help="a provider above this measured corrupt rate is advised against (default 0.02)")
    parser.add_argument("--min-verified", type=int, default=20, metavar="N",
                        help="measured answers (verified, text path compared) needed before a provider is judged "
                             "(default 20)")


@dataclass
class Row:
    """The report line of one endpoint and upstream provider: its answers' counts (the run record's), the quality
    gate's tally of the measured ones, which suspect flags, and the learned profile's steps."""

    endpoint: str
    provider: str | None
    answers: Any = None  # app.store.count_records.AnswerCounts (over every run read)
    measured: Any = None  # app.engine.quality.FidelityTally of the measured answers (None: none)
    suspect_flags: Counter = field(default_factory=Counter)
    steps: list = field(default_factory=list)

    def as_json(self) -> dict:
        a, t = self.answers, self.measured
        return {"endpoint": self.endpoint, "provider": self.provider, "samples": a.answers,
                "verification": a.verification(), "verified": a.verified, "measured": a.measured,
                "exact": a.measured_exact, "benign": a.measured_benign, "truncated": a.measured_truncated,
                "corrupt": dict(a.measured_corrupt), "corrupt_rate": round(t.corrupt_rate, 6) if t else 0.0,
                "suspects": a.suspects, "suspect_flags": dict(self.suspect_flags),
                "example_corrupt_pk": t.example_pk if t else None, "steps": self.steps}


def run(args: argparse.Namespace) -> int:
    from app.errors import InputError
    from app.store.profile_store import load_profiles, read_measurements

    if not 0 <= args.max_corrupt_rate <= 1:
        raise InputError(f"--max-corrupt-rate {args.max_corrupt_rate}: a rate must be between 0 and 1")
    measurements = list(read_measurements(args.db, args.run))  # says first when the run does not exist
    rows = build_rows(measurements, provider_counts(args.db, args.run))
    for p in load_profiles(args.db):
        row = rows.get((p.endpoint, p.provider or None))
        if row is not None:
            row.steps = [{"name": s.name, "where": s.where, "inverse": s.inverse, "invertible": s.invertible,
                          "seen": s.seen, "of": s.of} for s in p.steps()]
    advice = advise(list(rows.values()), args.max_corrupt_rate, args.min_verified)
    if args.json:
        json.dump({"rows": [r.as_json() for r in rows.values()], "advice": advice}, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    _print(list(rows.values()), advice, args.db)
    return 0


def provider_counts(db, run: str | None) -> dict[tuple[str, str | None], Any]:
    """AnswerCounts per (endpoint, provider) over the run named `run` (every run when None): the run record's
    counts (app.store.queries.run_counts), summed over runs."""
    from app.store import queries
    from app.store.count_records import merge_answers

    conn = queries.connect_readonly(db)
    try:
        runs = [queries.resolve_run(conn, run, db_label=str(db))] if run is not None else queries.list_runs(conn)
        parts: dict[tuple[str, str | None], list] = {}
        for r in runs:
            for p in queries.run_counts(conn, r.id).providers:
                parts.setdefault((p.endpoint or "?", p.provider), []).append(p.answers)
    finally:
        conn.close()
    return {key: merge_answers(*answers) for key, answers in parts.items()}


def build_rows(measurements, counts: dict[tuple[str, str | None], Any]) -> dict[tuple[str, str | None], Row]:
    """Report rows keyed by (endpoint, provider): the counts (provider_counts); from the stored measurements
    (app.store.profile_store.Measurement), which suspect flags and the quality gate's tally (its example pk)."""
    from app.engine.quality import tally
    from app.tokens.flags import suspect_flags, text_path_of

    rows = {key: Row(key[0], key[1], answers) for key, answers in counts.items()}
    measured = []
    for m in measurements:
        row = rows.get((m.endpoint, m.provider))
        if row is None:  # written after the counts were read
            continue
        text_path = text_path_of(m.flags)
        if text_path is not None:
            measured.append((m.endpoint, m.provider, text_path, m.sample_pk))
        row.suspect_flags.update(suspect_flags(m.flags))
    for t in tally(measured):
        rows[(t.endpoint, t.provider)].measured = t
    return rows


def advise(rows: list[Row], max_rate: float, min_verified: int) -> list[str]:
    """Sentences for the operator: which provider to pin or ignore, where to measure more, what is flagged.

    The judgement is the quality gate's (app.engine.quality.judge), so the advice and a run's gate agree.
    """
    from app.engine.quality import judge

    out: list[str] = []
    by_endpoint: dict[str, list[Row]] = {}
    for r in rows:
        by_endpoint.setdefault(r.endpoint, []).append(r)
    for endpoint, group in by_endpoint.items():
        tallies = [r.measured for r in group if r.measured is not None]
        bad = judge(tallies, max_rate, min_verified, "route_around")
        bad_names = {d.provider for d in bad}
        for d in bad:
            t = next(t for t in tallies if t.provider == d.provider)
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(t.corrupt.items()))
            verb = (f"ignore provider {d.provider!r} (OpenRouter provider.ignore)" if d.action == "route_around"
                    else f"stop using endpoint {endpoint!r} for text rebuilds")
            out.append(f"{verb}: measured corrupt rate {d.rate:.1%} ({kinds} of {d.verified} measured; "
                       f"e.g. sample pk {d.example_pk})")
        good = [t for t in tallies if t.provider and t.provider not in bad_names and t.verified >= min_verified]
        if bad and good:
            best = min(good, key=lambda t: (t.corrupt_rate, -t.verified))
            out.append(f"pin provider {best.provider!r} on {endpoint!r} (OpenRouter provider.order / only): "
                       f"{best.corrupt_rate:.1%} corrupt over {best.verified} measured answers")
        for r in group:
            who = endpoint + (f" / {r.provider}" if r.provider else "")
            a = r.answers
            if a.measured == 0:
                out.append(f"{who}: no measured answers, so its text path is not judged (of its {a.answers} answers: "
                           f"verified {a.verified}, checked against a reference {a.checked}, unchecked {a.unchecked}); "
                           "ask for server ids or logprobs on a probe fraction, or run `eaglewatch calibrate`")
            elif a.measured < min_verified:
                out.append(f"{who}: only {a.measured} measured answer(s) (need {min_verified} to judge); measure more")
            for s in r.steps:
                if not s["invertible"]:
                    out.append(f"{who}: {s['name']} ({s['where']}) cannot be inverted from text; "
                               f"{a.suspects} answer(s) flagged suspect — prefer a provider without it, or ids")
    return out


def _print(rows: list[Row], advice: list[str], db) -> None:
    out = sys.stdout
    out.write(f"{db}: text-path fidelity per endpoint and upstream provider (measured = verified answers whose "
              "text-only rebuild was compared with their true ids)\n")
    out.write(f"  {'endpoint / provider':<32} {'answers':>7} {'measured':>8} {'exact':>6} {'benign':>6} {'trunc':>5} "
              f"{'corrupt':>7} {'rate':>7} {'suspect':>7}\n")
    for r in rows:
        who = r.endpoint + (f" / {r.provider}" if r.provider else "")
        t = r.as_json()
        out.write(f"  {who:<32} {t['samples']:>7} {t['measured']:>8} {t['exact']:>6} {t['benign']:>6} "
                  f"{t['truncated']:>5} {sum(t['corrupt'].values()):>7} {t['corrupt_rate']:>7.1%} {t['suspects']:>7}\n")
        a = r.answers
        out.write(f"      ids: verified {a.verified} · checked against a reference {a.checked} · unchecked "
                  f"{a.unchecked}\n")
        if t["corrupt"]:
            out.write("      corrupt by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(t["corrupt"].items())) + "\n")
        if r.suspect_flags:
            out.write("      suspect flags: " + ", ".join(f"{k} {n}" for k, n in sorted(r.suspect_flags.items())) + "\n")
        for s in r.steps:
            state = "invertible" if s["invertible"] else "NOT invertible"
            out.write(f"      learned: {s['name']} at {s['where']}: {s['inverse']} [{state}, {s['seen']}/{s['of']}]\n")
    if not rows:
        out.write("  no reconstructions stored yet\n")
    if advice:
        out.write("advice:\n")
        for a in advice:
            out.write(f"  - {a}\n")
