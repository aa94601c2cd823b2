"""Live ground truth in the engine: probes by default, the fidelity profile learned during the run, the
measured text path, the prompt-id check, the trusted twin and the quality gate.

Data flow (docs/architecture.md, "Live fidelity"):

- At start (`open_verification`) each endpoint's server is identified (app.engine.fidelity.identify) and its known text
  steps become its prior fidelity profile (app.tokens.server_steps); stored profiles learned on the same path
  (streaming or not) are loaded on top; what ground truth the server gives decides how it is probed: "ids"
  (vLLM, SGLang without streaming: every request), "logprobs" (OpenRouter, OpenAI-compatible: asked on a probe),
  "none" (transformers serve: only a trusted twin can tell).
- `Verifier.request_extra` decides whether a request is a *probe*: every request while its endpoint (or an
  upstream provider seen behind it) has fewer than `limits.min_verified_samples` verified samples, then
  `probe_fraction` (default 1 where ids come anyway, `DEFAULT_PROBE_FRACTION` where logprobs must be asked,
  spread evenly). It adds the fields that ask for ground truth, the sample id for a simulator (which replays
  that sample), `temperature: 0` when a trusted twin will be asked the same, and the providers the gate routes
  around.
- In the reconstruction worker `EndpointReconstructor.reconstruct` keeps true ids as they are, reconstructs the rest
from text with
  the endpoint × provider's current profile, and on a probe with true ids (its own, or a trusted twin's greedy
  answer to the same prompt) measures the text-only reconstruction against them (`text_path:<verdict>`) and returns
  what the probe showed of the server's steps (`Reconstructed.observed`).
- `Verifier.learn` merges each observation into the endpoint × provider's profile; when that changes what the
  reconstruction does (`plan_key`) the new profile goes to every reconstruction worker (`on_profile`) and to the
  database.
- After the result is stored, `Verifier.observe` tallies the measurement, keeps the prompt-check counts and asks
  `app.engine.fidelity.quality.judge` whether to pause or route around; the Run acts on the decisions it returns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from app.engine.fidelity import quality
from app.records import Completion, Intervention, Reconstruction, Verdict, positional_builder
from app.tokens import Reconstructor
from app.tokens import flags as fl

if TYPE_CHECKING:  # types only: a reconstruction worker process imports this module and needs none of them
    import asyncio
    from pathlib import Path

    from app.config import Endpoint as EndpointConfig
    from app.config import RunConfig
    from app.engine.capacity.endpoints import Endpoint
    from app.store.profile_store import Measurement
    from app.store.run_store import RunStore
    from app.store.store_records import LeasedSample
    from app.store.verification import VerificationStatus
    from app.tokens.fidelity_profile import FidelityProfile
    from app.tokens.profile import Profile
    from app.tokens.prompt_check import PromptCheck

# what asks an OpenRouter-style endpoint for logprobs with bytes (the ids ground truth); OpenRouter passes
# `logprobs` / `top_logprobs` to providers that support them (openrouter.ai/docs/api-reference/parameters)
LOGPROB_PROBE_FIELDS = {"logprobs": True, "top_logprobs": 0}
# servers whose chat API returns output ids when asked (app.providers.servers.ids_request_fields)
IDS_SERVERS = ("vllm", "sglang")
# share of requests probed once an endpoint has its minimum of verified samples, where probes must ask for
# logprobs (a longer answer, no extra tokens billed) or go to a trusted twin (a second request)
DEFAULT_PROBE_FRACTION = 0.05
TWIN_CONCURRENCY = 4  # greedy requests to a trusted twin at once
TRUTH_KINDS = ("ids", "logprobs", "none", "unknown")


@dataclass(frozen=True, slots=True)
class Reconstructed:
    """What the reconstruction hands back: the reconstructed ids, their verdict, the text-path measurement (None: not
    measured), the prompt-id check (None: the server returned no prompt ids), and what a measured probe showed of
    the server's text steps (a one-probe FidelityProfile, None otherwise)."""

    reconstruction: Reconstruction | None
    verdict: Verdict | None
    measured: str | None = None
    prompt_check: PromptCheck | None = None
    observed: FidelityProfile | None = None  # what this probe showed of the endpoint's text steps
    # the answer's ledger of server interventions (app.engine.interventions): reported and measured
    interventions: tuple[Intervention, ...] = ()


