"""The architecture's layering, enforced: textual only in app/tui and widgets; app/tokens stays pure; SQL only in
app/store.

The checker reads every module's imports from its syntax tree (imports inside functions included), so
a lazy import cannot hide a violation.
"""

from __future__ import annotations

import ast
import re
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
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
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


# ---------------------------------------------------------------------------------------------- between packages
# What each of the project's own packages may import of the others (`app.<name>`), as docs/architecture.md draws
# the floors: the pure records and tokens at the bottom, the store and providers above them, the engine over those,
# the faces on top. A package not listed here (app/commands, app/cli.py) may import anything of the project.
ALLOWED: dict[str, frozenset[str]] = {
    "app/records.py": frozenset(),
    "app/conversation.py": frozenset(),
    "app/errors.py": frozenset(),
    "app/libnoise.py": frozenset(),
    "app/token_bucket.py": frozenset(),
    "app/tokens/": frozenset({"errors", "libnoise", "records", "tokens"}),
    "app/providers/": frozenset({"errors", "libnoise", "records", "providers"}),
    "app/extract/": frozenset({"errors", "libnoise", "records", "extract"}),
    "app/store/": frozenset({"conversation", "errors", "libnoise", "records", "tokens", "store"}),
    "app/simulator/": frozenset({"errors", "libnoise", "records", "providers", "token_bucket", "tokens", "simulator"}),
    "app/config.py": frozenset({"errors", "simulator"}),
    "app/datasets.py": frozenset({"conversation", "errors", "records", "store", "tokens"}),
    "app/jobs/": frozenset({"config", "errors", "extract", "libnoise", "records", "store", "jobs"}),
    "app/export/": frozenset({"config", "errors", "libnoise", "records", "store", "tokens", "export"}),
    "app/engine/": frozenset({"config", "conversation", "datasets", "errors", "libnoise", "providers", "records",
                              "simulator", "store", "token_bucket", "tokens", "engine"}),
    "widgets/": frozenset({"records"}),
    "app/tui/": frozenset({"config", "engine", "errors", "jobs", "libnoise", "records", "store", "tokens", "tui"}),
}
# The monitor reaches the store only through its data source (app/tui/source.py, the protocol and the records it
# returns; app/tui/db_source.py, its two implementations): screens never hold a query.
TUI_STORE_GATES = ("app/tui/source.py", "app/tui/db_source.py")


def project_imports(source: str, filename: str = "<module>", *, names_too: bool = False) -> set[str]:
    """Every `app.*` / `widgets.*` module a source file imports anywhere (lazy and TYPE_CHECKING imports too); with
    names_too, `from pkg import name` is read as `pkg.name` (the caller resolves whether that is a module, else the
    import is of `pkg`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] in ("app", "widgets"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in ("app", "widgets"):
            if names_too:
                names.update(f"{node.module}.{a.name}" for a in node.names)
            else:
                names.add(node.module)
    return names


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under root/app and root/widgets."""
    found: dict[str, Path] = {}
    for top in ("app", "widgets"):
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name imported from a package that is not a module of its own
    counts as an import of the package's __init__)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in project_imports(path.read_text(encoding="utf-8"), str(path), names_too=True):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    """Every cycle of project modules that import each other (strongly connected components of more than one
    module; a package's __init__ importing its own submodules, which never import the __init__ back, is none)."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's algorithm, iterative enough for this tree's depth
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def package_violations(root: Path) -> list[str]:
    """`path: imports app.x (rule)` for every import between the project's packages that the floors forbid."""
    found: list[str] = []
    for _name, path in sorted(_modules(root).items()):
        rel = path.relative_to(root).as_posix()
        rule = next(((prefix, allowed) for prefix, allowed in ALLOWED.items() if rel.startswith(prefix)), None)
        for imported in sorted(project_imports(path.read_text(encoding="utf-8"), rel)):
            top = imported.split(".")
            package = top[1] if top[0] == "app" and len(top) > 1 else top[0]
            if rule is not None and top[0] == "app" and package not in rule[1]:
                found.append(f"{rel}: imports {imported} (app/{package} is not allowed in {rule[0]})")
            elif rule is not None and top[0] == "widgets" and not rel.startswith(("app/tui/", "widgets/")):
                found.append(f"{rel}: imports {imported} (widgets are for the monitor only)")
            if rel.startswith("app/tui/") and rel not in TUI_STORE_GATES and imported.startswith("app.store"):
                found.append(f"{rel}: imports {imported} (the monitor reads the store only through its data source)")
    return sorted(set(found))


def repeated_module_names(root: Path) -> dict[str, list[str]]:
    """File names that two modules share (verbs in app/commands are named after the verb they run, and are left
    out; `__init__` and `__main__` too)."""
    seen: dict[str, list[str]] = {}
    for path in _modules(root).values():
        rel = path.relative_to(root).as_posix()
        if rel.startswith("app/commands/") or path.stem in ("__init__", "__main__"):
            continue
        seen.setdefault(path.name, []).append(rel)
    return {name: paths for name, paths in sorted(seen.items()) if len(paths) > 1}


def test_packages_import_only_what_their_floor_allows(repo_root: Path) -> None:
    assert package_violations(repo_root) == []


def test_no_import_cycles(repo_root: Path) -> None:
    assert import_cycles(repo_root) == []


