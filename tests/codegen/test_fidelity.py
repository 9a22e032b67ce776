"""Where models cannot be exact: fallbacks to looser types, and the build's report of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import add_spec, import_generated, run_mypy, spec
from pydantic import MISSING

from blade_codegen import models as models_module
from blade_codegen.build import build

BIN = Path(sys.executable).parent
LOOSE_INPUT = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "when": {"type": "string", "format": "date"},
        "mode": {"not": {"const": "off"}},
        "options": {
            "type": "object",
            "properties": {"depth": {"type": "integer"}},
            "default": {"depth": 2},
        },
        "limit": {"type": "integer", "default": "ten"},
    },
}


def test_the_build_reports_where_models_accept_more_than_the_schema(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    add_spec(specs, spec("t.loose.v1", inputSchema=LOOSE_INPUT))
    result = build(specs, tmp_path / "out", "pkg")
    notes = result.looser["t.loose.v1"]
    assert "input /properties/tags: 'uniqueItems' is enforced by the JSON Schema only" in notes
    assert "input /properties/mode: 'not' is enforced by the JSON Schema only" in notes
    assert any(n.startswith("input /properties/when: 'format' is an annotation") for n in notes)
    assert "input /properties/options: this 'default' is not carried into the model" in notes
    assert "input /properties/limit: this 'default' is not carried into the model" in notes
    module = (tmp_path / "out" / "pkg" / "t" / "loose_v1.py").read_text()
    assert "# The models accept more than the JSON Schema" in module
    assert "\"input /properties/mode: 'not' is enforced by the JSON Schema only\"" in module
    # Object and mistyped defaults stay out of the model: it type-checks and parses as typed.
    loose_v1 = import_generated(tmp_path / "out", "pkg.t.loose_v1")
    parsed = loose_v1.LooseInput.model_validate({})
    assert parsed.options is MISSING and parsed.limit is MISSING  # left out: not None
    assert loose_v1.LooseInput.model_validate({"options": {"depth": 3}}).options.depth == 3
    done = subprocess.run(
        [str(BIN / "blade-codegen"), "build", str(specs), "--out", str(tmp_path / "out2")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert "note: t.loose.v1: models looser than its JSON Schema at 5 place(s)" in done.stderr


def test_a_slot_the_generator_fails_on_is_typed_loosely_and_only_that_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = models_module.generate_models

    def fails_on_marker(document: dict[str, Any]) -> str:
        if "generator-breaker" in json.dumps(document):
            raise RecursionError("maximum recursion depth exceeded")
        return real(document)

    monkeypatch.setattr(models_module, "generate_models", fails_on_marker)
    specs = tmp_path / "specs"
    output = {
        "type": "object",
        "title": "generator-breaker",
        "properties": {"n": {"type": "integer"}},
    }
    add_spec(specs, spec("t.breaks.v1", outputSchema=output))
    result = build(specs, tmp_path / "out", "pkg")
    assert (
        result.looser["t.breaks.v1"][0]
        == "output: the generator failed; typed as any JSON object/value"
    )
    module = (tmp_path / "out" / "pkg" / "t" / "breaks_v1.py").read_text()
    assert (
        "class BreaksInput(BaseModel)" in module and "q: str | MISSING = MISSING" in module
    )  # still typed
    assert (
        "class BreaksOutput(BaseModel)" in module
        and "n:" not in module.split("class BreaksOutput")[1].split("class ")[0]
    )


def test_a_generator_that_fails_on_everything_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def always(document: dict[str, Any]) -> str:
        raise ValueError("unsupported")

    monkeypatch.setattr(models_module, "generate_models", always)
    specs = tmp_path / "specs"
    add_spec(specs, spec("t.tool.v1"))
    with pytest.raises(
        models_module.ModelFailure, match=r"t/tool\.v1\.json: t\.tool\.v1: the generator fails"
    ):
        build(specs, tmp_path / "out", "pkg")


def test_const_tagged_unions_become_discriminated_unions(tmp_path: Path) -> None:
    branch = {
        "type": "object",
        "properties": {"kind": {"const": "card"}, "last4": {"type": "string"}},
        "required": ["kind"],
    }
    other = {
        "type": "object",
        "properties": {"kind": {"const": "iban"}, "iban": {"type": "string"}},
        "required": ["kind", "iban"],
    }
    untagged = {"type": "object", "properties": {"kind": {"const": "cash"}}}  # kind optional
    specs = tmp_path / "specs"
    add_spec(specs, spec("t.tagged.v1", outputSchema={"oneOf": [branch, other]}))
    add_spec(specs, spec("t.loose-tag.v1", outputSchema={"oneOf": [branch, untagged]}))
    build(specs, tmp_path / "out", "tagged_pkg")
    tagged = (tmp_path / "out" / "tagged_pkg" / "t" / "tagged_v1.py").read_text()
    assert 'Field(discriminator="kind")' in tagged
    untagged_module = (tmp_path / "out" / "tagged_pkg" / "t" / "loose_tag_v1.py").read_text()
    assert "discriminator" not in untagged_module  # a branch may omit kind: no tag to pick by
    tagged_v1 = import_generated(tmp_path / "out", "tagged_pkg.t.tagged_v1")
    from pydantic import TypeAdapter, ValidationError

    adapter = TypeAdapter(tagged_v1.TaggedOutput)
    assert (
        type(adapter.validate_python({"kind": "iban", "iban": "DE1"})).__name__
        == "TaggedOutputIban"
    )
    with pytest.raises(ValidationError, match="union_tag_invalid"):
        adapter.validate_python({"kind": "cash"})


def test_every_mcp_corpus_module_passes_mypy_strict(mcp_package: Any) -> None:
    out = Path(mcp_package.__file__).parent.parent
    result = run_mypy(Path("blade_mcp"), cwd=out)
    assert result.returncode == 0, result.stdout[-3000:]
    assert len(list((out / "blade_mcp").rglob("*_v1.py"))) == 312


AWKWARD = {
    "type": "object",
    "$defs": {
        "Base": {
            "type": "object",
            "properties": {"x": {"type": "string"}, "y": {"type": "integer"}},
        },
        "Tpl": {
            "type": "array",
            "minItems": 1,
            "items": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/Tpl"}]},
        },
    },
    "properties": {
        # A constrained string inside a union: the generator writes constr(...).
        "lang": {"type": ["string", "number"], "pattern": "^[a-z]{2}$"},
        # An optional property whose schema excludes null, with a None default.
        "apps": {"type": "array", "const": []},
        # allOf parts typing one property differently: a subclass overriding its base.
        "merged": {"allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"x": {"type": "boolean"}}}]},
        # A recursive array: the generator writes a bare list.
        "template": {"$ref": "#/$defs/Tpl"},
    },
}


@pytest.mark.parametrize(
    "value",
    [
        {"lang": "en"},
        {"lang": 2.5},
        {"lang": 7},
        {"apps": []},
        {"merged": {"y": 1}},
        {"merged": {"y": 2, "extra": [1]}},
        {"template": ["a", ["b", ["c"]]]},
    ],
)
def test_schemas_the_generator_types_awkwardly_type_check_and_keep_values(
    awkward: Any, value: dict[str, Any]
) -> None:
    from pydantic import TypeAdapter

    adapter = TypeAdapter(awkward.SPEC.input_type)
    parsed = adapter.validate_python(value)
    assert adapter.dump_python(parsed, mode="json", by_alias=True, exclude_unset=True) == value


@pytest.fixture(scope="module")
def awkward(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("awkward")
    add_spec(root / "specs", spec("t.awkward.v1", inputSchema=AWKWARD))
    build(root / "specs", root / "out", "awkward_pkg")
    checked = run_mypy(root / "out" / "awkward_pkg", cwd=root / "out")
    assert checked.returncode == 0, checked.stdout
    module = (root / "out" / "awkward_pkg" / "t" / "awkward_v1.py").read_text("utf-8")
    assert "StringConstraints(pattern=" in module and "constr(" not in module
    awkward_v1 = import_generated(root / "out", "awkward_pkg.t.awkward_v1")
    return awkward_v1
