"""Fixtures for the monitor's tests: a real run database written through the store API."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from app.jobs.spec import JobSpec
from app.records import Completion, Reconstruction, Usage, Verdict
from app.store.run_store import RunStore
from app.store.store_records import ResultRecord, SampleInput
from app.tokens import load_tokenizer
from app.tokens.align import diff_spans

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

VERDICT_CYCLE = ("exact", "bpe_equivalent", "text_mismatch", "truncated", "exact", "structure_mismatch")
N_SAMPLES = 240


def _rec_ids(ref: list[int], verdict: str, i: int) -> list[int]:
    """Reconstructed ids that differ from the reference the way `verdict` says (deterministically)."""
    if verdict == "exact":
        return list(ref)
    if verdict == "truncated":
        return ref[: len(ref) // 2]
    out = list(ref)
    k = 2 + i % 5
    out[k] = (out[k] + 1) % 1000 + 10
    if verdict == "structure_mismatch":
        out.append(out[-1])
    return out


@pytest.fixture(scope="session")
def tokenizer(sample_tokenizer_dir: Path):
    return load_tokenizer(sample_tokenizer_dir)


async def build_run_db(path: Path, tokenizer_dir: Path, tokenizer, *, run_state: str = "running") -> Path:
    """A run database holding N_SAMPLES samples with responses and reconstructions in every verdict."""
    store = await RunStore.open(path)
    try:
        run_id = await store.ensure_run(
            "demo", {"model": {"tokenizer": str(tokenizer_dir)}, "limits": {"budget_usd": 5.0}}
        )
        texts = [f"The answer to question {i} is the NOR gate.\nIt is complete." for i in range(N_SAMPLES)]
        refs = [tokenizer.encode(t) for t in texts]
        await store.ingest(
            run_id,
            [
                SampleInput(
                    f"s{i:04d}",
                    "chat" if i % 3 else "code",
                    [{"role": "user", "content": f"question {i}"}],
                    None,
                    tuple(refs[i]),
                )
                for i in range(N_SAMPLES)
            ],
        )
        leased = await store.lease(run_id, N_SAMPLES, 600)
        for sample in leased:
            i = int(sample.sample_id[1:])
            verdict = VERDICT_CYCLE[i % len(VERDICT_CYCLE)]
            ref = refs[i]
            rec = _rec_ids(ref, verdict, i)
            spans = diff_spans(ref, rec)
            completion = Completion(
                content=tokenizer.decode(rec),
                reasoning="thinking about gates",
                finish_reason="stop",
                usage=Usage(prompt_tokens=10, completion_tokens=len(rec)),
                total_s=1.5,
                ttft_s=0.2,
                raw={"id": f"gen-{i}"},
            )
            await store.record_result(
                ResultRecord(
                    run_id,
                    sample.pk,
                    1,
                    "sim-a" if i % 2 else "sim-b",
                    completion,
                    0.001,
                    Reconstruction(tuple(rec), "canonical"),
                    Verdict(
                        verdict,
                        spans[0].ref_start if spans else None,
                        len(ref),
                        len(rec),
                        spans,
                        "" if verdict == "exact" else f"{verdict} at token {spans[0].ref_start if spans else 0}",
                    ),
                    tuple(ref),
                    keep_raw=True,
                )
            )
        await store.add_event(run_id, "info", "run", "engine started with 2 endpoints")
        await store.add_event(run_id, "warning", "endpoint", "sim-b: 429 rate limited")
        await store.set_run_state(run_id, run_state)

        def add_job(conn):
            now = time.time()
            spec = JobSpec("extract-demo", ("true",), (0, 1, 2, 3), path.parent / "out", path.parent)
            conn.execute(
                "INSERT INTO jobs (id, run_id, name, executor, spec, state, n_shards, created_at, updated_at) "
                "VALUES (1, ?, 'extract-demo', 'local', ?, 'running', 4, ?, ?)",
                (run_id, spec.to_json(), now, now),
            )
            log = path.parent / "shard_0.log"
            log.write_text('{"event": "progress", "shard": 0, "done": 10, "total": 100}\n')
            conn.executemany(
                "INSERT INTO job_shards (job_id, shard, state, done, total, tokens, log_path, updated_at) "
                "VALUES (1, ?, ?, ?, 100, ?, ?, ?)",
                [(s, "done" if s < 2 else "running", 100 if s < 2 else 10, 5000, str(log), now) for s in range(4)],
            )

        await store.write(add_job)
    finally:
        await store.close()
    return path


@pytest.fixture(scope="session")
def run_db_template(tmp_path_factory, sample_tokenizer_dir: Path, tokenizer) -> Path:
    """Built once per session through the store API (a few seconds); tests get their own copy."""
    import asyncio

    path = tmp_path_factory.mktemp("template") / "run.db"
    asyncio.run(build_run_db(path, sample_tokenizer_dir, tokenizer))
    return path


@pytest.fixture
def run_db(tmp_path: Path, run_db_template: Path) -> Path:
    path = tmp_path / "run.db"
    shutil.copyfile(run_db_template, path)
    return path


def conversation_config(directory: Path, sample_data_dir: Path):
    """A run of sample_data's whole conversations (10 openai-messages ones with tools, conv-oa-03 diverging under
    the stop policy, 6 sharegpt ones) over the built-in simulator replaying each turn's reference."""
    from app.config import parse_config
    from tests.engine.conftest import config_data

    data = config_data(directory, sample_data_dir, simulator={"prompt_cache": True})
    data["data"] = {
        "datasets": [
            {
                "path": str(sample_data_dir / "conversations.openai.jsonl"),
                "format": "openai-messages",
                "regenerate": "all",
                "on_tool_divergence": "stop",
            },
            {"path": str(sample_data_dir / "conversations.sharegpt.jsonl"), "format": "sharegpt", "regenerate": "all"},
        ],
        "reference": str(sample_data_dir / "conversations.reference.jsonl"),
    }
    return parse_config(data, base_dir=directory)


async def run_conversations(config) -> None:
    """Ingest and run the config to its end through the engine as `eaglewatch run` does (app.engine.session)."""
    import asyncio

    from app.engine.session import open_run

    async with open_run(config) as opened:
        await asyncio.wait_for(opened.run.wait(), 60)


@pytest.fixture(scope="session")
def conversation_db_template(tmp_path_factory, sample_data_dir: Path) -> Path:
    """A finished run of sample_data's 16 conversations, built once per session; tests get their own copy."""
    import asyncio

    config = conversation_config(tmp_path_factory.mktemp("conversations"), sample_data_dir)
    asyncio.run(run_conversations(config))
    return Path(config.run.database)


@pytest.fixture
def conversation_db(tmp_path: Path, conversation_db_template: Path) -> Path:
    """A copy of the template through SQLite's backup (its write-ahead log included)."""
    import sqlite3

    path = tmp_path / "conversations.db"
    source, copy = sqlite3.connect(conversation_db_template), sqlite3.connect(path)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()
    return path
