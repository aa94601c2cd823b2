"""How fast does `eaglewatch ingest` stream a large prompt file into the run store, and in how much memory?

Generates an N-line (default 1M) openai-messages JSONL file in a temp dir, then, each in a fresh
subprocess (so peak RSS is that job's own):
  - eaglewatch: `ingest_config` — parse + validate every line, content checks, INSERT OR IGNORE into the
    real schema (unique (run, sample_id) index, state index) through the RunStore writer;
  - re-ingest: the same `ingest_config` again over the unchanged file into the same database, forced to read
    it (every line "already present" through the indexed conflict check); reported against the first ingest;
  - baseline: the least a loader can do — `json.loads` each line, `json.dumps` its messages, and a bare
    `sqlite3.executemany` into an index-free table, 5000 rows per transaction.
Reports rows/s, the ratio to the baseline, and peak RSS (ru_maxrss). Targets: >= 50k rows/s, < 200 MB.
Then each dataset reader (`iter_prompts`, no store) on the same rows written as a JSON array, Parquet, Arrow,
`.jsonl.gz` and `.jsonl.zst`, in rows/s against the JSON-lines reader in the same run (target >= 0.8x for Parquet
and Arrow). `--readers-only` skips the ingest rows. `--json-array-mb 1000` instead ingests one JSON array of about
that size (prompts of ~4 KB, as long chats are) and reports its peak RSS against the file's size: the array is
streamed, never loaded whole.
Results go to bench/results/ingest.json; the last line is a markdown row for docs/performance.md.

    python bench/ingest.py [--lines 1000000] [--reader-lines 200000] [--readers-only] [--keep DIR]
    python bench/ingest.py --json-array-mb 1000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_ROWS_S = 50_000
TARGET_RSS_MB = 200
TARGET_REINGEST_RATIO = 2.0


def generate(path: Path, n: int) -> None:
    """A prompt file shaped like real chat data: a system turn, a user turn, the answer to drop."""
    topics = ["python", "rust", "sqlite", "tokenizers", "gpu", "slurm", "eagle", "textual"]
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            t = topics[i % len(topics)]
            fh.write(
                json.dumps(
                    {
                        "id": f"sample-{i:07d}",
                        "messages": [
                            {"role": "system", "content": "You are a careful assistant."},
                            {
                                "role": "user",
                                "content": f"Question {i}: explain {t} in three sentences, "
                                f"with one example. 例 {i % 97}",
                            },
                            {"role": "assistant", "content": f"An answer about {t}."},
                        ],
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )


def child_eaglewatch(prompts: Path, db: Path, force: bool = False) -> dict:
    """`ingest_config` into `db`; with `force` the file is read again although unchanged (the re-ingest row:
    every line goes through the indexed conflict check and is "already present")."""
    import asyncio

    from app.config import parse_config
    from app.engine.work.config_ingest import ingest_config
    from app.store.run_store import RunStore

    config = parse_config(
        {
            "run": {"name": "bench", "database": str(db)},
            "data": {"datasets": [{"path": str(prompts), "format": "openai-messages"}]},
            "model": {"name": "m", "tokenizer": str(ROOT / "sample_data" / "tokenizer")},
            "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}],
        }
    )

    async def go():
        store = await RunStore.open(config.run.database)
        try:
            return await ingest_config(store, config, force=force)
        finally:
            await store.close()

    t = time.perf_counter()
    summary = asyncio.run(go())
    elapsed = time.perf_counter() - t
    d = summary.datasets[0]
    return {
        "rows": d.added + d.already_present,
        "added": d.added,
        "already_present": d.already_present,
        "bad": d.bad_lines,
        "seconds": elapsed,
    }


def child_baseline(prompts: Path, db: Path) -> dict:
    import sqlite3

    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE samples (sample_id TEXT, messages TEXT)")
    t = time.perf_counter()
    rows = 0
    batch: list[tuple[str, str]] = []
    with prompts.open("rb") as fh:
        for line in fh:
            obj = json.loads(line)
            batch.append((obj["id"], json.dumps(obj["messages"][:-1], ensure_ascii=False)))
            if len(batch) == 5000:
                conn.execute("BEGIN")
                conn.executemany("INSERT INTO samples VALUES (?, ?)", batch)
                conn.execute("COMMIT")
                rows += len(batch)
                batch = []
    if batch:
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO samples VALUES (?, ?)", batch)
        conn.execute("COMMIT")
        rows += len(batch)
    elapsed = time.perf_counter() - t
    conn.close()
    return {"rows": rows, "bad": 0, "seconds": elapsed}


TARGET_TABLE_READER_RATIO = 0.8
TARGET_ARRAY_RSS_MB = 200  # a 1 GB JSON array ingests in this much, like the 1M-line JSON-lines file


def generate_array(path: Path, megabytes: int) -> int:
    """A JSON array of openai-messages rows of about `megabytes` MB (a ~4 KB user turn each); returns the rows."""
    pad = " ".join(f"word{k}" for k in range(600))
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        fh.write("[")
        while fh.tell() < megabytes * 1_000_000:
            row = {
                "id": f"array-{n:08d}",
                "messages": [
                    {"role": "user", "content": f"Question {n}: {pad}"},
                    {"role": "assistant", "content": "An answer."},
                ],
            }
            fh.write(("," if n else "") + "\n" + json.dumps(row))
            n += 1
        fh.write("]\n")
    return n


def json_array_row(megabytes: int, keep: str | None) -> int:
    """Ingest one generated JSON array of about `megabytes` MB in a child process; print rows/s and peak RSS."""
    with tempfile.TemporaryDirectory(prefix="eaglewatch-bench-") as tmp:
        work = Path(keep) if keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        prompts = work / "array.json"
        t = time.perf_counter()
        rows = generate_array(prompts, megabytes)
        size_mb = prompts.stat().st_size / 1e6
        print(f"generated a JSON array of {rows:,} rows ({size_mb:,.0f} MB) in {time.perf_counter() - t:.1f} s")
        db = work / "array.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        r = run_child("eaglewatch", prompts, db)
    ok = r["rows"] == rows and r["peak_rss_mb"] < TARGET_ARRAY_RSS_MB
    print(
        f"json-array ingest: {r['rows']:,} rows in {r['seconds']:.1f} s ({r['rows'] / r['seconds']:,.0f} rows/s, "
        f"{size_mb / r['seconds']:,.0f} MB/s), peak RSS {r['peak_rss_mb']:.0f} MB for a {size_mb:,.0f} MB file "
        f"({r['peak_rss_mb'] / size_mb:.2f}x its size); every row stored and < {TARGET_ARRAY_RSS_MB} MB "
        f"{'met' if ok else 'MISSED'}"
    )
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    payload = {"file_mb": round(size_mb, 1), "rows": rows, "result": r, "target_rss_mb": TARGET_ARRAY_RSS_MB}
    (out / "ingest_json_array.json").write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if ok else 1


def reader_rates(work: Path, n: int) -> dict[str, dict]:
    """rows/s of `iter_prompts` over the same n rows in each container, best of three; the JSON-lines reader is
    the baseline of the ratios."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from app.datasets import iter_prompts

    jsonl = work / "readers.jsonl"
    generate(jsonl, n)
    raw = jsonl.read_bytes()
    rows = [json.loads(line) for line in raw.splitlines()]
    table = pa.Table.from_pylist(rows)
    files = {
        "jsonl": jsonl,
        "json-array": work / "readers.json",
        "parquet": work / "readers.parquet",
        "arrow": work / "readers.arrow",
        "jsonl.gz": work / "readers.jsonl.gz",
        "jsonl.zst": work / "readers.jsonl.zst",
    }
    files["json-array"].write_bytes(b"[" + b",\n".join(raw.splitlines()) + b"]")
    pq.write_table(table, files["parquet"])
    with pa.OSFile(str(files["arrow"]), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)  # datasets' save_to_disk batch size
    files["jsonl.gz"].write_bytes(gzip.compress(raw, 6))
    files["jsonl.zst"].write_bytes(zstandard.ZstdCompressor(level=3).compress(raw))
    del rows, table
    out = {}
    for kind, path in files.items():
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            got = sum(1 for _ in iter_prompts(path, "openai-messages"))
            best = min(best, time.perf_counter() - t)
        assert got == n, f"{kind}: read {got} of {n} rows"
        out[kind] = {"rows": n, "seconds": best, "rows_per_s": n / best, "file_mb": path.stat().st_size / 1e6}
    for r in out.values():
        r["ratio"] = r["rows_per_s"] / out["jsonl"]["rows_per_s"]
    return out


