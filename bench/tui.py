"""What does the monitor cost? Dashboard refresh over 1M samples, a 32k-token diff, a mismatch page of 100k.

Builds a run database of --samples samples (default 1,000,000; responses spread over the last 24 h,
10% of reconstructions non-exact, so 100k mismatches, 2% measured by probes) with executemany straight
into the schema, and a 1,000-sample database as the baseline measured in the same run. Before measuring,
each database is brought to NOW (a reused --db has its times shifted so its last response is a second
old: the 5-minute window the rates read is never empty), and while it is measured a live writer stands in
for the engine: it beats the heartbeat (with a live snapshot, so the attached refresh decodes it) and
stores about 12 responses a second, as a running engine would. Median of --repeat rounds:
  - dashboard refresh, attached: the run's record (`app.engine.record.reads.read_record`: the store's counts and
    the heartbeat's live figures) + jobs + events + the plots' new rows (`series_since`) from SQLite (through
    the store's `RunReader`, as the attached source reads), then rendering them (tiles, the three time plots
    over the whole 24 h, tables, events);
  - dashboard refresh, in-process: the run's record (the store's counts with the engine's live figures, taken
    in memory) + jobs + events + the plots' new rows, then rendering;
  - the plots' first read: a viewer that opens the run reads its whole history once, in chunks;
  - token diff open: `app.tokens.align` of a 32k-token pair with 64 differences + model build + first
    paint of `TokenDiffView`, and a jump to the last difference;
  - mismatch page: one page (50 rows) of the 100k non-exact samples, first and deep (offset 50,000),
    per sort order of `app.store.queries.MISMATCH_ORDERS` and with a text filter, plus filling the table;
  - the dashboard's poll (fetch + render) over the big database as it is and over a copy whose rows are the
    turns of whole conversations (4 each, the last 1% in progress): the cost of the conversations tile and
    counts, as a ratio of the two measured in the same run.
Queries are wall-clock; rendering (through Textual's Pilot) is the process's CPU time less the CPU time of
an empty Pilot round trip measured alongside.
Targets: refresh < 50 ms, diff open < 300 ms, page < 50 ms, free-text filter < 50 ms. Results go to
bench/results/tui.json.

    python bench/tui.py [--samples 1000000] [--repeat 5] [--db /tmp/tui-bench.db]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

from app.libnoise import silence_library_noise  # noqa: E402

silence_library_noise()

MISMATCH_SHARE = 0.10
PROBE_EVERY = 50  # one sample in 50 measured by a probe (the text_path flag), for the match-rate plot
from app.records import Category  # noqa: E402

NON_EXACT = (Category.BPE_EQUIVALENT, Category.TEXT_MISMATCH, Category.STRUCTURE_MISMATCH, Category.TRUNCATED)


def build_db(path: Path, samples: int, tokenizer_dir: Path) -> float:
    """Write a run of `samples` finished samples straight into the schema; returns seconds taken."""
    from app.store.db import migrate
    from app.store.ids import pack_ids

    t0 = time.perf_counter()
    migrate(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    now = time.time()
    config = json.dumps({"model": {"tokenizer": str(tokenizer_dir)}, "limits": {"budget_usd": 500.0}})
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO runs (id, name, config, state, created_at, updated_at) VALUES (1, 'bench', ?, 'running', ?, ?)",
        (config, now - 86_400, now),
    )
    rng = random.Random(7)
    ids_blob = pack_ids(range(100, 108))
    step = max(1, int(1 / MISMATCH_SHARE))
    chunk = 50_000
    for start in range(0, samples, chunk):
        stop = min(samples, start + chunk)
        conn.executemany(
            "INSERT INTO samples (pk, run_id, sample_id, dataset, messages, state, attempts, updated_at) "
            "VALUES (?, 1, ?, ?, '[]', 'done', 1, ?)",
            [(i + 1, f"s{i:07d}", "chat" if i % 3 else "code", now) for i in range(start, stop)],
        )
        conn.executemany(
            "INSERT INTO responses (id, run_id, sample_pk, attempt, endpoint, finish_reason, content, usage, "
            "prompt_tokens, completion_tokens, cost_usd, latency_ms, ttft_ms, created_at) "
            "VALUES (?, 1, ?, 1, ?, 'stop', 'x', '{}', 100, ?, 0.0004, ?, ?, ?)",
            [
                (
                    i + 1,
                    i + 1,
                    "sim-a" if i % 2 else "sim-b",
                    200 + i % 300,
                    800.0 + i % 2000,
                    100.0 + i % 300,
                    now - 86_400 * (samples - i) / samples,
                )
                for i in range(start, stop)
            ],
        )
        rows = []
        for i in range(start, stop):
            if i % step == 0:
                verdict = NON_EXACT[(i // step) % len(NON_EXACT)]
                k = rng.randrange(1, 40)
                spans = json.dumps({"spans": [[k, k + 1 + i % 5, k, k + 2]]})
                # n_diff as the store writes it (schema v4): the longer side of each span
                rows.append((i + 1, i + 1, verdict, k, spans, f"{verdict} at token {k}", max(1 + i % 5, 2)))
            else:
                rows.append((i + 1, i + 1, Category.EXACT, None, '{"spans": []}', None, 0))
        conn.executemany(
            "INSERT INTO reconstructions (run_id, sample_pk, response_id, profile, tokenizer, strategy, output_ids, "
            "reference_ids, category, first_diff, n_tokens, ref_len, explanation, detail, n_diff, flags, created_at) "
            "VALUES (1, ?, ?, 'kimi-k2.5', 'fp', 'canonical', ?, ?, ?, ?, 8, 8, ?, ?, ?, ?, ?)",
            [
                (
                    pk,
                    rid,
                    ids_blob,
                    ids_blob,
                    verdict,
                    first,
                    expl,
                    spans,
                    n_diff,
                    _probe_flags(pk, verdict),
                    now - 86_400 * (samples - pk + 1) / samples,
                )
                for pk, rid, verdict, first, spans, expl, n_diff in rows
            ],
        )
    conn.executemany(
        "INSERT INTO events (run_id, ts, level, kind, message) VALUES (1, ?, 'info', 'run', ?)",
        [(now - 60 + i, f"event {i}") for i in range(50)],
    )
    conn.execute(
        "INSERT INTO jobs (id, run_id, name, executor, spec, state, n_shards, created_at, updated_at) "
        "VALUES (1, 1, 'extract', 'local', '{}', 'running', 8, ?, ?)",
        (now, now),
    )
    conn.executemany(
        "INSERT INTO job_shards (job_id, shard, state, done, total, tokens, updated_at) VALUES (1, ?, 'running', "
        "5, 10, 100, ?)",
        [(s, now) for s in range(8)],
    )
    conn.execute("COMMIT")
    # the samples went in by plain SQL, past the ingest path that counts them: rebuild the tallies
    from app.store.tallies import recount

    recount(conn)
    # and the reconstructions went past the run store, which moves them into the text index (schema v6)
    from app.store.run_store import index_pending_text

    conn.execute("BEGIN")
    while index_pending_text(conn):
        pass
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - t0


def _probe_flags(pk: int, verdict: str) -> str | None:
    """Every PROBE_EVERY-th sample measured (its text-path verdict is its verdict), as the engine's probes flag it."""
    return json.dumps([f"text_path:{verdict}"]) if pk % PROBE_EVERY == 0 else None


