"""Fixtures for the token tests: the sample tokenizer, the real Kimi files, and tiny tokenizers built here."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from app.tokens import Reconstructor, get_profile, load_tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Let me check the weather in Paris and Beijing.",
    'def f(x):\n    return {"city": "Paris", "n": 3}\n',
    "Okay, the user wants weather. I should call the tool with the city name.",
    "北京的天气怎么样？今天很好。 emoji 🙂🚀 done.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
] * 20


def build_hf_tokenizer(
    directory: Path, added: list[tuple[str, bool]], vocab_size: int = 600, nfc: bool = False
) -> Path:
    """Train a tiny byte-level BPE `tokenizer.json` with these added tokens (text, special) into `directory`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in added])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory


def build_tiktoken_dir(directory: Path, names: dict[int, str] | None = None) -> Path:
    """A tiny tiktoken vocabulary (256 bytes + a few merges) and a config naming some special slots."""
    ranks = {bytes([i]): i for i in range(256)}
    for word in (b"he", b"ll", b"hell", b"hello", b" w", b" wo", b"or", b" world", b"ch", b"as", b"chas"):
        ranks.setdefault(word, len(ranks))
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(b).decode()} {r}" for b, r in ranks.items()]
    (directory / "tiktoken.model").write_text("\n".join(lines) + "\n")
    n = len(ranks)
    names = names if names is not None else {n + 2: "<|im_end|>", n + 22: "<think>", n + 23: "</think>"}
    config = {"added_tokens_decoder": {str(i): {"content": t, "special": True} for i, t in names.items()}}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


QWEN_MARKERS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<think>", False),
    ("</think>", False),
]
DEEPSEEK_MARKERS = [
    ("<｜begin▁of▁sentence｜>", True),
    ("<｜end▁of▁sentence｜>", True),
    ("<think>", False),
    ("</think>", False),
    ("<｜tool▁calls▁begin｜>", False),
    ("<｜tool▁calls▁end｜>", False),
    ("<｜tool▁call▁begin｜>", False),
    ("<｜tool▁call▁end｜>", False),
    ("<｜tool▁sep｜>", False),
]
GLM_MARKERS = [
    ("<|endoftext|>", True),
    ("<|user|>", True),
    ("<|assistant|>", True),
    ("<|observation|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<arg_key>", False),
    ("</arg_key>", False),
    ("<arg_value>", False),
    ("</arg_value>", False),
]
PROFILE_MARKERS = {"qwen3": QWEN_MARKERS, "deepseek-v3.1": DEEPSEEK_MARKERS, "glm-4.5": GLM_MARKERS}


@pytest.fixture(scope="session")
def family_tokenizers(tmp_path_factory) -> dict:
    """profile name -> a tiny HF tokenizer carrying that profile's markers."""
    root = tmp_path_factory.mktemp("families")
    return {name: load_tokenizer(build_hf_tokenizer(root / name, markers)) for name, markers in PROFILE_MARKERS.items()}


@pytest.fixture(scope="session")
def nfc_qwen_tokenizer(tmp_path_factory):
    """A tiny Qwen3-style tokenizer with an NFC normaliser (as the real Qwen3 has)."""
    return load_tokenizer(build_hf_tokenizer(tmp_path_factory.mktemp("nfc"), QWEN_MARKERS, nfc=True))


@pytest.fixture(scope="session")
def kimi_tok(kimi_tokenizer_dir):
    return load_tokenizer(kimi_tokenizer_dir)


@pytest.fixture(scope="session")
def kimi_rec(kimi_tok):
    return Reconstructor(get_profile("kimi-k2.5"), kimi_tok)


@pytest.fixture(scope="session")
def sample_tok(sample_tokenizer_dir):
    return load_tokenizer(sample_tokenizer_dir)


@pytest.fixture(scope="session")
def sample_rec(sample_tok):
    return Reconstructor(get_profile("kimi-k2.5"), sample_tok)
