"""The architecture's layering, enforced: textual only in app/tui and widgets; app/tokens stays pure.

The checker reads every module's imports from its syntax tree (imports inside functions included), so
a lazy import cannot hide a violation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

# (package prefix the rule applies to, modules it must not import, packages exempt from the rule)
RULES: list[tuple[str, frozenset[str], tuple[str, ...]]] = [
    ("", frozenset({"textual"}), ("app/tui/", "widgets/")),
    ("app/tokens/", frozenset({"asyncio", "httpx", "aiosqlite", "aiohttp", "httpx_aiohttp"}), ()),
    ("app/config.py", frozenset({"textual", "httpx", "aiosqlite", "asyncio", "transformers", "torch"}), ()),
]


def imported_modules(source: str, filename: str = "<module>") -> set[str]:
    """Top-level names of every absolute module a source file imports, anywhere in the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                names.add(node.args[0].value.split(".")[0])
    return names


def layering_violations(root: Path) -> list[str]:
    """`path: imports X (rule)` for every module under root/app and root/widgets that breaks a rule."""
    found: list[str] = []
    for top in ("app", "widgets"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            modules = imported_modules(path.read_text(encoding="utf-8"), rel)
            for prefix, banned, exempt in RULES:
                if not rel.startswith(prefix) or rel.startswith(exempt):
                    continue
                for name in sorted(modules & banned):
                    where = f"outside {', '.join(exempt)}" if exempt else f"in {prefix}"
                    found.append(f"{rel}: imports {name} ({name} is not allowed {where})")
    return found


def test_repository_follows_the_layering(repo_root: Path) -> None:
    assert layering_violations(repo_root) == []


def test_checker_finds_a_textual_import_outside_the_tui(tmp_path: Path) -> None:
    (tmp_path / "app" / "engine").mkdir(parents=True)
    (tmp_path / "app" / "tui").mkdir()
    (tmp_path / "widgets").mkdir()
    (tmp_path / "app" / "engine" / "run.py").write_text("def f():\n    from textual.app import App\n")
    (tmp_path / "app" / "tui" / "app.py").write_text("import textual\n")
    (tmp_path / "widgets" / "diff.py").write_text("from textual.widget import Widget\n")
    assert layering_violations(tmp_path) == [
        "app/engine/run.py: imports textual (textual is not allowed outside app/tui/, widgets/)"
    ]


def test_checker_finds_io_in_tokens(tmp_path: Path) -> None:
    (tmp_path / "app" / "tokens").mkdir(parents=True)
    (tmp_path / "widgets").mkdir()
    (tmp_path / "app" / "tokens" / "rebuild.py").write_text(
        "import json\nimport asyncio.tasks\nfrom httpx import Client\nimportlib.import_module('aiosqlite')\n"
    )
    assert layering_violations(tmp_path) == [
        "app/tokens/rebuild.py: imports aiosqlite (aiosqlite is not allowed in app/tokens/)",
        "app/tokens/rebuild.py: imports asyncio (asyncio is not allowed in app/tokens/)",
        "app/tokens/rebuild.py: imports httpx (httpx is not allowed in app/tokens/)",
    ]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import a.b.c", {"a"}),
        ("from x.y import z", {"x"}),
        ("from . import sibling", set()),
        ("def f():\n    import lazy", {"lazy"}),
    ],
)
def test_imported_modules(source: str, expected: set[str]) -> None:
    assert imported_modules(source) == expected
