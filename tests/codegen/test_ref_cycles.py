"""A cycle of ``$ref`` keywords that never reaches a schema is a spec problem; recursion through
properties or items builds, and its models accept what the schema accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from conftest import add_spec, import_generated, run_cli, spec, write_json

from blade_codegen.load import load
from blade_codegen.validate import validate


def _with_c(defs: dict[str, Any], c: Any | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"c": c if c is not None else {"$ref": "#/$defs/A"}},
        "$defs": defs,
    }


CYCLES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "two bare references",
        _with_c({"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}),
        "/inputSchema/$defs/A/$ref",
        "#/$defs/A -> #/$defs/B -> #/$defs/A",
    ),
    (
        "a definition naming itself",
        _with_c({"A": {"$ref": "#/$defs/A"}}),
        "/inputSchema/$defs/A/$ref",
        "#/$defs/A -> #/$defs/A",
    ),
    (
        "annotations beside the references",
        _with_c(
            {
                "A": {"$ref": "#/$defs/B", "title": "A"},
                "B": {"$ref": "#/$defs/A", "description": "b"},
            }
        ),
        "/inputSchema/$defs/A/$ref",
        "#/$defs/A -> #/$defs/B -> #/$defs/A",
    ),
    (
        # $ref applies to the same value whatever sits beside it: the type ends nothing.
        "a type beside a reference",
        _with_c({"A": {"$ref": "#/$defs/B", "type": "object"}, "B": {"$ref": "#/$defs/A"}}),
        "/inputSchema/$defs/A/$ref",
        "#/$defs/A -> #/$defs/B -> #/$defs/A",
    ),
    (
        "the slot root naming itself",
        {"type": "object", "$ref": "#"},
        "/inputSchema/$ref",
        "# -> #",
    ),
]


@pytest.mark.parametrize(
    ("schema", "at", "chain"), [c[1:] for c in CYCLES], ids=[c[0] for c in CYCLES]
)
def test_a_cycle_of_references_is_one_problem_and_nothing_is_written(
    tmp_path: Path, schema: dict[str, Any], at: str, chain: str
) -> None:
    specs, out = tmp_path / "specs", tmp_path / "out"
    add_spec(specs, spec("ns.t.v1", inputSchema=schema))
    result = run_cli("build", str(specs), "--out", str(out))
    assert result.returncode == 3, result
    lines = [line for line in result.stderr.splitlines() if line.startswith("ns/")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ns/t.v1.json:"), lines
    assert f": {at}: references form a cycle that never reaches a schema: {chain} (" in lines[0]
    assert not out.exists()


def test_a_cycle_inside_a_shared_file_is_reported_there_once(tmp_path: Path) -> None:
    write_json(
        tmp_path / "common" / "loop.schema.json",
        {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}},
    )
    add_spec(
        tmp_path,
        spec("ns.t.v1", inputSchema=_with_c({}, {"$ref": "../common/loop.schema.json#/$defs/B"})),
    )
    found = [str(p) for p in validate(load(tmp_path))]
    assert len(found) == 1, found
    assert found[0].startswith("common/loop.schema.json:"), found
    assert "/$defs/A/$ref: references form a cycle" in found[0]
    assert "#/$defs/A -> #/$defs/B -> #/$defs/A" in found[0]


def test_references_into_a_property_name_are_not_followed_as_keywords(tmp_path: Path) -> None:
    # "#/properties" is a map of names: its "$ref" is a property, not a reference to follow.
    schema = {
        "type": "object",
        "properties": {"$ref": {"type": "string"}},
        "$defs": {"P": {"$ref": "#/$defs/Q"}, "Q": {"type": "integer"}},
    }
    add_spec(tmp_path, spec("ns.t.v1", inputSchema=schema))
    assert validate(load(tmp_path)) == []


TREE = {
    "type": "object",
    "properties": {"label": {"type": "string"}, "children": {"type": "array"}},
    "required": ["label"],
}


def _node(ref: str) -> dict[str, Any]:
    children = {"type": "array", "items": {"$ref": ref}}
    return {**TREE, "properties": {**TREE["properties"], "children": children}}


def test_recursion_through_properties_and_items_builds_and_its_models_accept_the_schema(
    tmp_path: Path,
) -> None:
    specs, out = tmp_path / "specs", tmp_path / "out"
    write_json(specs / "common" / "tree.schema.json", {"$defs": {"Node": _node("#/$defs/Node")}})
    # A chain of references that ends in a schema is no cycle.
    local = {
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Alias"}},
        "$defs": {"Alias": {"$ref": "#/$defs/Node"}, "Node": _node("#/$defs/Alias")},
    }
    add_spec(specs, spec("ns.local-tree.v1", inputSchema=local))
    add_spec(specs, spec("ns.root-tree.v1", inputSchema=_node("#")))
    shared = {
        "type": "object",
        "properties": {"root": {"$ref": "../common/tree.schema.json#/$defs/Node"}},
    }
    add_spec(specs, spec("ns.shared-tree.v1", inputSchema=shared))
    result = run_cli("build", str(specs), "--out", str(out), "--package", "cycles_pkg")
    assert result.returncode == 0, result
    deep = {"label": "a", "children": [{"label": "b", "children": [{"label": "c", "x": 1}]}]}
    for module, cls, value in (
        ("local_tree_v1", "LocalTreeInput", {"root": deep}),
        ("root_tree_v1", "RootTreeInput", deep),
        ("shared_tree_v1", "SharedTreeInput", {"root": deep}),
    ):
        generated = import_generated(out, f"cycles_pkg.ns.{module}")
        assert jsonschema_rs.validator_for(generated.SPEC.input_schema).is_valid(value)
        model = getattr(generated, cls).model_validate(value)
        assert model.model_dump(mode="json") == value