class EndpointReconstructor:
    """The engine's reconstruction: one `app.tokens.Reconstructor` per fidelity profile (endpoint and upstream
    provider), the run's own for the rest. `set_profile` replaces one (the event loop thread does, between
    reconstructs: a dict item assignment, atomic for the reconstruction threads that read it)."""

    def __init__(self, base: Reconstructor, profiles: Iterable[FidelityProfile] = ()) -> None:
        self.profile, self.tokenizer = base.profile, base.tokenizer
        # measure=False: the engine measures probes only (measured_category), so the logprob path stays cheap
        self._default = Reconstructor(base.profile, base.tokenizer, base.fidelity, measure=False)
        self._by_key: dict[tuple[str, str], Reconstructor] = {}
        for p in profiles:
            self.set_profile(p)

    def set_profile(self, fp: FidelityProfile) -> None:
        """Reconstruct results of fp's endpoint and provider with `fp` from now on."""
        self._by_key[(fp.endpoint, fp.provider or "")] = Reconstructor(self.profile, self.tokenizer, fp, measure=False)

    @property
    def fidelity_profiles(self) -> tuple[FidelityProfile | None, ...]:
        """The run's own fidelity profile (None: none) and every endpoint's, in order: what reconstructs this
        EndpointReconstructor in another process (app.engine.fidelity.pool.ReconstructorRecipe)."""
        return (self._default.fidelity, *(r.fidelity for r in self._by_key.values()))

    @property
    def learned(self) -> tuple[tuple[str, str], ...]:
        """(endpoint, provider) of every fidelity profile in use."""
        return tuple(self._by_key)

    def reconstructor_for(self, endpoint: str, provider: str | None) -> Reconstructor:
        """The Reconstructor for results of `endpoint` from upstream `provider` (its own profile first)."""
        return self._by_key.get((endpoint, provider or "")) or self._by_key.get((endpoint, "")) or self._default

    def process(self, completion: Completion, reference_ids: Sequence[int] | None) -> tuple[Reconstruction, Verdict]:
        """The plain reconstruction (no endpoint profile, no measurement), as `app.tokens.Reconstructor.process`."""
        return self._default.process(completion, reference_ids)

    def reconstruct(
        self,
        completion: Completion,
        reference_ids: Sequence[int] | None,
        messages: Sequence[dict],
        tools: Sequence[dict] | None,
        *,
        endpoint: str,
        measure: bool,
        twin: Completion | None = None,
    ) -> Reconstructed:
        """Reconstruct `completion`. With `measure` (a probe) and true ids — its own, or those of `twin`, a trusted
        server's greedy answer to the same prompt — the text-only reconstruction is measured against them and the
        server's steps observed (a twin whose answer is not the same text is not used). The server's prompt ids
        (when returned) are compared with the rendered prompt of `messages` and `tools`."""
        r = self.reconstructor_for(endpoint, completion.provider)
        rec, verdict = r.process(completion, reference_ids)
        check = None
        if completion.prompt_token_ids is not None:
            from app.tokens.prompt_check import check_prompt

            check = check_prompt(self.tokenizer, self.profile, messages, tools, completion.prompt_token_ids)
        if not measure:
            return _reconstructed(rec, verdict, None, check, None, ())
        from app.tokens.fidelity_profile import learn
        from app.tokens.reconstruct import REGIONS_FROM_TEXT

        measured = observed = None
        # true ids whose count is not what the server says it generated are not taught from (their layout is off)
        truth = rec.output_ids if rec.ids_source in fl.VERIFIED_SOURCES and fl.TOKEN_COUNT not in rec.flags else None
        whole = REGIONS_FROM_TEXT not in rec.notes
        from_twin = False
        if truth is None and twin is not None:
            found = r.truth_of(twin)
            truth, whole, from_twin = (found[0], found[2], True) if found else (None, False, True)
        if truth is not None:
            seen = learn(
                [(completion, truth)],
                self.profile,
                self.tokenizer,
                endpoint=endpoint,
                provider=completion.provider,
                whole=whole,
                view=r.decoded_view,
            )
            if not (from_twin and _diverged(seen)):
                observed = seen
                measured = r.measured_category(completion, truth)
                rec = Reconstruction(
                    rec.output_ids,
                    rec.strategy,
                    rec.repair,
                    rec.roundtrip,
                    rec.notes,
                    rec.ids_source,
                    tuple(rec.flags) + (fl.text_path_flag(measured),),
                )
        return Reconstructed(rec, verdict, measured, check, observed)


