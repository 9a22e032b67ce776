"""Class names: from a title, else a const tag, else a $defs key, else numbered; never shadowing."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import add_spec, run_mypy, run_ruff, spec, tree_bytes, write_json
from pydantic import TypeAdapter

from blade_codegen.build import build


def _branch(tag: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"kind": {"const": tag}, "n": {"type": "integer"}},
        "required": ["kind"],
        **extra,
    }


def _module(out: Path, package: str, name: str) -> Any:
    sys.path.insert(0, str(out))
    try:
        for loaded in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[loaded]
        return importlib.import_module(f"{package}.{name}")
    finally:
        sys.path.remove(str(out))


def _build(root: Path, data: dict[str, Any], package: str) -> Path:
    add_spec(root / "specs", data)
    build(root / "specs", root / "out", package)
    return root / "out"


def test_union_branches_are_named_by_title_then_tag_then_position(tmp_path: Path) -> None:
    output = {
        "oneOf": [
            _branch("done", title="Finished"),
            _branch("queued-later"),
            {"type": "object", "properties": {"error": {"type": "string"}}},
            {"type": "string"},
        ]
    }
    out = _build(tmp_path, spec("t.job-status.v1", outputSchema=output), "names_pkg")
    module = _module(out, "names_pkg", "t.job_status_v1")
    assert module.Finished(kind="done").kind == "done"
    assert module.JobStatusOutputQueuedLater(kind="queued-later").kind == "queued-later"
    assert module.JobStatusOutput3(error="x").error == "x"
    # The string branch stays a branch: strings are valid outputs.
    assert TypeAdapter(module.JobStatusOutput).validate_python("plain") == "plain"


def test_a_title_that_is_taken_gets_the_holder_in_front(tmp_path: Path) -> None:
    output = {"anyOf": [_branch("a", title="Execution"), _branch("b", title="JobOutput")]}
    out = _build(tmp_path, spec("t.job.v1", outputSchema=output), "taken_pkg")
    module = _module(out, "taken_pkg", "t.job_v1")
    assert module.JobOutputExecution(kind="a").kind == "a"
    assert module.JobOutputJobOutput(kind="b").kind == "b"


def test_names_are_deterministic(tmp_path: Path) -> None:
    output = {"oneOf": [_branch("x", title="Same"), _branch("y", title="Same")]}
    first = _build(tmp_path / "a", spec("t.twice.v1", outputSchema=output), "det_pkg")
    second = _build(tmp_path / "b", spec("t.twice.v1", outputSchema=output), "det_pkg")
    assert tree_bytes(first) == tree_bytes(second)
    text = (first / "det_pkg" / "t" / "twice_v1.py").read_text("utf-8")
    assert "class Same(BaseModel)" in text and "class TwiceOutputSame(BaseModel)" in text


RUNTIME_NAMES = ["Execution", "ResumeEntry", "SuspendPoint", "Parser", "InitialEntry", "MISSING"]


def test_no_definition_shadows_a_name_the_module_uses(tmp_path: Path) -> None:
    defs = {
        name: {"type": "object", "properties": {"v": {"type": "string"}}} for name in RUNTIME_NAMES
    }
    schema = {
        "type": "object",
        "properties": {name.lower(): {"$ref": f"#/$defs/{name}"} for name in RUNTIME_NAMES},
        "$defs": defs,
    }
    write_json(
        tmp_path / "specs" / "common" / "parts.schema.json",
        {"$defs": {"Parser": {"type": "object", "properties": {"p": {"type": "string"}}}}},
    )
    resume = {
        "type": "object",
        "properties": {
            "shared": {"$ref": "../common/parts.schema.json#/$defs/Parser"},
            "pick": {"anyOf": [{"title": "Parser", "type": "object"}, {"type": "string"}]},
        },
    }
    data = spec(
        "t.shadow.v1",
        inputSchema=schema,
        outputSchema=schema,
        suspend={"ask": {"suspendSchema": schema, "resumeSchema": resume}},
    )
    out = _build(tmp_path, data, "shadow_pkg")
    module = _module(out, "shadow_pkg", "t.shadow_v1")
    assert module.ExecutionModel(v="x").v == "x"
    assert module.SPEC.suspend["ask"].name == "ask"
    (out / "use.py").write_text(
        "from shadow_pkg.t.shadow_v1 import ShadowAskSuspend, ShadowExecution, ShadowOutput\n"
        "async def run(ctx: ShadowExecution) -> ShadowOutput:\n"
        "    ctx.suspend('ask', ShadowAskSuspend(execution=ctx.input.execution))\n",
        "utf-8",
    )
    result = run_mypy(out / "shadow_pkg", out / "use.py", cwd=out)
    assert result.returncode == 0, result.stdout
    assert run_ruff(out / "shadow_pkg").returncode == 0


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_a_shared_definition_named_like_a_runtime_name_is_renamed(
    tmp_path: Path, name: str
) -> None:
    write_json(
        tmp_path / "specs" / "common" / "defs.schema.json",
        {"$defs": {name: {"type": "object", "properties": {"v": {"type": "string"}}}}},
    )
    schema = {
        "type": "object",
        "properties": {"x": {"$ref": f"../common/defs.schema.json#/$defs/{name}"}},
    }
    out = _build(tmp_path, spec("t.uses.v1", inputSchema=schema), f"s_{name.lower()}")
    module = _module(out, f"s_{name.lower()}", "t.uses_v1")
    assert module.UsesInput.model_validate({"x": {"v": "1"}}).x.v == "1"


def test_an_inline_object_with_a_title_is_a_class_of_that_name(tmp_path: Path) -> None:
    address = {"type": "object", "title": "Postal address", "properties": {"city": {}}}
    schema = {
        "type": "object",
        "properties": {
            "home": {**address, "description": "Where they live."},
            "work": address,
            "other": {**address, "properties": {"zip": {}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {}}}},
        },
    }
    out = _build(tmp_path, spec("t.person.v1", inputSchema=schema), "titled_pkg")
    module = _module(out, "titled_pkg", "t.person_v1")
    value = {"home": {"city": "Oslo"}, "work": {"city": "Bergen"}, "tags": [{"t": 1}]}
    parsed = module.PersonInput.model_validate(value)
    assert type(parsed.home).__name__ == "PostalAddress"
    assert type(parsed.work).__name__ == "PostalAddress"  # the same object: the same class
    other = module.PersonInput.model_validate({"other": {"zip": 1}}).other
    assert type(other).__name__ == "PersonInputOtherPostalAddress"  # the title was taken
    assert type(parsed.tags[0]).__name__ == "PersonInputTag"  # untitled: the generator's name
    assert module.PersonInput.model_fields["home"].description == "Where they live."
    assert parsed.model_dump(exclude_unset=True) == value


def test_every_name_a_generated_module_imports_is_reserved(built_examples: Path) -> None:
    """A name imported from the runtime, pydantic or the standard library must be in
    plan.RESERVED, or a definition of that name would shadow it: templates that start importing
    a new name have to reserve it."""
    import ast

    from blade_codegen.plan import RESERVED

    imported: set[str] = set()
    for path in (built_examples / "blade_specs").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
                imported.update(alias.asname or alias.name for alias in node.names)
    assert imported, "the example package imports names"
    # Spec-derived class names start with a capital (pascal), so only those can collide.
    assert {name for name in imported if name[:1].isupper()} - RESERVED == set()
