"""Example values for compatibility findings: a value the old schema accepts and the new one
rejects (or the reverse), built from the change and checked with both validators.

Candidates come from the change itself (the removed enum value, a string one character past the
new maximum length, the added branch's minimal instance...), are placed at the change's location
inside a minimal instance of the whole schema, and are kept only if the two validators disagree
the right way. Formats are asserted here: generated clients parse them.
"""

from __future__ import annotations

from typing import Any

import exrex  # type: ignore[import-untyped]
import jsonschema_rs

from blade_codegen.compat import Change, Direction, deref

_SAMPLES: list[Any] = [None, True, 0, 1.5, "x", [], {}]
_FORMATS = {
    "date": "2025-03-01",
    "date-time": "2025-03-01T09:30:00Z",
    "time": "09:30:00Z",
    "email": "someone@example.com",
    "uri": "https://example.com/a",
    "uuid": "6f1c2a52-3c1b-4a55-9d0e-0c6e3a1f8b11",
    "ipv4": "192.0.2.1",
    "hostname": "example.com",
}
_MAX_DEPTH = 8


def example(change: Change, old: Any, new: Any, direction: Direction) -> tuple[bool, Any]:
    """``(True, value)`` for a value that shows ``change`` breaks ``direction``, if one is found.

    Accepting breaks: the old schema accepts the value, the new one rejects it; emitting breaks:
    the reverse. A semantic change (a default) has a value both accept that means two things.
    """
    try:
        old_valid = _validator(old)
        new_valid = _validator(new)
    except (ValueError, jsonschema_rs.ValidationError):
        return False, None
    accepts, accepting_root = (old_valid, old) if direction == "accepting" else (new_valid, new)
    rejects = new_valid if direction == "accepting" else old_valid
    semantic = change.effect == "semantic"
    path = change.instance_path[:-1] if semantic else change.instance_path
    for candidate in _candidates(change, old, new, semantic):
        instance = _embed(candidate, path, accepting_root)
        try:
            if accepts(instance) and (semantic or not rejects(instance)):
                return True, instance
            if semantic and old_valid(instance) and new_valid(instance):
                return True, instance
        except (ValueError, OverflowError):
            continue
    return False, None


_COMPILED: dict[int, tuple[Any, Any]] = {}


def _validator(schema: Any) -> Any:
    """The schema's format-asserting validator, compiled once however many findings a part has
    (the findings of one part share the same two schema objects)."""
    seen = _COMPILED.get(id(schema))
    if seen is None or seen[0] is not schema:
        if len(_COMPILED) > 64:
            _COMPILED.clear()
        seen = _COMPILED[id(schema)] = (
            schema,
            jsonschema_rs.validator_for(schema, validate_formats=True).is_valid,
        )
    return seen[1]


def _candidates(change: Change, old: Any, new: Any, semantic: bool) -> list[Any]:
    if semantic:
        parent = change.instance_path[:-1]
        return [_minimal(_at(old, parent), old)]
    values: list[Any] = []
    types = change.rule.startswith(("TYPE", "NULL"))  # sides name types: try values of them
    for side in (change.old, change.new):
        if types and isinstance(side, list) and all(isinstance(t, str) for t in side):
            values.extend(_minimal({"type": t}, {}) for t in side)
        elif isinstance(side, list):
            values.extend(side)
        elif isinstance(side, dict):
            if "exclusive" in side and len(side) == 1:
                values.extend(_around(side["exclusive"]))
            else:
                values.append(_minimal(side, new if side is change.new else old))
        elif isinstance(side, bool):
            pass
        elif isinstance(side, int | float):
            values.extend(_around(side))
            values.extend(_sized(int(side), _at(old, change.instance_path), old))
        elif isinstance(side, str) and types:
            values.append(_minimal({"type": side}, {}))  # a value of the type, not its name
        elif isinstance(side, str):
            values.append(side)
            if side in _FORMATS:
                values.append(_FORMATS[side])
    if change.rule.startswith("FORMAT"):
        values.extend(_FORMATS.values())
    if change.rule.startswith("REQUIRED"):
        values = [_minimal(_at(old, change.instance_path), old)]
        values.append(_minimal(_at(new, change.instance_path), new))
    if change.rule.startswith("UNIQUE_ITEMS"):
        item = _minimal(_at(old, change.instance_path), old)
        values.append(item * 2 if isinstance(item, list) and item else [0, 0])
    values.extend(_SAMPLES)
    return values


