"""`eaglewatch fidelity --db PATH`: how faithful the text path is, per endpoint and upstream provider.

Reads the run database (read-only): per run, endpoint and provider (responses.provider), the verification state
(app.store.verification: *verified* (n probes, x % exact), *prior only*, *unverified*: the words every face uses);
the run record's counts (`app.store.queries.run_counts`, the words of `app.records`): the answers by verification
class (verified: true ids; checked against a reference; unchecked), the measured ones (verified answers whose
text-only reconstruction was also compared with their true ids, flag `text_path:<verdict>`: the probes) and how they
came
out (exact, benign, truncated, corrupt by kind), the suspects; from the rows, which suspect flags and the first
corrupt sample; the profile's steps (known from the server table, or learned), the population statistics of edge
whitespace; then the advice ("pin provider X", "ignore Y", what would verify an endpoint).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.store.count_records import AnswerCounts

if TYPE_CHECKING:
    from app.engine.fidelity.quality import FidelityTally
    from app.store.count_records import RunCounts
    from app.store.verification import VerificationStatus

EXAMPLE = """\
eaglewatch fidelity --db /tmp/eaglewatch-demo.db
eaglewatch fidelity --db run.db --run nightly --json | jq '.advice'
eaglewatch fidelity --db run.db --max-corrupt-rate 0.01 --min-verified 50"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, metavar="PATH", help="run database")
    parser.add_argument("--run", metavar="NAME", help="only this run (default: every run in the database)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--max-corrupt-rate",
        type=float,
        default=0.02,
        metavar="R",
        help="a provider above this measured corrupt rate is advised against (default 0.02)",
    )
    parser.add_argument(
        "--min-verified",
        type=int,
        default=20,
        metavar="N",
        help="measured answers (verified, text path compared) needed before a provider is judged (default 20)",
    )


@dataclass
class Row:
    """The report line of one run, endpoint and upstream provider: its verification status, its answers' counts
    (the run record's), the quality gate's tally of the measured ones, which suspect flags, the profile's steps."""

    endpoint: str
    provider: str | None
    run: str = ""
    answers: AnswerCounts = field(default_factory=AnswerCounts)
    measured: FidelityTally | None = None  # the quality gate's tally of the measured answers (None: none)
    suspect_flags: Counter = field(default_factory=Counter)
    steps: list = field(default_factory=list)
    status: VerificationStatus | None = None

    def as_json(self) -> dict:
        a, t, s = self.answers, self.measured, self.status
        out = {
            "run": self.run,
            "endpoint": self.endpoint,
            "provider": self.provider,
            "samples": a.answers,
            "verification": a.verification(),
            "verified": a.verified,
            "measured": a.measured,
            "exact": a.measured_exact,
            "benign": a.measured_benign,
            "truncated": a.measured_truncated,
            "corrupt": dict(a.measured_corrupt),
            "corrupt_rate": round(t.corrupt_rate, 6) if t else 0.0,
            "suspects": a.suspects,
            "suspect_flags": dict(self.suspect_flags),
            "example_corrupt_pk": t.example_pk if t else None,
            "steps": self.steps,
        }
        if s is not None:
            out.update(
                {
                    "state": s.state,
                    "text": s.describe(),
                    "probes": s.probes,
                    "text_samples": s.text_samples,
                    "checked_against_reference": s.checked,
                    "prior": s.prior.label if s.prior else None,
                }
            )
        return out


