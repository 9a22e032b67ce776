"""Every validation rule: one problem per line, file:line:col: pointer: message (hint)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import add_spec, spec, write_json

from blade_codegen.load import load
from blade_codegen.problems import SpecError
from blade_codegen.resolve import resolve
from blade_codegen.validate import validate

LINE = re.compile(r"^[^:\n]+:\d+:\d+: /[^ ]*: .+$")


def problems_for(root: Path) -> list[str]:
    found = [str(p) for p in validate(load(root))]
    for line in found:
        assert LINE.match(line), line
    return found


def one(root: Path, data: dict[str, Any]) -> list[str]:
    add_spec(root, data)
    return problems_for(root)


OBJ = {"type": "object"}

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("missing name", spec("ns.t.v1", name=None), '/: the key "name" is missing (add the key'),
    (
        # outputSchema is a valid sibling, not a misspelling of the missing key: never blamed
        "missing input beside an output",
        spec("ns.t.v1", inputSchema=None, outputSchema=OBJ),
        '/: the key "inputSchema" is missing (add the key "inputSchema"',
    ),
    (
        "missing resume beside a suspend schema",
        spec("ns.t.v1", suspend={"p": {"suspendSchema": OBJ}}),
        '/suspend/p: the key "resumeSchema" is missing (add the key "resumeSchema"',
    ),
    (
        "unversioned id",
        spec("ns.cancel-order", name="cancel_order"),
        "/id: id 'ns.cancel-order' has no version (end it with .v1 (ns.cancel-order.v1)",
    ),
    ("bad name", spec("ns.t.v1", name="9x"), '/name: "9x" does not match'),
    ("empty description", spec("ns.t.v1", description=""), "/description:"),
    (
        "unknown key",
        spec("ns.t.v1", inputschema=OBJ),
        '/inputschema: unknown key "inputschema" (did you mean "inputSchema"?)',
    ),
    ("bad kind", spec("ns.t.v1", kind="read"), '/kind: "read" is not one of'),
    ("zero timeout", spec("ns.t.v1", timeoutMs=0), "/timeoutMs: 0 is less than the minimum"),
    ("float timeout", spec("ns.t.v1", timeoutMs=1.5), "/timeoutMs:"),
    ("whole float timeout", spec("ns.t.v1", timeoutMs=10.0), "timeoutMs must be a whole number"),
    ("input not object", spec("ns.t.v1", inputSchema={"type": "string"}), "root must be an object"),
    (
        "client without output",
        spec("ns.t.v1", execution="client"),
        "a client tool needs an outputSchema",
    ),
    (
        "client with suspend",
        spec(
            "ns.t.v1",
            execution="client",
            outputSchema=OBJ,
            suspend={"p": {"suspendSchema": OBJ, "resumeSchema": OBJ}},
        ),
        "/suspend: a client tool cannot have suspend",
    ),
    (
        "client with effects",
        spec("ns.t.v1", execution="client", outputSchema=OBJ, effects={"message": OBJ}),
        "/effects: a client tool cannot have effects",
    ),
    (
        "context patch not an object",
        spec("ns.t.v1", effects={"context": {"type": "array"}}),
        "/effects/context: a context patch's schema must have root type object",
    ),
    ("no effect declared", spec("ns.t.v1", effects={}), "/effects:"),
    (
        "unknown effect",
        spec("ns.t.v1", effects={"policy": OBJ}),
        '/effects/policy: unknown key "policy"',
    ),
    (
        "permissions without tools",
        spec("ns.t.v1", effects={"permissions": {"tools": []}}),
        "/effects/permissions/tools:",
    ),
    (
        "permission for no known tool",
        spec("ns.t.v1", effects={"permissions": {"tools": ["ns.nope.v1"]}}),
        "/effects/permissions/tools/0: 'ns.nope.v1' is not a tool of this spec tree",
    ),
    (
        "invalid effect schema",
        spec("ns.t.v1", effects={"message": {"type": "txet"}}),
        '/effects/message/type: "txet" is not a JSON Schema type',
    ),
    (
        "invalid schema",
        spec("ns.t.v1", outputSchema={"type": "strnig"}),
        '/outputSchema/type: "strnig" is not a JSON Schema type (did you mean "string"?',
    ),
    (
        "old dialect",
        spec("ns.t.v1", outputSchema={"$schema": "http://json-schema.org/draft-07/schema#"}),
        "/outputSchema/$schema: schema dialect",
    ),
    (
        "dangling local ref",
        spec("ns.t.v1", outputSchema={"$ref": "#/$defs/Nope"}),
        "/outputSchema/$ref: reference '#/$defs/Nope': /$defs/Nope does not exist",
    ),
    (
        "network ref",
        spec("ns.t.v1", outputSchema={"$ref": "https://example.com/s.json"}),
        "names a URL: nothing is fetched",
    ),
    (
        "ref leaving the tree",
        spec("ns.t.v1", outputSchema={"$ref": "../../outside.schema.json"}),
        "leaves the spec tree",
    ),
    (
        "ref to a spec file",
        spec("ns.t.v1", outputSchema={"$ref": "other.v1.json"}),
        "does not name a shared schema file",
    ),
    (
        "missing shared file",
        spec("ns.t.v1", outputSchema={"$ref": "../common/none.schema.json"}),
        "no file common/none.schema.json",
    ),
    ("dynamic ref", spec("ns.t.v1", outputSchema={"$dynamicRef": "#x"}), "$dynamicRef is not"),
    ("bad channel name", spec("ns.t.v1", dataSchemas={"9ch": OBJ}), "/dataSchemas:"),
]


@pytest.mark.parametrize(
    ("data", "expected"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule(tmp_path: Path, data: dict[str, Any], expected: str) -> None:
    found = one(tmp_path, data)
    assert any(expected in line for line in found), found


ANCHORED = {
    "type": "object",
    "$defs": {"address": {"$anchor": "addressDef", "type": "object"}},
    "properties": {"address": {"$ref": "#/$defs/address"}},
}


def test_an_anchor_is_allowed_and_only_a_reference_by_it_is_refused(tmp_path: Path) -> None:
    """JSON Schema 2020-12's ``$anchor`` names a subschema (MCP's conformance suite lists one in
    a tool's schema): a spec may carry it, referenced by JSON pointer; a ``$ref`` by the
    anchor's name is what cannot be resolved, and is refused where it is written."""
    assert one(tmp_path / "ok", spec("ns.t.v1", inputSchema=ANCHORED)) == []
    by_name = {**ANCHORED, "properties": {"address": {"$ref": "#addressDef"}}}
    found = one(tmp_path / "by-name", spec("ns.t.v1", inputSchema=by_name))
    assert [line.split(": ", 1)[1] for line in found] == [
        "/inputSchema/properties/address/$ref: reference '#addressDef' uses a plain-name "
        "fragment (use a JSON pointer fragment such as #/$defs/Name)"
    ]


