"""What does one poll of the eval monitor cost on a big eval run? Target: < 50 ms with 100k stored requests.

Seeds a real SQLite file with an eval run of --requests requests (half on the drafter endpoint with per-position
figures, half on the baseline; 2 % loops, 1 % failed) with executemany straight into the schema, and, as the
baseline measured in the same run, a generation run of the same number of samples (bench/tui.py's `build_db`).
Then, through the faces' own sources (attached, read-only, as `watch` reads):
  - the eval poll (`app.tui.eval_source.EvalSource.poll`: the requests stored since the last poll into the running
    tally, the running figures and verdicts, the run's state, heartbeat and events), each round after a stand-in
    engine stored --per-poll new requests (a live eval), and with nothing new;
  - the eval monitor's first read of the whole run (a viewer opening it: chunks of TALLY_CHUNK rows, one per poll,
    until caught up), in all and its slowest poll;
  - the generation dashboard's poll over its run (the record, jobs, events and the plots' new rows), the baseline.
Prints min / median / max in ms over --repeat rounds and the ratio of the medians (eval / generation).

    python bench/eval_poll.py [--requests 100000] [--repeat 20] [--per-poll 20] [--dir /tmp/eval-poll]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

from app.libnoise import silence_library_noise  # noqa: E402

silence_library_noise()

K = 3  # draft tokens per step
CONFIG = {
    "model": {"name": "bench/target", "tokenizer": str(ROOT / "sample_data" / "tokenizer")},
    "endpoints": [{"name": "spec"}, {"name": "base"}],
    "eval": {"drafter": "bench/drafter", "baseline": "base", "num_draft_tokens": K},
}


def _row(i: int, pk: int, endpoint: str, rng: random.Random, created: float) -> tuple:
    """One eval_requests row (id i) in the schema's column order."""
    if i % 100 == 0:
        return (i, 1, pk, endpoint, "bench/drafter", "chat", "ServerError: 500", None, 0, None, None, None, None,
                None, None, None, None, None, None, 0, "{}", created, None, None)  # fmt: skip
    if endpoint == "base":
        return (i, 1, pk, endpoint, None, "chat", None, None, 200, 30.0, 8.0, 1600.0, 125.0, None, None, None,
                None, None, None, 0, "{}", created, None, None)  # fmt: skip
    steps = 60 + i % 40
    per_step = [min(K, int(rng.random() * 4)) for _ in range(steps)]
    per_pos = [sum(1 for n in per_step if n > k) for k in range(K)]
    spec = json.dumps({"num_spec_steps": steps, "num_accepted_draft_tokens": sum(per_step)})
    return (
        i, 1, pk, endpoint, "bench/drafter", ("chat", "code", "math", "tools")[pk % 4], None, None,
        sum(per_step) + steps, 25.0, 5.0, 900.0, 220.0 + i % 50, "vllm", spec, sum(per_step), K * steps, steps,
        json.dumps(per_pos), int(i % 50 == 0), "{}", created, None, None,
    )  # fmt: skip


