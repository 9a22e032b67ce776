"""Walking JSON Schema documents by keyword, so that a property *named* ``$ref`` or ``description``
is never mistaken for the keyword."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

# Keywords whose value is a map of name -> subschema.
SCHEMA_MAPS = ("$defs", "definitions", "properties", "patternProperties", "dependentSchemas")
# Keywords whose value is a list of subschemas.
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
# Keywords whose value is one subschema.
SCHEMA_SINGLE = (
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
ANNOTATIONS = ("title", "description", "examples", "$comment", "deprecated")

Segments = tuple[str | int, ...]


def subschemas(schema: Any, at: Segments = ()) -> Iterator[tuple[Segments, dict[str, Any]]]:
    """Every object subschema of ``schema`` (itself included) with its path, depth first."""
    if not isinstance(schema, dict):
        return
    yield at, schema
    for key in SCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, dict):
            for name, sub in value.items():
                yield from subschemas(sub, (*at, key, name))
    for key in SCHEMA_LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            for index, sub in enumerate(value):
                yield from subschemas(sub, (*at, key, index))
    for key in SCHEMA_SINGLE:
        value = schema.get(key)
        if isinstance(value, list) and key == "items":  # draft-04 tuple form
            for index, sub in enumerate(value):
                yield from subschemas(sub, (*at, key, index))
        elif isinstance(value, dict):
            yield from subschemas(value, (*at, key))


def transform(schema: Any, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """A copy of ``schema`` with ``edit`` applied to every object subschema, children first."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SCHEMA_MAPS:
        value = out.get(key)
        if isinstance(value, dict):
            out[key] = {name: transform(sub, edit) for name, sub in value.items()}
    for key in (*SCHEMA_LISTS, *SCHEMA_SINGLE):
        value = out.get(key)
        if isinstance(value, list) and (key in SCHEMA_LISTS or key == "items"):
            out[key] = [transform(sub, edit) for sub in value]
        elif isinstance(value, dict):
            out[key] = transform(value, edit)
    return edit(out)


def without_annotations(schema: Any) -> Any:
    """The schema with annotation keywords removed: what the wire contract does not depend on."""
    return transform(schema, lambda s: {k: v for k, v in s.items() if k not in ANNOTATIONS})


def resolve_pointer(document: Any, fragment: str) -> tuple[bool, Any]:
    """Follow a JSON pointer fragment (``/a/b``, already URL-decoded) into ``document``."""
    node = document
    if not fragment:
        return True, node
    for raw in fragment.split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return False, None
    return True, node