@pytest.mark.parametrize(
    ("spec_id", "expected"),
    [
        (" ns.t.v1", "id has surrounding whitespace"),
        ("ns/t.v1", "id contains a slash"),
        ("ns\\t.v1", "id contains a backslash"),
        ("ns..t.v1", "id contains '..'"),
        ("ns.other.v1", "does not match the file path"),
    ],
)
def test_id_rules(tmp_path: Path, spec_id: str, expected: str) -> None:
    write_json(tmp_path / "ns" / "t.v1.json", spec("ns.t.v1", id=spec_id))
    found = problems_for(tmp_path)
    assert any(expected in line for line in found), found


def test_duplicate_ids_and_names_name_both_files(tmp_path: Path) -> None:
    write_json(tmp_path / "a" / "b.c.v1.json", spec("a.b.c.v1", name="same"))
    write_json(tmp_path / "a.b" / "c.v1.json", spec("a.b.c.v1", name="same"))
    found = problems_for(tmp_path)
    assert any(
        "id 'a.b.c.v1' is already used by" in f and "a.b/c.v1.json" in f and "a/b.c.v1.json" in f
        for f in found
    ), found
    assert any("name 'same' is already used" in f for f in found)


def test_positions_point_at_the_offending_key(tmp_path: Path) -> None:
    path = tmp_path / "ns" / "t.v1.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        '{\n  "id": "ns.t.v1",\n  "name": "t",\n  "description": "d",\n'
        '  "inputSchema": {"type": "object"},\n  "kind": "nope"\n}\n',
        "utf-8",
    )
    found = problems_for(tmp_path)
    assert found == [
        'ns/t.v1.json:6:3: /kind: "nope" is not one of "read_only", "write" or "execute" '
        '(use one of "read_only", "write", "execute")'
    ]


