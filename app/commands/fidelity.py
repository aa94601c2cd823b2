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
    """The report line of one endpoint and upstream provider."""

    endpoint: str
    provider: str | None
    samples: int = 0
    verified: int = 0
    exact: int = 0
    benign: int = 0
    corrupt: Counter = field(default_factory=Counter)
    suspects: int = 0
    suspect_flags: Counter = field(default_factory=Counter)
    example_pk: int | None = None
    steps: list = field(default_factory=list)

    @property
    def corrupt_rate(self) -> float:
        return sum(self.corrupt.values()) / self.verified if self.verified else 0.0

    def as_json(self) -> dict:
        return {"endpoint": self.endpoint, "provider": self.provider, "samples": self.samples, "verified": self.verified,
                "exact": self.exact, "benign": self.benign, "corrupt": dict(self.corrupt),
                "corrupt_rate": round(self.corrupt_rate, 6), "suspects": self.suspects,
                "suspect_flags": dict(self.suspect_flags), "example_corrupt_pk": self.example_pk, "steps": self.steps}


def run(args: argparse.Namespace) -> int:
    from app.errors import InputError
    from app.store.fidelity import load_profiles, read_measurements

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
    """Report rows keyed by (endpoint, provider) from stored measurements (app.store.fidelity.Measurement)."""
    from app.records import CORRUPT_VERDICTS
    from app.tokens.flags import IDS_TEXT, suspect_flags, text_path_of

    rows: dict[tuple[str, str | None], Row] = {}
    for m in measurements:
        row = rows.setdefault((m.endpoint, m.provider), Row(m.endpoint, m.provider))
        row.samples += 1
        measured = text_path_of(m.flags)
        if measured is not None:
            row.verified += 1
            if measured == "exact":
                row.exact += 1
            elif measured in CORRUPT_VERDICTS:
                row.corrupt[measured] += 1
                row.example_pk = row.example_pk if row.example_pk is not None else m.sample_pk
            else:
                row.benign += 1
        suspects = suspect_flags(m.flags) if m.ids_source in (None, IDS_TEXT) else ()
        if suspects:
            row.suspects += 1
            row.suspect_flags.update(suspects)
    return rows


def advise(rows: list[Row], max_rate: float, min_verified: int) -> list[str]:
    """Sentences for the operator: which provider to pin or ignore, where to measure more, what is flagged."""
    out: list[str] = []
    by_endpoint: dict[str, list[Row]] = {}
    for r in rows:
        by_endpoint.setdefault(r.endpoint, []).append(r)
    for endpoint, group in by_endpoint.items():
        judged = [r for r in group if r.verified >= min_verified]
        bad = [r for r in judged if r.corrupt_rate > max_rate]
        good = [r for r in judged if r.corrupt_rate <= max_rate]
        for r in bad:
            what = f"provider {r.provider!r}" if r.provider else f"endpoint {endpoint!r}"
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.corrupt.items()))
            verb = f"ignore {what} (OpenRouter provider.ignore)" if r.provider else f"stop using {what} for text rebuilds"
            out.append(f"{verb}: measured corrupt rate {r.corrupt_rate:.1%} ({kinds} of {r.verified} verified; "
                       f"e.g. sample pk {r.example_pk})")
        named_good = [r for r in good if r.provider]
        if bad and named_good:
            best = min(named_good, key=lambda r: (r.corrupt_rate, -r.verified))
            out.append(f"pin provider {best.provider!r} on {endpoint!r} (OpenRouter provider.order / only): "
                       f"{best.corrupt_rate:.1%} corrupt over {best.verified} verified samples")
        for r in group:
            who = endpoint + (f" / {r.provider}" if r.provider else "")
            if r.verified == 0:
                out.append(f"{who}: no verified samples — all {r.samples} are unchecked (not verified); ask for "
                           "server ids or logprobs on a probe fraction, or run `eaglewatch calibrate`")
            elif r.verified < min_verified:
                out.append(f"{who}: only {r.verified} verified sample(s) (need {min_verified} to judge); measure more")
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
        out.write(f"  {who:<32} {r.samples:>7} {r.verified:>8} {r.exact:>6} {r.benign:>6} "
                  f"{sum(r.corrupt.values()):>7} {r.corrupt_rate:>7.1%} {r.suspects:>7}\n")
        if r.corrupt:
            out.write("      corrupt by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(r.corrupt.items())) + "\n")
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
