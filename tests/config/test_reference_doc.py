"""The configuration reference, docs/config-reference.md, is generated from app/config.py; README.md links to it
and holds no copy (one place to keep in step)."""

from __future__ import annotations

from pathlib import Path

from app.config import (
    REFERENCE_END,
    REFERENCE_START,
    Dataset,
    Endpoint,
    ExportSection,
    Extraction,
    Generation,
    Limits,
    ModelSection,
    Pricing,
    RunSection,
    SimulatorOptions,
    config_reference_markdown,
)

REGENERATE = "regenerate it with `python -m app.config > docs/config-reference.md`"


def readme_section(text: str) -> str | None:
    if REFERENCE_START not in text or REFERENCE_END not in text:
        return None
    return text.split(REFERENCE_START, 1)[1].split(REFERENCE_END, 1)[0].strip()


def test_docs_config_reference_matches_config_py(repo_root: Path) -> None:
    doc = (repo_root / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert doc.strip() == config_reference_markdown().strip(), f"docs/config-reference.md is stale; {REGENERATE}"


def test_readme_links_the_config_reference_and_holds_no_copy(repo_root: Path) -> None:
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    assert "(docs/config-reference.md)" in readme, "README.md should link to docs/config-reference.md"
    assert readme_section(readme) is None and "| `api_key_env` |" not in readme, (
        "README.md holds a copy of the configuration reference; link to docs/config-reference.md instead"
    )


def test_reference_lists_every_key_of_every_section() -> None:
    text = config_reference_markdown()
    for model in (
        RunSection,
        Dataset,
        ModelSection,
        Endpoint,
        SimulatorOptions,
        Generation,
        Limits,
        Pricing,
        Extraction,
        ExportSection,
    ):
        for name in model.model_fields:
            assert f"| `{name}` |" in text, f"{model.__name__}.{name} missing from the reference"


def test_section_extraction_finds_the_marked_text() -> None:
    text = f"intro\n{REFERENCE_START}\nbody\n{REFERENCE_END}\nrest"
    assert readme_section(text) == "body"
    assert readme_section("no markers") is None