def bring_to_now(path: Path) -> float:
    """Shift the database's times so its last response is a second old (a reused --db would otherwise have
    an empty rate window and stale plots), and recount its tallies if rows went in past them; returns the
    shift in seconds."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        last = conn.execute("SELECT MAX(created_at) FROM responses").fetchone()[0] or time.time()
        shift = time.time() - 1.0 - last
        if shift > 1.0:
            conn.execute("BEGIN")
            for table, column in (
                ("responses", "created_at"),
                ("reconstructions", "created_at"),
                ("events", "ts"),
                ("runs", "created_at"),
                ("runs", "updated_at"),
            ):
                conn.execute(f"UPDATE {table} SET {column} = {column} + ?", (shift,))
            conn.execute("COMMIT")
        from app.store.tallies import recount, samples_current

        if not samples_current(conn):  # rows added by plain SQL since: tallies behind would mean COUNT scans
            recount(conn)
        return max(shift, 0.0)
    finally:
        conn.close()


class LiveWriter:
    """Stands in for a running engine while a database is measured: beats the heartbeat every 0.5 s (with a
    live snapshot) and stores ~12 responses a second, in its own connection."""

    RATE = 12

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stop = threading.Event()
        self._first = threading.Event()  # the first batch is stored (the window has rows)
        self._thread = threading.Thread(target=self._run, name="bench-live-writer", daemon=True)
        self.written = 0

    def __enter__(self) -> LiveWriter:
        self._beat(sqlite3.connect(self.path, isolation_level=None, timeout=5), close=True)
        self._thread.start()
        self._first.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self, conn: sqlite3.Connection, close: bool = False) -> None:
        from app.engine.record.codec import snapshot_to_json
        from app.store.heartbeat import beat_op, this_host

        now = time.time()
        live = LIVE
        beat_op(
            1, pid=os.getpid(), host=this_host(), started_at=now - 86_400, now=now, snapshot_json=snapshot_to_json(live)
        )(conn)
        if close:
            conn.close()

    def _run(self) -> None:
        # responses only (new attempts of stored samples): a plain-SQL sample row would put the sample
        # tallies behind and send every snapshot to a COUNT over the samples table, which no engine does
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        n_samples = conn.execute("SELECT MAX(pk) FROM samples").fetchone()[0] or 1
        rid = conn.execute("SELECT MAX(id) FROM responses").fetchone()[0] or 0
        while True:
            now = time.time()
            conn.execute("BEGIN")
            for _ in range(self.RATE // 2):
                rid += 1
                conn.execute(
                    "INSERT INTO responses (id, run_id, sample_pk, attempt, endpoint, finish_reason, content, "
                    "usage, prompt_tokens, completion_tokens, cost_usd, latency_ms, ttft_ms, created_at) "
                    "VALUES (?, 1, ?, 2, 'sim-a', 'stop', 'x', '{}', 100, 250, 0.0004, 900, 120, ?)",
                    (rid, 1 + rid % n_samples, now),
                )
                self.written += 1
            self._beat(conn)
            conn.execute("COMMIT")
            self._first.set()
            if self._stop.wait(0.5):
                break
        conn.close()


def _live():
    from app.engine.record.snapshot import EndpointLive, LiveFigures, Rate

    return LiveFigures(
        "running",
        started_at=time.time() - 86_400,
        in_flight=40,
        waiting=3,
        concurrency_limit=48,
        rate=Rate(req_s_10s=12.0, req_s_1m=12.0, tok_s_10s=3000.0, tok_s_1m=3000.0),
        eta_s=120.0,
        endpoints=(
            EndpointLive("sim-a", in_flight=20, concurrency_limit=24),
            EndpointLive("sim-b", in_flight=20, concurrency_limit=24),
        ),
    )


LIVE = _live()  # what the stand-in engine beats, and what an in-process face takes from its engine


def read_history(source) -> tuple[float, object]:
    """The plots' first read of a run (every stored row, in chunks): (ms, the RunSeries)."""
    from app.tui.series import RunSeries, read_chunk

    t = time.perf_counter()
    series = RunSeries()
    while True:
        series.add(read_chunk(source, series.cursor))
        if series.caught_up:
            return (time.perf_counter() - t) * 1000, series


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


