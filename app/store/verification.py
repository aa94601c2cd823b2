"""Whether each endpoint × upstream provider of a run is *verified*, *prior only* or *unverified*: the ONE place.

- verified (n probes, x % exact): probe samples with true ids (server ids, logprobs with bytes, or a trusted
  twin's ids) had their text-only reconstruction measured against those ids (`text_path:<verdict>` flags);
- prior only: no probe yet, but the server is known (`server =`, a simulator personality, or what its
  `GET /v1/models` said) and app.tokens.server_steps knows its text steps;
- unverified: neither: nothing proves that text reconstructions of its answers carry the model's ids.

`status_of` is pure over one row's counts; `read_verification(conn, run_id)` reads the counts and the stored
fidelity profiles from the run database; the engine calls `status_of` over its live tallies, so `fidelity`, the
export, `status` and the monitor say the same words about the same counts. `edge_contrasts` compares how often
endpoints return whitespace at the edges of their fields (a server that never does where another one serving
the same model does is likely stripping it). Read-only: nothing here writes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.store.count_records import AnswerCounts
from app.tokens.fidelity_profile import FidelityProfile

VERIFIED = "verified"
PRIOR_ONLY = "prior only"
UNVERIFIED = "unverified"
STATES = (VERIFIED, PRIOR_ONLY, UNVERIFIED)
EDGES = ("reasoning.lead", "reasoning.trail", "content.lead", "content.trail")
CONTRAST_MIN = 30  # fields on each side before two endpoints' edge whitespace is compared
CONTRAST_RATE = 0.05  # the other endpoint returns whitespace at that edge at least this often


@dataclass(frozen=True, slots=True)
class Counts:
    """One endpoint × provider's samples in a run: all, reconstructed from text, judged against a reference (of those
    from text), and its probes by text-path verdict."""

    endpoint: str
    provider: str | None
    samples: int = 0
    text_samples: int = 0
    checked: int = 0  # text samples whose verdict came from a reference (checked against a reference)
    probes: int = 0
    exact: int = 0
    corrupt: int = 0

    @property
    def benign(self) -> int:
        """Probes whose text reconstruction differed from the true ids only by a BPE split (or agreed up to a cut)."""
        return self.probes - self.exact - self.corrupt


@dataclass(frozen=True, slots=True)
class Prior:
    """What the server table says of an endpoint (app.tokens.server_steps): its label, what ground truth the
    server can give on this path ("ids" | "logprobs" | "none"), and what the other path does differently."""

    label: str
    truth: str
    other_path: str = ""


@dataclass(frozen=True, slots=True)
class VerificationStatus:
    """The verification state of one endpoint × upstream provider, with its numbers and the words for them."""

    endpoint: str
    provider: str | None
    state: str  # one of STATES
    probes: int
    exact: int
    benign: int
    corrupt: int
    samples: int
    text_samples: int
    checked: int
    prior: Prior | None

    @property
    def who(self) -> str:
        """'endpoint' or 'endpoint / provider'."""
        return self.endpoint + (f" / {self.provider}" if self.provider else "")

    @property
    def exact_rate(self) -> float | None:
        """Exact share of the probes (None without probes)."""
        return self.exact / self.probes if self.probes else None

    def describe(self) -> str:
        """'verified (24 probes, 95.8 % exact)', 'prior only (transformers serve, streaming; no probe)' or
        'unverified (no probe, server unknown)'."""
        if self.state == VERIFIED:
            return (
                f"{VERIFIED} ({self.probes} probe{'s' if self.probes != 1 else ''}, "
                f"{100 * (self.exact_rate or 0):.1f} % exact)"
            )
        if self.state == PRIOR_ONLY:
            return f"{PRIOR_ONLY} ({self.prior.label if self.prior else '?'}; no probe)"
        return f"{UNVERIFIED} (no probe, server unknown)"

    def advice(self) -> str | None:
        """What would verify this endpoint's text reconstructions (None when it is verified)."""
        if self.state == VERIFIED:
            return None
        truth = self.prior.truth if self.prior else None
        if truth == "ids":
            how = "its probes return token ids: run it (probes are on by default)"
        elif truth == "logprobs":
            how = (
                "probes ask it for logprobs: keep probe_fraction above 0 (or pin an upstream provider that returns "
                "logprobs with bytes)"
            )
        elif truth == "none":
            how = (
                "this server returns neither ids nor logprobs: add the same model on a server that returns ids as a "
                "trusted twin ([[endpoints]] trusted = true), whose greedy probes teach this one's steps"
            )
        else:
            how = (
                'tell eaglewatch what it is: `server = "vllm"` / "sglang" (they return ids), "openrouter" or '
                '"openai" (logprobs), "transformers-serve"; or set probe_fraction if it returns logprobs; or a '
                "trusted twin ([[endpoints]] trusted = true)"
            )
        out = f"{self.who}: {self.describe()} — {how}"
        if self.prior is not None and self.prior.other_path:
            out += f"; {self.prior.other_path}"
        return out

    def as_json(self) -> dict:
        """JSON-ready (`fidelity --json`, the export manifest)."""
        return {
            "endpoint": self.endpoint,
            "provider": self.provider,
            "state": self.state,
            "text": self.describe(),
            "probes": self.probes,
            "exact": self.exact,
            "benign": self.benign,
            "corrupt": self.corrupt,
            "exact_rate": None if self.exact_rate is None else round(self.exact_rate, 6),
            "samples": self.samples,
            "text_samples": self.text_samples,
            "checked_against_reference": self.checked,
            "prior": self.prior.label if self.prior else None,
            "advice": self.advice(),
        }


