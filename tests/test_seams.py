"""The seams stay narrow: every entry point of the store and of export takes at most MAX_PARAMS parameters.

A call that needs more passes one frozen record (`app.store.store_records.ResultRecord` into
`RunStore.record_result`, `app.store.queries.MismatchQuery` into `mismatch_page`, `ExportOptions` into `Export`),
so the caller names what it hands over once and the seam can grow a field without a new argument everywhere.
Read from the syntax tree: every public function of the modules in `app/store/` and `app/export/`, and every public
method (and `__init__`) of their public classes; `self` / `cls` do not count, keyword-only, `*args` and
`**kwargs` do.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app/store", "app/export")
MAX_PARAMS = 8


def _param_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _entry_points(source: str) -> list[tuple[str, int]]:
    """(qualified name, parameter count) of each public function and public class method in `source`."""
    found: list[tuple[str, int]] = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            found.append((node.name, _param_count(node)))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for f in node.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not f.name.startswith("_") or f.name == "__init__"
                ):
                    found.append((f"{node.name}.{f.name}", _param_count(f)))
    return found


def test_the_walk_counts_parameters_as_a_caller_passes_them() -> None:
    source = (
        "def wide(a, b, /, c, d=1, *rest, e, f=2, **more): ...\n"
        "class Store:\n"
        "    def __init__(self, path): ...\n"
        "    async def put(self, a, b, *, c): ...\n"
        "    def _private(self, a, b, c, d, e, f, g, h, i): ...\n"
        "def _hidden(a, b, c, d, e, f, g, h, i): ...\n"
    )
    assert _entry_points(source) == [("wide", 8), ("Store.__init__", 1), ("Store.put", 3)]


def test_every_store_and_export_entry_point_takes_at_most_eight_parameters() -> None:
    modules = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    assert len(modules) > 20  # the walk found the packages
    wide = [
        f"{path.relative_to(ROOT)}: {name} takes {n} parameters"
        for path in modules
        for name, n in _entry_points(path.read_text(encoding="utf-8"))
        if n > MAX_PARAMS
    ]
    assert not wide, (
        f"entry points over {MAX_PARAMS} parameters (pass one frozen record instead, as RunStore.record_result "
        "takes a ResultRecord):\n" + "\n".join(wide)
    )
