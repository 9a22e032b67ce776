"""Rewrites of generated models that accept exactly the same values and cost less to build.

The runtime builds ``ctx.input`` from every call's arguments, so the input model's validation is
on the hot path. Three shapes datamodel-code-generator writes cost more than they must:

- a root model per constrained scalar item (``list[XTag]`` with ``class XTag(RootModel[str])``):
  a model instance per item, and a ``.root`` for the user to unwrap. Written as a type alias
  instead (``XTag: TypeAlias = Annotated[str, Field(...)]``), the items are plain values;
- numeric bounds on ``float | int``, which pydantic checks with a Python validator after the
  union: each member gets its own bounds instead (integral ones for ``int``), checked in Rust
  (not with a multipleOf, whose float check in Rust has a tolerance the Python one lacks);
- ``validate_by_name=True`` on a model without aliases: a second key lookup per field for nothing.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Collection, Iterator

from blade_codegen.syntax import (
    code_lines,
    config_call,
    is_name,
    node_span,
    nodes,
    parsed,
    source_of,
    spliced,
    union_members,
    with_imports,
)

# The names a scalar root's annotation may use: builtins and the constraint spellings only, so
# an inlined alias never refers to a class (and so never to itself).
_SCALAR_NAMES = frozenset(
    {"str", "int", "float", "bool", "None", "Literal", "Annotated", "Field", "StringConstraints"}
)
_NUMERIC = ("gt", "ge", "lt", "le")

Span = tuple[ast.expr, str]  # a node of the parsed code and its replacement text


def _replace(code: str, spans: list[Span]) -> str:
    """The code with each node's source replaced (nodes that do not overlap)."""
    return spliced(code, [(*node_span(code, node), text) for node, text in spans])


def inline_scalar_roots(code: str, keep: Collection[str]) -> str:
    """Root models of a constrained scalar as type aliases of the same name (not the classes in
    ``keep``: the ones the module's spec and other modules refer to as models)."""
    tree = parsed(code)
    uses_outside_annotations = _names_used_as_values(code)
    lines = code_lines(code)
    replaced: list[tuple[int, int, str]] = []
    for node in tree.body:
        annotation = _scalar_root(node)
        if (
            annotation is None
            or not isinstance(node, ast.ClassDef)
            or node.name in keep
            or node.name in uses_outside_annotations
        ):
            continue
        text = source_of(code, annotation)
        alias = f"{node.name}: TypeAlias = {text}\n"
        body = node.body
        if isinstance(body[0], ast.Expr):  # the docstring stays, as the alias's docstring
            alias += "".join(lines[body[0].lineno - 1 : body[0].end_lineno]).lstrip() + "\n"
        replaced.append((node.lineno, node.end_lineno or node.lineno, alias))
    if not replaced:
        return code
    for first, last, text in sorted(replaced, reverse=True):
        lines[first - 1 : last] = [text]
    return with_imports("".join(lines), "from typing import TypeAlias\n")


def _scalar_root(node: ast.stmt) -> ast.expr | None:
    """The annotation of ``root`` when ``node`` is a root model of a scalar and nothing else
    (no configuration, no default, no validator): else None."""
    if not (
        isinstance(node, ast.ClassDef)
        and len(node.bases) == 1
        and isinstance(node.bases[0], ast.Subscript)
        and is_name(node.bases[0].value, "RootModel")
        and not node.decorator_list
        and not node.keywords
    ):
        return None
    statements = node.body[1:] if _is_docstring(node.body[0]) else node.body
    if len(statements) != 1:
        return None
    root = statements[0]
    if not (
        isinstance(root, ast.AnnAssign)
        and isinstance(root.target, ast.Name)
        and root.target.id == "root"
        and root.value is None
    ):
        return None
    names = {sub.id for sub in ast.walk(root.annotation) if isinstance(sub, ast.Name)}
    return root.annotation if names <= _SCALAR_NAMES else None


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _names_used_as_values(code: str) -> set[str]:
    """Names the code uses other than in annotations and class bases (a call, an attribute, a
    default): a class used so must stay a class."""
    typed = [node.annotation for node in nodes(code, ast.AnnAssign)]
    typed += [base for node in nodes(code, ast.ClassDef) for base in node.bases]
    in_types = {id(sub) for expression in typed for sub in ast.walk(expression)}
    return {
        node.id
        for node in nodes(code, ast.Name)
        if isinstance(node.ctx, ast.Load) and id(node) not in in_types
    }


