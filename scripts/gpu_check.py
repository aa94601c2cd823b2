"""One-shot GPU check of the built-in extractor (for a rented GPU machine; < 3 minutes; no downloads).

Builds a random Llama of real layer width from a config, in bf16 on the GPU, saves it, writes three
eagle3 shards, then:
  1. loads it the way jobs do (`load_target`: bf16, device_map="auto", local files only);
  2. times a bare decoder forward over the extractor's own batches against `extract_shard` end to end
     (states to safetensors) on shards 0 and 1: tokens/s and their ratio;
  3. checks saved states of several samples against a direct single-sample forward pass
     (`output_hidden_states=True`: hidden_states[-1] and hidden_states[i+1] of the aux layers) within bf16
     tolerance;
  4. runs `python -m app.extract` as a subprocess on shard 2 (progress lines, done-marker), checks its
     states, then runs it again to see the shard skipped;
  5. the norm trap on the GPU: `--layout speculators` on shard 2 (last state before the final norm), and the
     model's own norm + LM head over that last slot must give the model's next-token argmax (bf16: >= 99%).
Prints a table and a JSON summary; writes `$OUT/gpu_check.json` when OUT is set. Exit 0 when every
correctness check passed.

    python scripts/gpu_check.py                      # on the GPU machine (preset medium)
    python scripts/gpu_check.py --preset tiny --device cpu   # smoke run anywhere
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.libnoise import silence_library_noise  # noqa: E402

silence_library_noise()

# name -> (hidden, layers, intermediate, heads, kv heads, vocab, samples per big shard, min len, max len)
PRESETS = {
    "medium": (4096, 16, 14336, 32, 8, 32000, 48, 64, 2048),  # Llama-3-8B layer width, half its depth
    "small": (2048, 16, 8192, 32, 8, 32000, 48, 64, 2048),  # Llama-3.2-1B shape
    "tiny": (64, 8, 128, 4, 2, 512, 6, 4, 48),  # CPU smoke run
}
# bf16 tolerance of a padded batch against a single-sample pass, relative to the tensor's scale
MAX_REL_ERR = 0.05  # max |diff| / max |ref|
MEAN_REL_ERR = 0.02  # mean |diff| / mean |ref|
SOFT_DEADLINE_S = 150  # skip the optional steps past this


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def dtype_kwarg(torch_dtype) -> dict:
    import transformers

    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    return {"dtype" if version >= (4, 56) else "torch_dtype": torch_dtype}


def build_model(path: Path, preset: str, device: str, dtype: str) -> int:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    hidden, layers, inter, heads, kv, vocab, *_ = PRESETS[preset]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, **dtype_kwarg(torch_dtype))
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return params


def write_export(root: Path, preset: str) -> Path:
    *_, vocab, per_shard, lo, hi = PRESETS[preset]
    rng = random.Random(0)
    root.mkdir(parents=True)
    entries = []
    for index, count in enumerate((per_shard, per_shard, max(2, per_shard // 4))):
        rows = []
        for k in range(count):
            n = rng.randint(lo, hi)
            ids = [rng.randrange(1, vocab) for _ in range(n)]
            rows.append({"id": f"g{index}-{k}", "input_ids": ids, "loss_mask": [0] * (n // 3) + [1] * (n - n // 3)})
        name = f"shard_{index:05d}.jsonl"
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        tokens = sum(len(r["input_ids"]) for r in rows)
        entries.append({"index": index, "path": name, "samples": count, "tokens": tokens})
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps({"format": "eagle3-shards", "version": 1, "shards": entries}))
    return manifest


def bare_forward(target, batches) -> float:
    """Seconds of the decoder forward alone over the same padded batches (the baseline)."""
    import torch

    if target.input_device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    target.bare_forward(batches)
    return time.perf_counter() - start


def compare(target, saved: list[dict], samples_by_id: dict, picks: list[str]) -> list[dict]:
    """Saved states vs a direct single-sample forward with output_hidden_states=True."""
    import torch

    out = []
    by_id = {s["sample_id"]: s for s in saved}
    indices = target.aux.hidden_state_indices
    for sid in picks:
        got = by_id[sid]
        ids = list(samples_by_id[sid].input_ids)
        with torch.inference_mode():
            ref = target.model(
                input_ids=torch.tensor([ids], device=target.input_device), output_hidden_states=True, use_cache=False
            ).hidden_states
        want_last = ref[-1][0].float().cpu()
        want_aux = torch.cat([ref[h][0].float().cpu() for h in indices], dim=-1)
        row = {"sample": sid, "tokens": len(ids), "ids_equal": got["input_ids"].tolist() == ids}
        for key, want in (("last", want_last), ("aux", want_aux)):
            have = got["hidden_states" if key == "last" else "aux_hidden_states"].float()
            if have.shape != want.shape:
                row[f"{key}_shape_ok"] = False
                continue
            diff = (have - want).abs()
            row[f"{key}_max_rel"] = float(diff.max() / want.abs().max().clamp_min(1e-6))
            row[f"{key}_mean_rel"] = float(diff.mean() / want.abs().mean().clamp_min(1e-6))
            row[f"{key}_finite"] = bool(torch.isfinite(have).all())
        # random-init layers change the residual stream little, so also show that the saved aux states are
        # much closer to the right layers than to their neighbours (an off-by-one would not pass this)
        shifted = torch.cat([ref[h + 1][0].float().cpu() for h in indices], dim=-1)
        have_aux = got["aux_hidden_states"].float()
        if have_aux.shape == shifted.shape:
            row["aux_vs_next_layer_mean_rel"] = float((have_aux - shifted).abs().mean() / shifted.abs().mean())
        within = all(
            row.get(f"{k}_max_rel", 1) <= MAX_REL_ERR
            and row.get(f"{k}_mean_rel", 1) <= MEAN_REL_ERR
            and row.get(f"{k}_finite", False)
            for k in ("last", "aux")
        )
        distinct = row.get("aux_mean_rel", 1) * 4 <= row.get("aux_vs_next_layer_mean_rel", 0)
        row["ok"] = row["ids_equal"] and within and distinct
        out.append(row)
    return out


def pick_samples(samples) -> list[str]:
    """The shortest, the longest and a few in between."""
    ordered = sorted(samples, key=lambda s: len(s.input_ids))
    idx = sorted({0, len(ordered) // 3, len(ordered) // 2, 2 * len(ordered) // 3, len(ordered) - 1})
    return [ordered[i].sample_id for i in idx]


def scratch_dir(need_bytes: int) -> Path:
    """A tmpfs folder when it has room (keeps disk speed out of the numbers), else the temp dir."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > need_bytes * 1.5:
        return Path(tempfile.mkdtemp(prefix="eaglewatch-gpu-check-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="eaglewatch-gpu-check-"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="medium")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    t0 = time.monotonic()
    import torch
    import transformers

    from app.extract.disk_budget import estimate_output_bytes
    from app.extract.layers import resolve_aux_layers
    from app.extract.manifest import read_manifest, read_shard
    from app.extract.output import done_marker_path, load_shard_output, shard_data_path
    from app.extract.progress_lines import ProgressLog
    from app.extract.runner import ExtractOptions, extract_shard, load_target

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; use --device cpu --preset tiny for a smoke run", file=sys.stderr)
        return 2
    dtype = "bf16" if args.device == "cuda" else "fp32"
    hidden, layers, *_ = PRESETS[args.preset]
    summary: dict = {
        "preset": args.preset,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
        "gpus": torch.cuda.device_count() if args.device == "cuda" else 0,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": dtype,
        "batch_tokens": args.batch_tokens,
        "hidden": hidden,
        "layers": layers,
        "steps_s": {},
        "skipped_steps": [],
    }
    steps = summary["steps_s"]
    ok = True
    model_bytes = (12 * hidden * hidden * layers + 2 * 32000 * hidden) * 2
    work = scratch_dir(model_bytes + 8 * 10**9 if args.preset != "tiny" else 10**8)
    summary["scratch"] = str(work)
    log(f"scratch folder {work}")
    try:
        t = time.monotonic()
        summary["params"] = build_model(work / "model", args.preset, args.device, dtype)
        steps["build_and_save_model"] = round(time.monotonic() - t, 2)
        log(
            f"built and saved a random Llama with {summary['params'] / 1e9:.2f}B params "
            f"in {steps['build_and_save_model']}s"
        )
        manifest_path = write_export(work / "export", args.preset)
        manifest = read_manifest(manifest_path)
        out = work / "hs"
        out.mkdir()
        options = ExtractOptions(work / "model", out, batch_tokens=args.batch_tokens, device=args.device, dtype=dtype)
        aux = resolve_aux_layers(None, "output", layers)
        summary["aux_layers"] = aux.metadata()

        t = time.monotonic()
        target = load_target(options.model_path, aux, args.device, dtype)
        steps["load_target"] = round(time.monotonic() - t, 2)
        summary["device_map"] = str(getattr(target.model, "hf_device_map", None))
        summary["accelerate"] = importlib.util.find_spec("accelerate") is not None
        log(
            f"loaded in {steps['load_target']}s (accelerate: {summary['accelerate']}, "
            f"device map: {summary['device_map']})"
        )

        from app.extract.batching import plan_batches

        samples = {i: read_shard(manifest.shard(i)) for i in (0, 1, 2)}
        batches = [
            [list(samples[i][k].input_ids) for k in b]
            for i in (0, 1)
            for b in plan_batches([len(s.input_ids) for s in samples[i]], args.batch_tokens)
        ]
        tokens = sum(len(s.input_ids) for i in (0, 1) for s in samples[i])
        summary["timed_tokens"], summary["timed_batches"] = tokens, len(batches)
        bare_forward(target, batches[:2])  # warm-up: kernels, allocator, pinned host memory
        warm = work / "warm"
        warm.mkdir()
        extract_shard(
            target,
            manifest,
            2,
            ExtractOptions(work / "model", warm, batch_tokens=args.batch_tokens, device=args.device, dtype=dtype),
            ProgressLog(io.StringIO()),
        )
        rounds: list[dict] = []
        for r in range(2):
            if r and time.monotonic() - t0 > SOFT_DEADLINE_S / 2:
                summary["skipped_steps"].append("second timing round")
                break
            base = bare_forward(target, batches)
            for i in (0, 1):
                done_marker_path(out, i).unlink(missing_ok=True)
            if args.device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            for i in (0, 1):
                extract_shard(target, manifest, i, options, ProgressLog(io.StringIO()))
            ext = time.perf_counter() - t
            rounds.append({"baseline_s": base, "extractor_s": ext})
            log(f"round {r}: bare forward {tokens / base:,.0f} tok/s, extractor {tokens / ext:,.0f} tok/s")
        best_base = min(x["baseline_s"] for x in rounds)
        best_ext = min(x["extractor_s"] for x in rounds)
        summary["rounds"] = rounds
        summary["baseline_tokens_per_s"] = round(tokens / best_base)
        summary["extractor_tokens_per_s"] = round(tokens / best_ext)
        summary["ratio"] = round(best_base / best_ext, 3)
        written = sum(shard_data_path(out, i).stat().st_size for i in (0, 1))
        estimate = estimate_output_bytes(manifest, work / "model", aux.ids, dtype, shards=[0, 1])
        summary["output_bytes"], summary["estimated_bytes"] = written, estimate
        summary["bytes_per_token"] = round(written / tokens)
        summary["estimate_covers_output"] = written <= estimate
        ok &= written <= estimate
        if args.device == "cuda":
            summary["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)

        t = time.monotonic()
        checks = []
        for i in (0, 1):
            by_id = {s.sample_id: s for s in samples[i]}
            checks += compare(target, load_shard_output(shard_data_path(out, i)), by_id, pick_samples(samples[i]))
        steps["verify_in_process"] = round(time.monotonic() - t, 2)
        summary["checks"] = checks
        ok &= all(c["ok"] for c in checks)
        log(
            f"{sum(c['ok'] for c in checks)}/{len(checks)} samples match a direct forward pass; worst max_rel "
            f"{max(max(c.get('last_max_rel', 9), c.get('aux_max_rel', 9)) for c in checks):.4f}"
        )

        if time.monotonic() - t0 > SOFT_DEADLINE_S:
            summary["skipped_steps"].append("cli subprocess")
        else:
            cli_out = work / "hs_cli"
            cmd = [
                sys.executable,
                "-m",
                "app.extract",
                "--manifest",
                str(manifest_path),
                "--shard",
                "2",
                "--model",
                str(work / "model"),
                "--out",
                str(cli_out),
                "--device",
                args.device,
                "--batch-tokens",
                str(args.batch_tokens),
            ]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            t = time.monotonic()
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
            steps["cli_shard"] = round(time.monotonic() - t, 2)
            events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
            cli = {
                "exit": proc.returncode,
                "events": len(events),
                "last_event": events[-1] if events else None,
                "stderr_tail": proc.stderr[-500:],
                "marker": done_marker_path(cli_out, 2).exists(),
            }
            cli_ok = proc.returncode == 0 and cli["marker"] and events and events[-1]["event"] == "shard_done"
            if cli_ok:
                by_id = {s.sample_id: s for s in samples[2]}
                cli["checks"] = compare(
                    target, load_shard_output(shard_data_path(cli_out, 2)), by_id, pick_samples(samples[2])[:3]
                )
                cli_ok = all(c["ok"] for c in cli["checks"])
                if time.monotonic() - t0 < SOFT_DEADLINE_S:
                    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
                    lines = [json.loads(x) for x in again.stdout.splitlines() if x.startswith("{")]
                    cli["resume_skipped"] = again.returncode == 0 and lines[-1].get("skipped") is True
                    cli_ok &= cli["resume_skipped"]
                else:
                    summary["skipped_steps"].append("cli resume")
            cli["ok"] = bool(cli_ok)
            summary["cli"] = cli
            ok &= bool(cli_ok)
            log(f"CLI subprocess on shard 2: {'ok' if cli_ok else 'FAILED'} in {steps['cli_shard']}s")
        target.close()
        if time.monotonic() - t0 > SOFT_DEADLINE_S:
            summary["skipped_steps"].append("speculators layout norm check")
        else:
            t = time.monotonic()
            summary["speculators_norm"] = norm_check(work, manifest, samples[2], aux, args, dtype)
            steps["speculators_layout"] = round(time.monotonic() - t, 2)
            ok &= summary["speculators_norm"]["ok"]
            log(f"speculators layout: argmax agreement {summary['speculators_norm']['agreement']:.4f}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    summary["ok"] = bool(ok)
    summary["total_s"] = round(time.monotonic() - t0, 1)
    print()
    print("| check | result |")
    print("|---|---|")
    print(
        f"| device | {summary['device']} x{summary['gpus']}, torch {summary['torch']}, "
        f"transformers {summary['transformers']} |"
    )
    print(f"| model | random Llama {layers}x{hidden}, {summary['params'] / 1e9:.2f}B params, {dtype} |")
    print(f"| bare forward | {summary['baseline_tokens_per_s']:,} tokens/s |")
    print(f"| extractor (to safetensors) | {summary['extractor_tokens_per_s']:,} tokens/s ({summary['ratio']:.2f}x) |")
    print(f"| states vs direct forward | {sum(c['ok'] for c in checks)}/{len(checks)} within bf16 tolerance |")
    print(f"| CLI + resume | {summary.get('cli', {}).get('ok', 'skipped')} |")
    print(
        f"| speculators layout: norm + LM head of the last slot = model argmax | "
        f"{summary.get('speculators_norm', {}).get('agreement', 'skipped')} |"
    )
    print(f"| total | {summary['total_s']} s, ok={summary['ok']} |")
    text = json.dumps(summary, indent=1, default=str)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "gpu_check.json").write_text(text + "\n")
    return 0 if ok else 1


def norm_check(work: Path, manifest, samples, aux, args, dtype: str) -> dict:
    """Extract shard 2 in the speculators layout (pre-norm last slot) and check that the model's own final norm
    and LM head over that slot give its next-token argmax on every token (bf16 rounding allows <1% flips)."""
    import torch
    from safetensors.torch import load_file

    from app.extract.layouts import global_offsets
    from app.extract.progress_lines import ProgressLog
    from app.extract.runner import ExtractOptions, extract_shard, load_target

    out = work / "hs_speculators"
    out.mkdir()
    options = ExtractOptions(
        work / "model", out, batch_tokens=args.batch_tokens, device=args.device, dtype=dtype, layout="speculators"
    )
    target = load_target(options.model_path, aux, args.device, dtype, last_prenorm=True)
    try:
        extract_shard(target, manifest, 2, options, ProgressLog(io.StringIO()))
        model = target.model
        norm = target.decoder.norm
        first = global_offsets(manifest)[2]
        agree = total = 0
        for k, sample in enumerate(samples[:8]):
            saved = load_file(str(out / "hidden_states" / f"hs_{first + k}.safetensors"))
            ids = torch.tensor([sample.input_ids], device=target.input_device)
            with torch.inference_mode():
                own = model(input_ids=ids).logits[0].argmax(-1).cpu()
                slot = saved["hidden_states"][:, -1].to(target.input_device)
                ours = model.lm_head(norm(slot)).argmax(-1).cpu()
            agree += int((own == ours).sum())
            total += len(sample.input_ids)
    finally:
        target.close()
    agreement = agree / max(total, 1)
    return {"tokens": total, "agreement": round(agreement, 4), "ok": agreement >= 0.99}


if __name__ == "__main__":
    sys.exit(main())