def build_eval_db(path: Path, requests: int) -> float:
    """An eval run of `requests` stored requests over requests/2 prompts; returns seconds taken."""
    from app.store.db import migrate

    t0 = time.perf_counter()
    migrate(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    now = time.time()
    prompts = max(requests // 2, 1)
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO runs (id, name, config, state, kind, created_at, updated_at) "
        "VALUES (1, 'bench-eval', ?, 'running', 'eval', ?, ?)",
        (json.dumps(CONFIG), now - 3600, now),
    )
    conn.executemany(
        "INSERT INTO samples (pk, run_id, sample_id, dataset, messages, state, attempts, updated_at) "
        "VALUES (?, 1, ?, 'bench', '[]', 'pending', 0, ?)",
        [(pk, f"p{pk:07d}", now) for pk in range(1, prompts + 1)],
    )
    rng = random.Random(5)
    rows = []
    for i in range(1, requests + 1):
        pk, endpoint = (i + 1) // 2, ("spec" if i % 2 else "base")
        rows.append(_row(i, pk, endpoint, rng, now - 3600 * (requests - i) / requests))
        if len(rows) == 20_000:
            _insert(conn, rows)
    _insert(conn, rows)
    conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - t0


def _insert(conn: sqlite3.Connection, rows: list[tuple]) -> None:
    from app.store.rows import EVAL_REQUEST_COLUMNS

    if rows:
        marks = ", ".join("?" * (len(EVAL_REQUEST_COLUMNS.split(",")) + 1))
        conn.executemany(f"INSERT INTO eval_requests (id, {EVAL_REQUEST_COLUMNS}) VALUES ({marks})", rows)
        rows.clear()


class LiveWriter:
    """Stands in for a running eval: stores `n` new requests per call (the answers of the next prompts)."""

    def __init__(self, path: Path, n: int) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.n = n
        self.next_id = self.conn.execute("SELECT MAX(id) FROM eval_requests").fetchone()[0] + 1
        self.rng = random.Random(9)

    def store(self) -> None:
        rows = []
        for _ in range(self.n):
            i = self.next_id
            self.next_id += 1
            rows.append(_row(i, (i + 1) // 2, "spec" if i % 2 else "base", self.rng, time.time()))
        self.conn.execute("BEGIN")
        _insert(self.conn, rows)
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


def timed(fn, repeat: int, before=None) -> list[float]:
    """Milliseconds of `fn()` per round (`before()` runs first, untimed)."""
    out = []
    for _ in range(repeat):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def summary(times: list[float]) -> dict[str, float]:
    return {
        "min": round(min(times), 3),
        "median": round(statistics.median(times), 3),
        "max": round(max(times), 3),
    }


def measure(requests: int, repeat: int, per_poll: int, folder: Path) -> dict:
    from app.store.queries import RunReader
    from app.tui.db_source import AttachedSource
    from app.tui.eval_source import EvalSource
    from app.tui.screens.dashboard import EVENTS_FETCHED, DashboardData
    from app.tui.series import RunSeries, read_chunk

    sys.path.insert(0, str(ROOT / "bench"))
    from tui import bring_to_now, build_db  # bench/tui.py: the generation monitor's bench database

    eval_db, gen_db = folder / "eval.db", folder / "generation.db"
    for p in (eval_db, gen_db):
        for suffix in ("", "-wal", "-shm"):
            Path(str(p) + suffix).unlink(missing_ok=True)
    seeded = {"eval_s": round(build_eval_db(eval_db, requests), 2)}
    seeded["generation_s"] = round(build_db(gen_db, requests, ROOT / "sample_data" / "tokenizer"), 2)
    bring_to_now(gen_db)

    source = EvalSource(RunReader(eval_db, None), control=None, readonly=True)
    catch_up: list[float] = []
    while True:
        t = time.perf_counter()
        caught_up = source.poll().caught_up
        catch_up.append((time.perf_counter() - t) * 1000)
        if caught_up:
            break
    first_read = {"ms": round(sum(catch_up), 1), "polls": len(catch_up), "max_poll_ms": round(max(catch_up), 1)}
    writer = LiveWriter(eval_db, per_poll)
    try:
        live = timed(source.poll, repeat, writer.store)
    finally:
        writer.close()
    idle = timed(source.poll, repeat)
    figures = source.poll().figures
    source.close()

    gen = AttachedSource(gen_db)
    series = RunSeries()
    while True:  # the dashboard's plots read the run's history once, then only what is new
        series.add(read_chunk(gen, series.cursor))
        if series.caught_up:
            break

    def gen_poll() -> None:
        data = DashboardData(
            gen.record(None), tuple(gen.jobs()), tuple(gen.events(EVENTS_FETCHED)), read_chunk(gen, series.cursor)
        )
        assert data.series is not None
        series.add(data.series)

    gen_poll()  # the record's latency percentiles are read once (LatencyCache), as the dashboard's first poll does
    baseline = timed(gen_poll, repeat)
    gen.close()
    out = {
        "requests": requests,
        "repeat": repeat,
        "per_poll": per_poll,
        "seeded_s": seeded,
        "eval_poll_live_ms": summary(live),
        "eval_poll_idle_ms": summary(idle),
        "eval_first_read": first_read,
        "generation_poll_ms": summary(baseline),
        "ratio_eval_to_generation": round(statistics.median(live) / statistics.median(baseline), 3),
        "stored_seen": figures.stored,
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000, help="eval requests stored (and generation samples)")
    parser.add_argument("--repeat", type=int, default=20, help="timed polls per measure")
    parser.add_argument("--per-poll", type=int, default=20, help="requests the stand-in eval stores before each poll")
    parser.add_argument("--dir", type=Path, help="where the databases go (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        out = measure(args.requests, args.repeat, args.per_poll, args.dir)
    else:
        with tempfile.TemporaryDirectory(prefix="eval-poll-") as tmp:
            out = measure(args.requests, args.repeat, args.per_poll, Path(tmp))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0

    def line(name: str, s: dict[str, float]) -> str:
        return f"{name:<38} min {s['min']:8.2f} ms  median {s['median']:8.2f} ms  max {s['max']:8.2f} ms"

    print(f"eval poll over {args.requests:,} stored eval requests ({args.repeat} rounds, {args.per_poll} new per poll)")
    print(line("eval poll (live: new rows each poll)", out["eval_poll_live_ms"]))
    print(line("eval poll (nothing new)", out["eval_poll_idle_ms"]))
    print(line(f"generation poll ({args.requests:,} samples)", out["generation_poll_ms"]))
    first = out["eval_first_read"]
    print(
        f"eval first read of the whole run: {first['ms']:.1f} ms in {first['polls']} polls "
        f"(slowest poll {first['max_poll_ms']:.1f} ms)"
    )
    print(f"ratio eval / generation (medians): {out['ratio_eval_to_generation']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
