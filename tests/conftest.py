"""Fixtures shared by every test area: where the repo's sample data and the real Kimi files are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.libnoise import silence_library_noise

silence_library_noise()

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO_ROOT / "sample_data"
# The project's shared folder (real tokenizer files): ../shared beside the checkout, or EAGLEWATCH_SHARED.
SHARED_DIR = Path(os.environ.get("EAGLEWATCH_SHARED") or REPO_ROOT.parent / "shared")
KIMI_DIR = SHARED_DIR / "tokenizers" / "kimi-k2.5"
REAL_TOKENIZER_FIXTURES = {"kimi_tokenizer_dir"}
_real_tokenizer_tests: set[str] = set()
_real_tokenizer_outcomes: dict[str, str] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_TOKENIZER_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("kimi"):
            _real_tokenizer_tests.add(item.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid in _real_tokenizer_tests and (report.when == "call" or report.skipped):
        _real_tokenizer_outcomes[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter) -> None:
    """Say loudly how many tests ran on the real tokenizer files, so a clone without them is never mistaken for a full run."""
    if not _real_tokenizer_tests:
        return
    ran = sum(1 for o in _real_tokenizer_outcomes.values() if o != "skipped")
    skipped = sum(1 for o in _real_tokenizer_outcomes.values() if o == "skipped")
    where = KIMI_DIR if (KIMI_DIR / "tiktoken.model").exists() else f"{KIMI_DIR} (absent: set EAGLEWATCH_SHARED to the shared folder)"
    terminalreporter.write_sep("=", f"real-tokenizer tests: {ran} ran, {skipped} skipped; files: {where}",
                               yellow=bool(skipped), green=not skipped)


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
        pytest.skip(f"real Kimi K2.5 tokenizer files not found at {KIMI_DIR} (set EAGLEWATCH_SHARED to the shared folder)")
    return KIMI_DIR
