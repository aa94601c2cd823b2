"""How close is the built-in extractor to a bare forward loop? Tokens/s on a small random CPU model.

Builds a random Llama from a config (no download), writes an eagle3-shards export of N samples, loads the
model once, then measures in the same run, alternating, best of --repeats:
  - bare forward (baseline): the decoder's forward over exactly the batches the extractor plans
    (same padding, same attention mask), nothing kept;
  - extractor: `extract_shard` end to end: read the shard, forward with hooks, gather, checks, stream the
    safetensors file to disk, done-marker.
Target: extractor >= 0.9x the baseline. Both wall-clock and process CPU time are measured (best of the
repeats); the verdict uses CPU time, which counts the extractor's writer thread too (a conservative
measure) and is not inflated by other processes on a shared machine, where wall-clock ratios swing by 2x.
Results go to bench/results/extract.json.

    python bench/extract.py [--samples 48] [--hidden 128] [--layers 8] [--batch-tokens 2048] [--threads 1]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.libnoise import silence_library_noise  # noqa: E402

silence_library_noise()


def build_model(path: Path, hidden: int, layers: int, vocab: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)


def write_export(root: Path, samples: int, vocab: int, lo: int, hi: int) -> Path:
    rng = random.Random(0)
    rows = []
    for k in range(samples):
        n = rng.randint(lo, hi)
        ids = [rng.randrange(1, vocab) for _ in range(n)]
        rows.append({"id": f"b{k}", "input_ids": ids, "loss_mask": [0] * (n // 2) + [1] * (n - n // 2)})
    root.mkdir(parents=True)
    (root / "shard_00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokens = sum(len(r["input_ids"]) for r in rows)
    manifest = root / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "format": "eagle3-shards",
                "shards": [{"index": 0, "path": "shard_00000.jsonl", "samples": samples, "tokens": tokens}],
            }
        )
    )
    return manifest


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=384)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: stable numbers on a shared 2-core machine)",
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)

    from app.extract.batching import plan_batches
    from app.extract.layers import resolve_aux_layers
    from app.extract.manifest import read_manifest, read_shard
    from app.extract.progress_lines import ProgressLog
    from app.extract.runner import ExtractOptions, extract_shard, load_target

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        build_model(tmp_path / "model", args.hidden, args.layers, args.vocab)
        manifest_path = write_export(tmp_path / "export", args.samples, args.vocab, args.min_len, args.max_len)
        manifest = read_manifest(manifest_path)
        samples = read_shard(manifest.shard(0))
        tokens = sum(len(s.input_ids) for s in samples)
        aux = resolve_aux_layers(None, "output", args.layers)
        options = ExtractOptions(tmp_path / "model", tmp_path / "hs", batch_tokens=args.batch_tokens, device="cpu")
        target = load_target(options.model_path, aux, "cpu", "fp32")
        plan = plan_batches([len(s.input_ids) for s in samples], args.batch_tokens)
        batches = [[list(samples[k].input_ids) for k in b] for b in plan]

        def extractor() -> None:
            extract_shard(target, manifest, 0, options, ProgressLog(io.StringIO()))

        def fresh_out() -> None:
            shutil.rmtree(options.out_dir, ignore_errors=True)
            options.out_dir.mkdir()

        target.bare_forward(batches[:1])  # warm up kernels and allocator
        runs: dict[str, list[tuple[float, float]]] = {"baseline": [], "extractor": []}
        for _ in range(args.repeats):  # alternate, so drifting load hits both alike
            runs["baseline"].append(timed(lambda: target.bare_forward(batches)))
            fresh_out()
            runs["extractor"].append(timed(extractor))
        out_bytes = (options.out_dir / "shard_0.safetensors").stat().st_size
    best = {name: (min(w for w, _ in r), min(c for _, c in r)) for name, r in runs.items()}
    tps = {name: (tokens / w, tokens / c) for name, (w, c) in best.items()}
    wall_ratio = tps["extractor"][0] / tps["baseline"][0]
    ratio = tps["extractor"][1] / tps["baseline"][1]
    torch_threads = torch.get_num_threads()
    print(
        f"extract benchmark: {args.samples} samples, {tokens} tokens, {len(batches)} batches, random Llama "
        f"{args.layers}x{args.hidden} fp32 on CPU ({torch_threads} torch thread(s)), best of {args.repeats}"
    )
    print(f"{'case':<28} {'tok/s wall':>11} {'tok/s cpu':>10} {'vs base wall':>13} {'vs base cpu':>12}")
    for name, label in (("baseline", "bare forward (baseline)"), ("extractor", "extractor (to safetensors)")):
        w, c = tps[name]
        print(f"{label:<28} {w:>11.0f} {c:>10.0f} {w / tps['baseline'][0]:>12.2f}x {c / tps['baseline'][1]:>11.2f}x")
    print(f"output: {out_bytes / 1e6:.1f} MB for {tokens} tokens ({out_bytes / tokens / 1e3:.2f} KB/token)")
    print()
    print(
        f"| extractor (random Llama {args.layers}x{args.hidden}, CPU fp32, 1 thread) | "
        f"{tps['extractor'][1]:.0f} tokens/s (CPU time) | {ratio:.2f}x a bare forward loop over the same batches "
        f"(wall clock {wall_ratio:.2f}x; target >= 0.9x) |"
    )
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "extract.json").write_text(
        json.dumps(
            {
                "samples": args.samples,
                "tokens": tokens,
                "batches": len(batches),
                "hidden": args.hidden,
                "layers": args.layers,
                "batch_tokens": args.batch_tokens,
                "torch_threads": torch_threads,
                "runs_wall_cpu_seconds": runs,
                "tokens_per_s_wall_cpu": tps,
                "ratio_cpu": ratio,
                "ratio_wall": wall_ratio,
                "output_bytes": out_bytes,
            },
            indent=1,
        )
        + "\n"
    )
    return 0 if ratio >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
