"""`eaglewatch fidelity --db PATH`: how faithful the text path is, per endpoint and upstream provider.

Reads the run database (read-only): per endpoint and provider (responses.provider), the verified samples
(true ids whose text-only rebuild was measured, flag `text_path:<verdict>`), how many came out exact,
benign or corrupt (by kind), the suspects among the text-rebuilt samples, and the learned fidelity
profile's steps; then the advice ("pin provider X", "ignore Y", "measure more").
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
                        help="verified samples needed before a provider is judged (default 20)")


@dataclass
class Row:
    """The report line of one endpoint and upstream provider: the quality gate's tally plus the suspects."""

    endpoint: str
    provider: str | None
    measured: Any = None  # app.engine.quality.FidelityTally of the verified samples (None: none)
    samples: int = 0
    suspects: int = 0
    suspect_flags: Counter = field(default_factory=Counter)
    steps: list = field(default_factory=list)

    def as_json(self) -> dict:
        t = self.measured
        return {"endpoint": self.endpoint, "provider": self.provider, "samples": self.samples,
                "verified": t.verified if t else 0, "exact": t.exact if t else 0, "benign": t.benign if t else 0,
                "corrupt": dict(t.corrupt) if t else {}, "corrupt_rate": round(t.corrupt_rate, 6) if t else 0.0,
                "suspects": self.suspects, "suspect_flags": dict(self.suspect_flags),
                "example_corrupt_pk": t.example_pk if t else None, "steps": self.steps}


def run(args: argparse.Namespace) -> int:
    from app.errors import InputError
    from app.store.profile_store import load_profiles, read_measurements

    if not 0 <= args.max_corrupt_rate <= 1:
        raise InputError(f"--max-corrupt-rate {args.max_corrupt_rate}: a rate must be between 0 and 1")
    rows = build_rows(read_measurements(args.db, args.run))
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


def build_rows(measurements) -> dict[tuple[str, str | None], Row]:
    """Report rows keyed by (endpoint, provider) from stored measurements (app.store.profile_store.Measurement)."""
    from app.engine.quality import tally
    from app.tokens.flags import IDS_TEXT, suspect_flags, text_path_of

    rows: dict[tuple[str, str | None], Row] = {}
    verified = []
    for m in measurements:
        row = rows.setdefault((m.endpoint, m.provider), Row(m.endpoint, m.provider))
        row.samples += 1
        measured = text_path_of(m.flags)
        if measured is not None:
            verified.append((m.endpoint, m.provider, measured, m.sample_pk))
        suspects = suspect_flags(m.flags) if m.ids_source in (None, IDS_TEXT) else ()
        if suspects:
            row.suspects += 1
            row.suspect_flags.update(suspects)
    for t in tally(verified):
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
            out.append(f"{verb}: measured corrupt rate {d.rate:.1%} ({kinds} of {d.verified} verified; "
                       f"e.g. sample pk {d.example_pk})")
        good = [t for t in tallies if t.provider and t.provider not in bad_names and t.verified >= min_verified]
        if bad and good:
            best = min(good, key=lambda t: (t.corrupt_rate, -t.verified))
            out.append(f"pin provider {best.provider!r} on {endpoint!r} (OpenRouter provider.order / only): "
                       f"{best.corrupt_rate:.1%} corrupt over {best.verified} verified samples")
        for r in group:
            who = endpoint + (f" / {r.provider}" if r.provider else "")
            n = r.measured.verified if r.measured else 0
            if n == 0:
                out.append(f"{who}: no verified samples — all {r.samples} are unchecked (not verified); ask for "
                           "server ids or logprobs on a probe fraction, or run `eaglewatch calibrate`")
            elif n < min_verified:
                out.append(f"{who}: only {n} verified sample(s) (need {min_verified} to judge); measure more")
            for s in r.steps:
                if not s["invertible"]:
                    out.append(f"{who}: {s['name']} ({s['where']}) cannot be inverted from text; "
                               f"{r.suspects} sample(s) flagged suspect — prefer a provider without it, or ids")
    return out


def _print(rows: list[Row], advice: list[str], db) -> None:
    out = sys.stdout
    out.write(f"{db}: text-path fidelity per endpoint and upstream provider (verified = true ids, text rebuild measured)\n")
    out.write(f"  {'endpoint / provider':<32} {'samples':>7} {'verified':>8} {'exact':>6} {'benign':>6} "
              f"{'corrupt':>7} {'rate':>7} {'suspect':>7}\n")
    for r in rows:
        who = r.endpoint + (f" / {r.provider}" if r.provider else "")
        t = r.as_json()
        out.write(f"  {who:<32} {r.samples:>7} {t['verified']:>8} {t['exact']:>6} {t['benign']:>6} "
                  f"{sum(t['corrupt'].values()):>7} {t['corrupt_rate']:>7.1%} {r.suspects:>7}\n")
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
