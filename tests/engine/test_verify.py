"""Live ground truth through the engine against the real simulator on loopback: stored provenance, probes,
the measured text path in the snapshot, the prompt-id check and the quality gate."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.cli import main
from app.engine.fidelity.pool import build_reconstructor
from app.engine.fidelity.verify import Verifier, _Probes
from tests.engine.conftest import make_config, run_to_end


def _sim(**kw) -> dict:
    sim = {"latency_median_ms": 0.0, "latency_p95_ms": 0.0, "tokens_per_s": 0.0, "seed": 3, "logprobs": True}
    sim.update(kw)
    return sim


def _rows(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT r.ids_source, r.flags, r.prompt_check, r.prompt_first_diff, p.prompt_ids IS NOT NULL, s.sample_id "
            "FROM reconstructions r JOIN responses p ON p.id = r.response_id JOIN samples s ON s.pk = r.sample_pk "
            "ORDER BY r.sample_pk"
        ).fetchall()


def test_probes_are_spread_evenly() -> None:
    for fraction, n, want in ((1.0, 10, 10), (0.0, 10, 0), (0.25, 20, 5), (0.5, 9, 4)):
        p = _Probes(fraction)
        assert sum(p.next() for _ in range(n)) == want, fraction


async def test_provenance_is_stored_and_read_by_fidelity_and_export(tmp_path, sample_data, capsys) -> None:
    # every request is a probe (logprobs asked) until 4 are verified, then half of them: the probes' rows are
    # verified with a text_path flag, the rest are text reconstructions; `fidelity` and `export` read the columns back
    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[{"name": "sim", "simulator": _sim(), "timeout_s": 5.0, "probe_fraction": 0.5}],
        limits={"min_verified_samples": 4, "concurrency_initial": 1, "concurrency_max": 1},
    )
    run, outcome = await run_to_end(config, sample_data, 12, reconstructor=build_reconstructor(config))
    assert outcome.state == "done"
    rows = _rows(config.run.database)
    assert len(rows) == 12
    sources = [r[0] for r in rows]
    assert sources == ["logprobs"] * 4 + ["text", "logprobs"] * 4, sources
    for source, flags, *_ in rows:
        flags = json.loads(flags)
        assert isinstance(flags, list)
        measured = [f for f in flags if f.startswith("text_path:")]
        assert bool(measured) == (source == "logprobs"), (source, flags)
    a = run.snapshot().counts.answers
    assert (
        a.measured == 8 and a.measured_exact + a.measured_benign + a.measured_truncated + a.measured_corrupt_total == 8
    )
    assert (a.verified, a.checked) == (8, 4)  # the logprob rows have true ids; a reference judged the text ones

    capsys.readouterr()
    assert main(["fidelity", "--db", str(config.run.database), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    text = json.dumps(report)
    assert '"probes": 8' in text and '"measured": 8' in text and '"state": "verified"' in text, report

    out = tmp_path / "export"
    assert (
        main(["export", "--db", str(config.run.database), "--format", "eagle3-shards", "--out", str(out), "--json"])
        == 0
    )
    exported = json.loads(capsys.readouterr().out)
    counts = exported.get("counts") or exported
    assert counts.get("skipped", {}).get("suspect", 0) == 0, exported  # text_path flags are not suspect


async def test_prompt_mismatch_is_stored_and_reported_once(tmp_path, sample_data, capsys) -> None:
    # the vllm personality returns prompt ids rendered with the run's template; the engine renders with a
    # deliberately different one (no default system prompt / changed), so every sample differs
    from dataclasses import replace

    from app.tokens import Reconstructor

    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[{"name": "vllm", "simulator": _sim(personality="vllm", logprobs=False), "timeout_s": 5.0}],
    )
    base = build_reconstructor(config)
    wrong = replace(base.profile, **_wrong_template(base.profile))
    run, outcome = await run_to_end(config, sample_data, 6, reconstructor=Reconstructor(wrong, base.tokenizer))
    assert outcome.state == "done"
    rows = _rows(config.run.database)
    assert len(rows) == 6
    assert all(r[4] for r in rows), "responses.prompt_ids stored"
    assert {r[2] for r in rows} == {"differ"} and all(r[3] is not None for r in rows)
    assert all(r[0] == "server" for r in rows)
    prompt_events = [e for e in run.events_since(0) if e.kind == "prompt"]
    assert len(prompt_events) == 1, prompt_events
    first = next(r for r in rows)
    assert (
        first[5] in prompt_events[0].message
        and "differ from the rendered prompt at position" in prompt_events[0].message
    )
    assert dict(run.snapshot().counts.answers.prompt_checks) == {"differ": 6}
    # vllm returns ids anyway: every request is a probe by default, so all six are measured
    assert run.snapshot().counts.answers.measured == 6

    capsys.readouterr()
    out = tmp_path / "export"
    assert main(
        [
            "export",
            "--db",
            str(config.run.database),
            "--format",
            "eagle3-shards",
            "--out",
            str(out),
            "--json",
            "--require-prompt-agreement",
        ]
    ) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert report["skipped"].get("prompt_unverified") == 6, report


@pytest.mark.parametrize(("personality", "stream"), [("vllm", False), ("vllm", True), ("sglang", False)])
async def test_prompt_ids_agree_with_the_right_template(tmp_path, sample_data, personality, stream) -> None:
    # vLLM: prompt_token_ids on the response (first chunk when streaming); SGLang: choices[].prompt_token_ids
    config = make_config(
        tmp_path,
        sample_data,
        stream=stream,
        endpoints=[{"name": "srv", "simulator": _sim(personality=personality, logprobs=False), "timeout_s": 5.0}],
    )
    run, outcome = await run_to_end(config, sample_data, 4, reconstructor=build_reconstructor(config))
    rows = _rows(config.run.database)
    assert {r[2] for r in rows} == {"agree"} and all(r[4] for r in rows) and {r[0] for r in rows} == {"server"}
    assert dict(run.snapshot().counts.answers.prompt_checks) == {"agree": 4}
    assert not [e for e in run.events_since(0) if e.kind == "prompt"]


def _wrong_template(profile) -> dict:
    """The engine renders prompts with another model's chat template (Qwen3's) while the simulator renders
    the run's own: the run's profile does not match the server's."""
    assert profile.name != "qwen3"
    return {"name": "qwen3"}


