"""Spec text never becomes code: hostile strings and names give safe code or a clear error."""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path

import pytest
from conftest import add_spec, import_generated, run_mypy, run_ruff, spec
from hypothesis import given
from hypothesis import strategies as st

from blade_codegen.build import build
from blade_codegen.problems import SpecError
from blade_codegen.render import docstring_text, escape_controls, pyrepr

HOSTILE_TEXT = (
    'He said """hi""" \\ and \'\'\' then\n\timport os; os.system("x") # é ✓ \x00\x1b end"'
)


def hostile_spec() -> dict[str, object]:
    properties = {
        name: {"type": "string", "description": HOSTILE_TEXT}
        for name in (
            "class",
            "def",
            "import",
            "None",
            "self",
            "list",
            "type",
            "model_config",
            "model_dump",
            "__init__",
            "__class__",
            "a-b",
            "a_b",
            "a b",
            "é",
            "1st",
            "",
        )
    }
    properties["mode"] = {
        "type": "string",
        "enum": ['a"b', "c'd", 'e"""f', "g\\h", "line\nbreak", "None"],
        "default": 'a"b',
    }
    properties["count"] = {"type": "integer", "default": 3, "title": HOSTILE_TEXT}
    return spec(
        "evil.hostile-tool.v1",
        name="hostile.tool-name_1",
        description=HOSTILE_TEXT,
        inputSchema={"type": "object", "description": HOSTILE_TEXT, "properties": properties},
        outputSchema={"type": "string", "description": HOSTILE_TEXT},
        dataSchemas={"class": {"type": "object", "properties": {"def": {"type": "integer"}}}},
        suspend={
            "import": {
                "suspendSchema": {"type": "object", "properties": {"x": {"type": "string"}}},
                "resumeSchema": {"type": "array", "items": {"type": "string"}},
            }
        },
    )


def test_hostile_spec_gives_valid_safe_typed_code(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    add_spec(specs, hostile_spec())
    out = tmp_path / "out"
    build(specs, out, "evil_pkg")
    module_path = out / "evil_pkg" / "evil" / "hostile_tool_v1.py"
    source = module_path.read_text("utf-8")
    tree = ast.parse(source)
    # Only the expected top-level statements: no spec text turned into a statement.
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "system"
    ]
    assert not calls
    assert run_mypy(out / "evil_pkg", cwd=out).returncode == 0
    assert run_ruff(out / "evil_pkg").returncode == 0
    try:
        with warnings.catch_warnings():
            # A property named model_dump, renamed model_dump_: no warning at import.
            warnings.simplefilter("error")
            module = import_generated(out, "evil_pkg.evil.hostile_tool_v1")
        assert module.SPEC.description == HOSTILE_TEXT
        assert module.SPEC.name == "hostile.tool-name_1"
        fields = module.HostileToolInput.model_json_schema()["properties"]
        assert fields["class"]["description"] == HOSTILE_TEXT
        value = module.HostileToolInput.model_validate(
            {"class": "c", "a-b": "1", "a_b": "2", "mode": "line\nbreak", "": "empty"}
        )
        dumped = value.model_dump(mode="json", by_alias=True, exclude_unset=True)
        assert dumped == {"class": "c", "a-b": "1", "a_b": "2", "mode": "line\nbreak", "": "empty"}
    finally:
        for name in [m for m in sys.modules if m.startswith("evil_pkg")]:
            del sys.modules[name]


def test_names_differing_only_in_punctuation_are_a_clear_error(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    channel = {"type": "object"}
    add_spec(specs, spec("ns.tool.v1", dataSchemas={"step_log": channel, "stepLog": channel}))
    add_spec(specs, spec("ns.a-b.v1"))
    add_spec(specs, spec("ns.a_b.v1", name="other"))
    with pytest.raises(SpecError) as caught:
        build(specs, tmp_path / "out", "pkg")
    text = str(caught.value)
    assert "would be class ToolStepLogData" in text
    assert "module pkg.ns.a_b_v1 is also the module of ns/a-b.v1.json" in text
    assert not (tmp_path / "out").exists()


@given(st.text())
def test_docstring_text_round_trips_any_text(text: str) -> None:
    literal = '"""' + docstring_text(text) + '"""'
    assert ast.literal_eval(literal) == text


@given(st.text() | st.integers() | st.booleans() | st.none())
def test_pyrepr_is_a_literal_of_the_same_value(value: object) -> None:
    assert ast.literal_eval(pyrepr(value)) == value


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x0c", "\x0b", "\x1c", "\x85"])
def test_escaping_counts_lines_as_the_parser_does(separator: str) -> None:
    # str.splitlines breaks at these too; the parser and tokenize do not. A literal holding one
    # shifted every later position by a line, and the next escape cut the module apart.
    code = f'a = "p{separator}q"\nb = "\x01"\nc = 1\n'
    escaped = escape_controls(code)
    tree = ast.parse(escaped)
    values = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)]
    assert values == [f"p{separator}q", "\x01", 1]
    assert separator not in escaped and "\x01" not in escaped