def test_every_problem_of_the_set_is_reported_at_once(tmp_path: Path) -> None:
    add_spec(tmp_path, spec("ns.a.v1", name="9"))
    add_spec(tmp_path, spec("ns.b.v1", kind="x", timeoutMs=-1))
    (tmp_path / "ns" / "c.v1.json").write_text("{ not json", "utf-8")
    (tmp_path / "ns" / "d.v1.json").write_text('{"id": "x", "id": "y"}', "utf-8")
    found = problems_for(tmp_path)
    files = {line.split(":")[0] for line in found}
    assert files == {"ns/a.v1.json", "ns/b.v1.json", "ns/c.v1.json", "ns/d.v1.json"}
    assert any("invalid JSON" in f for f in found)
    assert any("duplicate key 'id'" in f for f in found)
    assert len(found) >= 5


def test_shared_file_cycles_are_refused_but_recursion_inside_a_file_is_fine(tmp_path: Path) -> None:
    write_json(tmp_path / "common" / "a.schema.json", {"$ref": "b.schema.json"})
    write_json(tmp_path / "common" / "b.schema.json", {"$ref": "a.schema.json"})
    write_json(
        tmp_path / "common" / "tree.schema.json",
        {
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
                    },
                }
            }
        },
    )
    found = problems_for(tmp_path)
    assert any("reference each other in a cycle" in f for f in found), found
    assert not any("tree.schema.json" in f for f in found)


def test_valid_tree_has_no_problems_and_resolves(tmp_path: Path) -> None:
    write_json(
        tmp_path / "common" / "ids.schema.json",
        {"$defs": {"Id": {"type": "string", "minLength": 3}}},
    )
    add_spec(
        tmp_path,
        spec(
            "ns.t.v1",
            inputSchema={
                "type": "object",
                "properties": {"id": {"$ref": "../common/ids.schema.json#/$defs/Id"}},
            },
        ),
    )
    tree = load(tmp_path)
    assert validate(tree) == []
    resolved = resolve(tree)
    bundled = resolved.specs[0].input.bundled
    assert bundled["properties"]["id"] == {"$ref": "#/$defs/common.ids.$defs.Id"}
    assert bundled["$defs"]["common.ids.$defs.Id"] == {"type": "string", "minLength": 3}
    assert resolved.specs[0].fingerprint.startswith("sha256:")


def test_fingerprint_ignores_descriptions_but_not_contract(tmp_path: Path) -> None:
    def fingerprint(input_schema: dict[str, Any]) -> str:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        add_spec(root, spec("ns.t.v1", inputSchema=input_schema))
        return resolve(load(root)).specs[0].fingerprint

    base = {"type": "object", "properties": {"a": {"type": "string"}}}
    described = {
        "type": "object",
        "description": "x",
        "properties": {"a": {"type": "string", "title": "A"}},
    }
    narrowed = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}}
    # A property *named* description is contract, not an annotation.
    named = {"type": "object", "properties": {"description": {"type": "string"}}}
    assert fingerprint(base) == fingerprint(described)
    assert fingerprint(base) != fingerprint(narrowed)
    assert fingerprint(named) != fingerprint({"type": "object", "properties": {}})


def test_spec_error_lists_problems_sorted() -> None:
    from blade_codegen.problems import Problem

    error = SpecError([Problem("b.json", 1, 1, "/x", "m"), Problem("a.json", 2, 1, "", "n", "h")])
    assert str(error).splitlines() == ["a.json:2:1: /: n (h)", "b.json:1:1: /x: m"]


def test_local_definition_named_like_a_bundled_shared_one_is_refused(tmp_path: Path) -> None:
    write_json(
        tmp_path / "common" / "ids.schema.json",
        {"$defs": {"Id": {"type": "string", "minLength": 3}}},
    )
    add_spec(
        tmp_path,
        spec(
            "ns.t.v1",
            inputSchema={
                "type": "object",
                "properties": {"id": {"$ref": "../common/ids.schema.json#/$defs/Id"}},
                "$defs": {"common.ids.$defs.Id": {"type": "integer"}},
            },
        ),
    )
    tree = load(tmp_path)
    assert validate(tree) == []
    with pytest.raises(SpecError) as caught:
        resolve(tree)
    assert "/inputSchema/$defs/common.ids.$defs.Id: local definition" in str(caught.value)