def run(args: argparse.Namespace) -> int:
    from app.errors import InputError
    from app.store.profile_store import load_profiles, read_measurements
    from app.store.queries import connect_readonly, list_runs, run_counts
    from app.store.verification import edge_contrasts, read_edge_stats, read_verification

    if not 0 <= args.max_corrupt_rate <= 1:
        raise InputError(f"--max-corrupt-rate {args.max_corrupt_rate}: a rate must be between 0 and 1")
    measurements = list(read_measurements(args.db, args.run))  # says first when the run does not exist
    conn = connect_readonly(args.db)
    contrasts: list[str] = []
    try:
        runs = [info for info in list_runs(conn) if args.run in (None, info.name)]
        rows = build_rows(measurements, {info.name: run_counts(conn, info.id) for info in runs})
        for info in runs:
            for status in read_verification(conn, info.id):
                row = rows.get((info.name, status.endpoint, status.provider))
                if row is not None:
                    row.status = status
            contrasts += [f"run {info.name!r}: {c}" for c in edge_contrasts(read_edge_stats(conn, info.id))]
    finally:
        conn.close()
    for p in load_profiles(args.db):
        for row in rows.values():
            if row.endpoint == p.endpoint and (row.provider or "") == (p.provider or ""):
                row.steps = [
                    {
                        "name": s.name,
                        "where": s.where,
                        "inverse": s.inverse,
                        "invertible": s.invertible,
                        "seen": s.seen,
                        "of": s.of,
                        "known": s.prior,
                    }
                    for s in p.steps()
                ]
    for row in rows.values():  # a provider without its own profile rests on its endpoint's
        if not row.steps and row.provider:
            same = next((r for r in rows.values() if r.endpoint == row.endpoint and not r.provider and r.steps), None)
            row.steps = list(same.steps) if same else _endpoint_steps(args.db, row.endpoint)
    advice = advise(list(rows.values()), args.max_corrupt_rate, args.min_verified) + contrasts
    if args.json:
        json.dump(
            {"rows": [r.as_json() for r in rows.values()], "advice": advice, "edge_contrasts": contrasts},
            sys.stdout,
            ensure_ascii=False,
        )
        sys.stdout.write("\n")
        return 0
    _print(list(rows.values()), advice, args.db)
    return 0


def _endpoint_steps(db, endpoint: str) -> list:
    from app.store.profile_store import load_profiles

    for p in load_profiles(db):
        if p.endpoint == endpoint and not p.provider:
            return [
                {
                    "name": s.name,
                    "where": s.where,
                    "inverse": s.inverse,
                    "invertible": s.invertible,
                    "seen": s.seen,
                    "of": s.of,
                    "known": s.prior,
                }
                for s in p.steps()
            ]
    return []


def build_rows(measurements, counts: dict[str, RunCounts]) -> dict[tuple[str, str, str | None], Row]:
    """Report rows keyed by (run, endpoint, provider): the run record's counts per endpoint and provider (`counts`:
    run name -> app.store.queries.run_counts); from the stored measurements (app.store.profile_store.Measurement),
    which suspect flags and the quality gate's tally (its example pk)."""
    from app.engine.fidelity.quality import tally
    from app.tokens.flags import suspect_flags, text_path_of

    rows: dict[tuple[str, str, str | None], Row] = {}
    for run_name, rc in counts.items():
        for p in rc.providers:
            key = (run_name, p.endpoint or "?", p.provider)
            rows[key] = Row(key[1], key[2], run_name, p.answers)
    measured: dict[str, list] = {}
    for m in measurements:
        row = rows.get((m.run, m.endpoint, m.provider))
        if row is None:  # written after the counts were read
            continue
        text_path = text_path_of(m.flags)
        if text_path is not None:
            measured.setdefault(m.run, []).append((m.endpoint, m.provider, text_path, m.sample_pk))
        row.suspect_flags.update(suspect_flags(m.flags))
    for run_name, items in measured.items():
        for t in tally(items):
            rows[(run_name, t.endpoint, t.provider)].measured = t
    return rows


