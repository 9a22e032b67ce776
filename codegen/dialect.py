"""Bring a JSON Schema of an older dialect to 2020-12, where the meaning survives the trip.

A schema without ``$schema`` is read as 2020-12, as is. Drafts 04, 06, 07 and 2019-09 are
converted keyword by keyword:

- ``definitions`` -> ``$defs`` (and the ``$ref`` pointers into them);
- array-form ``items`` -> ``prefixItems``, and ``additionalItems`` -> ``items``;
- draft-04 boolean ``exclusiveMinimum``/``exclusiveMaximum`` -> the numeric form;
- ``dependencies`` -> ``dependentRequired`` (name lists) and ``dependentSchemas`` (schemas);
- a ``$ref``'s sibling assertions, which those drafts ignore, are dropped (annotations stay);
- a root ``$id``/``id`` is dropped when every reference is local.

Refused, with the JSON pointer and the reason: remote references, embedded resources (``$id``
below the root), ``$recursiveRef``, and unknown dialects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blade_codegen.schemas import ANNOTATIONS, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_SINGLE, subschemas

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
    document = (
        {k: v for k, v in schema.items() if k != "$schema"} if isinstance(schema, dict) else schema
    )
    if dialect != "2020-12":
        document = _Converter(dialect, refusals).convert(document, "", root=True)
    _check_references(document, "", refusals)
    if refusals:
        raise NotConvertible(refusals)
    return document


class _Converter:
    def __init__(self, dialect: str, refusals: list[Refusal]) -> None:
        self.dialect = dialect
        self.refusals = refusals

    def convert(self, node: Any, at: str, root: bool = False) -> Any:
        if not isinstance(node, dict):
            return node
        node = dict(node)
        for key in ("$id", "id") if self.dialect == "draft-04" else ("$id",):
            if key in node and isinstance(node[key], str):
                if not root:
                    self.refusals.append(
                        Refusal(f"{at}/{key}", "an embedded resource ($id below the root)")
                    )
                del node[key]
        if "$recursiveRef" in node or "$recursiveAnchor" in node:
            self.refusals.append(Refusal(at, "$recursiveRef has no 2020-12 equivalent here"))
        if isinstance(node.get("$ref"), str) and self.dialect != "2019-09":
            # Drafts up to 07 ignore everything beside a $ref: keep only annotations.
            node = {k: v for k, v in node.items() if k == "$ref" or k in ANNOTATIONS}
            node["$ref"] = _definitions_to_defs(node["$ref"])
            return node
        if isinstance(node.get("$ref"), str):
            node["$ref"] = _definitions_to_defs(node["$ref"])
        if "definitions" in node and isinstance(node["definitions"], dict):
            merged = {**node.pop("definitions"), **node.get("$defs", {})}
            node["$defs"] = merged
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

    def _children(self, node: dict[str, Any], at: str) -> dict[str, Any]:
        for key in (*SCHEMA_MAPS, "$defs", "dependentSchemas"):
            if isinstance(node.get(key), dict):
                node[key] = {
                    name: self.convert(sub, f"{at}/{key}/{_escape(name)}")
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
            where = at + "".join(f"/{_escape(str(p))}" for p in path)
            refusals.append(Refusal(f"{where}/$ref", f"{ref!r} is not local: nothing is fetched"))


def _escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")