async def median_ms_async(fn, repeat: int) -> float:
    """CPU time of this process (all threads) per call: Pilot's idle waits and other processes' load
    on a shared machine would otherwise dominate a wall-clock reading of a few milliseconds of work."""
    times = []
    for _ in range(repeat):
        t = time.process_time()
        await fn()
        times.append(time.process_time() - t)
    return statistics.median(times) * 1000


def measure_db(path: Path, repeat: int) -> dict[str, float]:
    """Refresh and mismatch-page costs over one database (data side and rendering side)."""
    from app.tui.app import EaglewatchApp
    from app.tui.db_source import AttachedSource
    from app.tui.screens.dashboard import EVENTS_FETCHED, DashboardData
    from app.tui.screens.mismatches import PAGE_SIZE, MismatchesScreen
    from app.tui.series import read_chunk
    from app.tui.source import MISMATCH_VERDICTS

    source = AttachedSource(path)
    reader = source.reader
    total = reader.mismatch_page(MISMATCH_VERDICTS, "", "sample", 0, 1).total
    deep = max(0, min(50_000, total - PAGE_SIZE))
    out: dict[str, float] = {"mismatches": float(total)}
    snap = source.record(None)
    # a stale heartbeat would read as a gone engine (finished figures): say so instead of reporting its numbers
    if snap.engine != "running" or snap.live is None:
        raise SystemExit(f"{path}: the heartbeat is stale (engine {snap.engine}): the bench would measure nothing")
    out["history_read"], series = read_history(source)
    out["history_buckets"] = float(len(series.plots(snap)["throughput"].values))

    def fetch_attached():
        # the plots read only what was stored since the previous poll, as the dashboard does
        chunk = read_chunk(source, series.cursor)
        series.add(chunk)
        return source.record(None), source.jobs(), source.events(EVENTS_FETCHED), chunk

    def fetch_in_process():
        # the live figures come from the engine's memory; the counts, as attached, from the store
        chunk = read_chunk(source, series.cursor)
        series.add(chunk)
        return source.record(LIVE), source.jobs(), source.events(EVENTS_FETCHED), chunk

    out["fetch_attached"] = median_ms(fetch_attached, repeat)
    out["fetch_in_process"] = median_ms(fetch_in_process, repeat)
    for order in ("sample", "recent", "verdict"):
        out[f"page_{order}"] = median_ms(
            lambda order=order: reader.mismatch_page(MISMATCH_VERDICTS, "", order, 0, PAGE_SIZE), repeat
        )
    for order in ("first_diff", "n_diff", "longest"):
        # cold: a first page that sorts (longest; the others past their index) sorts every match; warm:
        # later pages reuse that order
        def cold(order=order):
            reader.sort_cache.clear()
            reader.mismatch_page(MISMATCH_VERDICTS, "", order, 0, PAGE_SIZE)

        out[f"page_{order}"] = median_ms(cold, repeat)
        out[f"page_{order}_next"] = median_ms(
            lambda order=order: reader.mismatch_page(MISMATCH_VERDICTS, "", order, deep, PAGE_SIZE), repeat
        )
    anchor = reader.mismatch_page(MISMATCH_VERDICTS, "", "sample", deep, 1).rows[0]
    out["page_deep"] = median_ms(
        lambda: reader.mismatch_page(MISMATCH_VERDICTS, "", "sample", deep, PAGE_SIZE, after=anchor), repeat
    )
    longest_anchor = reader.mismatch_page(MISMATCH_VERDICTS, "", "longest", deep, 1).rows[0]
    out["page_longest_deep"] = median_ms(
        lambda: reader.mismatch_page(MISMATCH_VERDICTS, "", "longest", deep, PAGE_SIZE, after=longest_anchor), repeat
    )
    out["page_one_verdict"] = median_ms(
        lambda: reader.mismatch_page((Category.TEXT_MISMATCH,), "", "sample", 0, PAGE_SIZE), repeat
    )
    out["page_text"] = median_ms(
        lambda: reader.mismatch_page(MISMATCH_VERDICTS, "s00012", "sample", 0, PAGE_SIZE), repeat
    )

    async def render() -> None:
        app = EaglewatchApp(source)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            screen = app.screen
            while not screen.series.caught_up:  # the dashboard's own polls read the history first
                screen.poll()
                await pilot.pause()
                await app.workers.wait_for_complete()
            assert all(plot.series.values for plot in screen.query("TimePlot"))

            async def idle_once() -> None:
                await pilot.pause()

            # Pilot's own cost per round trip, subtracted from the render rows below.
            out["pilot_idle"] = await median_ms_async(idle_once, repeat)
            data = DashboardData(source.record(None), tuple(source.jobs()), tuple(source.events(EVENTS_FETCHED)))

            async def apply_once() -> None:
                # tiles, tables, events and the three plots (redrawn: their time axis moves with the clock)
                screen._polling = True
                screen.apply(data)
                await pilot.pause()

            out["render_dashboard"] = max(0.0, await median_ms_async(apply_once, repeat) - out["pilot_idle"])
            await pilot.press("m")
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            mismatches = app.screen
            assert isinstance(mismatches, MismatchesScreen)
            page = reader.mismatch_page(MISMATCH_VERDICTS, "", "sample", 0, PAGE_SIZE)

            async def fill_once() -> None:
                mismatches.show_page(page)
                await pilot.pause()

            out["render_page"] = max(0.0, await median_ms_async(fill_once, repeat) - out["pilot_idle"])

    asyncio.run(render())
    source.close()
    return out


