"""Compatibility rules: the hand-checked vectors, every rule in both directions, a property test."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from conftest import ROOT
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import conform

from blade_codegen.compat import Change, compare
from blade_codegen.witness import example

# Our own hand-checked vectors (copied from shared/compat-vectors so every checkout runs them).
VECTORS = sorted((ROOT / "tests" / "compat-vectors").glob("*.json"))


def verdicts(old: Any, new: Any) -> tuple[str, str, list[Change]]:
    changes = compare(old, new)
    accepting = "breaking" if any(c.breaks("accepting") for c in changes) else "compatible"
    emitting = "breaking" if any(c.breaks("emitting") for c in changes) else "compatible"
    return accepting, emitting, changes


def valid(schema: Any, instance: Any) -> bool:
    return bool(jsonschema_rs.validator_for(schema, validate_formats=True).is_valid(instance))


@pytest.mark.parametrize("path", VECTORS, ids=[p.stem for p in VECTORS])
def test_hand_checked_vectors(path: Path) -> None:
    assert len(VECTORS) == 12
    vector = json.loads(path.read_text("utf-8"))
    old, new = vector["old"], vector["new"]
    accepting, emitting, changes = verdicts(old, new)
    assert (accepting, emitting) == (
        vector["expected"]["accepting"],
        vector["expected"]["emitting"],
    )
    expected_rule = vector["rule"]["accepting"].split()[0]
    rules = {c.rule for c in changes if c.effect != "none"}
    if expected_rule in ("ANNOTATION_CHANGED", "REF_RETARGETED"):
        assert rules == set()
    else:
        assert expected_rule in rules
    for direction in ("accepting", "emitting"):
        broken = [c for c in changes if c.breaks(direction)]  # type: ignore[arg-type]
        if not broken or vector["expected"][direction] != "breaking":
            continue
        found, instance = example(broken[0], old, new, direction)  # type: ignore[arg-type]
        assert found, f"no example for {direction}"
        if broken[0].effect == "semantic":
            assert valid(old, instance) and valid(new, instance)
        elif direction == "accepting":
            assert valid(old, instance) and not valid(new, instance)
        else:
            assert valid(new, instance) and not valid(old, instance)


def obj(prop: Any, **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"p": prop}, **more}


A, B, CHANGE, NONE, UNDECIDABLE = "widens", "narrows", "changes", "none", "undecidable"
RULES: list[tuple[str, Any, Any, str, str]] = [
    # (rule, old, new, effect, expected rule name)
    ("type widened", {"type": "string"}, {"type": ["string", "integer"]}, A, "TYPE_WIDENED"),
    ("type narrowed", {"type": ["string", "integer"]}, {"type": "string"}, B, "TYPE_NARROWED"),
    ("type changed", {"type": "string"}, {"type": "integer"}, CHANGE, "TYPE_CHANGED"),
    ("integer to number", {"type": "integer"}, {"type": "number"}, A, "TYPE_WIDENED"),
    ("number to integer", {"type": "number"}, {"type": "integer"}, B, "TYPE_NARROWED"),
    ("null added", {"type": "string"}, {"type": ["string", "null"]}, A, "NULL_ADDED"),
    ("null removed", {"type": ["string", "null"]}, {"type": "string"}, B, "NULL_REMOVED"),
    ("enum added", {"enum": ["a"]}, {"enum": ["a", "b"]}, A, "ENUM_VALUE_ADDED"),
    ("enum removed", {"enum": ["a", "b"]}, {"enum": ["a"]}, B, "ENUM_VALUE_REMOVED"),
    ("enum swapped", {"enum": ["a", "b"]}, {"enum": ["a", "c"]}, CHANGE, "ENUM_CHANGED"),
    ("enum introduced", {"type": "string"}, {"type": "string", "enum": ["a"]}, B, "ENUM_ADDED"),
    ("const changed", {"const": 1}, {"const": 2}, CHANGE, "CONST_CHANGED"),
    ("const added", {"type": "integer"}, {"type": "integer", "const": 1}, B, "CONST_ADDED"),
    ("const removed", {"type": "integer", "const": 1}, {"type": "integer"}, A, "CONST_REMOVED"),
    ("minimum raised", {"minimum": 1}, {"minimum": 2}, B, "MIN_INCREASED"),
    ("minimum lowered", {"minimum": 2}, {"minimum": 1}, A, "MIN_DECREASED"),
    ("maximum lowered", {"maximum": 9}, {"maximum": 5}, B, "MAX_DECREASED"),
    ("maximum raised", {"maximum": 5}, {"maximum": 9}, A, "MAX_INCREASED"),
    ("maximum made exclusive", {"maximum": 5}, {"exclusiveMaximum": 5}, B, "MAX_DECREASED"),
    ("minimum added", {"type": "number"}, {"type": "number", "minimum": 0}, B, "MINIMUM_ADDED"),
    ("maximum removed", {"maximum": 3}, {}, A, "MAXIMUM_REMOVED"),
    ("minLength raised", {"minLength": 1}, {"minLength": 3}, B, "MIN_INCREASED"),
    ("maxLength raised", {"maxLength": 3}, {"maxLength": 9}, A, "MAX_INCREASED"),
    (
        "maxLength added",
        {"type": "string"},
        {"type": "string", "maxLength": 9},
        B,
        "MAX_LENGTH_ADDED",
    ),
    (
        "minItems raised",
        {"type": "array", "minItems": 0},
        {"type": "array", "minItems": 2},
        B,
        "MIN_INCREASED",
    ),
    (
        "maxItems lowered",
        {"type": "array", "maxItems": 5},
        {"type": "array", "maxItems": 2},
        B,
        "MAX_DECREASED",
    ),
    (
        "minProperties raised",
        {"type": "object", "minProperties": 0},
        {"type": "object", "minProperties": 1},
        B,
        "MIN_INCREASED",
    ),
    (
        "maxProperties raised",
        {"type": "object", "maxProperties": 1},
        {"type": "object", "maxProperties": 3},
        A,
        "MAX_INCREASED",
    ),
    ("multipleOf finer", {"multipleOf": 4}, {"multipleOf": 2}, A, "MULTIPLE_OF_CHANGED"),
    ("multipleOf coarser", {"multipleOf": 2}, {"multipleOf": 4}, B, "MULTIPLE_OF_CHANGED"),
    ("multipleOf unrelated", {"multipleOf": 2}, {"multipleOf": 3}, CHANGE, "MULTIPLE_OF_CHANGED"),
    ("pattern added", {"type": "string"}, {"type": "string", "pattern": "^a"}, B, "PATTERN_ADDED"),
    (
        "pattern removed",
        {"type": "string", "pattern": "^a"},
        {"type": "string"},
        A,
        "PATTERN_REMOVED",
    ),
    ("pattern changed", {"pattern": "^a"}, {"pattern": "^b"}, UNDECIDABLE, "PATTERN_CHANGED"),
    ("format added", {"type": "string"}, {"type": "string", "format": "date"}, B, "FORMAT_ADDED"),
    (
        "format removed",
        {"type": "string", "format": "date"},
        {"type": "string"},
        A,
        "FORMAT_REMOVED",
    ),
    ("format changed", {"format": "date"}, {"format": "date-time"}, CHANGE, "FORMAT_CHANGED"),
    (
        "unique added",
        {"type": "array"},
        {"type": "array", "uniqueItems": True},
        B,
        "UNIQUE_ITEMS_ADDED",
    ),
    (
        "unique removed",
        {"type": "array", "uniqueItems": True},
        {"type": "array"},
        A,
        "UNIQUE_ITEMS_REMOVED",
    ),
    ("default changed", {"default": 1}, {"default": 2}, "semantic", "DEFAULT_CHANGED"),
    ("default removed", {"default": 1}, {}, "semantic", "DEFAULT_REMOVED"),
    (
        "default added",
        {"type": "integer"},
        {"type": "integer", "default": 1},
        NONE,
        "DEFAULT_ADDED",
    ),
    ("not changed", {"not": {"const": 1}}, {"not": {"const": 2}}, UNDECIDABLE, "NOT_CHANGED"),
    (
        "if changed",
        {"if": {"minimum": 1}, "then": {}},
        {"if": {"minimum": 2}, "then": {}},
        UNDECIDABLE,
        "CONDITIONAL_CHANGED",
    ),
    (
        "unevaluated changed",
        {"unevaluatedProperties": False},
        {"unevaluatedProperties": True},
        UNDECIDABLE,
        "UNEVALUATED_CHANGED",
    ),
    (
        "items changed",
        {"type": "array", "items": {"type": "integer"}},
        {"type": "array", "items": {"type": "number"}},
        A,
        "TYPE_WIDENED",
    ),
]
OBJECT_RULES: list[tuple[str, Any, Any, str, str]] = [
    (
        "made required",
        obj({"type": "string"}),
        obj({"type": "string"}, required=["p"]),
        B,
        "PROPERTY_MADE_REQUIRED",
    ),
    (
        "made optional",
        obj({"type": "string"}, required=["p"]),
        obj({"type": "string"}),
        A,
        "PROPERTY_MADE_OPTIONAL",
    ),
    (
        "required property added",
        {"type": "object"},
        obj({"type": "string"}, required=["p"]),
        B,
        "REQUIRED_PROPERTY_ADDED",
    ),
    (
        "property added, open",
        {"type": "object"},
        obj({"type": "string"}),
        B,
        "OPTIONAL_PROPERTY_ADDED",
    ),
    (
        "property added, closed",
        {"type": "object", "additionalProperties": False},
        obj({"type": "string"}, additionalProperties=False),
        A,
        "OPTIONAL_PROPERTY_ADDED",
    ),
    ("property removed, open", obj({"type": "string"}), {"type": "object"}, A, "PROPERTY_REMOVED"),
    (
        "property removed, closed",
        obj({"type": "string"}, additionalProperties=False),
        {"type": "object", "additionalProperties": False},
        B,
        "PROPERTY_REMOVED",
    ),
    (
        "object opened",
        obj({}, additionalProperties=False),
        obj({}),
        A,
        "ADDITIONAL_PROPERTIES_OPENED",
    ),
    (
        "object closed",
        obj({}),
        obj({}, additionalProperties=False),
        B,
        "ADDITIONAL_PROPERTIES_CLOSED",
    ),
    (
        "anyOf branch added",
        {"anyOf": [{"type": "string"}]},
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        A,
        "UNION_BRANCH_ADDED",
    ),
    (
        "anyOf branch removed",
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        {"anyOf": [{"type": "string"}]},
        B,
        "UNION_BRANCH_REMOVED",
    ),
    (
        "oneOf disjoint branch",
        {"oneOf": [{"type": "string"}]},
        {"oneOf": [{"type": "string"}, {"type": "boolean"}]},
        A,
        "UNION_BRANCH_ADDED",
    ),
    (
        "oneOf overlapping branch",
        {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        {"oneOf": [{"type": "integer"}, {"type": "string"}, {"type": "number"}]},
        CHANGE,
        "UNION_BRANCH_ADDED",
    ),
    (
        "oneOf branch removed",
        {"oneOf": [{"type": "string"}, {"type": "boolean"}]},
        {"oneOf": [{"type": "string"}]},
        B,
        "UNION_BRANCH_REMOVED",
    ),
    (
        "allOf branch added",
        {"allOf": [{"type": "integer"}]},
        {"allOf": [{"type": "integer"}, {"minimum": 0}]},
        B,
        "ALL_OF_BRANCH_ADDED",
    ),
    (
        "allOf branch removed",
        {"allOf": [{"type": "integer"}, {"minimum": 0}]},
        {"allOf": [{"type": "integer"}]},
        A,
        "ALL_OF_BRANCH_REMOVED",
    ),
    (
        "allOf branch changed",
        {"allOf": [{"minimum": 0}]},
        {"allOf": [{"minimum": 1}]},
        B,
        "MIN_INCREASED",
    ),
    (
        "ref moved to an equivalent definition",
        {"$defs": {"A": {"type": "string"}}, "$ref": "#/$defs/A"},
        {"$defs": {"B": {"type": "string"}}, "$ref": "#/$defs/B"},
        NONE,
        "",
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "effect", "rule"),
    [case[1:] for case in RULES + OBJECT_RULES],
    ids=[case[0] for case in RULES + OBJECT_RULES],
)
def test_every_rule_in_both_directions(old: Any, new: Any, effect: str, rule: str) -> None:
    changes = [c for c in compare(old, new) if c.effect != "none"] if effect != NONE else []
    if effect == NONE:
        assert [c for c in compare(old, new) if c.effect != "none"] == []
        return
    assert rule in {c.rule for c in changes}, changes
    found = {c.effect for c in changes if c.rule == rule}
    assert found == {effect}, changes
    accepting = any(c.breaks("accepting") for c in changes)
    emitting = any(c.breaks("emitting") for c in changes)
    assert accepting == (effect != A) and emitting == (effect != B)
    # The reverse change has the mirror effect on the accepted set.
    mirror = {A: B, B: A}.get(effect, effect)
    if effect in (A, B):
        back = {c.effect for c in compare(new, old) if c.effect != "none"}
        assert back == {mirror}, back


# -- property: a change called compatible never breaks a value ---------------------------------

PRIMITIVES = st.sampled_from(
    [
        {"type": "string"},
        {"type": "string", "maxLength": 5},
        {"type": "string", "enum": ["a", "b"]},
        {"type": "integer"},
        {"type": "integer", "minimum": 0, "maximum": 10},
        {"type": "number"},
        {"type": "boolean"},
        {"type": ["string", "null"]},
        {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    ]
)
EDITS = st.sampled_from(
    [
        "widen_type",
        "narrow_enum",
        "widen_enum",
        "require",
        "unrequire",
        "open",
        "close",
        "add_property",
        "drop_property",
        "raise_max",
        "lower_max",
        "nullable",
    ]
)


APPLIES = {
    "widen_type": lambda prop: prop.get("type") == "integer",
    "narrow_enum": lambda prop: "enum" in prop,
    "widen_enum": lambda prop: "enum" in prop,
    "raise_max": lambda prop: "maximum" in prop or "maxLength" in prop or "maxItems" in prop,
    "lower_max": lambda prop: "maximum" in prop or "maxLength" in prop or "maxItems" in prop,
    "nullable": lambda prop: isinstance(prop.get("type"), str),
}


@st.composite
def schema_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """An object schema and a version of it with one to three edits, each where it applies."""
    names = draw(
        st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4, unique=True)
    )
    old: dict[str, Any] = {
        "type": "object",
        "properties": {name: copy.deepcopy(draw(PRIMITIVES)) for name in names},
        "required": draw(st.lists(st.sampled_from(names), unique=True)),
    }
    if draw(st.booleans()):
        old["additionalProperties"] = False
    new = copy.deepcopy(old)
    for edit in draw(st.lists(EDITS, min_size=1, max_size=3)):
        props = new["properties"]
        fits = [n for n in sorted(props) if APPLIES.get(edit, lambda prop: True)(props[n])]
        if not fits:
            continue
        name = draw(st.sampled_from(fits))
        prop = props[name]
        if edit == "widen_type":
            prop["type"] = "number"
        elif edit == "narrow_enum":
            prop["enum"] = prop["enum"][:1]
        elif edit == "widen_enum":
            prop["enum"] = [*prop["enum"], "z"]
        elif edit == "require" and name not in new["required"]:
            new["required"].append(name)
        elif edit == "unrequire" and name in new["required"]:
            new["required"].remove(name)
        elif edit == "open":
            new.pop("additionalProperties", None)
        elif edit == "close":
            new["additionalProperties"] = False
        elif edit == "add_property":
            props["e"] = copy.deepcopy(draw(PRIMITIVES))
        elif edit == "drop_property" and name not in new["required"]:
            del props[name]
        elif edit in ("raise_max", "lower_max"):
            key = next(k for k in ("maximum", "maxLength", "maxItems") if k in prop)
            prop[key] = max(prop[key] + (2 if edit == "raise_max" else -2), 0)
        elif edit == "nullable":
            prop["type"] = [prop["type"], "null"]
    return old, new


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(pair=schema_pairs(), data=st.data())
def test_a_change_called_compatible_breaks_no_generated_value(
    pair: tuple[dict[str, Any], dict[str, Any]], data: st.DataObject
) -> None:
    old, new = pair
    accepting, emitting, _ = verdicts(old, new)
    assume(accepting == "compatible" or emitting == "compatible")
    for _ in range(5):
        if accepting == "compatible":
            value = data.draw(conform(old, old, 0), label="old value")
            if valid(old, value):
                assert valid(new, value), (old, new, value)
        if emitting == "compatible":
            value = data.draw(conform(new, new, 0), label="new value")
            if valid(new, value):
                assert valid(old, value), (old, new, value)
