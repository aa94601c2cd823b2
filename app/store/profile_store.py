"""Fidelity profiles and text-path measurements in the run database, with plain sqlite3.

`save_profile` / `load_profile(s)` keep learned profiles (table fidelity_profiles, schema v5);
`read_measurements` reads, read-only, what `eaglewatch fidelity` reports: per sample, its endpoint and
upstream provider, where its ids came from, its flags and verdict.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from app.errors import InputError
from app.store.db import DEFAULT_BUSY_TIMEOUT_S, configure, connect_readonly, migrate
from app.tokens.fidelity_profile import FidelityProfile


@dataclass(frozen=True, slots=True)
class Measurement:
    """One stored reconstruction as the fidelity report sees it."""

    run: str
    endpoint: str
    provider: str | None
    sample_pk: int
    ids_source: str | None
    flags: tuple[str, ...]
    category: str


_UPSERT = (
    "INSERT INTO fidelity_profiles (endpoint, provider, profile, tokenizer, probes, body, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (endpoint, provider, profile) DO UPDATE SET "
    "tokenizer = excluded.tokenizer, probes = excluded.probes, body = excluded.body, "
    "created_at = excluded.created_at"
)


def _row(profile: FidelityProfile, tokenizer: str) -> tuple:
    return (
        profile.endpoint,
        profile.provider or "",
        profile.profile,
        tokenizer,
        profile.probes,
        profile.to_json(),
        time.time(),
    )


def save_profile(path: str | Path, profile: FidelityProfile, tokenizer: str = "") -> None:
    """Store (or replace) the profile of its endpoint/provider/template profile in the database at `path`."""
    migrate(path, create=True)
    conn = sqlite3.connect(path, timeout=DEFAULT_BUSY_TIMEOUT_S, isolation_level=None)
    try:
        configure(conn)
        conn.execute(_UPSERT, _row(profile, tokenizer))
    except sqlite3.Error as exc:
        raise InputError(f"{path}: cannot store the fidelity profile of {profile.endpoint!r} ({exc})") from None
    finally:
        conn.close()


def profiles_op(profiles: list[FidelityProfile], tokenizer: str = "") -> Callable[[sqlite3.Connection], None]:
    """A store write op (app.store.run_store.RunStore.write) that stores (or replaces) each profile: how a run
    keeps its endpoints' prior and learned profiles beside its results."""

    def op(conn: sqlite3.Connection) -> None:
        conn.executemany(_UPSERT, [_row(p, tokenizer) for p in profiles])

    return op


def load_profiles(path: str | Path, profile: str | None = None) -> list[FidelityProfile]:
    """Every stored profile (of one template profile when given), by endpoint then provider."""
    conn = connect_readonly(path)
    try:
        sql = "SELECT endpoint, provider, body FROM fidelity_profiles"
        rows = conn.execute(
            sql + (" WHERE profile = ?" if profile else "") + " ORDER BY endpoint, provider",
            (profile,) if profile else (),
        ).fetchall()
    finally:
        conn.close()
    out = []
    for endpoint, provider, body in rows:
        try:
            out.append(FidelityProfile.from_json(body))
        except ValueError as exc:
            raise InputError(
                f"{path}: fidelity profile of {endpoint!r}/{provider or '-'}: {exc}; run `eaglewatch calibrate` again"
            ) from None
    return out


def load_profile(path: str | Path, endpoint: str, provider: str | None, profile: str) -> FidelityProfile | None:
    """The stored profile of this endpoint, provider (None: the endpoint's own) and template profile, or None."""
    return next(
        (p for p in load_profiles(path, profile) if p.endpoint == endpoint and (p.provider or "") == (provider or "")),
        None,
    )


def read_measurements(path: str | Path, run: str | None = None) -> Iterator[Measurement]:
    """Every reconstruction with its response's endpoint and provider (of one run when `run` names it)."""
    conn = connect_readonly(path)
    try:
        if run is not None and conn.execute("SELECT 1 FROM runs WHERE name = ?", (run,)).fetchone() is None:
            names = [r[0] for r in conn.execute("SELECT name FROM runs ORDER BY id")]
            raise InputError(f"{path}: no run named {run!r}; runs here: {', '.join(names) or 'none'}")
        sql = (
            "SELECT ru.name, COALESCE(re.endpoint, '?'), re.provider, rc.sample_pk, rc.ids_source, rc.flags, "
            "rc.category "
            "FROM reconstructions rc JOIN runs ru ON ru.id = rc.run_id "
            "LEFT JOIN responses re ON re.id = rc.response_id"
        )
        cursor = conn.execute(
            sql + (" WHERE ru.name = ?" if run else "") + " ORDER BY rc.run_id, rc.sample_pk", (run,) if run else ()
        )
        for name, endpoint, provider, pk, source, flags, category in cursor:
            yield Measurement(name, endpoint, provider or None, pk, source, _flags(flags), category)
    finally:
        conn.close()


def prompt_check_counts(path: str | Path, run: str) -> dict[str, int]:
    """How many of the run's reconstructions had each prompt-check status (agree | differ | no_server_ids)."""
    conn = connect_readonly(path)
    try:
        rows = conn.execute(
            "SELECT rc.prompt_check, COUNT(*) FROM reconstructions rc JOIN runs ru ON ru.id = rc.run_id "
            "WHERE ru.name = ? AND rc.prompt_check IS NOT NULL GROUP BY rc.prompt_check",
            (run,),
        ).fetchall()
    finally:
        conn.close()
    return {str(status): int(n) for status, n in rows}


def _flags(text: str | None) -> tuple[str, ...]:
    # reconstructions.flags is a JSON list (schema v5); tolerate NULL and a plain comma list
    if not text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        return tuple(f.strip() for f in text.split(",") if f.strip())
    return tuple(str(f) for f in value) if isinstance(value, list) else ()