async def test_quality_gate_pauses_a_corrupting_endpoint(tmp_path, sample_data) -> None:
    # the server puts ' ' around added tokens (vLLM's slow detokenizer) and no fidelity profile exists: the
    # text path is corrupt on every probe (logprobs hold the model's tokens); the gate pauses after
    # min_verified_samples verified samples. (replacement_char / json_reserialised do not show here: the
    # sample data has no split UTF-8 and logprobs do not cover tool sections, which are text on both sides.)
    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[
            {
                "name": "bad",
                "simulator": _sim(quirks=["think_spaces"]),
                "timeout_s": 5.0,
                "probe_fraction": 1.0,
                "max_concurrency": 1,
            }
        ],
        limits={"max_corrupt_rate": 0.2, "min_verified_samples": 4, "concurrency_initial": 1, "concurrency_max": 1},
    )
    run, outcome = await run_to_end(config, sample_data, 30, reconstructor=build_reconstructor(config))
    assert outcome.state == "paused" and "quality gate" in (outcome.reason or ""), outcome
    events = [e.message for e in run.events_since(0) if e.kind == "quality"]
    assert len(events) == 1, events
    assert "endpoint 'bad'" in events[0] and "measured corrupt rate" in events[0] and "example sample pk" in events[0]
    assert "exceeds limits.max_corrupt_rate 20.0%" in events[0]
    snap = run.snapshot()
    assert snap.counts.answers.measured <= 4 + 1, snap.counts.answers  # at most one more in flight at concurrency 1
    assert snap.done < 30


def test_route_around_adds_the_provider_to_ignore() -> None:
    from app.config import Endpoint

    ep = Endpoint(
        name="or", base_url="https://openrouter.ai/api/v1", extra={"provider": {"sort": "price"}}, probe_fraction=0.0
    )
    v = Verifier([ep], max_corrupt_rate=0.1, min_verified=2, on_corrupt="route_around", kinds=["openrouter"])
    assert v.request_extra(0) == ({"provider": {"sort": "price"}}, False)  # probes turned off
    for pk in (1, 2):
        seen = v.observe("or", "BadCloud", pk, f"s{pk}", "text_mismatch")
    assert [d.action for d in seen.decisions] == ["route_around"]
    extra, _ = v.request_extra(0)
    assert extra == {"provider": {"sort": "price", "ignore": ["BadCloud"]}}
    assert v.observe("or", "BadCloud", 3, "s3", "text_mismatch").decisions == ()  # decided once


def test_dashboard_match_tile_shows_the_measured_rate_with_its_count() -> None:
    from app.engine.record.snapshot import RunRecord
    from app.store.count_records import AnswerCounts, RunCounts
    from app.tui.screens.dashboard import reconstruction_lines

    answers = AnswerCounts(
        answers=40, measured=40, measured_exact=30, measured_benign=6, measured_corrupt=(("text_mismatch", 4),)
    )
    assert reconstruction_lines(RunRecord("r", "running", RunCounts(answers=answers)))[-1] == "match 90.0% n=40"
    assert reconstruction_lines(RunRecord("r", "running"))[-1] == "measured 0"  # no probes yet


