"""Live ground truth in the engine: probes, the measured text path, the prompt-id check and the quality gate.

Data flow (docs/architecture.md, "Live fidelity"): for each request `Verifier.request_extra` decides whether
it is a *probe* (per endpoint `probe_fraction`, spread evenly) and adds the fields that ask for true ids
(logprobs on OpenRouter; servers that return ids need nothing extra, `app.providers.servers`) plus the
upstream providers the gate routes around (`provider.ignore`). In the reconstruction thread
`Rebuilder.rebuild` keeps the true ids of a result that carries them (server ids, logprob tokens: stored and
exported as they are, whatever the server did to the text), rebuilds the rest from text with the endpoint's
learned fidelity profile, measures the text-only rebuild of every probe that came back with true ids (a
`text_path:<verdict>` flag) and compares the server's
prompt ids with the rendered prompt. After the result is stored, `Verifier.observe` tallies the measurement
per (endpoint, upstream provider), keeps the prompt-check counts and asks `app.engine.quality.judge` whether
to pause or route around; the Run acts on the decisions it returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine import quality
from app.records import Completion, Reconstruction, Verdict
from app.tokens import flags as fl

# what asks an OpenRouter-style endpoint for logprobs with bytes (the ids ground truth); OpenRouter passes
# `logprobs` / `top_logprobs` to providers that support them (openrouter.ai/docs/api-reference/parameters)
LOGPROB_PROBE_FIELDS = {"logprobs": True, "top_logprobs": 0}
# servers whose chat API returns output ids when asked (app.providers.servers.ids_request_fields)
IDS_SERVERS = ("vllm", "sglang")


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """What the reconstruction thread hands back: the rebuilt ids, their verdict, the text-path measurement
    (None: not measured) and the prompt-id check (None: the server returned no prompt ids)."""

    reconstruction: Reconstruction | None
    verdict: Verdict | None
    measured: str | None = None
    prompt_check: Any = None  # app.tokens.prompt_check.PromptCheck


class Rebuilder:
    """The engine's reconstruction: one `app.tokens.Reconstructor` per learned fidelity profile (endpoint and
    upstream provider), the run's own for the rest. Holds no mutable state (safe in the reconstruct threads)."""

    def __init__(self, base: Any, profiles: Iterable[Any] = ()) -> None:
        from app.tokens import Reconstructor

        self.profile, self.tokenizer = base.profile, base.tokenizer
        # measure=False: the engine measures probes only (measure_text_path), so the logprob path stays cheap
        self._default = Reconstructor(base.profile, base.tokenizer, getattr(base, "fidelity", None), measure=False)
        self._by_key = {(p.endpoint, p.provider or ""): Reconstructor(base.profile, base.tokenizer, p, measure=False)
                        for p in profiles}

    @property
    def fidelity_profiles(self) -> tuple[Any, ...]:
        """The run's own fidelity profile (None: none) and every learned one, in order: what rebuilds this
        Rebuilder in another process (app.engine.rebuild_pool.RebuildRecipe)."""
        return (self._default.fidelity, *(r.fidelity for r in self._by_key.values()))

    @property
    def learned(self) -> tuple[tuple[str, str], ...]:
        """(endpoint, provider) of every fidelity profile in use."""
        return tuple(self._by_key)

    def reconstructor_for(self, endpoint: str, provider: str | None) -> Any:
        """The Reconstructor for results of `endpoint` from upstream `provider` (its own profile first)."""
        return (self._by_key.get((endpoint, provider or "")) or self._by_key.get((endpoint, ""))
                or self._default)

    def process(self, completion: Completion, reference_ids: Sequence[int] | None) -> tuple[Reconstruction, Verdict]:
        """The plain rebuild (no endpoint profile, no measurement): the engine's CompletionReconstructor contract."""
        return self._default.process(completion, reference_ids)

    def rebuild(self, completion: Completion, reference_ids: Sequence[int] | None, messages: Sequence[dict],
                tools: Sequence[dict] | None, *, endpoint: str, measure: bool) -> Rebuilt:
        """Rebuild `completion`; with `measure`, a result with true ids also gets its text path measured; the
        server's prompt ids (when returned) are compared with the rendered prompt of `messages` and `tools`."""
        from app.tokens.prompt_check import check_prompt

        r = self.reconstructor_for(endpoint, completion.provider)
        rec, verdict = r.process(completion, reference_ids)
        measured = None
        if measure and rec.ids_source in fl.VERIFIED_SOURCES:
            # process() stored the true ids (server ids or logprob tokens, whatever the server did to the text):
            # the text-only rebuild is measured against them
            measured = str(r.measure_text_path(completion, rec.output_ids).category)
            rec = replace(rec, flags=tuple(rec.flags) + (fl.text_path_flag(measured),))
        check = None
        if completion.prompt_token_ids is not None:
            check = check_prompt(self.tokenizer, self.profile, messages, tools, completion.prompt_token_ids)
        return Rebuilt(rec, verdict, measured, check)


@dataclass(frozen=True, slots=True)
class Observed:
    """What one stored result asks of the Run: gate decisions to act on, and a prompt-mismatch event."""

    decisions: tuple[quality.QualityDecision, ...] = ()
    prompt_event: str | None = None


