"""The runtime's rings hold: the core imports no outer ring, no module-level import cycle exists,
and importing a generated package imports no store driver.

The rings, innermost first (DESIGN.md): ``core``; then ``stores``; then the facade
(``blade_runtime.runtime``) and ``client``; then ``serving`` and ``adapters``. A module may import
its own ring and the rings inside it, never one outside.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "runtime" / "blade_runtime"

# What each ring may import besides itself (the package's ``__init__`` re-exports everything and
# is nobody's dependency: a submodule importing it would import every ring).
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "stores": {"core"},
    "runtime": {"core", "stores"},
    "client": {"core", "runtime"},
    "serving": {"core", "stores", "runtime", "client", "version", "temporal"},
    "adapters": {"core", "runtime"},
    # An outer ring like the adapters: the Temporal worker runs a Runtime on a memory store,
    # and the typed client reaches Temporal through a Transport.
    "temporal": {"core", "stores", "runtime", "client"},
    # Outside the core, which never imports it: tracing is an observer a runtime is given.
    "otel": {"core"},
    # The MCP bridge: an outer ring like the adapters; it registers tools on the runtime it is
    # handed (through its public methods) and builds specs and failures of the core's.
    "remote": {"core"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _ring(module: str) -> str:
    parts = module.split(".")
    return "init" if len(parts) == 1 else parts[1]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, *, module_level: bool) -> set[str]:
    """The blade_runtime modules ``path`` imports (at module level only, or anywhere), without
    what it imports for type checking alone. ``from blade_runtime import __version__`` is
    recorded as ``blade_runtime.version``."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("blade_runtime"))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == "blade_runtime":
                    for alias in node.names:
                        found.add(
                            "blade_runtime.version"
                            if alias.name == "__version__"
                            else f"blade_runtime.{alias.name}"
                        )
                elif node.module.startswith("blade_runtime."):
                    found.add(node.module)
            if not module_level:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        visit([child])
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body + node.orelse + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return found


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _outward(module: str, imported: set[str]) -> list[str]:
    ring = _ring(module)
    if ring == "init":
        return []
    allowed = MAY_IMPORT[ring] | {ring}
    return sorted(i for i in imported if _ring(i) not in allowed)


def test_every_module_belongs_to_a_ring() -> None:
    rings = {_ring(m) for m in _modules()}
    assert rings == set(MAY_IMPORT) | {"init"}


def test_no_ring_imports_outward() -> None:
    """Anywhere in a module, function bodies included: a lazy import outward is still one."""
    problems = {}
    for module, path in _modules().items():
        outward = _outward(module, _imports(path, module_level=False))
        if outward:
            problems[module] = outward
    assert problems == {}


def test_the_contract_check_sees_an_outward_import(tmp_path: Path) -> None:
    """The check above is not vacuous: a core module importing a store is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from blade_runtime.stores.sqlite import SQLiteStore\n")
    assert _outward("blade_runtime.core.bad", _imports(bad, module_level=False)) == [
        "blade_runtime.stores.sqlite"
    ]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {
        module: {i for i in _imports(path, module_level=True) if i in modules}
        for module, path in modules.items()
    }
    assert _cycles(graph) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_importing_a_generated_package_imports_no_store_driver(built_examples: Path) -> None:
    probe = (
        "import os, sys, json\n"
        "hooks = []\n"
        "real = os.register_at_fork\n"
        "def counted(**kw):\n"
        "    if sys._getframe(1).f_globals.get('__name__', '').startswith('blade_runtime'):\n"
        "        hooks.append(kw)\n"
        "    real(**kw)\n"
        "os.register_at_fork = counted\n"
        "import blade_specs, blade_specs.client\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlite3', '_sqlite3', "
        "'psycopg', 'psycopg_pool', 'starlette', 'httpx', 'mcp', 'temporalio') or m.startswith("
        "'blade_runtime.stores.') and m != 'blade_runtime.stores.memory')\n"
        "print(json.dumps({'loaded': loaded, 'fork_hooks': len(hooks)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=built_examples,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout) == {"loaded": [], "fork_hooks": 0}
