"""How fast does `eaglewatch export` write training data? Rows/s per format against bare loops.

Builds a finished run of N samples (the 300 sample-data samples repeated with fresh ids) in a temp SQLite
file, then measures, in the same run:
  - bare read+write: one SELECT over the same join, unpack ids, one json.dumps line per row (no prompt);
  - bare render: the same plus the chat template rendered with jinja2 and encoded (the irreducible work
    of an eagle3 shard line) — the baseline the export is compared with;
  - export_run for eagle3-shards, sglang-raw and specforge.
Ratios are rows/s divided by the bare-render baseline. Results go to bench/results/export.json.

    python bench/export.py [--rows 3000]
"""

from __future__ import annotations

import argparse
import json
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.libnoise import silence_library_noise  # noqa: E402

silence_library_noise()


def build_db(db: Path, rows: int, tokenizer_dir: Path) -> None:
    """A finished run of `rows` exact samples cycling through sample_data/reference.jsonl."""
    from app.store.db import configure, migrate
    from app.store.ids import pack_ids
    from app.tokens import load_tokenizer

    fingerprint = load_tokenizer(tokenizer_dir).fingerprint
    reference = [json.loads(line) for line in (ROOT / "sample_data" / "reference.jsonl").read_text().splitlines()]
    reference = [r for r in reference if r["meta_info"]["finish_reason"]["type"] == "stop"]
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)
    configure(conn)
    now = time.time()
    config = {"model": {"tokenizer": str(tokenizer_dir), "profile": "kimi-k2.5"}, "endpoints": []}
    conn.execute("BEGIN")
    run_id = conn.execute("INSERT INTO runs (name, config, state, created_at, updated_at) VALUES ('bench', ?, 'done', ?, ?)",
                          (json.dumps(config), now, now)).lastrowid
    for n in range(rows):
        rec = reference[n % len(reference)]
        ids = pack_ids(rec["output_ids"])
        pk = conn.execute(
            "INSERT INTO samples (run_id, sample_id, dataset, messages, tools, state, updated_at) "
            "VALUES (?, ?, 'bench', ?, ?, 'done', ?)",
            (run_id, f"{rec['id']}-{n}", json.dumps(rec["messages"]), json.dumps(rec.get("tools")) if rec.get("tools") else None, now),
        ).lastrowid
        rid = conn.execute("INSERT INTO responses (run_id, sample_pk, attempt, endpoint, finish_reason, created_at) "
                           "VALUES (?, ?, 1, 'sim', 'stop', ?)", (run_id, pk, now)).lastrowid
        conn.execute(
            "INSERT INTO reconstructions (run_id, sample_pk, response_id, tokenizer, strategy, output_ids, category, "
            "n_tokens, created_at) VALUES (?, ?, ?, ?, 'canonical', ?, 'exact', ?, ?)",
            (run_id, pk, rid, fingerprint, ids, len(rec["output_ids"]), now),
        )
    conn.execute("COMMIT")
    conn.close()


_SQL = """SELECT s.sample_id, s.messages, s.tools, r.output_ids FROM samples s
JOIN reconstructions r ON r.sample_pk = s.pk WHERE s.run_id = 1 AND s.state = 'done' ORDER BY s.pk"""


def bare_read_write(db: Path, out: Path) -> int:
    from app.store.ids import unpack_ids

    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    n = 0
    with out.open("w") as fh:
        for sid, messages, tools, ids in conn.execute(_SQL):
            json.loads(messages)
            fh.write(json.dumps({"id": sid, "output_ids": list(unpack_ids(ids))}, separators=(",", ":")) + "\n")
            n += 1
    conn.close()
    return n


def bare_render(db: Path, out: Path, tokenizer_dir: Path) -> int:
    import jinja2
    from jinja2.ext import loopcontrols

    from app.store.ids import unpack_ids
    from app.tokens import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, separators=None, **_: json.dumps(x, ensure_ascii=False, separators=separators)
    template = env.from_string(cfg["chat_template"])
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    n = 0
    with out.open("w") as fh:
        for sid, messages, tools, ids in conn.execute(_SQL):
            prompt = tok.encode(template.render(messages=json.loads(messages), tools=json.loads(tools) if tools else None,
                                                add_generation_prompt=True))
            output = list(unpack_ids(ids))
            fh.write(json.dumps({"id": sid, "input_ids": prompt + output,
                                 "loss_mask": [0] * len(prompt) + [1] * len(output)}, separators=(",", ":")) + "\n")
            n += 1
    conn.close()
    return n


def timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    n = fn()
    return time.perf_counter() - start, n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    args = parser.parse_args()
    from app.export import export_run

    tokenizer_dir = ROOT / "sample_data" / "tokenizer"
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        db = tmp_path / "bench.db"
        build_db(db, args.rows, tokenizer_dir)
        # warm: imports, template compilation, tokenizer load
        export_run(db, tmp_path / "warm", "eagle3-shards")
        results: dict[str, dict] = {}
        seconds, n = timed(lambda: bare_read_write(db, tmp_path / "bare.jsonl"))
        results["bare read+write"] = {"rows": n, "seconds": seconds}
        seconds, n = timed(lambda: bare_render(db, tmp_path / "bare_render.jsonl", tokenizer_dir))
        results["bare render (baseline)"] = {"rows": n, "seconds": seconds}
        for fmt in ("eagle3-shards", "sglang-raw", "specforge"):
            seconds, _ = timed(lambda: export_run(db, tmp_path / fmt, fmt).exported)
            results[f"export {fmt}"] = {"rows": args.rows, "seconds": seconds}
        seconds, _ = timed(lambda: export_run(db, tmp_path / "par", "eagle3-shards", workers=2).exported)
        results["export eagle3 --workers 2"] = {"rows": args.rows, "seconds": seconds}
    base = results["bare render (baseline)"]["rows"] / results["bare render (baseline)"]["seconds"]
    print(f"export benchmark: {args.rows} rows, sample tokenizer, {platform.python_version()} on {platform.machine()}")
    print(f"{'case':<26} {'rows/s':>10} {'vs baseline':>12}")
    for name, r in results.items():
        r["rows_per_s"] = r["rows"] / r["seconds"]
        r["ratio"] = r["rows_per_s"] / base
        print(f"{name:<26} {r['rows_per_s']:>10.0f} {r['ratio']:>11.2f}x")
    shards = results["export eagle3-shards"]
    print()
    print("| export (eagle3-shards, sample tokenizer) | "
          f"{shards['rows_per_s']:.0f} rows/s | {shards['ratio']:.2f}x a bare render+encode+write loop |")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "export.json").write_text(json.dumps({"rows": args.rows, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