@dataclass
class _Probes:
    """Evenly spread probes: request n is a probe when floor((n+1)·f) > floor(n·f) (f=1: all, 0.25: every 4th)."""

    fraction: float
    sent: int = 0

    def next(self) -> bool:
        n, self.sent = self.sent, self.sent + 1
        return int((n + 1) * self.fraction + 1e-9) > int(n * self.fraction + 1e-9)


def probe_fraction_of(endpoint: Any) -> float:
    """The endpoint's probe fraction: `probe_fraction` when set, else 1 for servers that return ids anyway
    (vLLM, SGLang and their simulator personalities) and 0 for the rest."""
    from app.providers.servers import server_kind

    value = getattr(endpoint, "probe_fraction", None)
    if value is not None:
        return float(value)
    return 1.0 if server_kind(endpoint) in IDS_SERVERS else 0.0


@dataclass
class Verifier:
    """Per-run live fidelity state (event loop only): probes, tallies, prompt-check counts, ignored providers."""

    endpoints: Sequence[Any]  # config.Endpoint, in the Run's order
    max_corrupt_rate: float | None = None
    min_verified: int = 20
    on_corrupt: str = "pause"
    asks_logprobs: bool = False  # generation.logprobs: every request asks already (with its own top_logprobs)
    _probes: list[_Probes] = field(default_factory=list)
    tallies: dict[tuple[str, str | None], quality.FidelityTally] = field(default_factory=dict)
    _decided: set[tuple[str, str | None]] = field(default_factory=set)
    ignored: dict[str, list[str]] = field(default_factory=dict)  # endpoint -> upstream providers routed around
    prompt_checks: dict[str, int] = field(default_factory=dict)  # agree / differ -> count
    first_differ: tuple[str, int | None, str] | None = None  # (sample id, first diff, describe())

    def __post_init__(self) -> None:
        self._probes = [_Probes(probe_fraction_of(e)) for e in self.endpoints]

    @classmethod
    def of(cls, config: Any) -> "Verifier":
        """The Verifier for a RunConfig's endpoints and limits."""
        lim = config.limits
        return cls(list(config.endpoints), lim.max_corrupt_rate, lim.min_verified_samples, lim.on_corrupt,
                   bool(config.generation.logprobs))

    def seed(self, measurements: Iterable[Any], prompt_counts: dict[str, int]) -> None:
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

    def request_extra(self, index: int) -> tuple[dict | None, bool]:
        """(the request's extra body fields, whether it is a probe) for a request to endpoint `index`."""
        ep = self.endpoints[index]
        probe = self._probes[index].next()
        extra = dict(ep.extra or {})
        if probe and not self.asks_logprobs and probe_fraction_of_kind(ep) == "logprobs":
            extra.update(LOGPROB_PROBE_FIELDS)
        ignored = self.ignored.get(ep.name)
        if ignored:
            # merged into the endpoint's own routing preferences (OpenRouter `provider.ignore`)
            routing = dict(extra.get("provider") or {})
            routing["ignore"] = sorted(set(routing.get("ignore") or ()) | set(ignored))
            extra["provider"] = routing
        return (extra or None), probe

    def observe(self, endpoint: str, provider: str | None, pk: int, sample_id: str, measured: str | None,
                check: Any = None) -> Observed:
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
                    "mismatches are counted in the snapshot (prompt_checks), not reported one by one")
        if measured is None:
            return Observed((), prompt_event)
        t = self._count(endpoint, provider, measured, pk)
        decisions = tuple(d for d in quality.judge((t,), self.max_corrupt_rate, self.min_verified, self.on_corrupt)
                          if (d.endpoint, d.provider) not in self._decided)
        for d in decisions:
            self._decided.add((d.endpoint, d.provider))
            if d.action == "route_around" and d.provider:
                self.ignored.setdefault(d.endpoint, []).append(d.provider)
        return Observed(decisions, prompt_event)

    def _count(self, endpoint: str, provider: str | None, measured: str, pk: int) -> quality.FidelityTally:
        key = (endpoint, provider)
        t = self.tallies[key] = quality.add(self.tallies.get(key) or quality.FidelityTally(endpoint, provider),
                                            measured, pk)
        return t

    @property
    def verified(self) -> int:
        """Verified (measured) samples over every endpoint and provider."""
        return sum(t.verified for t in self.tallies.values())


async def seed_from_store(verifier: Verifier, db_path: Any, run_name: str) -> int:
    """Seed `verifier` with the run's stored measurements (read-only, in a thread); returns how many."""
    import asyncio

    from app.store.profile_store import prompt_check_counts, read_measurements

    def read() -> tuple[list[Any], dict[str, int]]:
        return list(read_measurements(db_path, run_name)), prompt_check_counts(db_path, run_name)

    measurements, counts = await asyncio.to_thread(read)
    before = verifier.verified
    verifier.seed(measurements, counts)
    return verifier.verified - before


def probe_fraction_of_kind(endpoint: Any) -> str:
    """How a probe to `endpoint` gets true ids: "server" (vLLM/SGLang return them when asked, which every
    request is) or "logprobs" (asked for per probe)."""
    from app.providers.servers import server_kind

    return "server" if server_kind(endpoint) in IDS_SERVERS else "logprobs"