def _toml(data: dict) -> str:
    """A TOML text of the simple config dicts these tests use (tables, arrays of tables, scalars, lists)."""

    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(v)

    lines = []
    for section, body in data.items():
        if isinstance(body, list):
            for item in body:
                lines.append(f"[[{section}]]")
                lines += [f"{k} = {value(v)}" for k, v in item.items()]
        else:
            lines.append(f"[{section}]")
            lines += [f"{json.dumps(k)} = {value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


async def test_a_calibrated_profile_is_loaded_and_keeps_the_gate_closed(tmp_path, sample_data, capsys) -> None:
    # `calibrate` learns the think_spaces step of this endpoint and stores it; the engine loads it at start,
    # applies its inverse to reconstructions from text, and the measured text path is no longer corrupt
    import asyncio

    from tests.engine.conftest import config_data

    data = config_data(
        tmp_path,
        sample_data,
        endpoints=[
            {"name": "spaces", "simulator": _sim(quirks=["think_spaces"]), "timeout_s": 5.0, "probe_fraction": 1.0}
        ],
        limits={"max_corrupt_rate": 0.2, "min_verified_samples": 4},
    )
    path = tmp_path / "run.toml"
    path.write_text(_toml(data))
    assert await asyncio.to_thread(main, ["calibrate", str(path), "--samples", "12"]) == 0
    config = make_config(tmp_path, sample_data, endpoints=data["endpoints"], limits=data["limits"])
    run, outcome = await run_to_end(config, sample_data, 16, reconstructor=build_reconstructor(config))
    notes = [e.message for e in run.events_since(0) if e.kind == "fidelity"]
    assert notes and "spaces" in notes[0] and "learned fidelity profile" in notes[0], notes
    assert outcome.state == "done", outcome
    m = run.snapshot().counts.answers
    assert m.measured == 16 and m.measured_corrupt_total == 0, m


async def test_a_restarted_engine_keeps_the_runs_measurements_and_prompt_event(tmp_path, sample_data) -> None:
    from dataclasses import replace

    from app.tokens import Reconstructor

    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[{"name": "vllm", "simulator": _sim(personality="vllm", logprobs=False), "timeout_s": 5.0}],
    )
    base = build_reconstructor(config)
    wrong = Reconstructor(replace(base.profile, **_wrong_template(base.profile)), base.tokenizer)
    first, _ = await run_to_end(config, sample_data, 4, reconstructor=wrong)
    assert len([e for e in first.events_since(0) if e.kind == "prompt"]) == 1
    second, outcome = await run_to_end(config, sample_data, 8, reconstructor=wrong)
    assert outcome.state == "done"
    assert not [e for e in second.events_since(0) if e.kind == "prompt"]  # one per run, not per engine
    snap = second.snapshot()
    assert dict(snap.counts.answers.prompt_checks) == {"differ": 8} and snap.counts.answers.measured == 8


async def test_route_around_ignores_the_corrupting_provider_in_later_requests(tmp_path, sample_data) -> None:
    # on_corrupt = route_around: no pause; a warning names the provider, and every request after the decision
    # carries it in OpenRouter's provider.ignore (bodies recorded by a real ChatClient over loopback HTTP)
    from app.engine.capacity.endpoints import _start_simulator
    from app.providers.client import ChatClient

    class Recording(ChatClient):
        bodies: list[dict] = []

        def build_request(self, *a, **kw) -> dict:
            body = super().build_request(*a, **kw)
            self.bodies.append(body)
            return body

    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[
            {
                "name": "or",
                "simulator": _sim(quirks=["think_spaces"]),
                "timeout_s": 5.0,
                "probe_fraction": 1.0,
                "extra": {"provider": {"sort": "price"}},
            }
        ],
        limits={
            "max_corrupt_rate": 0.2,
            "min_verified_samples": 3,
            "on_corrupt": "route_around",
            "concurrency_initial": 1,
            "concurrency_max": 1,
        },
    )
    server = await _start_simulator(config, config.endpoints[0])
    ep = config.endpoints[0].model_copy(update={"base_url": server.base_url, "simulator": None, "server": "openrouter"})
    client = Recording(ep, config.generation, None)
    try:
        run, outcome = await run_to_end(
            config, sample_data, 10, reconstructor=build_reconstructor(config), clients={"or": client}
        )
    finally:
        await client.aclose()
        await server.close()
    assert outcome.state == "done", outcome
    warnings = [e.message for e in run.events_since(0) if e.kind == "quality"]
    assert len(warnings) == 1 and "ignoring provider 'eaglewatch-simulator'" in warnings[0], warnings
    bodies = Recording.bodies
    assert len(bodies) == 10 and all(b["logprobs"] is True and b["top_logprobs"] == 0 for b in bodies)
    assert [b["provider"] for b in bodies[:3]] == [{"sort": "price"}] * 3
    assert all(
        b["provider"] == {"sort": "price", "ignore": ["eaglewatch-simulator"]} for b in bodies[3:]
    )  # the slot is held until the decision


