"""Bring a JSON Schema of an older dialect to 2020-12, where the meaning survives the trip.

A schema without ``$schema`` is read as 2020-12, as is. Drafts 04, 06, 07 and 2019-09 are
converted keyword by keyword:

- ``definitions`` -> ``$defs`` (and the ``$ref`` pointers into them);
- array-form ``items`` -> ``prefixItems``, and ``additionalItems`` -> ``items``;
- draft-04 boolean ``exclusiveMinimum``/``exclusiveMaximum`` -> the numeric form;
- ``dependencies`` -> ``dependentRequired`` (name lists) and ``dependentSchemas`` (schemas);
- a ``$ref``'s sibling assertions, which those drafts ignore, are dropped (annotations stay);
- a root ``$id``/``id`` is dropped when every reference is local, and so are pointer-shaped ones
  below it (``"$id": "#/properties/x"``, which generators write and no ``$ref`` depends on).

Refused, with the JSON pointer and the reason: remote references, embedded resources (any other
``$id`` below the root), ``$recursiveRef``, and unknown dialects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blade_codegen.problems import pointer
from blade_codegen.schemas import (
    ANNOTATIONS,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_SINGLE,
    resolve_pointer,
    subschemas,
)

DIALECTS = {
    "http://json-schema.org/draft-04/schema": "draft-04",
    "http://json-schema.org/draft-06/schema": "draft-06",
    "http://json-schema.org/draft-07/schema": "draft-07",
    "https://json-schema.org/draft/2019-09/schema": "2019-09",
    "https://json-schema.org/draft/2020-12/schema": "2020-12",
}


@dataclass(frozen=True)
class Refusal:
    """A place whose meaning cannot be kept in 2020-12."""

    pointer: str
    reason: str


class NotConvertible(Exception):
    def __init__(self, refusals: list[Refusal]) -> None:
        super().__init__("; ".join(f"{r.pointer or '/'}: {r.reason}" for r in refusals))
        self.refusals = refusals


def dialect_of(schema: Any) -> str:
    """The dialect a schema declares ("2020-12" when it declares none)."""
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    if declared is None:
        return "2020-12"
    key = (
        str(declared)
        .rstrip("#")
        .replace("https://json-schema.org/draft-0", "http://json-schema.org/draft-0")
    )
    if key not in DIALECTS:
        raise NotConvertible([Refusal("/$schema", f"unknown dialect {declared!r}")])
    return DIALECTS[key]


def to_2020_12(schema: Any) -> Any:
    """``schema`` in draft 2020-12, without ``$schema``; NotConvertible lists what cannot be."""
    dialect = dialect_of(schema)
    refusals: list[Refusal] = []
    document = schema
    if isinstance(schema, dict):
        document = {k: v for k, v in schema.items() if k != "$schema"}
    document = _Converter(dialect, refusals).convert(document, "", root=True)
    _check_references(document, "", refusals)
    if refusals:
        raise NotConvertible(refusals)
    return _inline_root_ref(document)


def _inline_root_ref(document: Any) -> Any:
    """A root that is only a ``$ref`` (besides definitions and annotations) becomes its target,
    so that an object schema reached through a reference is an object schema at the root."""
    if not isinstance(document, dict) or not isinstance(document.get("$ref"), str):
        return document
    ref: str = document["$ref"]
    found, target = resolve_pointer(document, ref[1:]) if ref.startswith("#/") else (False, None)
    if set(document) - {"$ref", "$defs", "definitions", *ANNOTATIONS}:
        return document
    if not found or not isinstance(target, dict) or "$ref" in target:
        return document
    rest = {k: v for k, v in document.items() if k != "$ref"}
    return {**rest, **{k: v for k, v in target.items() if k not in ("$defs", "definitions")}}


class _Converter:
    def __init__(self, dialect: str, refusals: list[Refusal]) -> None:
        self.dialect = dialect
        self.refusals = refusals

    def convert(self, node: Any, at: str, root: bool = False) -> Any:
        if not isinstance(node, dict):
            return node
        node = dict(node)
        self._identifiers(node, at, root)
        if "deprecated" in node and not isinstance(node["deprecated"], bool):
            node["deprecated"] = True  # an annotation; a message there is not 2020-12
        if self.dialect == "2020-12":
            return self._children(node, at)
        if "$recursiveRef" in node or "$recursiveAnchor" in node:
            self.refusals.append(Refusal(at, "$recursiveRef has no 2020-12 equivalent here"))
        if isinstance(node.get("$ref"), str):
            node["$ref"] = _definitions_to_defs(node["$ref"])
            if self.dialect != "2019-09":
                # Those drafts ignore assertions beside a $ref: keep annotations, and
                # definitions (still reachable by pointer).
                kept = ("$ref", "definitions", "$defs", *ANNOTATIONS)
                node = {k: v for k, v in node.items() if k in kept}
        if isinstance(node.get("definitions"), dict):
            node["$defs"] = {**node.pop("definitions"), **node.get("$defs", {})}
        if isinstance(node.get("items"), list):
            node["prefixItems"] = node.pop("items")
            if "additionalItems" in node:
                node["items"] = node.pop("additionalItems")
        elif "additionalItems" in node:
            del node["additionalItems"]  # ignored beside a schema-form items
        if self.dialect == "draft-04":
            for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
                if isinstance(node.get(flag), bool):
                    exclusive = node.pop(flag)  # draft-04: a flag on the bound beside it
                    if exclusive and bound in node:
                        node[flag] = node.pop(bound)
        if isinstance(node.get("dependencies"), dict):
            for name, value in node.pop("dependencies").items():
                target = "dependentRequired" if isinstance(value, list) else "dependentSchemas"
                node.setdefault(target, {})[name] = value
        return self._children(node, at)

    def _identifiers(self, node: dict[str, Any], at: str, root: bool) -> None:
        for key in ("$id", "id") if self.dialect == "draft-04" else ("$id",):
            identifier = node.get(key)
            if isinstance(identifier, str):
                # A pointer-shaped fragment ("#/properties/x", as generators write) names nothing
                # a $ref could use that its pointer does not: dropping it keeps the meaning.
                if not root and not (identifier == "#" or identifier.startswith("#/")):
                    self.refusals.append(
                        Refusal(f"{at}/{key}", f"{identifier!r} starts an embedded resource")
                    )
                del node[key]

    def _children(self, node: dict[str, Any], at: str) -> dict[str, Any]:
        for key in (*SCHEMA_MAPS, "$defs", "dependentSchemas"):
            if isinstance(node.get(key), dict):
                node[key] = {
                    name: self.convert(sub, at + pointer(key, name))
                    for name, sub in node[key].items()
                }
        for key in (*SCHEMA_LISTS, "prefixItems"):
            if isinstance(node.get(key), list):
                node[key] = [
                    self.convert(sub, f"{at}/{key}/{i}") for i, sub in enumerate(node[key])
                ]
        for key in SCHEMA_SINGLE:
            if isinstance(node.get(key), dict):
                node[key] = self.convert(node[key], f"{at}/{key}")
        return node


def _definitions_to_defs(ref: str) -> str:
    """``#/definitions/A`` -> ``#/$defs/A``; a property named "definitions" keeps its name."""
    if not ref.startswith("#/"):
        return ref
    parts = ref[2:].split("/")
    out = [
        "$defs" if part == "definitions" and (i == 0 or parts[i - 1] != "properties") else part
        for i, part in enumerate(parts)
    ]
    return "#/" + "/".join(out)


def _check_references(node: Any, at: str, refusals: list[Refusal]) -> None:
    for path, sub in subschemas(node):
        ref = sub.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            where = at + pointer(*path)
            refusals.append(Refusal(f"{where}/$ref", f"{ref!r} is not local: nothing is fetched"))
