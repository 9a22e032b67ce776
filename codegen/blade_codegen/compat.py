"""Compatibility of two versions of one schema: which values the change lets in or shuts out.

The walk compares an old and a new schema at the same instance location and records every change
with its *effect* on the set of accepted values:

- ``widens``: the new schema accepts values the old one rejects (an enum value added);
- ``narrows``: the new schema rejects values the old one accepts (a required property added);
- ``changes``: both (a format changed);
- ``semantic``: the same values, another meaning (a default changed);
- ``undecidable``: the checker cannot tell (``not``, ``if``, two different patterns);
- ``none``: annotations only.

A part the tool *accepts* (input, resume payloads) breaks when a change narrows; a part it *emits*
(output, data records, suspend payloads) breaks when a change widens. ``changes``, ``semantic``
and ``undecidable`` break both. References are followed, so moving a ``$ref`` to an equivalent
definition is no change at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from blade_codegen.schemas import resolve_pointer

Effect = Literal["widens", "narrows", "changes", "semantic", "undecidable", "none"]
Direction = Literal["accepting", "emitting"]

ANNOTATIONS = frozenset(
    {"title", "description", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)
# Keywords whose changes the checker cannot reason about: any change is undecidable.
OPAQUE = {
    "not": "NOT_CHANGED",
    "if": "CONDITIONAL_CHANGED",
    "then": "CONDITIONAL_CHANGED",
    "else": "CONDITIONAL_CHANGED",
    "unevaluatedProperties": "UNEVALUATED_CHANGED",
    "unevaluatedItems": "UNEVALUATED_CHANGED",
    "dependentSchemas": "DEPENDENCIES_CHANGED",
    "dependentRequired": "DEPENDENCIES_CHANGED",
    "patternProperties": "PATTERN_PROPERTIES_CHANGED",
    "contains": "CONTAINS_CHANGED",
    "minContains": "CONTAINS_CHANGED",
    "maxContains": "CONTAINS_CHANGED",
    "$dynamicRef": "DYNAMIC_REF_CHANGED",
}
# Lower and upper bounds: keyword -> (rule stem, which side of the range it bounds).
BOUNDS: dict[str, tuple[str, Literal["low", "high"]]] = {
    "minLength": ("MIN_LENGTH", "low"),
    "maxLength": ("MAX_LENGTH", "high"),
    "minItems": ("MIN_ITEMS", "low"),
    "maxItems": ("MAX_ITEMS", "high"),
    "minProperties": ("MIN_PROPERTIES", "low"),
    "maxProperties": ("MAX_PROPERTIES", "high"),
}
JSON_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


@dataclass(frozen=True)
class Change:
    """One difference between the old and the new schema, at one place."""

    rule: str
    effect: Effect
    schema_path: tuple[str | int, ...]
    instance_path: tuple[str | int, ...]  # "*" for any array item or any other property
    old: Any
    new: Any
    detail: str

    def breaks(self, direction: Direction) -> bool:
        if self.effect in ("changes", "semantic", "undecidable"):
            return True
        return self.effect == ("narrows" if direction == "accepting" else "widens")


def canonical(schema: Any) -> str:
    return json.dumps(_stripped(schema), sort_keys=True, separators=(",", ":"))


def compare(old_root: Any, new_root: Any) -> list[Change]:
    """Every change from ``old_root`` to ``new_root`` (bundled schemas: local ``$ref``s only)."""
    return list(_Walk(old_root, new_root).diff(old_root, new_root, (), ()))


class _Walk:
    def __init__(self, old_root: Any, new_root: Any) -> None:
        self.old_root = old_root
        self.new_root = new_root
        self.visiting: set[tuple[int, int]] = set()

    def diff(
        self, old: Any, new: Any, at: tuple[str | int, ...], where: tuple[str | int, ...]
    ) -> Iterator[Change]:
        old = deref(old, self.old_root)
        new = deref(new, self.new_root)
        pair = (id(old), id(new))
        if pair in self.visiting or canonical(old) == canonical(new):
            return
        self.visiting.add(pair)
        try:
            yield from self._diff(old, new, at, where)
        finally:
            self.visiting.discard(pair)

    def _diff(
        self, old: Any, new: Any, at: tuple[str | int, ...], where: tuple[str | int, ...]
    ) -> Iterator[Change]:
        def change(rule: str, effect: Effect, o: Any, n: Any, detail: str, *path: Any) -> Change:
            return Change(rule, effect, (*at, *path), where, o, n, detail)

        old = {} if old is True else old
        new = {} if new is True else new
        if old is False or new is False or not isinstance(old, dict) or not isinstance(new, dict):
            yield from self._trivial(old, new, at, where)
            return
        for keyword, rule in OPAQUE.items():
            if canonical(old.get(keyword)) != canonical(new.get(keyword)):
                yield change(
                    rule,
                    "undecidable",
                    old.get(keyword),
                    new.get(keyword),
                    f"{keyword} changed; the checker cannot compare it",
                    keyword,
                )
        yield from self._types(old, new, change)
        yield from self._values(old, new, change)
        yield from self._numbers(old, new, change)
        yield from self._strings(old, new, change)
        yield from self._objects(old, new, at, where, change)
        yield from self._arrays(old, new, at, where, change)
        yield from self._unions(old, new, at, where, change)

    def _trivial(
        self, old: Any, new: Any, at: tuple[str | int, ...], where: tuple[str | int, ...]
    ) -> Iterator[Change]:
        if old is False and new is not False:
            yield Change("SCHEMA_OPENED", "widens", at, where, old, new, "nothing was allowed here")
        elif new is False and old is not False:
            yield Change("SCHEMA_CLOSED", "narrows", at, where, old, new, "nothing is allowed here")
        elif old != new:  # not a schema at all: nothing to reason about
            yield Change("SCHEMA_CHANGED", "undecidable", at, where, old, new, "not a schema")

    def _types(self, old: dict[str, Any], new: dict[str, Any], change: Any) -> Iterator[Change]:
        old_types, new_types = _types(old), _types(new)
        if old_types == new_types:
            return
        added = {t for t in new_types - old_types if not (t == "integer" and "number" in old_types)}
        removed = {
            t for t in old_types - new_types if not (t == "integer" and "number" in new_types)
        }
        shown = (old.get("type"), new.get("type"))
        if added and removed:
            yield change("TYPE_CHANGED", "changes", *shown, "the type changed", "type")
        elif added:
            rule = "NULL_ADDED" if added == {"null"} else "TYPE_WIDENED"
            yield change(rule, "widens", *shown, f"now also {_list(added)}", "type")
        elif removed:
            rule = "NULL_REMOVED" if removed == {"null"} else "TYPE_NARROWED"
            yield change(rule, "narrows", *shown, f"no longer {_list(removed)}", "type")

    def _values(self, old: dict[str, Any], new: dict[str, Any], change: Any) -> Iterator[Change]:
        old_values, new_values = _allowed_values(old), _allowed_values(new)
        if old_values != new_values:
            key = "const" if "const" in old or "const" in new else "enum"
            shown = (old.get(key), new.get(key))
            if old_values is None:
                yield change(f"{key.upper()}_ADDED", "narrows", *shown, "values restricted", key)
            elif new_values is None:
                yield change(f"{key.upper()}_REMOVED", "widens", *shown, "any value now", key)
            else:
                added, removed = new_values - old_values, old_values - new_values
                if key == "const" or (added and removed):
                    rule = "CONST_CHANGED" if key == "const" else "ENUM_CHANGED"
                    yield change(rule, "changes", *shown, "the allowed values changed", key)
                elif added:
                    yield change(
                        "ENUM_VALUE_ADDED", "widens", *shown, f"adds {_values(added)}", key
                    )
                else:
                    yield change(
                        "ENUM_VALUE_REMOVED", "narrows", *shown, f"removes {_values(removed)}", key
                    )
        if canonical(old.get("default")) != canonical(new.get("default")):
            if "default" not in old:
                yield change("DEFAULT_ADDED", "none", None, new["default"], "default added")
            else:
                rule = "DEFAULT_REMOVED" if "default" not in new else "DEFAULT_CHANGED"
                yield change(
                    rule,
                    "semantic",
                    old.get("default"),
                    new.get("default"),
                    "a caller that omits the value now means something else",
                    "default",
                )

    def _numbers(self, old: dict[str, Any], new: dict[str, Any], change: Any) -> Iterator[Change]:
        for side in ("low", "high"):
            before, after = _numeric_bound(old, side), _numeric_bound(new, side)
            if before == after:
                continue
            keyword = "minimum" if side == "low" else "maximum"
            stem = "MIN" if side == "low" else "MAX"
            shown = (_show_bound(before), _show_bound(after))
            if before is None:
                yield change(f"{stem}IMUM_ADDED", "narrows", *shown, "new bound", keyword)
            elif after is None:
                yield change(f"{stem}IMUM_REMOVED", "widens", *shown, "bound removed", keyword)
            else:
                tighter = after > before if side == "low" else after < before
                grew = after > before
                rule = f"{stem}_{'INCREASED' if grew else 'DECREASED'}"
                effect: Effect = "narrows" if tighter else "widens"
                yield change(rule, effect, *shown, f"{keyword} {shown[0]} -> {shown[1]}", keyword)
        for keyword, (stem, side) in BOUNDS.items():
            before, after = old.get(keyword), new.get(keyword)
            if before == after:
                continue
            if before is None or after is None:
                added = before is None
                effect = "narrows" if added else "widens"
                rule = f"{stem}_{'ADDED' if added else 'REMOVED'}"
                yield change(rule, effect, before, after, f"{keyword} {before} -> {after}", keyword)
                continue
            tighter = after > before if side == "low" else after < before
            moved = "INCREASED" if after > before else "DECREASED"
            rule = f"{'MIN' if side == 'low' else 'MAX'}_{moved}"
            yield change(
                rule,
                "narrows" if tighter else "widens",
                before,
                after,
                f"{keyword} {before} -> {after}",
                keyword,
            )
        before, after = old.get("multipleOf"), new.get("multipleOf")
        if before != after:
            effect = _multiple_effect(before, after)
            yield change(
                "MULTIPLE_OF_CHANGED",
                effect,
                before,
                after,
                f"multipleOf {before} -> {after}",
                "multipleOf",
            )

    def _strings(self, old: dict[str, Any], new: dict[str, Any], change: Any) -> Iterator[Change]:
        for keyword, stem in (("pattern", "PATTERN"), ("format", "FORMAT")):
            before, after = old.get(keyword), new.get(keyword)
            if before == after:
                continue
            if before is None:
                yield change(f"{stem}_ADDED", "narrows", before, after, f"{keyword} added", keyword)
            elif after is None:
                yield change(
                    f"{stem}_REMOVED", "widens", before, after, f"{keyword} removed", keyword
                )
            else:
                # Two regular expressions cannot be compared in general; two formats are disjoint.
                effect: Effect = "undecidable" if keyword == "pattern" else "changes"
                yield change(
                    f"{stem}_CHANGED", effect, before, after, f"{keyword} changed", keyword
                )
        before, after = bool(old.get("uniqueItems")), bool(new.get("uniqueItems"))
        if before != after:
            rule = "UNIQUE_ITEMS_ADDED" if after else "UNIQUE_ITEMS_REMOVED"
            yield change(
                rule, "narrows" if after else "widens", before, after, "uniqueItems", "uniqueItems"
            )

    def _objects(
        self,
        old: dict[str, Any],
        new: dict[str, Any],
        at: tuple[str | int, ...],
        where: tuple[str | int, ...],
        change: Any,
    ) -> Iterator[Change]:
        old_props: dict[str, Any] = old.get("properties", {})
        new_props: dict[str, Any] = new.get("properties", {})
        old_rest = old.get("additionalProperties", True)
        new_rest = new.get("additionalProperties", True)
        old_required, new_required = set(old.get("required", [])), set(new.get("required", []))
        for name in sorted(set(old_props) | set(new_props)):
            here = (*at, "properties", name)
            if name in old_props and name in new_props:
                yield from self.diff(old_props[name], new_props[name], here, (*where, name))
                continue
            before = old_props.get(name, old_rest)
            after = new_props.get(name, new_rest)
            inner = list(self.diff(before, after, here, (*where, name)))
            added = name in new_props
            required = added and name in new_required and name not in old_required
            effect = _combined([*inner, *([_NARROWS] if required else [])])
            if effect == "none":
                continue
            closed = (old_rest if added else new_rest) is False
            rule = "PROPERTY_REMOVED"
            if added:
                rule = "REQUIRED_PROPERTY_ADDED" if required else "OPTIONAL_PROPERTY_ADDED"
            yield Change(
                rule,
                effect,
                here,
                (*where, name),
                None if added else old_props[name],
                new_props[name] if added else None,
                f"{'closed' if closed else 'open'} object",
            )
        yield from (
            _renamed(c, "ADDITIONAL_PROPERTIES")
            for c in self.diff(old_rest, new_rest, (*at, "additionalProperties"), (*where, "*"))
        )
        for name in sorted(new_required - old_required):
            if name in old_props or name not in new_props:
                yield change(
                    "PROPERTY_MADE_REQUIRED",
                    "narrows",
                    None,
                    name,
                    f"{name!r} is now required",
                    "required",
                )
        for name in sorted(old_required - new_required):
            yield change(
                "PROPERTY_MADE_OPTIONAL",
                "widens",
                name,
                None,
                f"{name!r} is no longer required",
                "required",
            )
        if "propertyNames" in old or "propertyNames" in new:
            yield from self.diff(
                old.get("propertyNames", True),
                new.get("propertyNames", True),
                (*at, "propertyNames"),
                (*where, "*"),
            )

    def _arrays(
        self,
        old: dict[str, Any],
        new: dict[str, Any],
        at: tuple[str | int, ...],
        where: tuple[str | int, ...],
        change: Any,
    ) -> Iterator[Change]:
        old_prefix: list[Any] = old.get("prefixItems", [])
        new_prefix: list[Any] = new.get("prefixItems", [])
        old_items, new_items = old.get("items", True), new.get("items", True)
        for index in range(max(len(old_prefix), len(new_prefix))):
            before = old_prefix[index] if index < len(old_prefix) else old_items
            after = new_prefix[index] if index < len(new_prefix) else new_items
            yield from self.diff(before, after, (*at, "prefixItems", index), (*where, index))
        if "items" in old or "items" in new:
            yield from self.diff(old_items, new_items, (*at, "items"), (*where, "*"))

    def _unions(
        self,
        old: dict[str, Any],
        new: dict[str, Any],
        at: tuple[str | int, ...],
        where: tuple[str | int, ...],
        change: Any,
    ) -> Iterator[Change]:
        for keyword in ("anyOf", "oneOf", "allOf"):
            before: list[Any] = old.get(keyword, [])
            after: list[Any] = new.get(keyword, [])
            if canonical(before) == canonical(after):
                continue
            old_keys = [canonical(deref(b, self.old_root)) for b in before]
            new_keys = [canonical(deref(b, self.new_root)) for b in after]
            gone = [i for i, key in enumerate(old_keys) if key not in new_keys]
            came = [i for i, key in enumerate(new_keys) if key not in old_keys]
            # Branches that changed in place pair up in order; the rest were added or removed.
            for i, j in zip(gone, came, strict=False):
                yield from self.diff(before[i], after[j], (*at, keyword, j), where)
            extra_old, extra_new = gone[len(came) :], came[len(gone) :]
            narrowing: Effect = "narrows" if keyword != "allOf" else "widens"
            widening: Effect = "widens" if keyword != "allOf" else "narrows"
            for i in extra_old:
                yield change(
                    "UNION_BRANCH_REMOVED" if keyword != "allOf" else "ALL_OF_BRANCH_REMOVED",
                    narrowing,
                    before[i],
                    None,
                    f"{keyword} branch {i} removed",
                    keyword,
                    i,
                )
            for j in extra_new:
                effect = widening
                detail = f"{keyword} branch {j} added"
                if keyword == "oneOf" and any(
                    _may_overlap(after[j], after[k], self.new_root)
                    for k in range(len(after))
                    if k != j
                ):
                    # A value matching two branches now fails oneOf: old callers break too.
                    effect, detail = "changes", f"{detail}; it overlaps another branch"
                yield change(
                    "UNION_BRANCH_ADDED" if keyword != "allOf" else "ALL_OF_BRANCH_ADDED",
                    effect,
                    None,
                    after[j],
                    detail,
                    keyword,
                    j,
                )


_NARROWS = Change("", "narrows", (), (), None, None, "")


def _renamed(change: Change, stem: str) -> Change:
    rule = {"SCHEMA_OPENED": f"{stem}_OPENED", "SCHEMA_CLOSED": f"{stem}_CLOSED"}.get(
        change.rule, change.rule
    )
    return Change(
        rule,
        change.effect,
        change.schema_path,
        change.instance_path,
        change.old,
        change.new,
        change.detail,
    )


def _combined(changes: list[Change]) -> Effect:
    effects = {c.effect for c in changes} - {"none"}
    if not effects:
        return "none"
    if len(effects) == 1:
        return effects.pop()
    strongest: Effect
    for strongest in ("undecidable", "semantic", "changes"):
        if strongest in effects:
            return strongest
    return "changes"  # widens and narrows


def deref(schema: Any, root: Any) -> Any:
    """``schema`` with its local ``$ref`` followed (siblings kept), as often as it takes."""
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and seen < 64:
        ref: str = schema["$ref"]
        found, target = resolve_pointer(root, ref[1:]) if ref.startswith("#") else (False, None)
        if not found:
            return schema
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **siblings} if siblings and isinstance(target, dict) else target
        seen += 1
    return schema


def _stripped(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {
            k: (v if k in ("const", "enum", "default") else _stripped(v))
            for k, v in schema.items()
            if k not in ANNOTATIONS and k != "$defs"
        }
    if isinstance(schema, list):
        return [_stripped(item) for item in schema]
    return schema


def _types(schema: dict[str, Any]) -> frozenset[str]:
    declared = schema.get("type")
    if declared is None:
        return frozenset(JSON_TYPES)
    kinds = frozenset([declared] if isinstance(declared, str) else declared)
    return kinds | {"integer"} if "number" in kinds else kinds


def _allowed_values(schema: dict[str, Any]) -> frozenset[str] | None:
    if "const" in schema:
        return frozenset([_value_key(schema["const"])])
    if isinstance(schema.get("enum"), list):
        return frozenset(_value_key(v) for v in schema["enum"])
    return None


def _value_key(value: Any) -> str:
    """JSON Schema equality: 1 and 1.0 are the same value, True and 1 are not."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