def test_module_names_say_one_job(repo_root: Path) -> None:
    assert repeated_module_names(repo_root) == {}


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for top in ("app", "widgets"):
        (tmp_path / top).mkdir(exist_ok=True)
    return tmp_path


def test_checker_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "app/__init__.py": "",
        "app/store/__init__.py": "",
        "app/store/ingest.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.store.run_store import RunStore\n"
        ),
        "app/store/run_store.py": "def f():\n    from app.store import ingest\n",
        "app/store/rows.py": "from app.store import run_store\n",
    })
    assert import_cycles(root) == [["app.store.ingest", "app.store.run_store"]]


def test_checker_finds_tokens_importing_the_store_and_the_tui_skipping_its_source(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "app/__init__.py": "",
        "app/tokens/__init__.py": "",
        "app/tokens/rebuild.py": "from app.store.rows import MismatchRow\nfrom app.records import Verdict\n",
        "app/tui/__init__.py": "",
        "app/tui/series.py": "from app.store.queries import series_since\n",
        "app/tui/db_source.py": "from app.store import queries\n",
        "app/simulator/__init__.py": "",
        "app/simulator/server.py": "import app.engine.limiter\n",
    })
    assert package_violations(root) == [
        "app/simulator/server.py: imports app.engine.limiter (app/engine is not allowed in app/simulator/)",
        "app/tokens/rebuild.py: imports app.store.rows (app/store is not allowed in app/tokens/)",
        "app/tui/series.py: imports app.store.queries (the monitor reads the store only through its data source)",
    ]


def test_checker_finds_two_modules_with_one_name(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "app/engine/ingest.py": "", "app/store/ingest.py": "", "app/commands/ingest.py": "", "app/store/rows.py": "",
    })
    assert repeated_module_names(root) == {"ingest.py": ["app/engine/ingest.py", "app/store/ingest.py"]}


# ---------------------------------------------------------------------------------------------- SQL in app/store
# Every statement the project runs lives in app/store (its reads, its writer, the jobs tables' sync writer), so a
# schema change has one place to look. bench/ and tests/ are outside the check (they are not scanned).
SQL_EXEMPT = ("app/store/",)
_CURSOR_CALLS = frozenset({"execute", "executemany", "executescript"})
# a string that opens with a statement's verb (upper case), or holds one of its shapes anywhere
_SQL_START = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|PRAGMA|BEGIN|COMMIT|ROLLBACK"
                        r"|SAVEPOINT|RELEASE|WITH|VACUUM|ANALYZE|ATTACH|DETACH|EXPLAIN)\b")
_SQL_ANYWHERE = re.compile(r"\b(SELECT\b[\s\S]*\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM"
                           r"|CREATE\s+(TABLE|INDEX|UNIQUE|VIEW|TRIGGER|VIRTUAL))\b")


def sql_uses(source: str, filename: str = "<module>") -> list[str]:
    """`line: what` for every cursor call (.execute / .executemany / .executescript) and every SQL statement
    string (an f-string read with its holes as `{}`; docstrings are prose and left out) in a source file."""
    tree = ast.parse(source, filename)
    prose = {id(node.body[0].value) for node in ast.walk(tree)
             if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
             and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    in_fstring = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CURSOR_CALLS:
            found.append(f"{node.lineno}: .{node.func.attr}()")
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose | in_fstring:
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in node.values)
        if text is not None and (_SQL_START.search(text) or _SQL_ANYWHERE.search(text)):
            found.append(f"{node.lineno}: SQL {text.strip().splitlines()[0][:60]!r}")
    return sorted(set(found), key=lambda f: (int(f.split(":")[0]), f))


def sql_outside_store(root: Path) -> list[str]:
    """`path:line: what` for every SQL use in app/ and widgets/ outside app/store (and the exempt files)."""
    found: list[str] = []
    for top in ("app", "widgets"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(SQL_EXEMPT):
                continue
            found.extend(f"{rel}:{use}" for use in sql_uses(path.read_text(encoding="utf-8"), rel))
    return found


def test_all_sql_lives_in_the_store(repo_root: Path) -> None:
    assert sql_outside_store(repo_root) == []


def test_checker_finds_sql_outside_the_store(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "app/jobs/launcher.py": (
            '"""SELECT a FROM b is prose in a docstring."""\n'
            "def f(conn, cols):\n"
            "    conn.executemany('INSERT INTO jobs (id) VALUES (?)', [(1,)])\n"
            "    return f'UPDATE jobs SET {cols} WHERE id = ?'\n"
        ),
        "app/commands/extract.py": "def g(db):\n    return db.execute(QUERY)\n",
        "app/commands/help.py": "TEXT = 'Select a run, then update its name and delete from the list'\n",
        "app/store/job_rows.py": "def h(conn):\n    conn.execute('DELETE FROM jobs')\n",
        "widgets/table.py": "HEAD = 'PRAGMA user_version'\n",
    })
    assert sql_outside_store(root) == [
        "app/commands/extract.py:2: .execute()",
        "app/jobs/launcher.py:3: .executemany()",
        "app/jobs/launcher.py:3: SQL 'INSERT INTO jobs (id) VALUES (?)'",
        "app/jobs/launcher.py:4: SQL 'UPDATE jobs SET {} WHERE id = ?'",
        "widgets/table.py:1: SQL 'PRAGMA user_version'",
    ]