def test_probe_fields_respect_generation_logprobs() -> None:
    from app.config import Endpoint

    ep = Endpoint(name="or", base_url="https://openrouter.ai/api/v1", probe_fraction=1.0)
    assert Verifier([ep]).request_extra(0) == ({"logprobs": True, "top_logprobs": 0}, True)
    # generation.logprobs already asks every request (with its own top_logprobs): nothing is overridden
    assert Verifier([ep], asks_logprobs=True).request_extra(0) == (None, True)
    vllm = Endpoint(name="v", base_url="http://127.0.0.1:8000/v1", server="vllm")
    assert Verifier([vllm]).request_extra(0) == (None, True)  # ids come anyway: every request is a probe


# ---- probes by default, the profile learned during the run ------------------------------------------------------


def test_every_request_is_a_probe_until_the_minimum_is_verified_then_the_fraction() -> None:
    from app.config import Endpoint

    ep = Endpoint(name="or", base_url="https://openrouter.ai/api/v1")
    v = Verifier([ep], min_verified=3, kinds=["openrouter"])
    assert [v.request_extra(0)[1] for _ in range(5)] == [True] * 5  # nothing verified yet
    for pk in range(3):
        v.observe("or", "P", pk, f"s{pk}", "exact")
    v.samples[("or", "P")] += 3
    sent = [v.request_extra(0)[1] for _ in range(40)]
    assert sum(sent) == 2, sent  # 5 % of 40
    # a second upstream provider appears: its minimum is not reached, so every request probes again
    v.samples[("or", "Q")] += 1
    assert all(v.request_extra(0)[1] for _ in range(5))
    # a provider that answers probes without ground truth twice the minimum is given up on
    v.no_truth[("or", "Q")] += 6
    assert sum(v.request_extra(0)[1] for _ in range(40)) == 2


def test_a_server_without_ground_truth_is_not_probed_unless_a_twin_is_trusted() -> None:
    from app.config import Endpoint

    serve = Endpoint(name="serve", base_url="http://127.0.0.1:1/v1")
    assert Verifier([serve], kinds=["transformers-serve"]).request_extra(0) == (None, False)
    twin = Endpoint(name="mine", base_url="http://127.0.0.1:2/v1", trusted=True)
    v = Verifier([serve, twin], kinds=["transformers-serve", "vllm"])
    assert v.twin == 1
    extra, probe = v.request_extra(0)
    assert probe and extra == {"temperature": 0}  # greedy, so the twin's answer is the same text
    # the twin itself is asked for its ids (an identified, not configured, vLLM)
    assert v.request_extra(1)[0] == {"return_token_ids": True}


async def test_a_profile_learned_during_the_run_reaches_the_reconstruction_workers(tmp_path, sample_data) -> None:
    # think_spaces: ' ' around the think tags. The first four requests are probes (their logprobs teach the step);
    # the samples after them are reconstructed from text in a worker process with the learned inverse: most come out as
    # the reference's ids, and any that four probes could not teach (a tool section's spaces) is flagged
    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[
            {"name": "sim", "simulator": _sim(quirks=["think_spaces"]), "timeout_s": 5.0, "probe_fraction": 0.01}
        ],
        limits={"min_verified_samples": 4, "concurrency_initial": 1, "concurrency_max": 1},
    )
    config = config.model_copy(update={"run": config.run.model_copy(update={"reconstruct_workers": 1})})
    run, outcome = await run_to_end(config, sample_data, 14, reconstructor=build_reconstructor(config))
    assert outcome.state == "done"
    with sqlite3.connect(config.run.database) as conn:
        rows = conn.execute(
            "SELECT ids_source, repair, category, flags FROM reconstructions ORDER BY sample_pk"
        ).fetchall()
        stored = conn.execute("SELECT probes, body FROM fidelity_profiles WHERE endpoint = 'sim'").fetchall()
    assert [r[0] for r in rows[:4]] == ["logprobs"] * 4
    text = [r for r in rows if r[0] == "text"]
    assert len(text) >= 9
    assert all("think_spaces" in (r[1] or "") for r in text), text
    benign = [r for r in text if r[2] in ("exact", "bpe_equivalent")]
    assert len(benign) > len(text) // 2, text
    from app.tokens.flags import is_suspect

    assert all(is_suspect(json.loads(r[3] or "[]")) for r in text if r not in benign), text
    assert any(p >= 4 and "think_spaces" not in b and '"+ "' in b for p, b in stored), stored  # learned, stored
    events = [e.message for e in run.events_since(0)]
    assert any("reconstructed in 1 worker process" in e for e in events), events


