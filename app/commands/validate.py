"""`eaglewatch validate`: check reconstruction against ground-truth output_ids from a reference file.

For each reference line: decode its `output_ids`, split them as a provider returns them (reasoning,
content, structured tool calls, end-of-turn removed; `--quirks` adds server-side text steps), reconstruct
the ids from that text as production would (the reference only judges; `--calibrate N` first learns the
endpoint's fidelity profile from N probe samples with their true ids), and compare. `--assisted` shows
the reference-assisted upper bound beside it. Prints counts and rates per verdict with the worst
examples; exits 4 when text or structure mismatches (production regime) exceed the given rates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.errors import EaglewatchError, InputError

EXAMPLE = """\
eaglewatch validate --reference sample_data/reference.jsonl --tokenizer sample_data/tokenizer --profile kimi-k2.5
eaglewatch validate --reference gt.jsonl --tokenizer ../shared/tokenizers/kimi-k2.5 --json | jq .verdicts
eaglewatch validate --reference gt.jsonl --tokenizer DIR --max-text-mismatch-rate 0.001 --max-structure-mismatch-rate 0
eaglewatch validate --reference sample_data/reference.jsonl --tokenizer sample_data/tokenizer --db v.db   # browse:
eaglewatch watch v.db
eaglewatch validate --reference sample_data/reference.jsonl --tokenizer sample_data/tokenizer --quirks
think_spaces,no_content --calibrate 40 --assisted"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reference", required=True, metavar="FILE", help="SGLang-style JSONL with id and output_ids")
    parser.add_argument(
        "--tokenizer", required=True, metavar="DIR", help="folder with tokenizer.json or tiktoken.model"
    )
    parser.add_argument("--profile", default="kimi-k2.5", metavar="P", help="template profile (default kimi-k2.5)")
    parser.add_argument("--json", action="store_true", help='print {"total": N, "verdicts": {...}, ...} as JSON')
    parser.add_argument("--db", metavar="PATH", help="also store every result in this run database (for the TUI)")
    parser.add_argument("--run", metavar="NAME", help="run name in --db (default: validate-<reference file stem>)")
    parser.add_argument("--max-text-mismatch-rate", type=float, metavar="R", help="exit 4 when text_mismatch rate > R")
    parser.add_argument(
        "--max-structure-mismatch-rate", type=float, metavar="R", help="exit 4 when structure_mismatch rate > R"
    )
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="reconstruction threads (default 1)")
    parser.add_argument("--examples", type=int, default=8, metavar="N", help="worst examples to show (default 8)")
    parser.add_argument(
        "--quirks",
        default="",
        metavar="LIST",
        help="server-side text steps to imitate, comma-separated (the simulator's quirk names)",
    )
    parser.add_argument(
        "--calibrate",
        type=int,
        default=0,
        metavar="N",
        help="learn a fidelity profile from N probe samples (spread over the file) and use it",
    )
    parser.add_argument(
        "--assisted",
        action="store_true",
        help="also show the reference-assisted upper bound (repairs that read the reference)",
    )


