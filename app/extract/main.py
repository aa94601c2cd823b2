"""`python -m app.extract`: the built-in extractor as one job process (shards in, hidden states out).

stdout carries only the JSON progress lines of docs/contracts.md ("Jobs"); messages go to stderr.
Exit status: 0 every shard done (or already done), 1 a shard failed its checks or run, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from app.errors import EaglewatchError

EXAMPLE = """\
python -m app.extract --manifest export/manifest.json --shard 0 --shard 1 \\
    --model /models/Qwen3-8B --out /scratch/hidden --aux-layers 1,17,32 --batch-tokens 16384 --layout speculators"""


def build_parser() -> argparse.ArgumentParser:
    """The extractor's argument parser (kept importable without torch)."""
    parser = argparse.ArgumentParser(
        prog="python -m app.extract",
        description=(
            "Run the target model over eagle3-shards and save EAGLE-3 hidden states (the last hidden state, "
            "before or after the final norm as the --layout's consumer wants it, plus the auxiliary layers), one "
            "JSON progress line per batch on "
            "stdout. Shards that already have a complete output and a shard_<i>.done marker are skipped."
        ),
        epilog="Example:\n  " + EXAMPLE.replace("\n", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--manifest", required=True, type=Path, help="eagle3-shards manifest.json (or its folder)")
    parser.add_argument(
        "--shard",
        required=True,
        type=int,
        action="append",
        metavar="I",
        help="shard index to extract; repeat for several",
    )
    parser.add_argument("--model", required=True, type=Path, help="local folder of the target model (no download)")
    parser.add_argument("--out", required=True, type=Path, help="output folder (shard_<i>.safetensors, shard_<i>.done)")
    parser.add_argument(
        "--aux-layers",
        default=None,
        metavar="LIST",
        help="comma-separated layer ids, e.g. 1,15,28 (default: [1, N//2-1, N-4] in the 'output' convention)",
    )
    parser.add_argument(
        "--layer-convention",
        choices=("output", "input"),
        default="output",
        help="'output': id i = output of layer i = hidden_states[i+1] (SpecForge); 'input': id i = "
        "input to layer i = hidden_states[i] (SGLang/vLLM). Both are recorded. Default: output",
    )
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=8192,
        metavar="N",
        help="padded tokens per forward pass (rows x longest sample); default 8192",
    )
    parser.add_argument(
        "--dtype",
        choices=("bf16", "fp16", "fp32"),
        default=None,
        help="compute and storage dtype (default: bf16 on GPUs, fp32 on the CPU)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="cuda loads with device_map='auto' over the visible GPUs; default auto",
    )
    parser.add_argument(
        "--layout",
        choices=("packed", "specforge", "speculators", "modelopt"),
        default="packed",
        help="files as their consumer reads them: packed (shard_<i>.safetensors, last state after the "
        "norm), specforge (rows_*/data_<k>.ckpt), speculators (hidden_states/hs_<k>.safetensors, "
        "[T, n+1, H], last state BEFORE the norm), modelopt (<conversation_id>.pt); default packed",
    )
    parser.add_argument(
        "--speculators-prepared",
        type=Path,
        default=None,
        metavar="DIR",
        help="speculators layout: the dataset `speculators prepare-data` wrote, whose row k reads "
        "hs_<k> (default: <manifest folder>/prepared)",
    )
    parser.add_argument(
        "--per-sample",
        action="store_true",
        help="packed layout: one safetensors file per sample in shard_<i>/ instead of one per shard",
    )
    parser.add_argument(
        "--backend",
        choices=("builtin", "vllm"),
        default="builtin",
        help="builtin: transformers with hooks; vllm: vLLM's hidden-states connector (run this module with "
        "vLLM's Python; same layouts, checks and done markers). Default builtin",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the model folder's own Python code (only for models that need it)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the extraction, print errors as sentences on stderr; return the exit status."""
    args = build_parser().parse_args(argv)
    if args.batch_tokens < 1:
        print("error: --batch-tokens must be at least 1", file=sys.stderr)
        return 2
    try:
        from app.extract.layers import parse_layer_list
        from app.extract.runner import ExtractOptions, run_extraction

        options = ExtractOptions(
            model_path=args.model,
            out_dir=args.out,
            aux_layers=parse_layer_list(args.aux_layers) if args.aux_layers else None,
            convention=args.layer_convention,
            batch_tokens=args.batch_tokens,
            dtype=args.dtype,
            device=args.device,
            per_sample=args.per_sample,
            layout=args.layout,
            speculators_prepared=args.speculators_prepared,
            trust_remote_code=args.trust_remote_code,
            backend=args.backend,
        )
        run_extraction(args.manifest, args.shard, options)
    except ModuleNotFoundError as exc:
        print(f"error: the extractor needs {exc.name!r}: pip install 'eaglewatch[extract]'", file=sys.stderr)
        return 2
    except EaglewatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
