"""Field names that no JSON key of another field can fill.

A model reads its fields by alias (the property name) and, with ``validate_by_name=True``, by
Python name too, so that code can build it as ``Model(default_prompt=...)``. The generator names
fields after their properties in snake case and numbers a name that is taken: an object with
both ``defaultPrompt`` and ``default_prompt`` got ``default_prompt`` (alias ``defaultPrompt``) and
``default_prompt_1`` (alias ``default_prompt``). The key ``"default_prompt"`` then filled both, one
by name and one by alias: a dump by alias added ``defaultPrompt``, and a union branch requiring
``defaultPrompt`` accepted a value without it.

So no field is named like another field's property: a property whose name another field took
takes its name back (its name is then its key), and the other field gets a name no property has.
"""

from __future__ import annotations

import ast
import keyword
from dataclasses import dataclass

from blade_codegen.syntax import node_span, nodes, spliced


@dataclass
class _Field:
    statement: ast.AnnAssign
    name: str
    key: str  # the property: its alias, or its name when it has none


def _key(statement: ast.AnnAssign, name: str) -> str:
    for sub in ast.walk(statement):
        if (
            isinstance(sub, ast.keyword)
            and sub.arg == "alias"
            and isinstance(sub.value, ast.Constant)
            and isinstance(sub.value.value, str)
        ):
            return sub.value.value
    return name


def _fields(cls: ast.ClassDef) -> list[_Field]:
    return [
        _Field(statement, statement.target.id, _key(statement, statement.target.id))
        for statement in cls.body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    ]


def _renamed(fields: list[_Field]) -> dict[str, str]:
    """Old name -> new name for the fields of one class whose names are other fields' keys."""
    keys = {f.key for f in fields}
    if not any(f.name != f.key and f.name in keys for f in fields):
        return {}
    names = {f.name: f.name for f in fields}
    taken_names = {f.name for f in fields}
    for field in fields:  # a key another field is named by takes its name back
        if field.name != field.key and field.key in taken_names and _usable(field.key):
            names[field.name] = field.key
    for field in fields:  # then whoever still holds another field's key, or a name twice
        name = names[field.name]
        others = [names[f.name] for f in fields if f is not field]
        if (name != field.key and name in keys) or name in others:
            n = 1
            while (candidate := f"{field.name}_{n}") in keys or candidate in names.values():
                n += 1
            names[field.name] = candidate
    return {old: new for old, new in names.items() if old != new}


def _usable(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


def distinct_field_names(code: str) -> str:
    """The generated models with no field named like another field's property."""
    edits = []
    for cls in nodes(code, ast.ClassDef):
        fields = _fields(cls)
        renamed = _renamed(fields)
        for field in fields:
            if field.name in renamed:
                start, end = node_span(code, field.statement.target)
                edits.append((start, end, renamed[field.name]))
    return spliced(code, edits) if edits else code