def _numeric_bound(
    schema: dict[str, Any], side: Literal["low", "high"]
) -> tuple[float, int] | None:
    """The effective bound as (value, strictness): (5, 1) excludes 5, (5, 0) includes it.

    Compared as tuples: a higher low bound, or a lower high bound, is tighter; at the same value
    an exclusive bound is tighter, hence the sign of the strictness on the high side.
    """
    inclusive, exclusive = (
        ("minimum", "exclusiveMinimum") if side == "low" else ("maximum", "exclusiveMaximum")
    )
    candidates = []
    if isinstance(schema.get(inclusive), int | float):
        candidates.append((float(schema[inclusive]), 0))
    if isinstance(schema.get(exclusive), int | float):
        candidates.append((float(schema[exclusive]), 1 if side == "low" else -1))
    if not candidates:
        return None
    return max(candidates) if side == "low" else min(candidates)


def _show_bound(bound: tuple[float, int] | None) -> Any:
    if bound is None:
        return None
    value = int(bound[0]) if bound[0].is_integer() else bound[0]
    return {"exclusive": value} if bound[1] else value


def _multiple_effect(before: Any, after: Any) -> Effect:
    if before is None:
        return "narrows"
    if after is None:
        return "widens"
    if _divides(after, before):
        return "widens"  # every multiple of the old step is a multiple of the new one
    if _divides(before, after):
        return "narrows"
    return "changes"


def _divides(step: float, value: float) -> bool:
    ratio = value / step
    return abs(ratio - round(ratio)) < 1e-9


def _may_overlap(first: Any, second: Any, root: Any) -> bool:
    """False only when no value can match both: disjoint types, or different consts/enums on a
    property both require."""
    a, b = deref(first, root), deref(second, root)
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a is not False and b is not False
    if not _types(a) & _types(b):
        return False
    values_a, values_b = _allowed_values(a), _allowed_values(b)
    if values_a is not None and values_b is not None and not values_a & values_b:
        return False
    required = set(a.get("required", [])) & set(b.get("required", []))
    for name in required:
        prop_a = deref(a.get("properties", {}).get(name, True), root)
        prop_b = deref(b.get("properties", {}).get(name, True), root)
        if isinstance(prop_a, dict) and isinstance(prop_b, dict):
            values_a, values_b = _allowed_values(prop_a), _allowed_values(prop_b)
            if values_a is not None and values_b is not None and not values_a & values_b:
                return False
    return True


def _list(types: set[str]) -> str:
    return ", ".join(sorted(types))


def _values(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))