def run(args: argparse.Namespace) -> int:
    from app.datasets import ReadStats, iter_references, out_of_vocab
    from app.tokens import Reconstructor, get_profile, load_tokenizer
    from app.tokens.validation import summarize, validate_all

    path = Path(args.reference)
    if not path.exists():
        raise InputError(f"{path}: no such reference file; pass the JSONL with output_ids via --reference")
    for flag in ("max_text_mismatch_rate", "max_structure_mismatch_rate"):
        value = getattr(args, flag)
        if value is not None and not 0 <= value <= 1:
            raise InputError(f"--{flag.replace('_', '-')} {value}: a rate must be between 0 and 1")
    if args.calibrate < 0:
        raise InputError(f"--calibrate {args.calibrate}: the number of probe samples cannot be negative")
    profile = get_profile(args.profile)
    tokenizer = load_tokenizer(args.tokenizer, profile.pretokenizer_pattern)
    reconstructor = Reconstructor(profile, tokenizer)
    serve = _server(args.quirks, reconstructor)
    stats = ReadStats()
    references = list(iter_references(path, stats=stats))
    for rec in references:
        problem = out_of_vocab(rec.output_ids, tokenizer.vocab_size)
        if problem is not None:
            raise InputError(f"{path}:{rec.line}: sample {rec.sample_id}: {problem}")
    pairs = [(r.sample_id, r.output_ids) for r in references]
    fidelity = None
    if args.calibrate:
        from app.tokens.fidelity_profile import learn

        step = max(1, len(pairs) // args.calibrate)
        probes = pairs[::step][: args.calibrate]
        fidelity = learn([(serve(ids), ids) for _, ids in probes], profile, tokenizer, endpoint=f"validate:{path.name}")
        reconstructor = Reconstructor(profile, tokenizer, fidelity)
    workers = max(1, args.workers)
    results = validate_all(reconstructor, pairs, workers=workers, serve=serve)
    summary = summarize(results, n_worst=args.examples)
    assisted = (
        summarize(
            validate_all(reconstructor, pairs, workers=workers, serve=serve, assisted=True), n_worst=args.examples
        )
        if args.assisted
        else None
    )

    if args.db:
        _store(args, path, references, results, profile.name, tokenizer.fingerprint)

    if args.json:
        payload = summary.as_json()
        payload["bad_lines"] = stats.bad
        payload["regime"] = "production"
        if fidelity is not None:
            payload["fidelity"] = _steps_json(fidelity)
        if assisted is not None:
            payload["assisted"] = assisted.as_json()
        json.dump(payload, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        _print_table(summary, path, tokenizer, profile.name, stats, assisted, fidelity)

    failed = []
    if args.max_text_mismatch_rate is not None and summary.rate("text_mismatch") > args.max_text_mismatch_rate:
        failed.append(f"text_mismatch rate {summary.rate('text_mismatch'):.4f} > {args.max_text_mismatch_rate}")
    if (
        args.max_structure_mismatch_rate is not None
        and summary.rate("structure_mismatch") > args.max_structure_mismatch_rate
    ):
        failed.append(
            f"structure_mismatch rate {summary.rate('structure_mismatch'):.4f} > {args.max_structure_mismatch_rate}"
        )
    if failed:
        raise EaglewatchError("validation failed: " + "; ".join(failed), exit_code=4)
    return 0


def _server(quirks: str, reconstructor):
    """What the server returns for reference ids: the ideal split, or the simulator's quirky renderer."""
    from app.tokens.validation import ideal_view

    if not quirks.strip():
        return ideal_view(reconstructor)
    from app.records import Completion, ToolCall
    from app.simulator.options import QUIRKS, parse_quirks
    from app.simulator.render import OutputRenderer

    names = frozenset(parse_quirks(quirks))
    unknown = sorted(names - set(QUIRKS))
    if unknown:
        raise InputError(f"--quirks: unknown server step(s) {', '.join(unknown)}; known: {', '.join(QUIRKS)}")
    renderer = OutputRenderer(reconstructor.tokenizer, reconstructor.profile)

    def serve(ids):
        o = renderer.render(tuple(ids), names, 0)
        calls = tuple(ToolCall(c.id, c.name, c.arguments, i) for i, c in enumerate(o.tool_calls))
        return Completion(
            content=o.content or "",
            reasoning=o.reasoning,
            tool_calls=calls,
            finish_reason=o.finish_reason,
            provider="reference",
        )

    return serve


def _steps_json(fidelity) -> dict:
    return {
        "probes": fidelity.probes,
        "steps": [
            {
                "name": s.name,
                "where": s.where,
                "inverse": s.inverse,
                "invertible": s.invertible,
                "seen": s.seen,
                "of": s.of,
            }
            for s in fidelity.steps()
        ],
    }


def _print_table(summary, path: Path, tokenizer, profile: str, stats, assisted=None, fidelity=None) -> None:
    out = sys.stdout
    out.write(f"{path}: {summary.total} samples, tokenizer {tokenizer.path} ({tokenizer.kind}), profile {profile}\n")
    if stats.bad:
        out.write(f"  skipped {stats.bad} bad line(s), e.g. {stats.examples[0]}\n")
    if fidelity is not None:
        out.write(f"  fidelity profile learned from {fidelity.probes} probe samples:\n")
        for s in fidelity.steps() or ():
            state = "invertible" if s.invertible else "NOT invertible (samples flagged)"
            out.write(f"    {s.name:<26} {s.where:<22} {s.inverse} [{state}, {s.seen}/{s.of}]\n")
        if not fidelity.steps():
            out.write("    no server-side text steps seen\n")
    head = f"  {'verdict':<20} {'production':>10} {'rate':>8}"
    out.write(head + (f" {'assisted':>10} {'rate':>8}\n" if assisted else "\n"))
    for cat, n in summary.verdicts.items():
        line = f"  {cat:<20} {n:>10} {summary.rate(cat):>8.2%}"
        if assisted:
            line += f" {assisted.verdicts[cat]:>10} {assisted.rate(cat):>8.2%}"
        out.write(line + "\n")
    out.write(f"  {'suspect (flagged)':<20} {summary.suspects:>10} {summary.suspects / max(1, summary.total):>8.2%}\n")
    out.write(f"  {'corrupt, not flagged':<20} {summary.wrong_kept:>10}   (wrong ids a default export would keep)\n")
    if assisted:
        out.write(
            "  (production: the reference only judges; assisted: repairs may read the reference, an upper bound)\n"
        )
    if summary.repairs:
        out.write("  repairs used: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.repairs.items())) + "\n")
    if summary.flags:
        out.write("  suspect flags: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.flags.items())) + "\n")
    if summary.notes:
        out.write("  unrecoverable: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.notes.items())) + "\n")
    if summary.worst:
        out.write("worst examples:\n")
        for r in summary.worst:
            out.write(f"  {r.sample_id}  {r.verdict.category}: {r.verdict.explanation}\n")


def _store(args, path: Path, references, results, profile: str, fingerprint: str) -> None:
    import asyncio

    from app.store.ingest_ops import sample_pks
    from app.store.run_store import RunStore
    from app.store.store_records import ResultRecord, SampleInput

    name = args.run or f"validate-{path.stem}"
    tok_dir = str(Path(args.tokenizer).resolve())
    config = {
        "validate": {"reference": str(path.resolve()), "tokenizer": tok_dir, "profile": profile},
        "model": {"tokenizer": tok_dir, "profile": profile},
    }

    async def go() -> None:
        store = await RunStore.open(args.db)
        try:
            run_id = await store.ensure_run(name, config)
            await store.ingest(
                run_id,
                (SampleInput(r.sample_id, "reference", r.messages or [], None, r.output_ids) for r in references),
            )
            pks = await store.read(lambda conn: sample_pks(conn, run_id))
            await asyncio.gather(
                *(
                    store.record_result(
                        ResultRecord(
                            run_id,
                            pks[r.sample_id],
                            1,
                            "validate",
                            r.completion,
                            0.0,
                            r.reconstruction,
                            r.verdict,
                            r.reference_ids,
                            profile=profile,
                            tokenizer=fingerprint,
                        )
                    )
                    for r in results
                    if r.sample_id in pks
                )
            )
            await store.set_run_state(run_id, "done")
        finally:
            await store.close()

    asyncio.run(go())
    print(f"stored {len(results)} results in {args.db} (run {name})", file=sys.stderr)
