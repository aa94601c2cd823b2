"""The layering that import-linter contracts cannot say, enforced; the floors themselves are contracts in
`.importlinter` (run by `lint-imports`, and by the first test here).

What stays here: the monitor reaches the store only through its data source, no two project modules import each
other in a cycle (lazy imports included), imports spelled as string literals (`importlib.import_module("x")`)
obey the same bans as the contracts, and all SQL lives in app/store. The checkers read every module's syntax
tree, so a lazy import cannot hide a violation.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def test_import_contracts_hold(repo_root: Path) -> None:
    """`lint-imports` keeps every contract in .importlinter (the package floors, textual in the faces only, pure
    tokens and config, the engine's rooms)."""
    pytest.importorskip("importlinter")
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert command, "lint-imports is not installed (pip install -e '.[dev]')"
    done = subprocess.run(
        [command, "--no-cache"], cwd=repo_root, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# (package prefix the rule applies to, modules it must not import, packages exempt from the rule): the bans of
# .importlinter's contracts, for the imports import-linter cannot see (a module named in a string literal)
DYNAMIC_RULES: list[tuple[str, frozenset[str], tuple[str, ...]]] = [
    ("", frozenset({"textual"}), ("app/tui/", "widgets/")),
    ("app/tokens/", frozenset({"asyncio", "httpx", "aiosqlite", "aiohttp", "httpx_aiohttp"}), ()),
    ("app/config.py", frozenset({"textual", "httpx", "aiosqlite", "asyncio", "transformers", "torch"}), ()),
]


def dynamic_imports(source: str, filename: str = "<module>") -> set[str]:
    """Top-level names of every module a source file imports by a string literal (`import_module("x.y")`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value.split(".")[0])
    return names


def dynamic_import_violations(root: Path) -> list[str]:
    """`path: imports X (rule)` for every string-literal import under root/app and root/widgets a rule bans."""
    found: list[str] = []
    for top in ("app", "widgets"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            modules = dynamic_imports(path.read_text(encoding="utf-8"), rel)
            for prefix, banned, exempt in DYNAMIC_RULES:
                if not rel.startswith(prefix) or rel.startswith(exempt):
                    continue
                for name in sorted(modules & banned):
                    where = f"outside {', '.join(exempt)}" if exempt else f"in {prefix}"
                    found.append(f"{rel}: imports {name} ({name} is not allowed {where})")
    return found


def test_no_string_literal_import_breaks_a_contract(repo_root: Path) -> None:
    assert dynamic_import_violations(repo_root) == []


def test_checker_finds_a_string_literal_import_of_io_in_tokens(tmp_path: Path) -> None:
    (tmp_path / "app" / "tokens").mkdir(parents=True)
    (tmp_path / "widgets").mkdir()
    (tmp_path / "app" / "tokens" / "reconstruct.py").write_text(
        "import asyncio\nimportlib.import_module('aiosqlite')\nimport_module('json')\n"
    )
    (tmp_path / "app" / "tokens" / "tui.py").write_text("def f():\n    importlib.import_module('textual.app')\n")
    assert dynamic_import_violations(tmp_path) == [
        "app/tokens/reconstruct.py: imports aiosqlite (aiosqlite is not allowed in app/tokens/)",
        "app/tokens/tui.py: imports textual (textual is not allowed outside app/tui/, widgets/)",
    ]


# ---------------------------------------------------------------------------------------------- between modules
# The monitor reaches the store only through its data source (app/tui/source.py, the protocol and the records it
# returns; app/tui/db_source.py, its two implementations): screens never hold a query. (A contract would need one
# ignore line per gate import; this says it once.)
TUI_STORE_GATES = ("app/tui/source.py", "app/tui/db_source.py", "app/tui/eval_source.py")


def project_imports(source: str, filename: str = "<module>", *, names_too: bool = False) -> set[str]:
    """Every `app.*` / `widgets.*` module a source file imports anywhere (lazy and TYPE_CHECKING imports too); with
    names_too, `from pkg import name` is read as `pkg.name` (the caller resolves whether that is a module, else the
    import is of `pkg`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] in ("app", "widgets"))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in ("app", "widgets")
        ):
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


def store_gate_violations(root: Path) -> list[str]:
    """`path: imports app.store.x` for every monitor module besides its data source that imports the store."""
    found: list[str] = []
    for path in sorted((root / "app" / "tui").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in TUI_STORE_GATES:
            continue
        for imported in sorted(project_imports(path.read_text(encoding="utf-8"), rel)):
            if imported.startswith("app.store"):
                found.append(f"{rel}: imports {imported} (the monitor reads the store only through its data source)")
    return found


def test_the_monitor_reads_the_store_only_through_its_source(repo_root: Path) -> None:
    assert store_gate_violations(repo_root) == []


def test_no_import_cycles(repo_root: Path) -> None:
    assert import_cycles(repo_root) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for top in ("app", "widgets"):
        (tmp_path / top).mkdir(exist_ok=True)
    return tmp_path


def test_checker_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/store/__init__.py": "",
            "app/store/ingest.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.store.run_store import RunStore\n"
            ),
            "app/store/run_store.py": "def f():\n    from app.store import ingest\n",
            "app/store/rows.py": "from app.store import run_store\n",
        },
    )
    assert import_cycles(root) == [["app.store.ingest", "app.store.run_store"]]


def test_checker_finds_the_tui_skipping_its_source(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/tui/__init__.py": "",
            "app/tui/series.py": "from app.store.queries import series_since\n",
            "app/tui/db_source.py": "from app.store import queries\n",
        },
    )
    assert store_gate_violations(root) == [
        "app/tui/series.py: imports app.store.queries (the monitor reads the store only through its data source)",
    ]


# ---------------------------------------------------------------------------------------------- SQL in app/store
# Every statement the project runs lives in app/store (its reads, its writer, the jobs tables' sync writer), so a
# schema change has one place to look. bench/ and tests/ are outside the check (they are not scanned).
SQL_EXEMPT = ("app/store/",)
_CURSOR_CALLS = frozenset({"execute", "executemany", "executescript"})
# a string that opens with a statement's verb (upper case), or holds one of its shapes anywhere
_SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|PRAGMA|BEGIN|COMMIT|ROLLBACK"
    r"|SAVEPOINT|RELEASE|WITH|VACUUM|ANALYZE|ATTACH|DETACH|EXPLAIN)\b"
)
_SQL_ANYWHERE = re.compile(
    r"\b(SELECT\b[\s\S]*\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM"
    r"|CREATE\s+(TABLE|INDEX|UNIQUE|VIEW|TRIGGER|VIRTUAL))\b"
)


def sql_uses(source: str, filename: str = "<module>") -> list[str]:
    """`line: what` for every cursor call (.execute / .executemany / .executescript) and every SQL statement
    string (an f-string read with its holes as `{}`; docstrings are prose and left out) in a source file."""
    tree = ast.parse(source, filename)
    prose = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
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
    root = _tree(
        tmp_path,
        {
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
        },
    )
    assert sql_outside_store(root) == [
        "app/commands/extract.py:2: .execute()",
        "app/jobs/launcher.py:3: .executemany()",
        "app/jobs/launcher.py:3: SQL 'INSERT INTO jobs (id) VALUES (?)'",
        "app/jobs/launcher.py:4: SQL 'UPDATE jobs SET {} WHERE id = ?'",
        "widgets/table.py:1: SQL 'PRAGMA user_version'",
    ]
