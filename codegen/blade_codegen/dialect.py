"""Bring a JSON Schema of an older dialect to 2020-12, where the meaning survives the trip.

A schema without ``$schema`` is read as 2020-12, except for the forms 2020-12 does not allow
and older drafts give one meaning (each converted with a note): a boolean
``exclusiveMinimum``/``exclusiveMaximum`` (draft-04) and an array-form ``items`` (drafts 04 to
2019-09). Drafts 04, 06, 07 and 2019-09 are converted keyword by keyword:

- ``definitions`` -> ``$defs`` (and the ``$ref`` pointers into them);
- array-form ``items`` -> ``prefixItems``, and ``additionalItems`` -> ``items``;
- draft-04 boolean ``exclusiveMinimum``/``exclusiveMaximum`` -> the numeric form;
- ``dependencies`` -> ``dependentRequired`` (name lists) and ``dependentSchemas`` (schemas);
- a ``$ref``'s sibling assertions, which those drafts ignore, are dropped (annotations stay);
- a root ``$id``/``id`` is dropped when every reference is local, and so are pointer-shaped ones
  below it (``"$id": "#/properties/x"``, which generators write and no ``$ref`` depends on).

A subschema that declares its own ``$schema`` is converted from that dialect, like a root.
Refused, with the JSON pointer and the reason: remote references, embedded resources (any other
``$id`` below the root), ``$recursiveRef``, unknown dialects, and whatever is still not a valid
2020-12 schema after conversion.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from blade_codegen.problems import pointer
from blade_codegen.schemas import (
    ANNOTATIONS,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_SINGLE,
    resolve_pointer,
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
    hint: str = "edit the schema there, then import again"


@dataclass(frozen=True)
class Note:
    """A place converted on a guess the schema did not declare (no ``$schema``)."""

    pointer: str
    message: str


@dataclass(frozen=True)
class Converted:
    """A schema in 2020-12 and the notes on how it was read."""

    schema: Any
    notes: tuple[Note, ...]


class NotConvertible(Exception):
    def __init__(self, refusals: list[Refusal]) -> None:
        super().__init__("; ".join(f"{r.pointer or '/'}: {r.reason}" for r in refusals))
        self.refusals = refusals


def dialect_of(schema: Any, at: str = "") -> str:
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
        raise NotConvertible(
            [
                Refusal(
                    f"{at}/$schema",
                    f"unknown dialect {declared!r}",
                    "declare draft-04, -06, -07, 2019-09 or 2020-12, or remove $schema",
                )
            ]
        )
    return DIALECTS[key]


def to_2020_12(schema: Any) -> Any:
    """``schema`` in draft 2020-12, without ``$schema``; NotConvertible lists what cannot be."""
    return convert(schema).schema


def convert(schema: Any) -> Converted:
    """``schema`` in draft 2020-12 without ``$schema``, and a note for each place read on a
    guess; NotConvertible lists every place whose meaning cannot be kept."""
    dialect = dialect_of(schema)
    declared = isinstance(schema, dict) and "$schema" in schema
    refusals: list[Refusal] = []
    notes: list[Note] = []
    document = schema
    if isinstance(schema, dict):
        document = {k: v for k, v in schema.items() if k != "$schema"}
    converter = _Converter(dialect, declared, refusals, notes)
    document = converter.convert(document, "", root=True)
    converter.convert_targets(document)
    if not refusals:
        document = _inline_root_ref(document)
        refusals.extend(
            replace(refusal, pointer=_source_pointer(document, refusal.pointer, converter.origins))
            for refusal in _invalid_2020_12(document)
        )
    if refusals:
        raise NotConvertible(refusals)
    return Converted(document, tuple(notes))


def _invalid_2020_12(document: Any) -> list[Refusal]:
    """Where the converted schema is still not a valid 2020-12 schema (the spec would not
    build), one refusal per place.

    jsonschema-rs says whether it is valid (0.02 s for the 150 SchemaStore schemas, where
    python-jsonschema takes 8.7 s); only when it says no does python-jsonschema list the places,
    in its words, so that a stricter verdict of the first (it refuses NaN bounds) refuses nothing
    the second accepts."""
    import jsonschema_rs

    try:
        if jsonschema_rs.meta.is_valid(document):
            return []
    except (jsonschema_rs.ReferencingError, ValueError):
        pass  # a declaration it cannot follow, or a value it cannot hold: the full check decides
    import jsonschema  # type: ignore[import-untyped]

    validator = jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA)
    return [
        Refusal(pointer(*error.absolute_path), f"not valid in JSON Schema 2020-12: {error.message}")
        for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    ]


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
    def __init__(
        self, dialect: str, declared: bool, refusals: list[Refusal], notes: list[Note]
    ) -> None:
        self.dialect = dialect
        self.declared = declared  # False: no $schema said which dialect this is
        self.rename_definitions = dialect != "2020-12"  # the root's dialect, for every node
        self.refusals = refusals
        self.notes = notes
        # id of each converted node -> its source pointer (and the node, kept alive: an id is
        # only unique among objects that live)
        self.origins: dict[int, tuple[str, Any]] = {}
        self.refs: list[str] = []  # every local $ref met, as converted (shared with nested ones)

    def convert(self, node: Any, at: str, root: bool = False) -> Any:
        converted = self._convert(node, at, root)
        if isinstance(converted, dict):
            self.origins[id(converted)] = (at, converted)
        return converted

    def _convert(self, node: Any, at: str, root: bool) -> Any:
        if not isinstance(node, dict):
            return node
        if not root and "$schema" in node:
            return self._nested_dialect(node, at)
        node = dict(node)
        self._identifiers(node, at, root)
        if "deprecated" in node and not isinstance(node["deprecated"], bool):
            node["deprecated"] = True  # an annotation; a message there is not 2020-12
        older = self.dialect != "2020-12"
        if older:
            if "$recursiveRef" in node or "$recursiveAnchor" in node:
                self.refusals.append(
                    Refusal(
                        at,
                        "$recursiveRef has no 2020-12 equivalent here",
                        "write the recursion as a $ref to a definition",
                    )
                )
            if isinstance(node.get("$ref"), str) and self.dialect != "2019-09":
                # Those drafts ignore assertions beside a $ref: keep annotations, and
                # definitions (still reachable by pointer).
                kept = ("$ref", "definitions", "$defs", *ANNOTATIONS)
                node = {k: v for k, v in node.items() if k in kept}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            self.refs.append(_definitions_to_defs(ref) if self.rename_definitions else ref)
        if isinstance(ref, str) and not ref.startswith("#"):
            self.refusals.append(
                Refusal(
                    f"{at}/$ref",
                    f"{ref!r} is not local: nothing is fetched",
                    "copy the schema it names into $defs and point the $ref at it",
                )
            )
        # Subschemas first, under the keywords the source names them by: every refusal and
        # note points at a place of the schema as it was written.
        self._children(node, at)
        if self.rename_definitions:
            # A $ref's "#" is the document's root, so pointers follow the root's dialect.
            if isinstance(node.get("$ref"), str):
                node["$ref"] = _definitions_to_defs(node["$ref"])
            if isinstance(node.get("definitions"), dict):
                node["$defs"] = {**node.pop("definitions"), **node.get("$defs", {})}
        if not older:
            if not self.declared:
                self._older_forms(node, at)
            return node
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
        return node

    def convert_targets(self, document: Any) -> None:
        """Convert, in place, each subschema that only a ``$ref`` reaches: one inside a folder
        no keyword names as a schema (``definitions/a/full``, as generators group definitions)
        was copied as data, its ``$schema`` and older keywords unconverted, and a root ``$ref``
        would bring them to the root."""
        done: set[str] = set()
        while pending := [ref for ref in dict.fromkeys(self.refs) if ref not in done]:
            for ref in pending:
                done.add(ref)
                parts = [
                    p.replace("%25", "%").replace("~1", "/").replace("~0", "~")
                    for p in ref[2:].split("/")
                ]
                parent, node = None, document
                for part in parts:
                    parent = node
                    if isinstance(node, dict) and part in node:
                        node = node[part]
                    elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                        node = node[int(part)]
                    else:
                        node = None
                        break
                if not isinstance(node, dict) or id(node) in self.origins:
                    continue  # not there (validation says so), or converted as a subschema
                at = _source_pointer(document, ref[1:], self.origins)
                converted = self.convert(node, at)
                key = parts[-1]
                if isinstance(parent, dict):
                    parent[key] = converted
                elif isinstance(parent, list):
                    parent[int(key)] = converted

    def _nested_dialect(self, node: dict[str, Any], at: str) -> Any:
        """A subschema declaring its own dialect (SchemaStore schemas do) is converted from it,
        as a root would be; the declaration itself goes (2020-12 allows it only on a resource)."""
        try:
            dialect = dialect_of(node, at)
        except NotConvertible as refused:
            self.refusals.extend(refused.refusals)
            return node
        rest = {k: v for k, v in node.items() if k != "$schema"}
        nested = _Converter(dialect, True, self.refusals, self.notes)
        nested.rename_definitions = self.rename_definitions
        nested.origins = self.origins
        nested.refs = self.refs
        return nested.convert(rest, at)

    def _older_forms(self, node: dict[str, Any], at: str) -> None:
        """Forms 2020-12 forbids in a schema that declares no dialect, where the older drafts
        give them one meaning: converted as those drafts read them, with a note."""
        for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(node.get(flag), bool):
                exclusive = node.pop(flag)
                if exclusive and bound in node:
                    node[flag] = node.pop(bound)
                self.notes.append(
                    Note(
                        f"{at}/{flag}",
                        f"boolean {flag} read as draft-04 (the schema declares no $schema): "
                        + (f"now {flag}: {node[flag]}" if flag in node else "dropped"),
                    )
                )
        if isinstance(node.get("items"), list):
            node["prefixItems"] = node.pop("items")
            if "additionalItems" in node:
                node["items"] = node.pop("additionalItems")
            self.notes.append(
                Note(
                    f"{at}/items",
                    "array-form items read as drafts 04 to 2019-09 do (the schema declares no "
                    "$schema): now prefixItems",
                )
            )

    def _identifiers(self, node: dict[str, Any], at: str, root: bool) -> None:
        for key in ("$id", "id") if self.dialect == "draft-04" else ("$id",):
            identifier = node.get(key)
            if isinstance(identifier, str):
                # A pointer-shaped fragment ("#/properties/x", as generators write) names nothing
                # a $ref could use that its pointer does not: dropping it keeps the meaning.
                if not root and not (identifier == "#" or identifier.startswith("#/")):
                    self.refusals.append(
                        Refusal(
                            f"{at}/{key}",
                            f"{identifier!r} starts an embedded resource",
                            f"remove {key} and reference the schema by its JSON pointer",
                        )
                    )
                del node[key]

    def _children(self, node: dict[str, Any], at: str) -> None:
        """Each subschema of ``node`` converted in place, where the source has it (each once:
        the keyword lists name ``$defs`` and ``dependentSchemas`` once)."""
        maps = (*SCHEMA_MAPS, "dependencies") if self.dialect != "2020-12" else SCHEMA_MAPS
        for key in maps:
            if isinstance(node.get(key), dict):
                node[key] = {
                    name: self.convert(sub, at + pointer(key, name))
                    for name, sub in node[key].items()
                }
        for key in (*SCHEMA_LISTS, "items"):
            if isinstance(node.get(key), list):
                node[key] = [
                    self.convert(sub, f"{at}/{key}/{i}") for i, sub in enumerate(node[key])
                ]
        for key in SCHEMA_SINGLE:
            if isinstance(node.get(key), dict):
                node[key] = self.convert(node[key], f"{at}/{key}")


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


def _source_pointer(document: Any, at: str, origins: dict[int, tuple[str, Any]]) -> str:
    """The place in the source of ``at``, a pointer into the converted ``document``: the
    nearest converted node on the way that came from the source, then the rest of the way."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in at.split("/")[1:]]
    found, rest = origins.get(id(document), ("", None))[0], parts
    node = document
    for i, part in enumerate(parts):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            break
        if id(node) in origins:
            found, rest = origins[id(node)][0], parts[i + 1 :]
    return found + pointer(*rest)