_reconstructed = positional_builder(Reconstructed)  # Reconstructed(*every field), built per reconstructed answer


def _diverged(seen: FidelityProfile) -> bool:
    """A twin's answer that is another text, not the same text after server steps: greedy decoding differed."""
    return bool(seen.unexplained()) or any(k.startswith("edge:") and "~" in v for k, v in seen.observations.items())


@dataclass(frozen=True, slots=True)
class Observed:
    """What one stored result asks of the Run: gate decisions to act on, and a prompt-mismatch event."""

    decisions: tuple[quality.QualityDecision, ...] = ()
    prompt_event: str | None = None


@dataclass
class _Probes:
    """Evenly spread probes: request n is a probe when floor((n+1)·f) > floor(n·f) (f=1: all, 0.25: every 4th);
    `rising` makes every request a probe (the count goes on, so the spread resumes where it was)."""

    fraction: float
    sent: int = 0

    def next(self, rising: bool = False) -> bool:
        n, self.sent = self.sent, self.sent + 1
        if self.fraction <= 0:
            return False
        return rising or int((n + 1) * self.fraction + 1e-9) > int(n * self.fraction + 1e-9)


def probe_fraction_of(endpoint: EndpointConfig, truth: str | None = None) -> float:
    """The endpoint's probe fraction once it has its minimum of verified samples: `probe_fraction` when set;
    else 1 where every answer carries ids anyway, DEFAULT_PROBE_FRACTION where probes ask for logprobs, 0 where
    the server gives no ground truth or is unknown. `truth` (TRUTH_KINDS) defaults to what the endpoint's
    configured server gives."""
    if endpoint.probe_fraction is not None:
        return float(endpoint.probe_fraction)
    truth = truth or truth_of(endpoint, None, True)
    return 1.0 if truth == "ids" else DEFAULT_PROBE_FRACTION if truth == "logprobs" else 0.0


def truth_of(endpoint: EndpointConfig, kind: str | None, stream: bool) -> str:
    """What ground truth `endpoint` (server `kind`, else its configured or simulated one) gives on this path:
    one of TRUTH_KINDS. An unknown server with a probe_fraction set is probed for logprobs."""
    from app.providers.servers import server_kind

    kind = kind or server_kind(endpoint)
    if kind in IDS_SERVERS:
        return "logprobs" if kind == "sglang" and stream else "ids"
    if kind in ("openrouter", "openai"):
        return "logprobs"
    if kind == "transformers-serve":
        return "none"
    return "logprobs" if endpoint.probe_fraction else "unknown"