def as_conversations(src: Path, dst: Path, turns: int = 4) -> int:
    """A copy of `src` whose samples are the turns of whole conversations (`turns` each, in row order), the last
    1% of them in progress (turn 1 done, turn 2 in flight, the rest waiting on it), its tallies recounted: the
    same rows, counted as conversations too. Returns how many conversations."""
    source, copy = sqlite3.connect(src), sqlite3.connect(dst, isolation_level=None)
    try:
        source.backup(copy)
    finally:
        source.close()
    try:
        n = copy.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        open_from = n - max(turns, n // 100)
        copy.execute("BEGIN")
        copy.execute(
            "UPDATE samples SET conversation_id = 'c' || ((pk - 1) / ?), turn = ((pk - 1) % ?) + 1, turns = ?, "
            "sample_id = 'c' || ((pk - 1) / ?) || '#' || (((pk - 1) % ?) + 1), "
            "parent_pk = CASE WHEN (pk - 1) % ? = 0 THEN NULL ELSE pk - 1 END",
            (turns, turns, turns, turns, turns, turns),
        )
        copy.execute(
            "UPDATE samples SET state = CASE turn WHEN 1 THEN 'done' WHEN 2 THEN 'leased' ELSE 'waiting' END "
            "WHERE pk > ? ",
            (open_from - open_from % turns,),
        )
        copy.execute("COMMIT")
        from app.store.tallies import recount

        recount(copy)
        copy.execute("ANALYZE")
        return copy.execute("SELECT COUNT(*) FROM samples WHERE turn = 1").fetchone()[0]
    finally:
        copy.close()


def measure_poll(path: Path, repeat: int) -> dict[str, float]:
    """The dashboard's poll over one database: the fetch (attached: the record with the heartbeat's figures, jobs,
    events, the plots' new rows) and applying it at 80x24 (CPU, less an empty Pilot round trip), where a run with
    conversations and one without both show one plot: they differ by the conversations tile alone."""
    from app.tui.app import EaglewatchApp
    from app.tui.db_source import AttachedSource
    from app.tui.screens.dashboard import EVENTS_FETCHED, DashboardData
    from app.tui.series import read_chunk

    source = AttachedSource(path)
    _, series = read_history(source)
    out: dict[str, float] = {}

    def fetch():
        chunk = read_chunk(source, series.cursor)
        series.add(chunk)
        return source.record(None), source.jobs(), source.events(EVENTS_FETCHED), chunk

    out["fetch"] = median_ms(fetch, repeat)
    out["conversations"] = float(
        0 if source.record(None).counts.conversations is None else source.record(None).counts.conversations.total
    )

    async def render() -> None:
        app = EaglewatchApp(source)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            screen = app.screen
            while not screen.series.caught_up:
                screen.poll()
                await pilot.pause()
                await app.workers.wait_for_complete()

            async def idle_once() -> None:
                await pilot.pause()

            idle = await median_ms_async(idle_once, repeat)
            data = DashboardData(source.record(None), tuple(source.jobs()), tuple(source.events(EVENTS_FETCHED)))

            async def apply_once() -> None:
                screen._polling = True
                screen.apply(data)
                await pilot.pause()

            out["render"] = max(0.0, await median_ms_async(apply_once, repeat) - idle)

    asyncio.run(render())
    source.close()
    return out


def measure_diff(tokenizer_dir: Path, n_tokens: int, repeat: int) -> dict[str, float]:
    """Align + open + jump-to-end of the diff view for an n-token pair with 64 differences."""
    from textual.app import App

    from app.tokens import load_tokenizer
    from app.tokens.align import align
    from widgets.token_diff import TokenDiffView

    tok = load_tokenizer(tokenizer_dir)
    rng = random.Random(3)
    words = "the gate NOR answer is complete proof we can build every boolean function from".split()
    ref: list[int] = []
    while len(ref) < n_tokens:
        line = " ".join(rng.choice(words) for _ in range(12)) + ".\n"
        ref.extend(tok.encode(line))
    ref = ref[:n_tokens]
    rec = list(ref)
    for k in sorted(rng.sample(range(10, n_tokens - 10), min(64, n_tokens // 20)), reverse=True):
        rec[k : k + 1] = [rec[k], rec[k]]
    out: dict[str, float] = {"tokens": float(len(ref))}
    out["align"] = median_ms(lambda: align(ref, rec, tok), repeat)
    alignment = align(ref, rec, tok)

    class Host(App):
        def compose(self):
            yield TokenDiffView()

    async def run() -> None:
        app = Host()
        async with app.run_test(size=(120, 40)) as pilot:
            view = app.query_one(TokenDiffView)

            async def idle_once() -> None:
                await pilot.pause()

            idle = await median_ms_async(idle_once, repeat)

            async def open_once() -> None:
                view.set_alignment(alignment)
                await pilot.pause()

            async def jump_end() -> None:
                view.goto_diff(view.diff_count - 1)
                await pilot.pause()
                view.goto_diff(0)
                await pilot.pause()

            out["open_view"] = max(0.0, await median_ms_async(open_once, repeat) - idle)
            out["jump_last_and_back"] = max(0.0, await median_ms_async(jump_end, repeat) - 2 * idle)
            out["rows"] = float(view.row_count)

    asyncio.run(run())
    out["open_total"] = out["align"] + out["open_view"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--db", type=Path, help="reuse (or create) the big database here")
    ap.add_argument("--tokenizer", type=Path, default=ROOT / "sample_data" / "tokenizer")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="eaglewatch-tui-bench-"))
    big = args.db or work / "big.db"
    build_s = 0.0
    if not big.exists():
        build_s = build_db(big, args.samples, args.tokenizer)
        print(f"built {args.samples:,} samples in {build_s:.1f} s -> {big}")
    small = work / "small.db"
    build_db(small, 1_000, args.tokenizer)

    shifted = bring_to_now(big)
    if shifted and not build_s:
        print(f"{big}: times shifted {shifted:,.0f} s to now (a reused database)")
    bring_to_now(small)
    with LiveWriter(small):
        base = measure_db(small, args.repeat)
    with LiveWriter(big) as writer:
        large = measure_db(big, args.repeat)
    print(f"live writer: {writer.written} responses stored while measuring, heartbeat every 0.5 s")
    # the same rows counted as whole conversations too: the dashboard's poll with its conversations tile, against
    # the poll of the rows as single-turn samples, measured one after the other in this run
    conversations_db = work / "conversations.db"
    n_conversations = as_conversations(big, conversations_db)
    rounds: dict[Path, list[dict[str, float]]] = {big: [], conversations_db: []}
    for _ in range(3):  # alternated, so a neighbour's load on a shared machine falls on both alike
        for path in rounds:
            with LiveWriter(path):
                rounds[path].append(measure_poll(path, args.repeat))
    single, whole = ({k: statistics.median(r[k] for r in rounds[p]) for k in rounds[p][0]} for p in rounds)
    diff_small = measure_diff(args.tokenizer, 1_000, args.repeat)
    diff_big = measure_diff(args.tokenizer, 32_000, args.repeat)

    def row(name: str, small_ms: float, big_ms: float, target: float | None) -> tuple:
        verdict = "" if target is None else ("ok" if big_ms < target else "OVER")
        return (name, small_ms, big_ms, big_ms / small_ms if small_ms else float("nan"), target, verdict)

    refresh_attached = large["fetch_attached"] + large["render_dashboard"]
    refresh_in_process = large["fetch_in_process"] + large["render_dashboard"]
    rows = [
        row(
            "dashboard refresh, attached (fetch + render)",
            base["fetch_attached"] + base["render_dashboard"],
            refresh_attached,
            50,
        ),
        row(
            "  fetch: the record (counts + heartbeat) + jobs + events + plot rows",
            base["fetch_attached"],
            large["fetch_attached"],
            None,
        ),
        row(
            "  fetch: the record (counts + live) + jobs + events + plot rows",
            base["fetch_in_process"],
            large["fetch_in_process"],
            None,
        ),
        row(
            "dashboard refresh, in-process (fetch + render)",
            base["fetch_in_process"] + base["render_dashboard"],
            refresh_in_process,
            50,
        ),
        row(
            "  render: apply one poll, with the plots (CPU)", base["render_dashboard"], large["render_dashboard"], None
        ),
        row("plots' first read of the whole history (once)", base["history_read"], large["history_read"], None),
        row(
            "mismatch page, sample order (query + table)",
            base["page_sample"] + base["render_page"],
            large["page_sample"] + large["render_page"],
            50,
        ),
        row("  query: first page, sample order", base["page_sample"], large["page_sample"], None),
        row("  query: next page at depth (offset 50,000)", base["page_deep"], large["page_deep"], None),
        row("  query: most recent first", base["page_recent"], large["page_recent"], None),
        row("  query: verdict order", base["page_verdict"], large["page_verdict"], None),
        row("  query: first-difference order, first page", base["page_first_diff"], large["page_first_diff"], None),
        row(
            "  query: first-difference order, later page",
            base["page_first_diff_next"],
            large["page_first_diff_next"],
            None,
        ),
        row("  query: tokens-differing order, first page", base["page_n_diff"], large["page_n_diff"], None),
        row("  query: tokens-differing order, later page", base["page_n_diff_next"], large["page_n_diff_next"], None),
        row("  query: longest first, first page", base["page_longest"], large["page_longest"], None),
        row(
            "  query: longest first, later page by offset", base["page_longest_next"], large["page_longest_next"], None
        ),
        row("  query: longest first, deep page by key", base["page_longest_deep"], large["page_longest_deep"], None),
        row("  query: one verdict", base["page_one_verdict"], large["page_one_verdict"], None),
        row("free-text mismatch filter (first page)", base["page_text"], large["page_text"], 50),
        row("  render: fill the table (CPU)", base["render_page"], large["render_page"], None),
        row("token diff open (align + view + paint)", diff_small["open_total"], diff_big["open_total"], 300),
        row("  align", diff_small["align"], diff_big["align"], None),
        row("  view: model + first paint (CPU)", diff_small["open_view"], diff_big["open_view"], None),
        row(
            "  jump to last difference and back (CPU)",
            diff_small["jump_last_and_back"],
            diff_big["jump_last_and_back"],
            None,
        ),
    ]
    conversation_rows = [
        row("dashboard poll, attached: fetch (the record, jobs, events, plots)", single["fetch"], whole["fetch"], None),
        row("dashboard poll: render at 80x24 (CPU; + the conversations tile)", single["render"], whole["render"], None),
        row("dashboard poll: fetch + render", single["fetch"] + single["render"], whole["fetch"] + whole["render"], 50),
    ]
    print(
        f"\nbaseline: 1,000 samples / 1k-token diff; measured: {args.samples:,} samples "
        f"({int(large['mismatches']):,} mismatches) / {int(diff_big['tokens']):,}-token diff "
        f"({int(diff_big['rows']):,} display rows at 120 columns); median of {args.repeat}"
    )
    print(f"{'what':<66} {'baseline ms':>11} {'measured ms':>11} {'ratio':>7} {'target':>7}")
    for name, s, b, ratio, target, verdict in rows:
        t = f"<{target}" if target else ""
        print(f"{name:<66} {s:>11.1f} {b:>11.1f} {ratio:>6.1f}x {t:>7} {verdict}")
    print(
        f"\nthe same {args.samples:,} rows as single-turn samples (baseline) and as {n_conversations:,} whole "
        f"conversations of 4 turns (measured); median of 3 alternated rounds of {args.repeat}; indicative (a "
        "shared machine)"
    )
    print(f"{'what':<66} {'single ms':>11} {'conv. ms':>11} {'ratio':>7} {'target':>7}")
    for name, s, b, ratio, target, verdict in conversation_rows:
        t = f"<{target}" if target else ""
        print(f"{name:<66} {s:>11.1f} {b:>11.1f} {ratio:>6.2f}x {t:>7} {verdict}")

    result = {
        "samples": args.samples,
        "mismatches": large["mismatches"],
        "diff_tokens": diff_big["tokens"],
        "baseline": base,
        "measured": large,
        "diff_baseline": diff_small,
        "diff": diff_big,
        "refresh_attached_ms": refresh_attached,
        "refresh_in_process_ms": refresh_in_process,
        "page_ms": large["page_sample"] + large["render_page"],
        "diff_open_ms": diff_big["open_total"],
        "text_filter_ms": large["page_text"],
        "history_read_ms": large["history_read"],
        "reused_db_shift_s": shifted,
        "build_s": build_s,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "poll_single_turn": single,
        "poll_conversations": whole,
        "conversations": n_conversations,
        "poll_conversations_ratio": (whole["fetch"] + whole["render"]) / max(single["fetch"] + single["render"], 1e-9),
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tui.json").write_text(json.dumps(result, indent=1) + "\n")
    print()
    print(
        "| TUI (1M samples, 100k mismatches, 32k-token diff) | refresh in-process / attached | mismatch page | "
        "diff open |"
    )
    print("|---|---|---|---|")
    print(
        f"| target <50 ms / <50 ms / <300 ms | {refresh_in_process:.0f} ms / {refresh_attached:.0f} ms | "
        f"{result['page_ms']:.0f} ms | {diff_big['open_total']:.0f} ms |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
