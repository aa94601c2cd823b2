"""What does the monitor cost? Dashboard refresh over 1M samples, a 32k-token diff, a mismatch page of 100k.

Builds a run database of --samples samples (default 1,000,000; responses spread over the last 24 h,
10% of reconstructions non-exact, so 100k mismatches) with executemany straight into the schema, and a
1,000-sample database as the baseline measured in the same run. Median of --repeat rounds:
  - dashboard refresh, attached: `snapshot_from_db` + jobs + events from SQLite (through the store's
    `RunReader`, as the attached source reads), then rendering them;
  - dashboard refresh, in-process: jobs + events from SQLite (the snapshot is in memory), then rendering;
  - token diff open: `app.tokens.align` of a 32k-token pair with 64 differences + model build + first
    paint of `TokenDiffView`, and a jump to the last difference;
  - mismatch page: one page (50 rows) of the 100k non-exact samples, first and deep (offset 50,000),
    per sort order of `app.store.queries.MISMATCH_ORDERS` and with a text filter, plus filling the table.
Queries are wall-clock; rendering (through Textual's Pilot) is the process's CPU time less the CPU time of
an empty Pilot round trip measured alongside.
Targets: refresh < 50 ms, diff open < 300 ms, page < 50 ms. Results go to bench/results/tui.json.

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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

from app.libnoise import silence_library_noise  # noqa: E402

silence_library_noise()

MISMATCH_SHARE = 0.10
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
    conn.execute("INSERT INTO runs (id, name, config, state, created_at, updated_at) VALUES (1, 'bench', ?, 'running', ?, ?)",
                 (config, now - 86_400, now))
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
            [(i + 1, i + 1, "sim-a" if i % 2 else "sim-b", 200 + i % 300, 800.0 + i % 2000, 100.0 + i % 300,
              now - 86_400 * (samples - i) / samples) for i in range(start, stop)],
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
            "reference_ids, category, first_diff, n_tokens, ref_len, explanation, detail, n_diff, created_at) "
            f"VALUES (1, ?, ?, 'kimi-k2.5', 'fp', 'canonical', ?, ?, ?, ?, 8, 8, ?, ?, ?, {now})",
            [
                (pk, rid, ids_blob, ids_blob, verdict, first, expl, spans, n_diff)
                for pk, rid, verdict, first, spans, expl, n_diff in rows
            ],
        )
    conn.executemany(
        "INSERT INTO events (run_id, ts, level, kind, message) VALUES (1, ?, 'info', 'run', ?)",
        [(now - 60 + i, f"event {i}") for i in range(50)],
    )
    conn.execute(
        "INSERT INTO jobs (id, run_id, name, executor, spec, state, n_shards, created_at, updated_at) "
        "VALUES (1, 1, 'extract', 'local', '{}', 'running', 8, ?, ?)", (now, now))
    conn.executemany(
        "INSERT INTO job_shards (job_id, shard, state, done, total, tokens, updated_at) VALUES (1, ?, 'running', 5, 10, 100, ?)",
        [(s, now) for s in range(8)],
    )
    conn.execute("COMMIT")
    # the samples went in by plain SQL, past the ingest path that counts them: rebuild the tallies
    from app.store.tallies import recount

    recount(conn)
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - t0


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
    from app.tui.screens.dashboard import DashboardData
    from app.tui.screens.mismatches import PAGE_SIZE, MismatchesScreen
    from app.tui.source import MISMATCH_VERDICTS

    source = AttachedSource(path)
    reader = source.reader
    total = reader.mismatch_page(MISMATCH_VERDICTS, "", "sample", 0, 1).total
    deep = max(0, min(50_000, total - PAGE_SIZE))
    out: dict[str, float] = {"mismatches": float(total)}
    out["fetch_attached"] = median_ms(lambda: (source.snapshot(), source.jobs(), source.events(6)), repeat)
    out["fetch_in_process"] = median_ms(lambda: (source.jobs(), source.events(6)), repeat)
    for order in ("sample", "recent", "verdict"):
        out[f"page_{order}"] = median_ms(lambda: reader.mismatch_page(MISMATCH_VERDICTS, "", order, 0, PAGE_SIZE), repeat)
    for order in ("first_diff", "n_diff", "longest"):
        # cold: a first page that sorts (longest; the others past their index) sorts every match; warm:
        # later pages reuse that order
        def cold(order=order):
            reader.sort_cache.clear()
            reader.mismatch_page(MISMATCH_VERDICTS, "", order, 0, PAGE_SIZE)

        out[f"page_{order}"] = median_ms(cold, repeat)
        out[f"page_{order}_next"] = median_ms(
            lambda: reader.mismatch_page(MISMATCH_VERDICTS, "", order, deep, PAGE_SIZE), repeat
        )
    anchor = reader.mismatch_page(MISMATCH_VERDICTS, "", "sample", deep, 1).rows[0]
    out["page_deep"] = median_ms(
        lambda: reader.mismatch_page(MISMATCH_VERDICTS, "", "sample", deep, PAGE_SIZE, after=anchor), repeat
    )
    longest_anchor = reader.mismatch_page(MISMATCH_VERDICTS, "", "longest", deep, 1).rows[0]
    out["page_longest_deep"] = median_ms(
        lambda: reader.mismatch_page(MISMATCH_VERDICTS, "", "longest", deep, PAGE_SIZE, after=longest_anchor), repeat
    )
    out["page_one_verdict"] = median_ms(lambda: reader.mismatch_page((Category.TEXT_MISMATCH,), "", "sample", 0, PAGE_SIZE), repeat)
    out["page_text"] = median_ms(lambda: reader.mismatch_page(MISMATCH_VERDICTS, "s00012", "sample", 0, PAGE_SIZE), repeat)

    async def render() -> None:
        app = EaglewatchApp(source)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            screen = app.screen

            async def idle_once() -> None:
                await pilot.pause()

            # Pilot's own cost per round trip, subtracted from the render rows below.
            out["pilot_idle"] = await median_ms_async(idle_once, repeat)
            data = DashboardData(source.snapshot(), tuple(source.jobs()), tuple(source.events(6)))

            async def apply_once() -> None:
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
        rec[k:k + 1] = [rec[k], rec[k]]
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

    base = measure_db(small, args.repeat)
    large = measure_db(big, args.repeat)
    diff_small = measure_diff(args.tokenizer, 1_000, args.repeat)
    diff_big = measure_diff(args.tokenizer, 32_000, args.repeat)

    def row(name: str, small_ms: float, big_ms: float, target: float | None) -> tuple:
        verdict = "" if target is None else ("ok" if big_ms < target else "OVER")
        return (name, small_ms, big_ms, big_ms / small_ms if small_ms else float("nan"), target, verdict)

    refresh_attached = large["fetch_attached"] + large["render_dashboard"]
    refresh_in_process = large["fetch_in_process"] + large["render_dashboard"]
    rows = [
        row("dashboard refresh, attached (fetch + render)", base["fetch_attached"] + base["render_dashboard"], refresh_attached, 50),
        row("  fetch: snapshot_from_db + jobs + events", base["fetch_attached"], large["fetch_attached"], None),
        row("dashboard refresh, in-process (fetch + render)", base["fetch_in_process"] + base["render_dashboard"], refresh_in_process, 50),
        row("  render: apply one poll (CPU)", base["render_dashboard"], large["render_dashboard"], None),
        row("mismatch page, sample order (query + table)", base["page_sample"] + base["render_page"], large["page_sample"] + large["render_page"], 50),
        row("  query: first page, sample order", base["page_sample"], large["page_sample"], None),
        row("  query: next page at depth (offset 50,000)", base["page_deep"], large["page_deep"], None),
        row("  query: most recent first", base["page_recent"], large["page_recent"], None),
        row("  query: verdict order", base["page_verdict"], large["page_verdict"], None),
        row("  query: first-difference order, first page", base["page_first_diff"], large["page_first_diff"], None),
        row("  query: first-difference order, later page", base["page_first_diff_next"], large["page_first_diff_next"], None),
        row("  query: tokens-differing order, first page", base["page_n_diff"], large["page_n_diff"], None),
        row("  query: tokens-differing order, later page", base["page_n_diff_next"], large["page_n_diff_next"], None),
        row("  query: longest first, first page", base["page_longest"], large["page_longest"], None),
        row("  query: longest first, later page by offset", base["page_longest_next"], large["page_longest_next"], None),
        row("  query: longest first, deep page by key", base["page_longest_deep"], large["page_longest_deep"], None),
        row("  query: one verdict", base["page_one_verdict"], large["page_one_verdict"], None),
        row("  query: text filter", base["page_text"], large["page_text"], None),
        row("  render: fill the table (CPU)", base["render_page"], large["render_page"], None),
        row("token diff open (align + view + paint)", diff_small["open_total"], diff_big["open_total"], 300),
        row("  align", diff_small["align"], diff_big["align"], None),
        row("  view: model + first paint (CPU)", diff_small["open_view"], diff_big["open_view"], None),
        row("  jump to last difference and back (CPU)", diff_small["jump_last_and_back"], diff_big["jump_last_and_back"], None),
    ]
    print(f"\nbaseline: 1,000 samples / 1k-token diff; measured: {args.samples:,} samples "
          f"({int(large['mismatches']):,} mismatches) / {int(diff_big['tokens']):,}-token diff "
          f"({int(diff_big['rows']):,} display rows at 120 columns); median of {args.repeat}")
    print(f"{'what':<48} {'baseline ms':>11} {'measured ms':>11} {'ratio':>7} {'target':>7}")
    for name, s, b, ratio, target, verdict in rows:
        t = f"<{target}" if target else ""
        print(f"{name:<48} {s:>11.1f} {b:>11.1f} {ratio:>6.1f}x {t:>7} {verdict}")

    result = {
        "samples": args.samples, "mismatches": large["mismatches"], "diff_tokens": diff_big["tokens"],
        "baseline": base, "measured": large, "diff_baseline": diff_small, "diff": diff_big,
        "refresh_attached_ms": refresh_attached, "refresh_in_process_ms": refresh_in_process,
        "page_ms": large["page_sample"] + large["render_page"], "diff_open_ms": diff_big["open_total"],
        "build_s": build_s, "python": platform.python_version(), "machine": platform.machine(),
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tui.json").write_text(json.dumps(result, indent=1) + "\n")
    print()
    print("| TUI (1M samples, 100k mismatches, 32k-token diff) | refresh in-process / attached | mismatch page | diff open |")
    print("|---|---|---|---|")
    print(f"| target <50 ms / <50 ms / <300 ms | {refresh_in_process:.0f} ms / {refresh_attached:.0f} ms | "
          f"{result['page_ms']:.0f} ms | {diff_big['open_total']:.0f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