@dataclass
class Verifier:
    """Per-run live fidelity state (event loop only): probes, learned profiles, tallies, prompt-check counts,
    ignored providers, the trusted twin."""

    endpoints: Sequence[EndpointConfig]  # in the Run's order
    max_corrupt_rate: float | None = None
    min_verified: int = 20
    on_corrupt: str = "pause"
    asks_logprobs: bool = False  # generation.logprobs: every request asks already (with its own top_logprobs)
    stream: bool = False
    _probes: list[_Probes] = field(default_factory=list)
    tallies: dict[tuple[str, str | None], quality.FidelityTally] = field(default_factory=dict)
    _decided: set[tuple[str, str | None]] = field(default_factory=set)
    ignored: dict[str, list[str]] = field(default_factory=dict)  # endpoint -> upstream providers routed around
    prompt_checks: dict[str, int] = field(default_factory=dict)  # agree / differ -> count
    first_differ: tuple[str, int | None, str] | None = None  # (sample id, first diff, describe())
    kinds: list[str | None] = field(default_factory=list)  # server kind per endpoint (None: unknown)
    truth: list[str] = field(default_factory=list)  # TRUTH_KINDS per endpoint
    profiles: dict[tuple[str, str], FidelityProfile] = field(
        default_factory=dict
    )  # (endpoint, provider or "") -> profile
    priors: dict[str, FidelityProfile] = field(default_factory=dict)  # endpoint -> its server's prior profile
    twin: int | None = None  # the trusted endpoint greedy probes are compared with
    on_profile: Callable[[FidelityProfile], None] | None = (
        None  # a profile whose plan changed: to the reconstructions and the store
    )
    samples: Counter = field(default_factory=Counter)  # (endpoint, provider) -> answers reconstructed
    text_samples: Counter = field(default_factory=Counter)  # (endpoint, provider) -> of those, ids from text
    no_truth: Counter = field(default_factory=Counter)  # (endpoint, provider) -> probes answered without truth
    edges: dict[tuple[str, str | None], Counter] = field(default_factory=dict)  # population statistics
    _told: set[str] = field(default_factory=set)  # population-statistics sentences already reported
    _twin_slots: asyncio.Semaphore | None = (
        None  # asyncio.Semaphore over the twin's requests (made on the loop, when first used)
    )

    def __post_init__(self) -> None:
        if not self.kinds:
            self.kinds = [None] * len(self.endpoints)
        self.set_kinds(self.kinds)

    def set_kinds(self, kinds: Sequence[str | None]) -> None:
        """Each endpoint's server kind (app.engine.fidelity.identify): what ground truth it gives, hence its probes."""
        self.kinds = list(kinds)
        self.truth = [truth_of(e, k, self.stream) for e, k in zip(self.endpoints, self.kinds)]
        twins = [i for i, e in enumerate(self.endpoints) if getattr(e, "trusted", False) and self.truth[i] == "ids"]
        self.twin = twins[0] if twins else None
        self._probes = []
        for i, e in enumerate(self.endpoints):
            fraction = probe_fraction_of(e, self.truth[i])
            if self.truth[i] == "none" and getattr(e, "probe_fraction", None) is None:
                fraction = DEFAULT_PROBE_FRACTION if self._twin_for(i) else 0.0
            self._probes.append(_Probes(fraction))

    def stop_probes(self) -> None:
        """Send no more probes (the run stores text only)."""
        for p in self._probes:
            p.fraction = 0.0

    @classmethod
    def of(cls, config: RunConfig) -> Verifier:
        """The Verifier for a RunConfig's endpoints and limits."""
        lim = config.limits
        return cls(
            list(config.endpoints),
            lim.max_corrupt_rate,
            lim.min_verified_samples,
            lim.on_corrupt,
            bool(config.generation.logprobs),
            bool(config.generation.stream),
        )

    def _twin_for(self, index: int) -> bool:
        """Whether requests to endpoint `index` can be compared with a trusted twin."""
        return self.twin is not None and self.twin != index and not getattr(self.endpoints[index], "trusted", False)

    def seed(self, measurements: Iterable[Measurement], prompt_counts: dict[str, int]) -> None:
        """Start from what earlier engines of this run stored (app.store.profile_store Measurements with a
        `text_path:` flag, prompt-check counts), so the gate and the match rate cover the whole run and the
        run's prompt-mismatch event is not repeated after a restart."""
        for m in measurements:
            measured = fl.text_path_of(m.flags)
            if measured is not None:
                self._count(m.endpoint, m.provider, measured, m.sample_pk)
        for status, n in prompt_counts.items():
            if status != "no_server_ids":
                self.prompt_checks[status] = self.prompt_checks.get(status, 0) + n
        if self.prompt_checks.get("differ"):
            self.first_differ = ("", None, "reported by an earlier engine of this run")

    # ---- probes ---------------------------------------------------------------------------------

    def rising(self, index: int) -> bool:
        """Whether endpoint `index` still probes every request: fewer than `min_verified` verified samples in
        all, or an upstream provider seen behind it with fewer (one that answered probes without ground truth
        twice that often is given up on: it cannot be verified this way)."""
        name = self.endpoints[index].name
        mine = [(k, t.verified) for k, t in self.tallies.items() if k[0] == name]
        if sum(v for _, v in mine) < self.min_verified:
            return True
        seen = {k for k in self.samples if k[0] == name}
        verified = dict(mine)
        return any(verified.get(k, 0) < self.min_verified and self.no_truth[k] < 2 * self.min_verified for k in seen)

    def request_extra(self, index: int, sample: LeasedSample | None = None) -> tuple[dict | None, bool]:
        """(the request's extra body fields, whether it is a probe) for a request of `sample` to endpoint `index`."""
        ep = self.endpoints[index]
        truth = self.truth[index]
        probe = self._probes[index].next(self.rising(index))
        extra = dict(ep.extra or {})
        kind = self.kinds[index]
        if kind and not getattr(ep, "server", None) and getattr(ep, "simulator", None) is None:
            # identified at start, not configured: ask for ids as the configured server would be asked
            from app.providers.servers import ids_request_fields

            for k, v in ids_request_fields(kind, self.stream).items():
                extra.setdefault(k, v)
        if probe and truth == "logprobs" and not self.asks_logprobs:
            extra.update(LOGPROB_PROBE_FIELDS)
        if probe and self._twin_for(index) and truth != "ids":
            extra["temperature"] = 0  # the twin is asked the same greedily: two servers, one model, one answer
        if sample is not None and getattr(ep, "simulator", None) is not None:
            from app.simulator.server import SAMPLE_FIELD

            meta = dict(extra.get(SAMPLE_FIELD[0]) or {})
            meta[SAMPLE_FIELD[1]] = sample.sample_id
            extra[SAMPLE_FIELD[0]] = meta
        ignored = self.ignored.get(ep.name)
        if ignored:
            # merged into the endpoint's own routing preferences (OpenRouter `provider.ignore`)
            routing = dict(extra.get("provider") or {})
            routing["ignore"] = sorted(set(routing.get("ignore") or ()) | set(ignored))
            extra["provider"] = routing
        return (extra or None), probe

    def wants_twin(self, index: int, probe: bool, completion: Completion) -> bool:
        """Whether a probe's answer from endpoint `index` should be compared with the trusted twin's: it carries
        no ground truth of its own."""
        return (
            probe
            and self._twin_for(index)
            and not completion.token_ids
            and completion.content_logprobs is None
            and completion.reasoning_logprobs is None
        )

    # ---- learning ---------------------------------------------------------------------------------

    def learn(
        self, endpoint: str, completion: Completion, reconstructed: Reconstructed, probe: bool
    ) -> FidelityProfile | None:
        """Count one reconstructed answer (population statistics, samples, probes without truth) and merge what a
        measured probe observed into the endpoint × provider's profile. Returns the profile when that changed
        what reconstructions do (also handed to `on_profile`), else None."""
        from app.tokens.fidelity_profile import merge, plan_key, with_prior

        provider = completion.provider
        key = (endpoint, provider)
        self.samples[key] += 1
        rec = reconstructed.reconstruction
        if rec is not None and rec.ids_source in (None, fl.IDS_TEXT):
            self.text_samples[key] += 1
        edges = self.edges.get(key)
        if edges is None:
            edges = self.edges[key] = Counter()
        _edge_counts(edges, completion)
        observed = reconstructed.observed
        if observed is None:
            if probe and reconstructed.measured is None:
                self.no_truth[key] += 1
            return None
        pkey = (endpoint, provider or "")
        before = self.profiles.get(pkey)
        if before is None:
            base = self.profiles.get((endpoint, ""))
            prior = self.priors.get(endpoint)
            start = replace(observed, stream=self.stream)
            after = with_prior(start, base if base is not None and base.prior else prior)
        else:
            after = merge(before, observed)
        self.profiles[pkey] = after
        if plan_key(after) != plan_key(before if before is not None else self._fallback(endpoint)):
            if self.on_profile is not None:
                self.on_profile(after)
            return after
        return None

    def learned_profiles(self) -> list[FidelityProfile]:
        """The profiles probes taught this run (to store at the end)."""
        return [fp for fp in self.profiles.values() if fp.probes]

    def _fallback(self, endpoint: str) -> FidelityProfile | None:
        """The profile reconstructions of a new provider of `endpoint` used until now (its endpoint's)."""
        return self.profiles.get((endpoint, "")) or self.priors.get(endpoint)

    # ---- after the store --------------------------------------------------------------------------

    def observe(
        self,
        endpoint: str,
        provider: str | None,
        pk: int,
        sample_id: str,
        measured: str | None,
        check: PromptCheck | None = None,
    ) -> Observed:
        """Count one stored result (its text-path verdict, its PromptCheck); returns the operator event of the
        run's first prompt mismatch and the gate's new decisions (each endpoint/provider decided once)."""
        prompt_event = None
        if check is not None and check.status != "no_server_ids":
            self.prompt_checks[check.status] = self.prompt_checks.get(check.status, 0) + 1
            if check.status == "differ" and self.first_differ is None:
                self.first_differ = (sample_id, check.first_diff, check.describe())
                prompt_event = (
                    f"sample {sample_id!r} ({endpoint}): {check.describe()} — the exported prompt halves would not "
                    "be what the model saw; fix model.profile (or the template) before extracting. Later "
                    "mismatches are counted in the snapshot (prompt_checks), not reported one by one"
                )
        if measured is None:
            return Observed((), prompt_event)
        t = self._count(endpoint, provider, measured, pk)
        decisions = tuple(
            d
            for d in quality.judge((t,), self.max_corrupt_rate, self.min_verified, self.on_corrupt)
            if (d.endpoint, d.provider) not in self._decided
        )
        for d in decisions:
            self._decided.add((d.endpoint, d.provider))
            if d.action == "route_around" and d.provider:
                self.ignored.setdefault(d.endpoint, []).append(d.provider)
        return Observed(decisions, prompt_event)

    def _count(self, endpoint: str, provider: str | None, measured: str, pk: int) -> quality.FidelityTally:
        key = (endpoint, provider)
        t = self.tallies[key] = quality.add(
            self.tallies.get(key) or quality.FidelityTally(endpoint, provider), measured, pk
        )
        return t

    @property
    def verified(self) -> int:
        """Verified (measured) samples over every endpoint and provider."""
        return sum(t.verified for t in self.tallies.values())

    def statuses(self) -> list[VerificationStatus]:
        """app.store.verification.VerificationStatus of every endpoint (and provider seen behind it) now: the
        same words `fidelity`, the export and `status` use."""
        from app.store.verification import Counts, Prior, statuses
        from app.tokens.server_steps import known_steps

        seen = set(self.samples) | set(self.tallies)
        keys: list[tuple[str, str | None]] = []
        for e in self.endpoints:  # an endpoint that answered is described by the providers it answered as
            keys.extend(sorted((k for k in seen if k[0] == e.name), key=lambda k: k[1] or "") or [(e.name, None)])
        counts = []
        for endpoint, provider in keys:
            t = self.tallies.get((endpoint, provider))
            counts.append(
                Counts(
                    endpoint,
                    provider,
                    self.samples[(endpoint, provider)],
                    self.text_samples[(endpoint, provider)],
                    0,
                    t.verified if t else 0,
                    t.exact if t else 0,
                    t.corrupt_total if t else 0,
                )
            )
        priors: dict[tuple[str, str], Prior] = {}
        for i, e in enumerate(self.endpoints):
            fp = self.priors.get(e.name)
            if fp is None:
                continue
            entry = known_steps(self.kinds[i], self.stream, _profile_of(fp))
            if entry is not None:
                priors[(e.name, "")] = Prior(entry.label, entry.truth, entry.other_path)
        return statuses(counts, priors)

    def pending_notes(self) -> list[str]:
        """Population-statistics sentences not reported yet (looked at every 50 answers)."""
        if sum(self.samples.values()) % 50:
            return []
        fresh = [n for n in self.edge_notes() if n not in self._told]
        self._told.update(fresh)
        return fresh

    def edge_notes(self) -> list[str]:
        """Population statistics: edges one endpoint never returns whitespace at where another does."""
        from app.store.verification import EDGES, EdgeStats, edge_contrasts

        stats = [
            EdgeStats(e, p, {k: c[k] for k in EDGES}, {k: c["ws:" + k] for k in EDGES})
            for (e, p), c in self.edges.items()
        ]
        return edge_contrasts(stats)


