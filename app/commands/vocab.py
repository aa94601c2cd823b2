"""`eaglewatch vocab`: the reduced draft vocabulary of an EAGLE-3 drafter from a run's loss tokens, in every
trainer's file layout (app.export.draft_vocab), with the share of the loss each size covers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.errors import InputError

EXAMPLE = """\
eaglewatch vocab out/specforge --size 32000
eaglewatch vocab --db /tmp/eaglewatch-demo.db               # writes /tmp/eaglewatch-demo-vocab/
eaglewatch vocab --db /tmp/eaglewatch-demo.db --size 4096 --out /tmp/demo-vocab
eaglewatch vocab out/speculators --size 32000 --model /models/target --json
eaglewatch vocab out/specforge --size 32000 --trainer specforge    # fails without torch (the .pt it reads)"""


DEFAULT_SIZE = 32000  # the draft vocabulary EAGLE-3 drafters of large models use


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "export",
        nargs="?",
        type=Path,
        metavar="EXPORT",
        help="an export folder (eagle3-shards, speculators or specforge): its training rows' loss "
        "tokens (OUT/data; the eval split is left out)",
    )
    parser.add_argument(
        "--db",
        type=Path,
        default=None,
        metavar="PATH",
        help="count from the run database instead: the output ids of every sample the default export keeps",
    )
    parser.add_argument("--run", default=None, help="run name (with --db, when the database holds several runs)")
    parser.add_argument(
        "--eval-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="with --db: leave out the rows an export with this --eval-fraction holds out",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=None,
        metavar="N",
        help=f"draft vocabulary size (default {DEFAULT_SIZE}, or the whole target vocabulary when it is smaller)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where to write the files (default EXPORT/vocab, or DB-vocab beside the database)",
    )
    parser.add_argument(
        "--target-vocab-size",
        type=int,
        default=None,
        metavar="V",
        help="the target model's vocabulary size, the length of t2d (default: --model's config, "
        "else the tokenizer's size)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        metavar="DIR",
        help="the target model folder: its config.json vocab_size sets the target vocabulary",
    )
    parser.add_argument(
        "--trainer",
        action="append",
        choices=("speculators", "specforge", "modelopt"),
        default=None,
        help="the trainer the files are for (repeat for several; default every one): without torch "
        "the .pt files are skipped, and asking for specforge or modelopt, which read them, fails",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def run(args: argparse.Namespace) -> int:
    from app.export.draft_vocab import (
        COMMON_SIZES,
        LossTokenCounts,
        choose,
        coverage_table,
        rows_of_export,
        rows_of_run,
        write_summary,
        write_vocab_files,
    )

    if (args.export is None) == (args.db is None):
        raise InputError("name either an export folder (EXPORT) or a run database (--db PATH), not both")
    if not 0.0 <= args.eval_fraction < 1.0:
        raise InputError(f"--eval-fraction: must be at least 0 and below 1, got {args.eval_fraction}")
    counts = LossTokenCounts()
    if args.export is not None:
        source = f"export {args.export}"
        rows = rows_of_export(args.export)
        out = args.out or args.export / "vocab"
    else:
        source = f"run database {args.db}" + (f" (run {args.run})" if args.run else "")
        rows = rows_of_run(args.db, args.run, args.eval_fraction)
        out = args.out or args.db.parent / f"{args.db.stem}{'-' + args.run if args.run else ''}-vocab"
    for ids, mask in rows:
        counts.add(ids, mask)
    if not counts.rows:
        raise InputError(f"{source}: no rows to count; export some samples first")
    target = _target_vocab_size(args)
    size = args.size if args.size is not None else min(DEFAULT_SIZE, target)
    if args.size is None and size < DEFAULT_SIZE and not args.json:
        print(
            f"the target vocabulary has {target} tokens, fewer than the default {DEFAULT_SIZE}: the draft "
            "vocabulary is all of it (pass --size N to reduce it)"
        )
    vocab = choose(counts.counts, size, target)
    table = coverage_table(counts.counts, sorted({*COMMON_SIZES, size}))
    files = write_vocab_files(vocab, counts.as_dict(), out, tuple(dict.fromkeys(args.trainer or ())))
    summary = write_summary(vocab, table, counts, source, out, files.written)
    if args.json:
        print(json.dumps({**summary, "out": str(out), "skipped": files.skipped}, indent=1))
        return 0
    print(
        f"draft vocabulary: {vocab.size} of {vocab.target_vocab_size} target tokens covers {vocab.coverage:.2%} of "
        f"the {vocab.loss_tokens} loss tokens in {counts.rows} rows ({summary['distinct_tokens']} distinct ids "
        f"seen) from {source}"
    )
    print(f"{'size':>8}  {'covers':>8}  {'loss tokens':>12}")
    for size, covered, share in table:
        print(f"{size:>8}  {share:>8.2%}  {covered:>12}{'  <- chosen' if size == vocab.size else ''}")
    print(f"wrote {out}/: " + ", ".join(summary["files"]))
    if files.skipped:
        print(files.skipped_sentence())
    return 0


def _target_vocab_size(args: argparse.Namespace) -> int:
    """--target-vocab-size, else --model's config.json vocab_size (text_config first), else the tokenizer's."""
    if args.target_vocab_size is not None:
        if args.target_vocab_size <= 0:
            raise InputError(f"--target-vocab-size: must be positive, got {args.target_vocab_size}")
        return args.target_vocab_size
    if args.model is not None:
        path = args.model / "config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"{path}: not found; --model is the target model's folder (with config.json)") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        for section in (config.get("text_config") or {}, config):
            if isinstance(section.get("vocab_size"), int):
                return section["vocab_size"]
        raise InputError(f"{path}: has no vocab_size; pass --target-vocab-size V")
    return _tokenizer_vocab_size(args)


def _tokenizer_vocab_size(args: argparse.Namespace) -> int:
    from app.tokens import load_tokenizer

    if args.export is not None:
        manifest = json.loads((args.export / "manifest.json").read_text(encoding="utf-8"))
        tok_dir = (manifest.get("tokenizer") or {}).get("path")
    else:
        from app.store.queries import connect_readonly, resolve_run

        conn = connect_readonly(args.db)
        try:
            config = resolve_run(conn, args.run, db_label=str(args.db)).config or {}
        finally:
            conn.close()
        tok_dir = (config.get("model") or {}).get("tokenizer")
    if not tok_dir or not Path(tok_dir).is_dir():
        raise InputError(
            "the target vocabulary size is unknown (no tokenizer folder recorded); pass --model DIR "
            "(the target model) or --target-vocab-size V"
        )
    return load_tokenizer(Path(tok_dir)).vocab_size
