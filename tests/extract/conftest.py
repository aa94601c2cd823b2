"""A tiny random Llama saved with save_pretrained (no download) and eagle3-shards written next to it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

VOCAB = 512
LAYERS = 8
HIDDEN = 64


def build_tiny_model(path: Path, *, arch: str = "llama", seed: int = 0, nan_token: int | None = None) -> Path:
    """Save a random 8-layer, hidden-64 model from a config; `nan_token` poisons that token's embedding."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if nan_token is not None:
        with torch.no_grad():
            model.get_input_embeddings().weight[nan_token] = float("nan")
    model.save_pretrained(path)
    return path


def extraction_config(tmp_path: Path, model: Path, **extraction: object) -> Path:
    """A run config with nothing but what `eaglewatch extract` needs, plus these `[extraction]` keys."""
    keys = "\n".join(f"{k} = {json.dumps(v)}" for k, v in extraction.items())
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"""
[run]
name = "t"
database = "{tmp_path / "run.db"}"
[data]
[[data.datasets]]
path = "prompts.jsonl"
[model]
name = "m"
tokenizer = "tok"
[[endpoints]]
name = "e"
base_url = "http://127.0.0.1:9"
[extraction]
model_path = "{model}"
output_dir = "{tmp_path / "hidden"}"
{keys}
""")
    return cfg


def make_samples(n: int, seed: int, *, lo: int = 3, hi: int = 40, vocab: int = VOCAB) -> list[dict]:
    """`n` samples of random length with ids in 1..vocab-1 and a loss mask over the second half."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        length = rng.randint(lo, hi)
        ids = [rng.randrange(1, vocab) for _ in range(length)]
        prompt = length // 2
        out.append({"id": f"s{seed}-{k}", "input_ids": ids, "loss_mask": [0] * prompt + [1] * (length - prompt)})
    return out


def write_shards(root: Path, shards: list[list[dict]], *, tokens_override: dict[int, int] | None = None) -> Path:
    """Write an eagle3-shards export (manifest.json + one JSON-lines file per shard); return the manifest."""
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, rows in enumerate(shards):
        name = f"shard_{i:05d}.jsonl"
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        tokens = sum(len(r["input_ids"]) for r in rows)
        if tokens_override and i in tokens_override:
            tokens = tokens_override[i]
        entries.append({"index": i, "path": name, "samples": len(rows), "tokens": tokens})
    manifest = root / "manifest.json"
    manifest.write_text(
        json.dumps({"format": "eagle3-shards", "tokenizer_fingerprint": "test", "shards": entries}), encoding="utf-8"
    )
    return manifest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_reference(tiny_model):
    """The same model loaded in fp32 for direct forward passes."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, local_files_only=True)
    return model.eval()


@pytest.fixture
def two_shards(tmp_path) -> Path:
    return write_shards(tmp_path / "export", [make_samples(7, seed=1), make_samples(5, seed=2)])