def status_of(counts: Counts, prior: Prior | None) -> VerificationStatus:
    """The state of one endpoint × provider: verified with at least one probe, else prior only with a known
    server, else unverified."""
    state = VERIFIED if counts.probes else PRIOR_ONLY if prior is not None else UNVERIFIED
    return VerificationStatus(
        counts.endpoint,
        counts.provider,
        state,
        counts.probes,
        counts.exact,
        counts.benign,
        counts.corrupt,
        counts.samples,
        counts.text_samples,
        counts.checked,
        prior,
    )


def prior_of(profile: FidelityProfile) -> Prior | None:
    """The server-table entry a stored profile rests on (None when it has none)."""
    if not profile.source or profile.server is None:
        return None
    from app.tokens.profile import get_profile
    from app.tokens.server_steps import known_steps

    try:
        entry = known_steps(profile.server, bool(profile.stream), get_profile(profile.profile))
    except (KeyError, ValueError):
        entry = None
    if entry is None:
        return Prior(profile.source, "none")
    return Prior(entry.label, entry.truth, entry.other_path)


def statuses(counts: Iterable[Counts], priors: dict[tuple[str, str], Prior]) -> list[VerificationStatus]:
    """`status_of` for each row; a provider without its own prior takes its endpoint's ((endpoint, "") key)."""
    out = []
    for c in counts:
        prior = priors.get((c.endpoint, c.provider or "")) or priors.get((c.endpoint, ""))
        out.append(status_of(c, prior))
    return out


def counts_of(endpoint: str, provider: str | None, answers: AnswerCounts) -> Counts:
    """One endpoint × provider's Counts from the run record's answer counts (app.store.queries.run_counts): the
    same numbers every face shows (probes: its measured answers; text samples: checked + unchecked)."""
    return Counts(
        endpoint,
        provider,
        answers.answers,
        answers.checked + answers.unchecked,
        answers.checked,
        answers.measured,
        answers.measured_exact,
        answers.measured_corrupt_total,
    )


def read_counts(conn: sqlite3.Connection, run_id: int) -> list[Counts]:
    """Per endpoint × provider of the run: samples, text samples, reference-checked ones and probes by verdict."""
    from app.store.queries import run_counts

    return [counts_of(p.endpoint or "?", p.provider, p.answers) for p in run_counts(conn, run_id).providers]


def read_priors(conn: sqlite3.Connection, endpoints: Iterable[str] | None = None) -> dict[tuple[str, str], Prior]:
    """(endpoint, provider or "") -> the server-table entry its stored fidelity profile rests on."""
    wanted = set(endpoints) if endpoints is not None else None
    out: dict[tuple[str, str], Prior] = {}
    try:
        rows = conn.execute("SELECT endpoint, provider, body FROM fidelity_profiles").fetchall()
    except sqlite3.OperationalError:
        return out  # a database from before fidelity profiles
    for endpoint, provider, body in rows:
        if wanted is not None and endpoint not in wanted:
            continue
        try:
            prior = prior_of(FidelityProfile.from_json(body))
        except ValueError:
            continue
        if prior is not None:
            out[(endpoint, provider or "")] = prior
    return out