def _profile_of(fp: FidelityProfile) -> Profile:
    from app.tokens import get_profile

    return get_profile(fp.profile)


def _edge_counts(c: Counter, completion: Completion) -> None:
    """Count which returned fields had text and which began / ended in whitespace (EdgeStats, live)."""
    for name, text in (("reasoning", completion.reasoning), ("content", completion.content)):
        if text and not text.isspace():
            c[f"{name}.lead"] += 1
            c[f"{name}.trail"] += 1
            if text[0].isspace():
                c[f"ws:{name}.lead"] += 1
            if text[-1].isspace():
                c[f"ws:{name}.trail"] += 1


async def open_verification(
    verifier: Verifier,
    reconstructor: Reconstructor | None,
    config: RunConfig,
    db_path: Path,
    endpoints: Sequence[Endpoint],
) -> tuple[EndpointReconstructor | Reconstructor | None, list[tuple[str, str]]]:
    """Identify the endpoints' servers, give each its prior profile, load the stored profiles learned on this
    path, seed the verifier with the run's stored measurements, and wrap `reconstructor` in an EndpointReconstructor
    over
    those profiles. Returns it with the operator's (level, sentence) notes. A reconstructor that is not a tokens
    Reconstructor (a pass-through) is returned as is, the verifier still identified and seeded."""
    import asyncio
    from pathlib import Path

    from app.engine.fidelity.identify import identify
    from app.tokens.fidelity_profile import with_prior
    from app.tokens.server_steps import prior_profile

    notes: list[tuple[str, str]] = []
    identities = await identify(endpoints)
    verifier.set_kinds([i.kind for i in identities])
    for ep, ident in zip(endpoints, identities):
        if ident.how in ("GET /models", "host"):
            notes.append(("info", f"{ep.name}: identified as {ident.kind} ({ident.how})"))
    profile = getattr(reconstructor, "profile", None)
    wrappable = hasattr(reconstructor, "measured_category") and profile is not None
    stored: list[FidelityProfile] = []
    db_path = Path(db_path)
    if wrappable and db_path.exists():
        from app.store.profile_store import load_profiles

        stored = await asyncio.to_thread(load_profiles, db_path, config.model.profile)
    names = [e.name for e in endpoints]
    for i, ep in enumerate(endpoints):
        if not wrappable or profile is None:  # (wrappable implies a profile)
            break
        simulated = getattr(verifier.endpoints[i], "simulator", None) is not None
        prior = prior_profile(verifier.kinds[i], verifier.stream, profile, ep.name, simulated=simulated)
        if prior is not None:
            verifier.priors[ep.name] = prior
            verifier.profiles[(ep.name, "")] = prior
    for fp in stored:
        if fp.endpoint not in names:
            continue
        if fp.stream is not None and fp.stream != verifier.stream:
            notes.append(
                (
                    "info",
                    f"{fp.endpoint}{f' / {fp.provider}' if fp.provider else ''}: the stored fidelity "
                    f"profile was learned {'streaming' if fp.stream else 'without streaming'}; this run "
                    f"{'streams' if verifier.stream else 'does not stream'}, so it is learned afresh",
                )
            )
            continue
        # a stored profile rests on today's table entry for its server, not on the one it was saved with
        fp = with_prior(replace(fp, prior={}, source=None, server=None), verifier.priors.get(fp.endpoint))
        if not fp.probes:
            continue
        verifier.profiles[(fp.endpoint, fp.provider or "")] = fp
        if fp.probes:
            notes.append(
                (
                    "info",
                    f"{fp.endpoint}{f' / {fp.provider}' if fp.provider else ''}: applying the "
                    f"learned fidelity profile ({fp.probes} probes) to reconstructions from text",
                )
            )
    for name, fp in verifier.priors.items():
        learned = verifier.profiles.get((name, ""))
        if learned is fp:
            notes.append(
                (
                    "info",
                    f"{name}: {fp.source}: applying its known text steps (server table) until "
                    "probes confirm or correct them",
                )
            )
    for i, ep in enumerate(endpoints):
        if verifier.truth[i] == "unknown" and getattr(ep.config, "probe_fraction", None) is None:
            notes.append(
                (
                    "warning",
                    f"{ep.name}: the server is unknown ({identities[i].how}) and nothing verifies "
                    "its text reconstructions: set `server =` on the endpoint (vllm / sglang return ids), a "
                    "probe_fraction if it returns logprobs, or a trusted twin; the export refuses its "
                    "reconstructions from text unless --accept-unverified",
                )
            )
        elif verifier.truth[i] == "none" and not verifier._twin_for(i):
            notes.append(
                (
                    "warning",
                    f"{ep.name}: {ep.config.server or verifier.kinds[i]} returns neither ids nor "
                    "logprobs: its text reconstructions rest on the server table alone (prior only); a trusted twin "
                    "([[endpoints]] trusted = true) would verify them",
                )
            )
    await seed_from_store(verifier, db_path, config.run.name)
    if not wrappable:
        verifier.stop_probes()  # nothing reconstructs the answers (a pass-through): no probe could be measured
        return reconstructor, notes
    assert reconstructor is not None  # wrappable: it has a profile
    return EndpointReconstructor(reconstructor, list(verifier.profiles.values())), notes