def bounds_per_member(code: str) -> str:
    """``Annotated[float | int | ..., Field(ge=a, le=b, ...)]`` as ``Annotated[float, Field(ge=a,
    le=b)] | Annotated[int, Field(ge=ceil(a), le=floor(b))] | ...`` (the other keywords stay on
    the outer Field). The same numbers pass; an int stays an int."""
    spans: list[Span] = []
    for sub in _annotated(code):
        rewritten = _split_bounds(sub)
        if rewritten is not None:
            spans.append((sub, rewritten))
    return _replace(code, spans)


def _annotated(code: str) -> Iterator[ast.Subscript]:
    for node in nodes(code, ast.AnnAssign):
        value: ast.expr = node.annotation
        if isinstance(node.value, ast.Subscript):
            value = node.value  # a type alias: X: TypeAlias = Annotated[...]
        for sub in ast.walk(value):
            if isinstance(sub, ast.Subscript) and is_name(sub.value, "Annotated"):
                yield sub


def _split_bounds(annotated: ast.Subscript) -> str | None:
    parts = annotated.slice.elts if isinstance(annotated.slice, ast.Tuple) else []
    if len(parts) != 2 or not _is_field_call(parts[1]):
        return None
    members = union_members(parts[0])
    names = [ast.unparse(m) for m in members]
    if (
        "float" not in names
        or "int" not in names
        or set(names) - {"float", "int", "MISSING", "None"}
    ):
        return None
    field = parts[1]
    assert isinstance(field, ast.Call)
    bounds = {k.arg: _number(k.value) for k in field.keywords if k.arg in _NUMERIC}
    if (
        not bounds
        or field.args
        or any(value is None for value in bounds.values())
        # pydantic-core's float multiple_of has a tolerance the Python check lacks: kept as is
        or any(k.arg == "multiple_of" for k in field.keywords)
    ):
        return None
    as_int = {key: _int_bound(key, value) for key, value in bounds.items() if value is not None}
    rest = [ast.unparse(k) for k in field.keywords if k.arg not in _NUMERIC]
    float_bounds = ", ".join(ast.unparse(k) for k in field.keywords if k.arg in _NUMERIC)
    int_bounds = ", ".join(f"{key}={value}" for key, value in as_int.items())
    union = " | ".join(
        (
            f"Annotated[float, Field({float_bounds})]"
            if name == "float"
            else f"Annotated[int, Field({int_bounds})]" if name == "int" else name
        )
        for name in names
    )
    return f"Annotated[{union}, Field({', '.join(rest)})]" if rest else union


def _is_field_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and is_name(node.func, "Field")


def _number(node: ast.expr) -> float | int | None:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return value


def _int_bound(key: str, value: float | int) -> int:
    """The integer bound that lets through exactly the integers ``value`` lets through."""
    return math.ceil(value) if key in ("ge", "lt") else math.floor(value)


def by_name_only_with_aliases(code: str) -> str:
    """``validate_by_name=True`` left out of plain models (bases: BaseModel only) whose fields
    have no alias: there is nothing but the name to validate by."""
    spans: list[Span] = []
    for node in nodes(code, ast.ClassDef):
        if not (
            len(node.bases) == 1
            and is_name(node.bases[0], "BaseModel")
            and not any(
                isinstance(sub, ast.keyword) and sub.arg == "alias" for sub in ast.walk(node)
            )
        ):
            continue
        config = config_call(node)
        if config is not None and any(k.arg == "validate_by_name" for k in config.keywords):
            kept = [ast.unparse(k) for k in config.keywords if k.arg != "validate_by_name"]
            spans.append((config, f"ConfigDict({', '.join(kept)})"))
    return _replace(code, spans)
