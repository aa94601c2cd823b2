"""Fixtures shared by every test area: where the repo's sample data and the real Kimi files are."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.libnoise import silence_library_noise

silence_library_noise()

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO_ROOT / "sample_data"
KIMI_DIR = REPO_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def sample_data_dir() -> Path:
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def sample_tokenizer_dir() -> Path:
    path = SAMPLE_DATA / "tokenizer"
    if not (path / "tokenizer.json").exists():
        pytest.fail(f"{path} is missing: run scripts/build_sample_tokenizer.py")
    return path


@pytest.fixture(scope="session")
def sample_reference() -> Path:
    return SAMPLE_DATA / "reference.jsonl"


@pytest.fixture(scope="session")
def kimi_tokenizer_dir() -> Path:
    if not (KIMI_DIR / "tiktoken.model").exists():
        pytest.skip("real Kimi K2.5 tokenizer files not found at ../shared/tokenizers/kimi-k2.5")
    return KIMI_DIR