async def ask_twin(
    verifier: Verifier, endpoints: Sequence[Endpoint], sample: LeasedSample, model: str
) -> Completion | None:
    """The trusted twin's greedy answer to `sample` (None when it fails: the probe then goes unmeasured). At most
    TWIN_CONCURRENCY at once; not counted in the run's budget (a twin is the operator's own server)."""
    import asyncio

    twin = verifier.twin
    if twin is None:
        return None
    if verifier._twin_slots is None:
        verifier._twin_slots = asyncio.Semaphore(TWIN_CONCURRENCY)
    from app.providers.servers import ids_request_fields

    ep = endpoints[twin]
    extra = dict(ep.config.extra or {})
    extra["temperature"] = 0
    for k, v in ids_request_fields(verifier.kinds[twin], verifier.stream).items():
        extra.setdefault(k, v)
    if getattr(verifier.endpoints[twin], "simulator", None) is not None:  # a simulator replays the sample asked for
        from app.simulator.server import SAMPLE_FIELD

        extra[SAMPLE_FIELD[0]] = {**(extra.get(SAMPLE_FIELD[0]) or {}), SAMPLE_FIELD[1]: sample.sample_id}
    async with verifier._twin_slots:
        try:
            return await ep.client.complete(sample.messages, sample.tools, model=model, extra=extra)
        except asyncio.CancelledError:
            raise
        except Exception:
            verifier.no_truth[(endpoints[twin].name, "twin failed")] += 1
            return None


def save_profiles(store: RunStore, profiles: Sequence[FidelityProfile], tokenizer: str = "") -> Awaitable[None]:
    """The store write (an awaitable, for the Run's StoreGate) that keeps `profiles` in the run database."""
    from app.store.profile_store import profiles_op

    return store.write(profiles_op(list(profiles), tokenizer))


async def seed_from_store(verifier: Verifier, db_path: Path, run_name: str) -> int:
    """Seed `verifier` with the run's stored measurements (read-only, in a thread); returns how many."""
    import asyncio
    from pathlib import Path

    from app.store.profile_store import prompt_check_counts, read_measurements

    if not Path(db_path).exists():
        return 0

    def read() -> tuple[list[Measurement], dict[str, int]]:
        from app.errors import InputError

        try:
            return list(read_measurements(db_path, run_name)), prompt_check_counts(db_path, run_name)
        except InputError:
            return [], {}  # a run not stored yet

    measurements, counts = await asyncio.to_thread(read)
    before = verifier.verified
    verifier.seed(measurements, counts)
    return verifier.verified - before
