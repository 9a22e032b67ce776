"""What the rewrites of generated code share: its syntax tree, parsed once for the rewrites that
read it in turn, and the few questions they all ask of it.

Each rewrite of the generated models (models.py, cheaper.py) and the split of a module (render.py)
takes code as text and returns text. Most of them change nothing in most modules, so the next one
would parse the very same text again: on a large schema set parsing was a fifth of the build.
The trees are shared, so no caller may change one.
"""

from __future__ import annotations

import ast
from functools import lru_cache


@lru_cache(maxsize=2)
def parsed(code: str) -> ast.Module:
    """``ast.parse(code)``, the same tree while ``code`` is one of the last two texts parsed (do
    not modify it)."""
    return ast.parse(code)


def is_name(node: ast.expr, name: str) -> bool:
    """``node`` is the bare name ``name`` (what ``ast.unparse(node) == name`` says, for free)."""
    return isinstance(node, ast.Name) and node.id == name


def union_members(node: ast.expr) -> list[ast.expr]:
    """The members of ``A | B | ...``, left to right (``[node]`` for anything else)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return union_members(node.left) + union_members(node.right)
    return [node]


def config_call(cls: ast.ClassDef) -> ast.Call | None:
    """The ``ConfigDict(...)`` a model class assigns in its body (its ``model_config``)."""
    for statement in cls.body:
        value = statement.value if isinstance(statement, ast.Assign) else None
        if isinstance(value, ast.Call) and is_name(value.func, "ConfigDict"):
            return value
    return None


def with_imports(code: str, imports: str) -> str:
    """``code`` with import lines added at its end (``from __future__`` must stay first); the
    module split merges imports and keeps the used ones."""
    return code + ("" if code.endswith("\n") else "\n") + imports
