"""Reference cycles kept away from the generator's collapsing of value models.

datamodel-code-generator writes a definition that is not an object model (a union, an array, a
map: a *root model*) inline where it is used ("collapsing" it). Where a reference cycle passes
through a class or through more than one definition, the collapse loses members of the unions that
reach the cycle through value definitions: ``item = oneOf[subs, F]`` with ``subs = anyOf[string,
R]`` and ``R`` holding ``default: array of subs`` became ``F`` alone, refusing every string the
schema accepts; ``anyOf[string, M]`` with ``M`` a map of that union lost ``M``; a value definition
that only leads to a cycle of classes loses its members the same way (0.89.0, with the pinned
preset). The same shapes without the cycle are right, and so is a value definition that refers
to itself alone (``tree = array of tree``), which the generator keeps as a named root model.

So the generator collapses none of those: each value definition on such a cycle, or leading to
one, is written out where it is used (its body, references to classes kept), which is what the
collapse would have done; inside itself it stays a reference, so what is left are classes and
value definitions that refer to themselves alone. A definition written out everywhere is left out,
as the collapse left it out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from blade_codegen.schemas import ANNOTATIONS, SCHEMA_LISTS, SCHEMA_SINGLE, subschemas

_DEFS = "#/$defs/"
_NOTES = frozenset({*ANNOTATIONS, "default"})


def is_class(node: Any) -> bool:
    """A definition the generator writes as a model class of its own (an object with named
    properties, not a union of objects)."""
    return (
        isinstance(node, dict)
        and node.get("type") == "object"
        and "properties" in node
        and not node.keys() & {"anyOf", "oneOf"}
    )


def _target(node: dict[str, Any]) -> str | None:
    """The definition ``node``'s ``$ref`` names, when it names one whole."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS) and "/" not in ref[len(_DEFS) :]:
        return ref[len(_DEFS) :]
    return None


def _references(schema: Any) -> Iterator[str]:
    for _, node in subschemas(schema):
        target = _target(node)
        if target is not None:
            yield target


def _reachable(edges: Mapping[str, set[str]], start: str) -> set[str]:
    """The definitions ``start`` refers to, directly or through others."""
    seen: set[str] = set()
    todo = list(edges[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(edges[name])
    return seen


def near_cycles(defs: Mapping[str, Any]) -> set[str]:
    """The definitions on a reference cycle of more than one definition or through a class, and
    those that lead to one (a value definition that refers only to itself is left out)."""
    edges = {name: {t for t in _references(body) if t in defs} for name, body in defs.items()}
    reach = {name: _reachable(edges, name) for name in defs}
    on_cycles = {
        name
        for name in defs
        if any(name in reach[other] for other in reach[name] if other != name)
        or (name in reach[name] and is_class(defs[name]))
    }
    return {name for name in defs if name in on_cycles or reach[name] & on_cycles}


def value_cycles_expanded(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (``{"$defs": ...}``) with every reference to a value definition that lies on
    a reference cycle replaced by that definition's body, recursively, except where the expansion
    would enter a definition it is already inside."""
    defs = document.get("$defs")
    if not isinstance(defs, dict):
        return document
    expanded = {name for name in near_cycles(defs) if not is_class(defs[name])}
    if not expanded:
        return document

    def expand(node: Any, inside: frozenset[str]) -> Any:
        if not isinstance(node, dict):
            return node
        target = _target(node)
        if target is not None:
            if target not in expanded or target in inside:
                return node
            body = expand(defs[target], inside | {target})
            notes = {k: v for k, v in node.items() if k != "$ref"}
            if not isinstance(body, dict):  # a boolean schema
                return {**notes, "allOf": [body]} if notes else body
            if (notes.keys() & body.keys()) - _NOTES:
                return {**notes, "allOf": [body]}
            return {**body, **notes}  # the reference's own title or description wins
        changes: dict[str, Any] = {}
        for key, value in node.items():
            if key in SCHEMA_LISTS and isinstance(value, list):
                changes[key] = [expand(sub, inside) for sub in value]
            elif key in SCHEMA_SINGLE and isinstance(value, dict):
                changes[key] = expand(value, inside)
            elif key in ("properties", "patternProperties") and isinstance(value, dict):
                changes[key] = {name: expand(sub, inside) for name, sub in value.items()}
        return {**node, **changes} if changes else node

    written = {name: expand(body, frozenset({name})) for name, body in defs.items()}
    # A definition written out wherever it was used is no class of its own, as the collapse left
    # none: dropped once nothing but itself refers to it (one nothing referred to stays).
    used = set().union(*({t for t in _references(b) if t != n} for n, b in defs.items()))
    uses = {name: set(_references(body)) - {name} for name, body in written.items()}
    while unused := (expanded & used & uses.keys()) - set().union(*uses.values()):
        uses = {name: refs for name, refs in uses.items() if name not in unused}
    written = {name: body for name, body in written.items() if name in uses}
    return {**document, "$defs": written}
