from __future__ import annotations

import pytest

from app.tokens.tokenizer import load_tokenizer
from tests.providers.support import write_reference


@pytest.fixture(scope="session")
def tok(sample_tokenizer_dir):
    return load_tokenizer(sample_tokenizer_dir)


@pytest.fixture(scope="session")
def reference(tmp_path_factory, tok):
    path = tmp_path_factory.mktemp("ref") / "reference.jsonl"
    ids = write_reference(path, tok)
    return path, ids


def pytest_terminal_summary(terminalreporter):
    """The yield of each personality × quirk mix run with default settings (test_default_fidelity), at the end."""
    from tests.simulator import test_default_fidelity

    if test_default_fidelity.YIELDS:
        terminalreporter.write_sep("-", "default fidelity: exported samples with the model's ids, per mix")
        for line in test_default_fidelity.YIELDS:
            terminalreporter.write_line(line)
