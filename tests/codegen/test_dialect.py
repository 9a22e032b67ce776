"""Nested ``$schema`` declarations, and refusals that point where the source has the place: the
conversion of older drafts (``import``) and the check of hand-written specs (``build``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import add_spec, run_cli, spec, write_json

from blade_codegen.build import build
from blade_codegen.dialect import NotConvertible, convert
from blade_codegen.problems import SpecError

DRAFT_07 = "http://json-schema.org/draft-07/schema#"


def refusals(schema: Any) -> list[tuple[str, str]]:
    with pytest.raises(NotConvertible) as refused:
        convert(schema)
    return [(r.pointer, r.reason) for r in refused.value.refusals]


def test_the_issues_nested_draft_07_declarations_convert_and_import(tmp_path: Path) -> None:
    """A draft-07 root whose definitions declare draft-07 again (as SchemaStore's do): the
    nested declarations name the root's own draft and go; the spec imports and builds."""
    nested = {
        "$schema": DRAFT_07,
        "definitions": {"a": {"$schema": DRAFT_07, "type": "object"}},
    }
    assert convert(nested).schema == {"$defs": {"a": {"type": "object"}}}
    used = {
        "$schema": DRAFT_07,
        "type": "object",
        "properties": {"x": {"$ref": "#/definitions/a"}, "y": {"$ref": "#/definitions/b"}},
        "definitions": {
            "a": {"$schema": DRAFT_07, "type": "object", "properties": {"n": {"type": "integer"}}},
            "b": {"$schema": "http://json-schema.org/draft-07/schema", "items": [{}]},
        },
    }
    tools = {
        "tools": [
            {"name": "one", "inputSchema": nested},
            {"name": "two", "inputSchema": used, "outputSchema": used},
        ]
    }
    specs = tmp_path / "specs"
    source = str(write_json(tmp_path / "tools.json", tools))
    done = run_cli("import", "--from", "mcp", source, "--namespace", "x", "--out", str(specs))
    assert done.returncode == 0, done.stderr
    assert "$schema" not in done.stderr and "import it" not in done.stderr
    two = json.loads((specs / "x" / "two.v1.json").read_text())
    assert two["inputSchema"]["$defs"]["b"] == {"prefixItems": [{}]}
    assert "$schema" not in json.dumps(two)
    build(specs, tmp_path / "out", "nested_pkg")


def test_refusals_below_renamed_keywords_point_at_the_source() -> None:
    """definitions becomes $defs, array items prefixItems, dependencies dependentSchemas: a
    refusal below one of them names the place as the schema has it (it named $defs/...)."""
    unknown = {"type": "object", "definitions": {"a": {"$schema": "http://example.com/mine"}}}
    assert refusals({"$schema": DRAFT_07, **unknown}) == [
        ("/definitions/a/$schema", "unknown dialect 'http://example.com/mine'")
    ]  # once: $defs and dependentSchemas were converted twice (and their notes made twice)
    embedded = {"a": {"$id": "http://example.com/a.json", "type": "object"}}
    assert refusals({"$schema": DRAFT_07, "definitions": embedded})[0][0] == "/definitions/a/$id"
    remote = {"$schema": DRAFT_07, "type": "array", "items": [{"$ref": "http://example.com/x"}]}
    assert refusals(remote)[0][0] == "/items/0/$ref"
    invalid = {"$schema": DRAFT_07, "dependencies": {"a": {"minLength": "3"}}}
    assert refusals(invalid)[0][0] == "/dependencies/a/minLength"
    draft_03 = {"$schema": DRAFT_07, "definitions": {"a": {"required": True}}}
    assert refusals(draft_03)[0][0] == "/definitions/a/required"


def test_each_definition_is_converted_once() -> None:
    """Nested $defs were each converted twice, so a schema 16 definitions deep was walked 65,536
    times at its bottom, and a refusal there said 65,536 times."""
    node: dict[str, Any] = {"$schema": "http://example.com/mine"}
    for depth in range(16):
        node = {"$defs": {f"d{depth}": node}}
    [(at, _)] = refusals({"type": "object", **node})
    assert at == "".join(f"/$defs/d{depth}" for depth in reversed(range(16))) + "/$schema"


def test_a_nested_dialect_in_a_spec_is_refused_at_its_own_place(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/a"}, "y": {"$schema": 7}},
        "$defs": {
            "a": {"$schema": DRAFT_07, "type": "object"},
            "same": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "string"},
        },
    }
    add_spec(tmp_path / "specs", spec("t.nested.v1", inputSchema=schema))
    add_spec(tmp_path / "specs", spec("t.weird.v1", outputSchema={"$schema": ["x"]}))
    with pytest.raises(SpecError) as raised:  # was: AttributeError on the list
        build(tmp_path / "specs", tmp_path / "out", "pkg")
    found = {(p.path, p.pointer): (p.message, p.hint) for p in raised.value.problems}
    assert set(found) == {
        ("t/nested.v1.json", "/inputSchema/$defs/a/$schema"),
        ("t/nested.v1.json", "/inputSchema/properties/y/$schema"),
        ("t/weird.v1.json", "/outputSchema/$schema"),
    }
    message, hint = found[("t/nested.v1.json", "/inputSchema/$defs/a/$schema")]
    assert message == f"schema dialect {DRAFT_07!r} is not supported"
    assert hint.startswith("remove it and write this subschema as JSON Schema 2020-12")
    assert found[("t/weird.v1.json", "/outputSchema/$schema")][0] == "$schema must be a URI string"
    assert not (tmp_path / "out").exists()
    cli = run_cli("build", str(tmp_path / "specs"), "--out", str(tmp_path / "out"))
    assert cli.returncode == 3 and "Traceback" not in cli.stderr
