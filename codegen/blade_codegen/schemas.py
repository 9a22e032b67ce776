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


_KIND = {
    **{key: "map" for key in SCHEMA_MAPS},
    **{key: "list" for key in SCHEMA_LISTS},
    **{key: "single" for key in SCHEMA_SINGLE},
}


def transform(schema: Any, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``schema`` with ``edit`` applied to every object subschema, children first.

    Subschemas nothing changed are shared with the input, not copied: rebuilds walk every schema
    of every spec, and most of them are left as they are. A node's own keys are looked up in the
    keyword table (a node has a handful of keys; the table has twenty-one keywords).
    """
    if not isinstance(schema, dict):
        return schema
    changes: dict[str, Any] = {}
    for key, value in schema.items():
        kind = _KIND.get(key)
        if kind is None:
            continue
        if kind == "map":
            if isinstance(value, dict):
                mapped = {name: transform(sub, edit) for name, sub in value.items()}
                if any(mapped[name] is not sub for name, sub in value.items()):
                    changes[key] = mapped
        elif isinstance(value, list):
            if kind == "list" or key == "items":  # "items" as a list: the draft-04 tuple form
                items = [transform(sub, edit) for sub in value]
                if any(new is not old for new, old in zip(items, value, strict=True)):
                    changes[key] = items
        elif kind == "single" and isinstance(value, dict):
            new = transform(value, edit)
            if new is not value:
                changes[key] = new
    return edit({**schema, **changes} if changes else schema)


def without_annotations(schema: Any) -> Any:
    """The schema with annotation keywords removed: what the wire contract does not depend on."""

    def strip(node: dict[str, Any]) -> dict[str, Any]:
        if not any(k in node for k in ANNOTATIONS):
            return node
        return {k: v for k, v in node.items() if k not in ANNOTATIONS}

    return transform(schema, strip)


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
