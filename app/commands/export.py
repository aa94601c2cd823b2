"""`eaglewatch export`: write a run's done samples as training data, one format per consumer (see FORMATS)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from app.errors import InputError

EXAMPLE = """\
eaglewatch export --db /tmp/eaglewatch-demo.db --run demo --format eagle3-shards --out /tmp/demo-shards
eaglewatch export --db runs.db --format specforge --out out/specforge --eval-fraction 0.02
eaglewatch export --db runs.db --format speculators --out out/speculators --max-length 16384
eaglewatch export --db runs.db --format eagle3-shards --out out/merged --conversations merged
eaglewatch export --db runs.db --format specforge --out out/sf --eval-prompts mt_bench.jsonl humaneval.jsonl"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", type=Path, required=True, help="run database (SQLite) to read")
    parser.add_argument("--run", default=None, help="run name (needed when the database holds several runs)")
    parser.add_argument(
        "--format",
        required=True,
        choices=("sglang-raw", "specforge", "specforge-text", "speculators", "modelopt", "eagle3-shards"),
        help="sglang-raw: id, messages, output_ids, meta_info; specforge: pre-tokenized input_ids + loss_mask rows "
        "in one file for SpecForge's data.prompts_path; specforge-text: SpecForge pre-formatted {id, text} rows "
        "(its mask differs for K2.5: warned); speculators: input_ids + loss_mask rows for `speculators "
        "prepare-data`; modelopt: {conversation_id, messages} with chat_template.jinja (generation tags) for "
        "Model-Optimizer's answer_only_loss; eagle3-shards: input_ids + loss_mask shards for hidden-state "
        "extraction. Data goes to OUT/data/, manifest.json beside it with each trainer's settings and commands",
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory (created if missing)")
    bpe = parser.add_mutually_exclusive_group()
    bpe.add_argument(
        "--keep-bpe-equivalent",
        dest="keep_bpe",
        action="store_true",
        default=True,
        help="keep samples whose ids differ from the reference only by BPE split (default)",
    )
    bpe.add_argument(
        "--drop-bpe-equivalent",
        dest="keep_bpe",
        action="store_false",
        help="drop samples whose ids differ from the reference only by BPE split",
    )
    parser.add_argument(
        "--keep-mismatches",
        action="store_true",
        help="also export text_mismatch / structure_mismatch samples (dropped by default)",
    )
    parser.add_argument(
        "--keep-truncated", action="store_true", help="also export samples cut at max_tokens (dropped by default)"
    )
    parser.add_argument(
        "--keep-roundtrip-failed",
        action="store_true",
        help="also export samples whose reconstructed ids failed the round-trip check (dropped by default)",
    )
    parser.add_argument(
        "--keep-suspect",
        action="store_true",
        help="also export samples flagged suspect by the reconstruction (dropped by default)",
    )
    parser.add_argument(
        "--keep-intervened",
        action="store_true",
        help="also export samples a server intervened on: a compressed or cut prompt, a fallback to another "
        "provider, a healed answer, a thinking-budget or repetition stop (dropped by default)",
    )
    parser.add_argument(
        "--accept-unverified",
        action="store_true",
        help="also export ids reconstructed from text by endpoints nothing verified (no probe, server "
        "unknown); refused by default and counted in manifest.json when accepted",
    )
    parser.add_argument(
        "--require-prompt-agreement",
        action="store_true",
        help="export only samples whose server prompt ids (vLLM/SGLang) agreed with the rendered "
        "prompt; the rest are skipped as prompt_unverified",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        metavar="N",
        help="skip samples whose prompt + completion exceed N tokens (never cut)",
    )
    parser.add_argument(
        "--conversations",
        choices=("per-turn", "merged"),
        default="per-turn",
        help='whole conversations (regenerate = "all"): per-turn writes one row per done turn, its '
        "request's prompt (the model's own earlier answers) + that answer in the loss (default); "
        "merged writes one row per conversation with every answer in the loss where each turn's "
        "prompt ids are proven to start with the previous turn's prompt + answer ids, else keeps "
        "that conversation's per-turn rows, counted by why in the report and manifest.json "
        "(templates that drop earlier reasoning, such as Kimi K2.5's and Qwen3's, break it); a "
        "conversation that ended early merges its done prefix. Either way the eval split keeps a "
        "conversation's rows together",
    )
    parser.add_argument(
        "--drop-off-policy",
        action="store_true",
        help="leave out conversation turns whose history holds recorded tool results replayed after "
        'a divergent call (on_tool_divergence = "replay"); exported and counted by default',
    )
    parser.add_argument(
        "--shard-size",
        type=int,
        default=1000,
        metavar="N",
        help="rows per shard file of eagle3-shards / speculators (default 1000)",
    )
    parser.add_argument(
        "--eval-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="hold this share of the rows out under OUT/eval (an export folder of its own), chosen "
        "by a stable hash of the sample id: a re-export holds out the same ids (default 0)",
    )
    parser.add_argument(
        "--eval-prompts",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help="eval prompt files (JSONL in any dataset format): training rows whose prompt equals one "
        "after whitespace normalisation are left out and counted, near-duplicates (word 8-gram "
        "containment >= 0.5) reported (default: the run config's [export] eval_prompts)",
    )
    overlap = parser.add_mutually_exclusive_group()
    overlap.add_argument(
        "--keep-eval-overlap",
        dest="keep_eval_overlap",
        action="store_true",
        default=None,
        help="count training rows equal to an eval prompt but keep them (default: the run "
        "config's [export] keep_eval_overlap, else left out)",
    )
    overlap.add_argument(
        "--drop-eval-overlap",
        dest="keep_eval_overlap",
        action="store_false",
        help="leave training rows equal to an eval prompt out (the default)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        metavar="DIR",
        help="tokenizer directory (default: the one in the run's config)",
    )
    parser.add_argument("--profile", default=None, help="template profile (default: the run's, else kimi-k2.5)")
    parser.add_argument(
        "--chat-template",
        type=Path,
        default=None,
        metavar="FILE",
        help="Jinja chat template to render prompts with (default: the tokenizer directory's)",
    )
    parser.add_argument(
        "--template-kwargs",
        default=None,
        metavar="JSON",
        help="chat_template_kwargs, e.g. '{\"thinking\": false}' (default: what the run sent)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="render prompts in N processes (worth it on many cores; default 1)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


class _Progress:
    """Progress on stderr: a line at most twice a second (carriage return on a terminal)."""

    def __init__(self) -> None:
        self.last = 0.0
        self.tty = sys.stderr.isatty()
        self.counts = self.shown = (0, 0)

    def __call__(self, seen: int, exported: int) -> None:
        self.counts = (seen, exported)
        now = time.monotonic()
        if now - self.last < 0.5:
            return
        self.last = now
        self._print("\r" if self.tty else "\n")

    def _print(self, end: str) -> None:
        self.shown = self.counts
        print(f"export: {self.counts[0]} samples read, {self.counts[1]} written", end=end, file=sys.stderr, flush=True)

    def done(self) -> None:
        """End the progress so no line shows older counts than the end's: cleared on a terminal (the report that
        follows has the counts), brought up to the final counts in a log."""
        if not self.last:
            return
        if self.tty:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)
        elif self.shown != self.counts:
            self._print("\n")


def run(args: argparse.Namespace) -> int:
    from app.export import Export, ExportOptions, ExportPolicy, summary_line
    from app.export.eval_overlap import overlap_line

    kwargs = None
    if args.template_kwargs is not None:
        try:
            kwargs = json.loads(args.template_kwargs)
        except json.JSONDecodeError as exc:
            raise InputError(f"--template-kwargs: not valid JSON ({exc.msg}); e.g. '{{\"thinking\": false}}'") from None
        if not isinstance(kwargs, dict):
            raise InputError("--template-kwargs: expected a JSON object, e.g. '{\"thinking\": false}'")
    policy = ExportPolicy(
        keep_bpe_equivalent=args.keep_bpe,
        keep_mismatches=args.keep_mismatches,
        keep_truncated=args.keep_truncated,
        keep_roundtrip_failed=args.keep_roundtrip_failed,
        keep_suspect=args.keep_suspect,
        keep_intervened=args.keep_intervened,
        require_prompt_agreement=args.require_prompt_agreement,
        max_length=args.max_length,
        accept_unverified=args.accept_unverified,
        keep_off_policy=not args.drop_off_policy,
    )
    progress = _Progress()
    options = ExportOptions(
        run=args.run,
        policy=policy,
        shard_size=args.shard_size,
        tokenizer_dir=args.tokenizer,
        profile_name=args.profile,
        chat_template=args.chat_template,
        template_kwargs=kwargs,
        overwrite=args.overwrite,
        workers=args.workers,
        eval_fraction=args.eval_fraction,
        conversations=args.conversations,
        eval_prompts=tuple(args.eval_prompts) if args.eval_prompts is not None else None,
        keep_eval_overlap=args.keep_eval_overlap,
    )
    report = Export(args.db, args.out, args.format, options, progress).run()
    progress.done()
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        print(summary_line(report))
        if report.eval_overlap is not None:
            print(overlap_line(report.eval_overlap))
        commands = report.train.get("commands") or []
        if commands:
            print(
                f"train with it (every length set to the longest row, {report.train['max_length']} tokens; "
                "manifest.json `train`, docs/jobs.md):"
            )
            for command in commands:
                print(f"  {command}")
    return 0