def advise(rows: list[Row], max_rate: float, min_verified: int) -> list[str]:
    """Sentences for the operator: which provider to pin or ignore, where to measure more, what would verify an
    endpoint, what is flagged. The judgement is the quality gate's (app.engine.fidelity.quality.judge), so the advice
    and
    a run's gate agree."""
    from app.engine.fidelity.quality import judge

    out: list[str] = []
    by_endpoint: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        by_endpoint.setdefault((r.run, r.endpoint), []).append(r)
    for (_, endpoint), group in by_endpoint.items():
        tallies = [r.measured for r in group if r.measured is not None]
        bad = judge(tallies, max_rate, min_verified, "route_around")
        bad_names = {d.provider for d in bad}
        for d in bad:
            t = next(t for t in tallies if t.provider == d.provider)
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(t.corrupt.items()))
            verb = (
                f"ignore provider {d.provider!r} (OpenRouter provider.ignore)"
                if d.action == "route_around"
                else f"stop using endpoint {endpoint!r} for text reconstructions"
            )
            out.append(
                f"{verb}: measured corrupt rate {d.rate:.1%} ({kinds} of {d.verified} measured; "
                f"e.g. sample pk {d.example_pk})"
            )
        good = [t for t in tallies if t.provider and t.provider not in bad_names and t.verified >= min_verified]
        if bad and good:
            best = min(good, key=lambda t: (t.corrupt_rate, -t.verified))
            out.append(
                f"pin provider {best.provider!r} on {endpoint!r} (OpenRouter provider.order / only): "
                f"{best.corrupt_rate:.1%} corrupt over {best.verified} measured answers"
            )
        for r in group:
            who = endpoint + (f" / {r.provider}" if r.provider else "")
            a = r.answers
            said = r.status.advice() if r.status is not None else None
            if said:
                out.append(said)
            elif a.measured == 0:
                out.append(
                    f"{who}: no measured answers, so its text path is not judged (of its {a.answers} answers: "
                    f"verified {a.verified}, checked against a reference {a.checked}, unchecked {a.unchecked}); "
                    "ask for server ids or logprobs on a probe fraction, or run `eaglewatch calibrate`"
                )
            elif a.measured < min_verified:
                out.append(f"{who}: only {a.measured} measured answer(s) (need {min_verified} to judge); measure more")
            for s in r.steps:
                if not s["invertible"]:
                    out.append(
                        f"{who}: {s['name']} ({s['where']}) cannot be inverted from text; "
                        f"{r.answers.suspects} answer(s) flagged suspect — prefer a provider without it, or ids"
                    )
    return out


def _print(rows: list[Row], advice: list[str], db) -> None:
    out = sys.stdout
    out.write(
        f"{db}: text-path fidelity per endpoint and upstream provider (verified = true ids; measured = "
        "verified answers whose text-only reconstruction was compared with their true ids)\n"
    )
    for r in rows:
        who = (
            (f"{r.run}: " if len({x.run for x in rows}) > 1 else "")
            + r.endpoint
            + (f" / {r.provider}" if r.provider else "")
        )
        t = r.as_json()
        s = r.status
        out.write(f"  {who}: {s.describe() if s else 'unverified'}\n")
        a = r.answers
        out.write(
            f"      {a.answers} answers: verified {a.verified} · checked against a reference {a.checked} · "
            f"unchecked {a.unchecked}; {a.suspects} suspect\n"
        )
        if t["measured"]:
            out.write(
                f"      measured {t['measured']}: exact {t['exact']}, benign {t['benign']}, truncated "
                f"{t['truncated']}, corrupt {sum(t['corrupt'].values())} ({t['corrupt_rate']:.1%})\n"
            )
        if t["corrupt"]:
            out.write("      corrupt by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(t["corrupt"].items())) + "\n")
        if r.suspect_flags:
            out.write(
                "      suspect flags: " + ", ".join(f"{k} {n}" for k, n in sorted(r.suspect_flags.items())) + "\n"
            )
        for st in r.steps:
            state = "invertible" if st["invertible"] else "NOT invertible"
            origin = "known" if st.get("known") else "learned"
            out.write(
                f"      {origin}: {st['name']} at {st['where']}: {st['inverse']} [{state}, {st['seen']}/{st['of']}]\n"
            )
    if not rows:
        out.write("  no reconstructions stored yet\n")
    if advice:
        out.write("advice:\n")
        for line in advice:
            out.write(f"  - {line}\n")
