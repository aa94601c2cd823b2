"""A real run database built from the sample reference, as a finished run would leave it."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.store.db import configure, migrate
from app.store.ids import pack_ids


@dataclass(frozen=True)
class BuiltRun:
    """What the fixture wrote: the database, and per sample id the reference record and stored verdict."""

    db: Path
    records: dict[str, dict]
    categories: dict[str, str]
    output_ids: dict[str, list[int]]  # as stored in reconstructions.output_ids
    exported_ids: dict[str, list[int]]  # what an export writes: the reference (true ids) for exact/bpe_equivalent


def build_run_db(
    db: Path,
    reference: Path,
    tokenizer_dir: Path,
    cases: dict,
    *,
    name: str = "demo",
    limit: int | None = None,
    mismatches: int = 3,
    fingerprint: str | None = None,
) -> BuiltRun:
    """Write a finished run: every reference sample done, with a reconstruction as the engine records it.

    Canonical samples are `exact`, non-canonical ones `bpe_equivalent` (the stored ids are the canonical
    re-encoding), truncated ones `truncated`; the first `mismatches` exact samples are turned into
    `text_mismatch` with a corrupted id.
    """
    from app.tokens import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)
    configure(conn)
    now = time.time()
    config = {
        "run": {"name": name},
        "model": {"name": "m", "tokenizer": str(tokenizer_dir), "profile": "kimi-k2.5"},
        "endpoints": [{"name": "simulator", "extra": {}}],
    }
    conn.execute("BEGIN")
    run_id = conn.execute(
        "INSERT INTO runs (name, config, state, created_at, updated_at) VALUES (?, ?, 'done', ?, ?)",
        (name, json.dumps(config), now, now),
    ).lastrowid
    records, categories, outputs, exported = {}, {}, {}, {}
    left_to_corrupt = mismatches
    for n, line in enumerate(reference.read_text(encoding="utf-8").splitlines()):
        if limit is not None and n >= limit:
            break
        rec = json.loads(line)
        sid = rec["id"]
        kinds = cases["samples"][sid]["kinds"]
        ref = rec["output_ids"]
        finish = rec["meta_info"]["finish_reason"]["type"]
        if "truncated" in kinds:
            category, out = "truncated", list(ref)
        elif "non_canonical" in kinds:
            category, out = "bpe_equivalent", tok.encode(tok.decode(ref))
        elif left_to_corrupt > 0:
            left_to_corrupt -= 1
            category, out = "text_mismatch", [ref[0] ^ 1, *ref[1:]]
        else:
            category, out = "exact", list(ref)
        pk = conn.execute(
            "INSERT INTO samples (run_id, sample_id, dataset, messages, tools, reference_ids, reference_finish, "
            "state, attempts, updated_at) VALUES (?, ?, 'prompts', ?, ?, ?, ?, 'done', 1, ?)",
            (
                run_id,
                sid,
                json.dumps(rec["messages"]),
                json.dumps(rec["tools"]) if "tools" in rec else None,
                pack_ids(ref),
                finish,
                now,
            ),
        ).lastrowid
        response_id = conn.execute(
            "INSERT INTO responses (run_id, sample_pk, attempt, endpoint, finish_reason, content, created_at) "
            "VALUES (?, ?, 1, 'simulator', ?, '', ?)",
            (run_id, pk, finish, now),
        ).lastrowid
        conn.execute(
            "INSERT INTO reconstructions (run_id, sample_pk, response_id, profile, tokenizer, strategy, output_ids, "
            "reference_ids, category, n_tokens, ref_len, created_at) VALUES (?, ?, ?, 'kimi-k2.5', ?, 'canonical', "
            "?, ?, ?, ?, ?, ?)",
            (
                run_id,
                pk,
                response_id,
                fingerprint if fingerprint is not None else tok.fingerprint,
                pack_ids(out),
                pack_ids(ref),
                category,
                len(out),
                len(ref),
                now,
            ),
        )
        records[sid], categories[sid], outputs[sid] = rec, category, out
        exported[sid] = list(ref) if category in ("exact", "bpe_equivalent") else out
    conn.execute("COMMIT")
    conn.close()
    return BuiltRun(db=db, records=records, categories=categories, output_ids=outputs, exported_ids=exported)


def pytest_terminal_summary(terminalreporter) -> None:
    """What the trainer tests measured through each trainer's own code, one line per route."""
    from tests.export.trainers.env import PROVEN

    if PROVEN:
        terminalreporter.write_sep("=", "trainer routes measured through the trainers' own code")
        for line in PROVEN:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def sample_cases(sample_data_dir):
    return json.loads((sample_data_dir / "reference_cases.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def built_run(tmp_path_factory, sample_reference, sample_tokenizer_dir, sample_cases) -> BuiltRun:
    db = tmp_path_factory.mktemp("export-db") / "run.db"
    return build_run_db(db, sample_reference, sample_tokenizer_dir, sample_cases)


@pytest.fixture(scope="session")
def hf_sample_tokenizer(sample_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(sample_tokenizer_dir))


def run_conversations(tmp: Path, sample_data: Path, *, policy: str = "stop") -> Path:
    """A finished run of sample_data's 16 whole conversations (regenerate = "all") over the simulator, its answers
    reconstructed as a run reconstructs them (the engine's own Reconstructor); the run database's path."""
    import asyncio

    from app.engine.fidelity.pool import build_reconstructor
    from app.engine.run import Run
    from app.engine.work.config_ingest import ingest_config
    from app.store.run_store import RunStore
    from tests.engine.test_conversation_run import _config

    config = _config(tmp, sample_data, policy=policy)

    async def run() -> None:
        store = await RunStore.open(config.run.database)
        try:
            await ingest_config(store, config)
            engine = Run(config, store, reconstructor=build_reconstructor(config), db_path=config.run.database)
            try:
                await engine.start()
                await asyncio.wait_for(engine.wait(), 120)
            finally:
                await engine.close()
        finally:
            await store.close()

    asyncio.run(run())
    return config.run.database


@pytest.fixture(scope="session")
def conversation_run(tmp_path_factory, sample_data_dir) -> Path:
    """The run database of sample_data's conversations, `on_tool_divergence = "stop"` (conv-oa-03 ends early)."""
    return run_conversations(tmp_path_factory.mktemp("conversations"), sample_data_dir)


@pytest.fixture(scope="session")
def conversation_run_replay(tmp_path_factory, sample_data_dir) -> Path:
    """The same conversations under `on_tool_divergence = "replay"` (conv-oa-03's later turns off-policy)."""
    return run_conversations(tmp_path_factory.mktemp("conversations-replay"), sample_data_dir, policy="replay")