def trust_of(conn: sqlite3.Connection, providers: Iterable[Any]) -> list[VerificationStatus]:
    """The verification status of each endpoint × provider in `providers` (the run's
    `app.store.count_records.ProviderCounts`): verified, prior only or unverified, as `fidelity` words them."""
    providers = list(providers)
    return statuses(
        [counts_of(p.endpoint or "?", p.provider, p.answers) for p in providers],
        read_priors(conn, {p.endpoint for p in providers if p.endpoint}),
    )


def worst_state(states: Iterable[str]) -> str | None:
    """The least proven of verification states (unverified, then prior only, then verified); None for none."""
    states = set(states)
    return next((s for s in reversed(STATES) if s in states), None)


def read_verification(conn: sqlite3.Connection, run_id: int) -> list[VerificationStatus]:
    """The verification status of every endpoint × provider that answered in the run."""
    counts = read_counts(conn, run_id)
    return statuses(counts, read_priors(conn, {c.endpoint for c in counts}))


# ---- population statistics: whitespace at the edges of returned fields --------------------------------------


@dataclass(frozen=True, slots=True)
class EdgeStats:
    """How many returned fields of one endpoint × provider had text, and how many began / ended in whitespace."""

    endpoint: str
    provider: str | None
    fields: dict[str, int]  # edge (EDGES) -> fields with text there
    spaced: dict[str, int]  # edge -> of those, the ones with whitespace at that edge


_WS = "(' ', char(9), char(10), char(13))"
_EDGE_SQL = f"""
SELECT COALESCE(endpoint, '?'), COALESCE(provider, ''),
       SUM(reasoning IS NOT NULL AND trim(reasoning) != ''),
       SUM(reasoning IS NOT NULL AND trim(reasoning) != '' AND substr(reasoning, 1, 1) IN {_WS}),
       SUM(reasoning IS NOT NULL AND trim(reasoning) != '' AND substr(reasoning, -1, 1) IN {_WS}),
       SUM(content IS NOT NULL AND trim(content) != ''),
       SUM(content IS NOT NULL AND trim(content) != '' AND substr(content, 1, 1) IN {_WS}),
       SUM(content IS NOT NULL AND trim(content) != '' AND substr(content, -1, 1) IN {_WS})
FROM responses WHERE run_id = ? AND error_class IS NULL
GROUP BY 1, 2 ORDER BY 1, 2
"""


def read_edge_stats(conn: sqlite3.Connection, run_id: int) -> list[EdgeStats]:
    """EdgeStats per endpoint × provider of the run's answered requests."""
    out = []
    for e, p, r, rl, rt, c, cl, ct in conn.execute(_EDGE_SQL, (run_id,)):
        r, c = int(r or 0), int(c or 0)
        out.append(
            EdgeStats(
                e,
                p or None,
                dict(zip(EDGES, (r, r, c, c))),
                dict(zip(EDGES, (int(rl or 0), int(rt or 0), int(cl or 0), int(ct or 0)))),
            )
        )
    return out


def edge_contrasts(stats: Iterable[EdgeStats]) -> list[str]:
    """Sentences for edges where one endpoint × provider never returns whitespace (0 of at least CONTRAST_MIN
    fields) while another does at least CONTRAST_RATE of the time: the first likely strips it on the way."""
    stats = list(stats)
    out = []
    for a in stats:
        for edge in EDGES:
            n = a.fields.get(edge, 0)
            if n < CONTRAST_MIN or a.spaced.get(edge, 0):
                continue
            for b in stats:
                m, k = b.fields.get(edge, 0), b.spaced.get(edge, 0)
                if b is a or m < CONTRAST_MIN or k < CONTRAST_RATE * m:
                    continue
                who_a = a.endpoint + (f" / {a.provider}" if a.provider else "")
                who_b = b.endpoint + (f" / {b.provider}" if b.provider else "")
                out.append(
                    f"{who_a} never returns whitespace at {edge} (0 of {n}) where {who_b} does ({k} of {m}): "
                    f"{who_a} likely strips it, so its reconstructed edges are ambiguous; prefer {who_b}, or verify "
                    f"{who_a} with probes"
                )
                break
    return out