def run_child(kind: str, prompts: Path, db: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(prompts), str(db)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{kind} child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep the files")
    ap.add_argument("--reader-lines", type=int, default=200_000, help="rows per container in the readers table")
    ap.add_argument("--readers-only", action="store_true", help="only the readers table")
    ap.add_argument("--json-array-mb", type=int, metavar="MB", help="only: ingest a JSON array of about MB megabytes")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "PROMPTS", "DB"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        kind, prompts, db = args.child
        if kind == "readers":  # (PROMPTS: the rows, DB: the work folder) in a child, like the ingest rows, so the
            # parent stays small: Linux keeps ru_maxrss across exec, and each ingest child's peak RSS starts there
            print(json.dumps(reader_rates(Path(db), int(prompts))))
            return 0
        before = resource.getrusage(resource.RUSAGE_SELF)
        if kind == "baseline":
            result = child_baseline(Path(prompts), Path(db))
        else:
            result = child_eaglewatch(Path(prompts), Path(db), force=kind == "re-ingest")
        after = resource.getrusage(resource.RUSAGE_SELF)
        result["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(json.dumps(result))
        return 0
    if args.json_array_mb:
        return json_array_row(args.json_array_mb, args.keep)

    with tempfile.TemporaryDirectory(prefix="eaglewatch-bench-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        readers = run_child("readers", Path(str(args.reader_lines)), work)
    print(f"{'reader':12} {'rows':>10} {'file MB':>8} {'seconds':>8} {'rows/s':>10} {'vs jsonl':>9}")
    for kind, r in readers.items():
        print(
            f"{kind:12} {r['rows']:>10,} {r['file_mb']:>8.1f} {r['seconds']:>8.2f} {r['rows_per_s']:>10,.0f} "
            f"{r['ratio']:>8.2f}x"
        )
    ok_tables = all(readers[k]["ratio"] >= TARGET_TABLE_READER_RATIO for k in ("parquet", "arrow"))
    print(
        f"target: Parquet and Arrow >= {TARGET_TABLE_READER_RATIO}x the JSON-lines reader "
        f"{'met' if ok_tables else 'MISSED'}"
    )
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ingest_readers.json").write_text(
        json.dumps({"rows": args.reader_lines, "readers": readers}, indent=2) + "\n"
    )
    if args.readers_only:
        return 0

    with tempfile.TemporaryDirectory(prefix="eaglewatch-bench-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        prompts = work / "prompts.jsonl"
        t = time.perf_counter()
        generate(prompts, args.lines)
        size_mb = prompts.stat().st_size / 1e6
        print(f"generated {args.lines:,} lines ({size_mb:.0f} MB) in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        results = {}
        for kind in ("baseline", "eaglewatch", "re-ingest"):
            # the re-ingest reads the same file again into the database the first ingest just wrote
            db = work / f"{'eaglewatch' if kind == 're-ingest' else kind}.db"
            if kind != "re-ingest":
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{db}{suffix}").unlink(missing_ok=True)
            results[kind] = run_child(kind, prompts, db)
            r = results[kind]
            r["rows_per_s"] = r["rows"] / r["seconds"]
            r["rows_per_cpu_s"] = r["rows"] / max(r["cpu_seconds"], 1e-9)

    ours, base = results["eaglewatch"], results["baseline"]
    ratio = ours["rows_per_s"] / base["rows_per_s"]
    print()
    cpu_ratio = ours["rows_per_cpu_s"] / base["rows_per_cpu_s"]
    print(f"{'':12} {'rows':>10} {'seconds':>8} {'rows/s':>10} {'rows/cpu-s':>11} {'peak RSS':>9}")
    for kind in ("baseline", "eaglewatch", "re-ingest"):
        r = results[kind]
        print(
            f"{kind:12} {r['rows']:>10,} {r['seconds']:>8.1f} {r['rows_per_s']:>10,.0f} "
            f"{r['rows_per_cpu_s']:>11,.0f} {r['peak_rss_mb']:>7.0f} MB"
        )
    print(
        f"ratio eaglewatch / baseline: {ratio:.2f}x wall, {cpu_ratio:.2f}x per CPU second "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: wall times on a busy machine run long)"
    )
    again = results["re-ingest"]
    reingest_ratio = again["seconds"] / ours["seconds"]
    print(
        f"re-ingest of the unchanged file: {again['already_present']:,} already present, {again['added']} added, "
        f"{reingest_ratio:.2f}x the first ingest's time (target <= {TARGET_REINGEST_RATIO}x)"
    )
    ok_speed = ours["rows_per_s"] >= TARGET_ROWS_S
    ok_rss = ours["peak_rss_mb"] < TARGET_RSS_MB
    print(
        f"targets: >= {TARGET_ROWS_S:,} rows/s {'met' if ok_speed else 'MISSED'}; "
        f"peak RSS < {TARGET_RSS_MB} MB {'met' if ok_rss else 'MISSED'}"
    )

    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "lines": args.lines,
        "file_mb": round(size_mb, 1),
        "results": results,
        "ratio": ratio,
        "reingest_ratio": reingest_ratio,
        "cpu_ratio": cpu_ratio,
        "targets": {"rows_per_s": TARGET_ROWS_S, "peak_rss_mb": TARGET_RSS_MB, "met": ok_speed and ok_rss},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
    }
    (out / "ingest.json").write_text(json.dumps(payload, indent=2) + "\n")
    print()
    print(
        f"| ingest {args.lines:,}-line prompt file | {ours['rows_per_s']:,.0f} rows/s "
        f"(bare sqlite3 executemany {base['rows_per_s']:,.0f}; {ratio:.2f}x); {ours['rows_per_cpu_s']:,.0f} rows "
        f"per CPU-s "
        f"| peak RSS {ours['peak_rss_mb']:.0f} MB |"
    )
    print(
        f"| re-ingest the unchanged {args.lines:,}-line file | {again['rows_per_s']:,.0f} rows/s, "
        f"{reingest_ratio:.2f}x the first ingest (target <= {TARGET_REINGEST_RATIO}x) | peak RSS "
        f"{again['peak_rss_mb']:.0f} MB |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