def _around(value: float) -> list[Any]:
    return [value, value - 1, value + 1, value - 0.5, value + 0.5, value * 2]


def _sized(size: int, schema: Any, root: Any) -> list[Any]:
    """Strings, arrays and objects of about ``size`` elements (for length and count bounds)."""
    out: list[Any] = []
    item = (
        _minimal(deref(schema, root).get("items", None), root)
        if isinstance(deref(schema, root), dict)
        else None
    )
    for n in (size - 1, size, size + 1):
        if 0 <= n <= 10_000:
            out.append("x" * n)
            out.append([item] * n)
            out.append({f"k{i}": item for i in range(n)})
    return out


def _at(root: Any, path: tuple[str | int, ...]) -> Any:
    """The subschema that describes the instance at ``path`` (first branch of any union)."""
    node = deref(root, root)
    for step in path:
        node = deref(_branch(node, root), root)
        if not isinstance(node, dict):
            return True
        if isinstance(step, int):
            prefix = node.get("prefixItems", [])
            node = prefix[step] if step < len(prefix) else node.get("items", True)
        elif step == "*" and "items" in node:
            node = node["items"]
        else:
            props = node.get("properties", {})
            node = props[step] if step in props else node.get("additionalProperties", True)
    return deref(node, root)


def _branch(node: Any, root: Any) -> Any:
    if isinstance(node, dict):
        for key in ("oneOf", "anyOf"):
            if key in node and node[key] and "properties" not in node and "items" not in node:
                return deref(node[key][0], root)
    return node


def _minimal(schema: Any, root: Any, depth: int = 0) -> Any:
    """A small instance meant to satisfy ``schema`` (verified by the caller, never assumed)."""
    schema = deref(schema, root)
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None if schema is not True else {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("oneOf", "anyOf"):
        if schema.get(key):
            return _minimal(
                {**_without(schema, key), **deref(schema[key][0], root)}, root, depth + 1
            )
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema or "required" in schema else None
    if kind == "object":
        props = schema.get("properties", {})
        return {
            name: _minimal(props.get(name, True), root, depth + 1)
            for name in schema.get("required", [])
        }
    if kind == "array":
        return [_minimal(schema.get("items", True), root, depth + 1)] * schema.get("minItems", 0)
    if kind == "string":
        if schema.get("format") in _FORMATS:
            return _FORMATS[schema["format"]]
        if isinstance(schema.get("pattern"), str):
            return _matching(schema["pattern"], schema.get("minLength", 0))
        return "x" * max(schema.get("minLength", 0), 1)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return 0 if low is None else (int(low) + 1 if "exclusiveMinimum" in schema else low)
    if kind == "boolean":
        return False
    return None


def _matching(pattern: str, min_length: int) -> str:
    """The first strings exrex enumerates for ``pattern`` (deterministic), long enough."""
    try:
        for text in exrex.generate(pattern, limit=4):
            if len(text) >= min_length:
                return str(text)
    except Exception:  # exrex parses Python syntax; an ECMA-only pattern just gets no example
        pass
    return "x" * max(min_length, 1)


def _without(schema: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != key}


def _embed(value: Any, path: tuple[str | int, ...], root: Any) -> Any:
    """``value`` placed at ``path`` inside a minimal instance of ``root``."""
    if not path:
        return value
    top = _minimal(root, root)
    container = top if isinstance(top, dict | list) else ({} if isinstance(path[0], str) else [])
    result = container
    for depth, step in enumerate(path):
        last = depth == len(path) - 1
        child = value if last else _minimal(_at(root, path[: depth + 1]), root)
        if isinstance(container, list) or isinstance(step, int):
            if not isinstance(container, list):
                return value
            index = step if isinstance(step, int) else 0
            while len(container) <= index:
                container.append(child)
            container[index] = (
                child
                if last
                else (container[index] if isinstance(container[index], dict | list) else child)
            )
            container = container[index]
        else:
            key = "unexpected_property" if step == "*" else step
            if last or not isinstance(container.get(key), dict | list):
                container[key] = child
            container = container[key]
        if not last and not isinstance(container, dict | list):
            return value
    return result


def minimal_instance(schema: Any) -> tuple[bool, Any]:
    """A small value valid against ``schema`` (checked), for documentation examples."""
    value = _minimal(schema, schema)
    return bool(_validator(schema)(value)), value