async def test_a_trusted_twin_teaches_an_endpoint_without_ground_truth(tmp_path, sample_data) -> None:
    # "plain" returns no logprobs and puts ' ' around the think tags; "mine" is a vLLM of the same model that
    # returns ids: probes to "plain" go greedy to both, and the comparison teaches and measures plain's steps
    config = make_config(
        tmp_path,
        sample_data,
        endpoints=[
            {"name": "plain", "simulator": _sim(quirks=["think_spaces"], logprobs=False), "timeout_s": 5.0},
            {
                "name": "mine",
                "simulator": _sim(personality="vllm", logprobs=False, seed=4),
                "timeout_s": 5.0,
                "trusted": True,
                "weight": 0.2,
            },
        ],
        limits={"min_verified_samples": 3, "concurrency_initial": 2, "concurrency_max": 2},
    )
    run, outcome = await run_to_end(config, sample_data, 24, reconstructor=build_reconstructor(config))
    assert outcome.state == "done"
    with sqlite3.connect(config.run.database) as conn:
        rows = conn.execute(
            "SELECT p.endpoint, r.ids_source, r.flags, r.repair FROM reconstructions r JOIN responses p "
            "ON p.id = r.response_id ORDER BY r.sample_pk"
        ).fetchall()
    plain = [r for r in rows if r[0] == "plain"]
    measured = [r for r in plain if "text_path:" in (r[2] or "")]
    assert plain and all(r[1] == "text" for r in plain)  # its own answers carry no ids
    assert len(measured) >= 3, plain  # measured against the twin's ids
    statuses = {(s.endpoint, s.state) for s in run._verifier.statuses()}
    assert ("plain", "verified") in statuses and ("mine", "verified") in statuses, statuses
    later = [r for r in plain if "think_spaces" in (r[3] or "")]
    assert later, plain  # the learned inverse applied to its reconstructions from text


async def test_the_export_refuses_unverified_text_reconstructions_unless_accepted(
    tmp_path, sample_data, capsys
) -> None:
    # an endpoint whose server nobody named and that does not say: nothing verifies its reconstructions from text
    from app.engine.capacity.endpoints import _start_simulator
    from app.providers.client import ChatClient

    config = make_config(
        tmp_path, sample_data, endpoints=[{"name": "anon", "base_url": "http://127.0.0.1:9/v1", "timeout_s": 5.0}]
    )
    sim_cfg = make_config(tmp_path, sample_data, endpoints=[{"name": "s", "simulator": _sim(), "timeout_s": 5.0}])
    server = await _start_simulator(sim_cfg, sim_cfg.endpoints[0])
    ep = config.endpoints[0].model_copy(update={"base_url": server.base_url})
    client = ChatClient(ep, config.generation, None)
    try:
        run, outcome = await run_to_end(
            config,
            sample_data,
            6,
            references=False,
            reconstructor=build_reconstructor(config),
            clients={"anon": client},
        )
    finally:
        await client.aclose()
        await server.close()
    assert outcome.state == "done"
    assert any("the server is unknown" in e.message for e in run.events_since(0))
    capsys.readouterr()
    out = tmp_path / "export"
    assert (
        main(["export", "--db", str(config.run.database), "--format", "sglang-raw", "--out", str(out), "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["exported"] == 0 and report["skipped"].get("unverified") == 6, report
    assert any("--accept-unverified" in w for w in report["warnings"]), report
    assert any("anon" in w and "server =" in w for w in report["warnings"]), report  # what would verify it
    assert (
        main(
            [
                "export",
                "--db",
                str(config.run.database),
                "--format",
                "sglang-raw",
                "--out",
                str(out),
                "--json",
                "--overwrite",
                "--accept-unverified",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert report["exported"] == manifest["verification"]["unverified"]["accepted"] > 0
    assert manifest["verification"]["endpoints"][0]["state"] == "unverified"
