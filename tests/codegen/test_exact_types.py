"""Optional properties are typed exactly: left out is MISSING, None only where null is valid.

Every slot (input, output, context, data, suspend, resume) gets the same two properties, one
optional and non-nullable, one optional and nullable; mypy must refuse ``None`` for the first and
accept it for the second, and values round-trip through the models unchanged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import add_spec, import_generated, run_mypy, spec
from hypothesis import given, settings
from hypothesis import strategies as st

SLOTS = ("Input", "Output", "Context", "NoteData", "AskSuspend", "AskResume")


def _object() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "plain": {"type": "string"},
            "maybe": {"type": ["string", "null"]},
            "count": {"type": "integer", "minimum": 0},
        },
    }


@pytest.fixture(scope="module")
def exact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from blade_codegen.build import build

    root = tmp_path_factory.mktemp("exact")
    specs, out = root / "specs", root / "out"
    add_spec(
        specs,
        spec(
            "t.every-slot.v1",
            inputSchema=_object(),
            outputSchema=_object(),
            contextSchema=_object(),
            dataSchemas={"note": _object()},
            suspend={"ask": {"suspendSchema": _object(), "resumeSchema": _object()}},
        ),
    )
    build(specs, out, "exact_pkg")
    return out


def _snippet(slot: str, value: str) -> str:
    return (
        f"from exact_pkg.t.every_slot_v1 import EverySlot{slot}\n"
        f"EverySlot{slot}(plain={value})\n"
    )


@pytest.mark.parametrize("slot", SLOTS)
def test_none_is_refused_where_the_schema_refuses_null(exact: Path, slot: str) -> None:
    (exact / "bad.py").write_text(_snippet(slot, "None"), "utf-8")
    result = run_mypy(exact / "bad.py", cwd=exact)
    assert result.returncode == 1, result.stdout
    assert 'incompatible type "None"' in result.stdout


def test_none_is_accepted_where_the_schema_allows_null(exact: Path) -> None:
    lines = [f"from exact_pkg.t.every_slot_v1 import EverySlot{s}\n" for s in SLOTS]
    lines += [f"EverySlot{s}(maybe=None, plain='x')\nEverySlot{s}()\n" for s in SLOTS]
    lines.append(
        "from pydantic import MISSING\n"
        "v = EverySlotInput().plain\n"
        "if v is not MISSING:\n"
        "    s: str = v\n"
    )
    (exact / "good.py").write_text("".join(lines), "utf-8")
    result = run_mypy(exact / "good.py", cwd=exact)
    assert result.returncode == 0, result.stdout


def _models(exact: Path) -> Any:
    return import_generated(exact, "exact_pkg.t.every_slot_v1")


@settings(max_examples=60, deadline=None)
@given(
    value=st.fixed_dictionaries(
        {},
        optional={
            "plain": st.text(max_size=5),
            "maybe": st.none() | st.text(max_size=5),
            "count": st.integers(min_value=0),
        },
    )
)
def test_values_round_trip_unchanged_in_every_slot(exact: Path, value: dict[str, Any]) -> None:
    module = _models(exact)
    for slot in SLOTS:
        model = getattr(module, f"EverySlot{slot}")
        parsed = model.model_validate(value)
        assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == value
        # The sentinel never reaches JSON, even without exclude_unset.
        assert parsed.model_dump(mode="json", by_alias=True) == value


def test_a_property_left_out_is_missing_not_none(exact: Path) -> None:
    from pydantic import MISSING

    module = _models(exact)
    empty = module.EverySlotOutput()
    assert empty.plain is MISSING
    assert empty.maybe is MISSING
    assert module.EverySlotOutput(maybe=None).model_dump(mode="json") == {"maybe": None}


def test_defaults_the_schema_rejects_stay_out_of_the_model(tmp_path: Path) -> None:
    from blade_codegen.build import build

    schema = {
        "type": "object",
        "properties": {
            "mode": {"type": "string", "enum": ["fast", "safe"], "default": "slow"},
            "size": {"type": "integer", "default": "big"},
            "short": {"type": "string", "maxLength": 2, "default": "toolong"},
            "kept": {"type": "string", "enum": ["fast", "safe"], "default": "safe"},
        },
    }
    add_spec(tmp_path / "specs", spec("t.defaults.v1", inputSchema=schema))
    build(tmp_path / "specs", tmp_path / "out", "defaults_pkg")
    text = (tmp_path / "out" / "defaults_pkg" / "t" / "defaults_v1.py").read_text("utf-8")
    assert '"slow"' not in text.split("_SCHEMAS")[0] and "toolong" not in text.split("_SCHEMAS")[0]
    assert text.count("this 'default' is not carried into the model") == 3
    module = import_generated(tmp_path / "out", "defaults_pkg.t.defaults_v1")
    assert module.DefaultsInput().kept == "safe"
    result = run_mypy(tmp_path / "out" / "defaults_pkg", cwd=tmp_path / "out")
    assert result.returncode == 0, result.stdout


def test_a_string_branch_beside_object_keywords_stays_a_branch(tmp_path: Path) -> None:
    from blade_codegen.build import build

    schema = {
        "type": "object",
        "properties": {
            "target": {
                "anyOf": [{"type": "string"}, {"type": "object", "required": ["id"]}],
                "properties": {"id": {"type": "string"}},
            }
        },
    }
    add_spec(tmp_path / "specs", spec("t.branches.v1", inputSchema=schema))
    build(tmp_path / "specs", tmp_path / "out", "branch_pkg")
    module = import_generated(tmp_path / "out", "branch_pkg.t.branches_v1")
    for value in ({"target": "a string"}, {"target": {"id": "x", "more": 1}}):
        parsed = module.BranchesInput.model_validate(value)
        assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == value


BRANCHES = [
    {"type": "string"},
    {"type": "integer"},
    {"type": "array", "items": {"type": "string"}},
    {"type": "object", "properties": {"q": {"type": "integer"}}},
    {"type": "object", "properties": {"k": {"const": "x"}}, "required": ["k"]},
    {"$ref": "#/$defs/S"},
    {"$ref": "#/$defs/O"},
]
SIBLINGS = {
    "properties": {"z": {"type": "string"}},
    "items": {"type": "string"},
    "minLength": 1,
    "maximum": 10,
}
INSTANCES = ["hello", "", 5, 50, ["s"], [], {"q": 1}, {"z": "w"}, {"k": "x"}, {"z": "w", "q": 2}]


def _models_of(slot: dict[str, Any]) -> Any:
    """The model class M of ``slot``, through the same reshaping render applies."""
    import types

    from blade_codegen.models import generate_models, model_shapes, name_branches
    from blade_codegen.render import split_module

    shaped = model_shapes(slot, False)
    defs = dict(shaped.pop("$defs"))
    defs["M"] = name_branches(shaped, "M", defs, {"M", "O", "S"})
    code = generate_models({"$defs": dict(sorted(defs.items()))})
    split = split_module(code)
    module = types.ModuleType(f"union_models_{abs(hash(code))}")
    sys.modules[module.__name__] = module
    imports = "\n".join(f"from {m} import {', '.join(sorted(n))}" for m, n in split.imports.items())
    exec(
        compile(f"from __future__ import annotations\n{imports}\n{split.body}", "m", "exec"),
        module.__dict__,
    )
    return module.M


@settings(max_examples=25, deadline=None)
@given(
    branches=st.lists(st.sampled_from(BRANCHES), min_size=2, max_size=4, unique_by=json.dumps),
    siblings=st.lists(st.sampled_from(sorted(SIBLINGS)), max_size=3, unique=True),
    combinator=st.sampled_from(["anyOf", "oneOf"]),
    wrapped=st.booleans(),
)
def test_every_union_branch_keeps_its_values(
    branches: list[dict[str, Any]], siblings: list[str], combinator: str, wrapped: bool
) -> None:
    import jsonschema_rs

    union: dict[str, Any] = {combinator: branches, **{k: SIBLINGS[k] for k in siblings}}
    slot = {
        "type": "object",
        "properties": {"p": {"allOf": [union]} if wrapped else union},
        "$defs": {"S": {"type": "string"}, "O": {"type": "object", "properties": {"o": {}}}},
    }
    validator = jsonschema_rs.Draft202012Validator(slot)
    model = _models_of(slot)
    for value in INSTANCES:
        instance = {"p": value}
        if validator.is_valid(instance):
            parsed = model.model_validate(instance)
            assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == instance
