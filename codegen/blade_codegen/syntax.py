"""What the rewrites of generated code share: its syntax tree, parsed once for the rewrites that
read it in turn, and the few questions they all ask of it.

Each rewrite of the generated models (models.py, cheaper.py) and the split of a module (render.py)
takes code as text and returns text. Most of them change nothing in most modules, so the next one
would parse the very same text again: on a large schema set parsing was a fifth of the build.
The trees are shared, so no caller may change one.
"""

from __future__ import annotations

import ast
import itertools
import re
import tokenize
from collections.abc import Iterable
from functools import lru_cache
from typing import TypeVar

N = TypeVar("N", bound=ast.AST)


@lru_cache(maxsize=2)
def parsed(code: str) -> ast.Module:
    """``ast.parse(code)``, the same tree while ``code`` is one of the last two texts parsed (do
    not modify it)."""
    return ast.parse(code)


def nodes(code: str, kind: type[N]) -> tuple[N, ...]:
    """The nodes whose type is ``kind`` (a concrete node class: ``ast.expr`` finds nothing) in
    ``parsed(code)``, in ``ast.walk``'s order. One walk of a text serves every rewrite, where
    each walked the whole tree (nine walks of each module: some 3 s of a 75 s build)."""
    found = _nodes_by_type(code).get(kind, ())
    return found  # type: ignore[return-value]  # the nodes under kind are of type kind


@lru_cache(maxsize=2)
def _nodes_by_type(code: str) -> dict[type[ast.AST], tuple[ast.AST, ...]]:
    found: dict[type[ast.AST], list[ast.AST]] = {}
    for node in ast.walk(parsed(code)):
        found.setdefault(type(node), []).append(node)
    return {kind: tuple(listed) for kind, listed in found.items()}


def code_lines(code: str) -> list[str]:
    """``code``'s lines as the parser counts them (ends kept): ``\\n``, ``\\r\\n`` or ``\\r``
    end a line, not ``str.splitlines``'s other breaks (a U+2028 or a form feed that spec text
    carried into a string literal is part of its line). Rows of ``ast`` and of ``tokens_of``
    index it (a new list each time: callers edit theirs)."""
    return list(_lines(code))


def tokens_of(code: str) -> list[tokenize.TokenInfo]:
    """``code``'s tokens, their rows counted as in ``code_lines`` (tokenize's own reading of a
    ``StringIO`` breaks lines only at ``\\n``)."""
    return list(tokenize.generate_tokens(iter(_lines(code)).__next__))


def offset(code: str, row: int, column: int) -> int:
    """The index in ``code`` of a tokenize position: its row, and its column in characters."""
    return _starts(code)[row - 1] + column


def ast_offset(code: str, row: int, column: int) -> int:
    """The index in ``code`` of an ast position: its row, and its column in UTF-8 bytes (after
    non-ASCII text on the line, not a character column)."""
    return _starts(code)[row - 1] + len(_lines(code)[row - 1].encode()[:column].decode())


def node_span(code: str, node: ast.expr) -> tuple[int, int]:
    """Where ``node``'s source starts and ends in ``code`` (indices)."""
    end_row, end_column = node.end_lineno or node.lineno, node.end_col_offset or 0
    return ast_offset(code, node.lineno, node.col_offset), ast_offset(code, end_row, end_column)


def source_of(code: str, node: ast.expr) -> str:
    """The source text of ``node`` (``ast.get_source_segment``, which splits the whole text into
    lines on every call: a twentieth of a large build, for a few hundred calls)."""
    start, end = node_span(code, node)
    return code[start:end]


Edit = tuple[int, int, str]  # start and end index in the code, and the text put there


def spliced(code: str, edits: Iterable[Edit]) -> str:
    """``code`` with each edit made: the text between its indices (as ``offset``, ``ast_offset``
    and ``node_span`` give them) replaced, or inserted where they are equal. Edits do not
    overlap; those at one place are made in the order of their texts."""
    pieces, last = [], 0
    for start, end, text in sorted(edits):
        pieces += [code[last:start], text]
        last = end
    return "".join(pieces) + code[last:]


# Where a line ends for the parser: \r\n, \r or \n (not str.splitlines's other breaks).
_LINE_END = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")


@lru_cache(maxsize=2)
def _lines(code: str) -> list[str]:
    return _LINE_END.split(code)


@lru_cache(maxsize=2)
def _starts(code: str) -> list[int]:
    """Where each of ``_lines(code)`` starts in ``code``."""
    return list(itertools.accumulate((len(line) for line in _lines(code)), initial=0))


def forget() -> None:
    """Drop every shared tree, node list, line list and line start (the build's last modules'
    are not kept alive: ``build --watch`` stays)."""
    for cache in (parsed, _nodes_by_type, _lines, _starts):
        cache.cache_clear()


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
