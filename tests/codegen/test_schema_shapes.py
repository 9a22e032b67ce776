"""Shapes of schema whose models once refused what the schema accepts, or failed at import: each
is a minimal schema written for its test, and recursion is also drawn at random.

- a union that reaches a reference cycle through other value definitions lost branches;
- two properties whose Python names collide (``defaultPrompt``, ``default_prompt``) filled one
  another;
- a pattern translated for one regex engine was compiled by the other (a type alias takes the
  engine of the model that uses it);
- a map of ``patternProperties`` alone refused names that match no pattern;
- a nested draft-07 ``$schema`` under a ``$ref`` root was refused at import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from conftest import add_spec, import_generated, run_cli, run_mypy, spec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from strategies import round_trip, valid_instances

from blade_codegen.build import build

# The issue's minimal form: items of `item = oneOf[subs, f]`, `subs = anyOf[string, r]`, and `r`
# holding `default: array of subs` (the cycle runs through the class r).
RECURSIVE_UNION = {
    "type": "object",
    "$defs": {
        "subs": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/r"}]},
        "r": {
            "type": "object",
            "properties": {"default": {"type": "array", "items": {"$ref": "#/$defs/subs"}}},
            "required": ["default"],
        },
        "f": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        "item": {"oneOf": [{"$ref": "#/$defs/subs"}, {"$ref": "#/$defs/f"}]},
    },
    "properties": {
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
        "same": {"$ref": "#/$defs/item"},
    },
}


def _built(root: Path, schema: Any, package: str, tool: str = "t.shape.v1") -> Any:
    """The tool module of ``schema`` as an input schema, built and imported."""
    add_spec(root / "specs", spec(tool, inputSchema=schema))
    build(root / "specs", root / "out", package)
    module = tool.split(".")[1].replace("-", "_") + "_" + tool.split(".")[2]
    return import_generated(root / "out", f"{package}.t.{module}")


def _faithful(module: Any, values: list[Any]) -> None:
    """Each value is valid by the schema, and the model keeps it as it was."""
    validator = jsonschema_rs.validator_for(module.SPEC.input_schema)
    adapter = TypeAdapter(module.SPEC.input_type)
    for value in values:
        assert validator.is_valid(value), value
        assert round_trip(adapter, value) is None, value


def test_a_union_reaching_a_cycle_through_a_class_keeps_every_branch(tmp_path: Path) -> None:
    module = _built(tmp_path, RECURSIVE_UNION, "rec_pkg")
    text = (tmp_path / "out" / "rec_pkg" / "t" / "shape_v1.py").read_text("utf-8")
    assert "items: list[F] |" not in text  # the issue's symptom: the subs branch lost
    _faithful(
        module,
        [
            {"items": ["plain", {"x": 1}, {"default": ["a", {"default": []}]}]},
            {"same": "plain"},
            {"same": {"default": ["b", {"default": ["c"]}]}},
        ],
    )
    checked = run_mypy(tmp_path / "out" / "rec_pkg", cwd=tmp_path / "out")
    assert checked.returncode == 0, checked.stdout


# Definitions drawn at random: objects (classes) may refer to any definition, arrays and maps
# too; a union refers only to later definitions, so no union contains itself before a value is
# consumed (a schema no finite value could satisfy would prove nothing).
_LEAVES = [{"type": t} for t in ("string", "integer", "boolean", "null")]


@st.composite
def recursive_schemas(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(2, 5))

    def member(first: int) -> Any:
        if first < count and draw(st.booleans()):  # as often a reference as not: cycles
            return {"$ref": f"#/$defs/d{draw(st.integers(first, count - 1))}"}
        return draw(st.sampled_from(_LEAVES))

    defs: dict[str, Any] = {}
    for i in range(count):
        kind = draw(st.sampled_from(["object", "union", "array", "map"]))
        if kind == "object":
            names = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, unique=True))
            defs[f"d{i}"] = {"type": "object", "properties": {n: member(0) for n in names}}
        elif kind == "union":
            branches = [member(i + 1) for _ in range(draw(st.integers(2, 3)))]
            defs[f"d{i}"] = {draw(st.sampled_from(["anyOf", "oneOf"])): branches}
        else:
            key = "items" if kind == "array" else "additionalProperties"
            defs[f"d{i}"] = {"type": "array" if kind == "array" else "object", key: member(0)}
    refs = [{"$ref": f"#/$defs/d{i}"} for i in range(count)]
    properties = {"p": draw(st.sampled_from(refs)), "q": draw(st.sampled_from(refs))}
    return {"type": "object", "$defs": defs, "properties": properties}


def _refs(*names: str) -> list[dict[str, str]]:
    return [{"$ref": f"#/$defs/{name}"} for name in names]


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def _drawn(defs: dict[str, Any], p: Any, q: Any) -> dict[str, Any]:
    return {"type": "object", "$defs": defs, "properties": {"p": p, "q": q}}


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=recursive_schemas())
# Shapes the generator's collapse got wrong, found by this test's drawing (each once lost a
# branch): a union through an array of a class on a self-cycle; a union of a union leading to a
# cycle of a class and a union; a map of a union whose branch is a class on a cycle with it; a
# union and a map of it (a cycle of two value definitions).
@example(
    _drawn(
        {
            "d0": _object(p0=_refs("d0")[0], p1=_refs("d1")[0]),
            "d1": {"anyOf": [{"type": "string"}, *_refs("d2")]},
            "d2": {"type": "array", "items": _refs("d0")[0]},
        },
        {"type": "null"},
        _refs("d1")[0],
    )
)
@example(
    _drawn(
        {
            "d0": {"anyOf": _refs("d4", "d2")},
            "d2": {"anyOf": [{"type": "integer"}, *_refs("d3")]},
            "d3": _object(p0={"type": "string"}, p1=_refs("d0")[0]),
            "d4": _object(p0={"type": "string"}),
        },
        *_refs("d3", "d2"),
    )
)
@example(
    _drawn(
        {
            "d0": {"type": "object", "additionalProperties": _refs("d1")[0]},
            "d1": {"anyOf": [{"type": "boolean"}, *_refs("d2")]},
            "d2": {"anyOf": [*_refs("d4"), {"type": "integer"}]},
            "d4": _object(p0=_refs("d1")[0]),
        },
        *_refs("d0", "d1"),
    )
)
@example(
    _drawn(
        {
            "d1": {"anyOf": [{"type": "string"}, *_refs("d2")]},
            "d2": {"type": "object", "additionalProperties": _refs("d1")[0]},
        },
        *_refs("d1", "d1"),
    )
)
def test_models_of_recursive_definitions_keep_every_valid_value(
    tmp_path_factory: pytest.TempPathFactory, schema: dict[str, Any]
) -> None:
    root = tmp_path_factory.mktemp("recursive")
    module = _built(root, schema, f"rnd_{root.name.replace('-', '_')}")
    values = valid_instances(schema, 15)
    assert values  # every drawn schema has finite values: p and q may be left out
    _faithful(module, values)


# Both properties, and a union that requires one or the other.
COLLIDING = {
    "type": "object",
    "properties": {"defaultPrompt": {"type": "string"}, "default_prompt": {"type": "string"}},
    "anyOf": [{"required": ["defaultPrompt"]}, {"required": ["default_prompt"]}],
}


def test_properties_whose_python_names_collide_keep_their_own_values(tmp_path: Path) -> None:
    module = _built(tmp_path, COLLIDING, "colliding_names_pkg")
    adapter = TypeAdapter(module.SPEC.input_type)
    for value in (
        {"default_prompt": "x"},
        {"defaultPrompt": "y"},
        {"defaultPrompt": "y", "default_prompt": "x"},
    ):
        assert round_trip(adapter, value) is None, value
    # The branch that requires defaultPrompt no longer takes default_prompt for it.
    parsed = adapter.validate_python({"default_prompt": "x"})
    assert "default_prompt" in parsed.root.model_fields_set
    assert parsed.root.model_dump(by_alias=True, exclude_unset=True) == {"default_prompt": "x"}
    # Built by Python name, each field is still its own.
    branch = type(adapter.validate_python({"defaultPrompt": "y"}).root)
    named = {f: info.alias for f, info in branch.model_fields.items()}
    assert named == {"default_prompt_1": "defaultPrompt", "default_prompt": "default_prompt"}


# A string item pattern (a type alias of its own) beside a closed map whose propertyNames pattern
# the generator writes as a lookahead: the model that uses the alias runs Python's re.
ENGINES = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^\\s+\\u{3000}?$"}},
        "labels": {
            "type": "object",
            "propertyNames": {"pattern": "^[a-z]+$"},
            "patternProperties": {"^x": {"type": "string"}},
            "additionalProperties": False,
        },
    },
}


def test_a_type_alias_pattern_compiles_whichever_engine_its_model_runs(tmp_path: Path) -> None:
    module = _built(tmp_path, ENGINES, "engines_pkg")  # imported: no "incomplete escape \x"
    text = (tmp_path / "out" / "engines_pkg" / "t" / "shape_v1.py").read_text("utf-8")
    assert 'regex_engine="python-re"' in text and "TypeAlias = Annotated[" in text
    assert "\\x{" not in text
    _faithful(module, [{"tags": ["\u3000 \t", "\u2028\u3000"]}, {"labels": {"xa": "s"}}])
    with pytest.raises(ValueError):
        module.SPEC.input_type.model_validate({"tags": ["a"]})


@pytest.mark.parametrize(
    "shape",
    [
        {"patternProperties": {"^x": {"type": "string"}}},
        {"patternProperties": {"^x": {"type": "string"}}, "additionalProperties": True},
        {"patternProperties": {"^x": {"type": "string"}}, "propertyNames": {"maxLength": 4}},
        # A name pattern the models cannot hold (a lookahead): the names it allowed stay allowed.
        {"patternProperties": {"^(?!@)[a-z]+$": {"type": "string"}}, "additionalProperties": False},
    ],
    ids=["open", "true", "names", "unholdable"],
)
def test_a_map_of_pattern_properties_accepts_names_no_pattern_matches(
    tmp_path: Path, shape: dict[str, Any]
) -> None:
    schema = {"type": "object", "properties": {"m": {"type": "object", **shape}}}
    module = _built(tmp_path, schema, "maps_pkg")
    values = [{"m": {"xa": "s"}}, {"m": {"abc": 5}}, {"m": {"abc": "s", "xb": "t"}}]
    validator = jsonschema_rs.validator_for(schema)
    _faithful(module, [v for v in values if validator.is_valid(v)])
    assert validator.is_valid({"m": {"abc": "s"}})


def test_a_nested_draft_07_schema_under_a_ref_root_imports(tmp_path: Path) -> None:
    draft_07 = "http://json-schema.org/draft-07/schema#"
    tools = [
        {
            "name": "send",
            "description": "Send.",
            "inputSchema": {
                "$schema": draft_07,
                "$ref": "#/definitions/send/full",
                "definitions": {
                    "send": {
                        "full": {
                            "$schema": draft_07,
                            "type": "object",
                            "properties": {
                                "to": {"$ref": "#/definitions/address/full", "minLength": 3},
                            },
                            "required": ["to"],
                        }
                    },
                    "address": {"full": {"$schema": draft_07, "type": "string", "format": "email"}},
                },
            },
        }
    ]
    listing = tmp_path / "tools.json"
    listing.write_text(json.dumps({"tools": tools}), "utf-8")
    done = run_cli(
        "import",
        "--from",
        "mcp",
        str(listing),
        "--namespace",
        "mail",
        "--out",
        str(tmp_path / "specs"),
    )
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "specs" / "mail" / "send.v1.json").read_text("utf-8"))
    schema = written["inputSchema"]
    assert "$schema" not in json.dumps(schema)  # every declaration converted, none copied
    # Draft-07 reads no keyword beside a $ref: the minLength there is dropped, as draft-07 does.
    assert schema["properties"]["to"] == {"$ref": "#/$defs/address/full"}
    validator = jsonschema_rs.validator_for(schema)
    assert validator.is_valid({"to": "a@b"}) and not validator.is_valid({"to": 5})
    built = run_cli("build", str(tmp_path / "specs"), "--out", str(tmp_path / "out"))
    assert built.returncode == 0, built.stderr
