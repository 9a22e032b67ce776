"""Model-facing exports: our manifest and the OpenAI, Anthropic and MCP shapes, with wire names."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLE_SPECS, add_spec, run_cli, spec
from hypothesis import given
from hypothesis import strategies as st

from blade_runtime.core.export import NAME_RULES, ExportedTool, export_tools, wire_names
from blade_runtime.runtime import Runtime

BIN = Path(sys.executable).parent


def tool(name: str, **overrides: Any) -> ExportedTool:
    fields: dict[str, Any] = {
        "name": name,
        "id": f"t.{name}.v1",
        "description": f"The {name} tool.",
        "input_schema": {"type": "object"},
        "output_schema": None,
        "kind": None,
        "side_effect": "non_idempotent",
        "execution": "backend",
        "timeout_ms": 1000,
    }
    return ExportedTool(**{**fields, **overrides})


def export_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``blade-codegen export ARGS`` as a real process (its exit codes, stdout and stderr)."""
    return subprocess.run(
        [str(BIN / "blade-codegen"), "export", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )


def test_dotted_names_get_provider_safe_wire_names_and_map_back() -> None:
    exported = export_tools([tool("crm.lookup"), tool("crm_lookup"), tool("plain")], "openai")
    names = [entry["function"]["name"] for entry in exported.document]  # type: ignore[index,union-attr]
    # "crm_lookup" is valid as written and keeps its name; "crm.lookup" must not take it.
    assert names[1] == "crm_lookup" and names[2] == "plain"
    assert re.fullmatch(r"crm_lookup_[0-9a-f]{8}", names[0])
    assert [exported.names.name(n) for n in names] == ["crm.lookup", "crm_lookup", "plain"]
    mcp = export_tools([tool("crm.lookup")], "mcp")
    assert mcp.names.wire("crm.lookup") == "crm.lookup"  # MCP allows dots


@given(st.lists(st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,90}", fullmatch=True), unique=True))
def test_wire_names_are_valid_unique_and_reversible(names: list[str]) -> None:
    for format_ in ("openai", "anthropic", "mcp"):
        rule = NAME_RULES[format_]  # type: ignore[index]
        mapping = wire_names(names, rule)
        wires = [mapping.wire(name) for name in names]
        assert len(set(wires)) == len(names)
        assert all(re.fullmatch(rule.text.strip("^$"), wire) for wire in wires)
        assert [mapping.name(wire) for wire in wires] == names
        assert wire_names(reversed(names), rule) == mapping  # independent of order


def test_formats_have_the_providers_shapes() -> None:
    tools = [
        tool("read.doc", kind="read_only", side_effect="pure", output_schema={"type": "object"}),
        tool("write_doc", kind="write", output_schema={"type": "string"}),
    ]
    openai = export_tools(tools, "openai").document
    assert openai[0] == {  # type: ignore[index]
        "type": "function",
        "function": {
            "name": export_tools(tools, "openai").names.wire("read.doc"),
            "description": "The read.doc tool.",
            "parameters": {"type": "object"},
        },
    }
    anthropic = export_tools(tools, "anthropic").document
    assert set(anthropic[1]) == {"name", "description", "input_schema"}  # type: ignore[index,arg-type]
    mcp = export_tools(tools, "mcp").document["tools"]  # type: ignore[index,call-overload]
    assert mcp[0]["annotations"] == {"readOnlyHint": True, "idempotentHint": True}
    assert mcp[0]["outputSchema"] == {"type": "object"}
    assert "outputSchema" not in mcp[1]  # MCP structured content is an object
    blade = export_tools(tools, "blade").document["tools"]  # type: ignore[index,call-overload]
    assert blade[1]["id"] == "t.write_doc.v1" and blade[1]["output_schema"] == {"type": "string"}


def test_the_runtime_and_the_command_export_the_same_document(example_package: Any) -> None:
    from blade_specs.crm import lookup_customer_v1 as lookup
    from blade_specs.deploy import deploy_service_v1 as deploy

    async def impl(ctx: Any) -> Any:
        return None

    runtime = Runtime()
    runtime.register(lookup.SPEC, impl, context=lambda call: None)
    runtime.register(deploy.SPEC, impl)
    from_specs = json.loads(run_cli("export", str(EXAMPLE_SPECS), "--format", "mcp").stdout)
    from_runtime = runtime.export("mcp").document
    by_name = {entry["name"]: entry for entry in from_specs["tools"]}
    assert set(by_name) == {"check_page", "deploy_service", "lookup_customer", "refund_payment"}
    for entry in from_runtime["tools"]:  # type: ignore[index,call-overload]
        assert by_name[entry["name"]] == entry


def test_export_command_writes_files_and_refuses_invalid_specs(tmp_path: Path) -> None:
    out = tmp_path / "tools.json"
    done = export_cli(str(EXAMPLE_SPECS), "--format", "anthropic", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert [t["name"] for t in json.loads(out.read_text())] == [
        "check_page",
        "deploy_service",
        "lookup_customer",
        "refund_payment",
    ]
    specs = tmp_path / "specs"
    add_spec(specs, spec("t.dotted.v1", name="t.dotted"))
    renamed = export_cli(str(specs), "--format", "openai")
    assert renamed.returncode == 0
    assert "openai name for t.dotted: t_dotted" in renamed.stderr
    add_spec(specs, spec("t.broken.v1", inputSchema={"type": "array"}))
    broken = export_cli(str(specs), "--format", "openai")
    assert broken.returncode == 3 and broken.stdout == ""
    assert "broken.v1.json" in broken.stderr and "Traceback" not in broken.stderr
    usage = export_cli(str(specs), "--format", "gemini")
    assert usage.returncode == 2


@pytest.mark.parametrize("format_", ["blade", "openai", "anthropic", "mcp"])
def test_every_format_is_plain_json(format_: str) -> None:
    # In this process; test_export_command_writes_files_and_refuses_invalid_specs runs the real one.
    done = run_cli("export", str(EXAMPLE_SPECS), "--format", format_)
    assert done.returncode == 0, done.stderr
    assert "contextSchema" not in done.stdout and "tenant_id" not in done.stdout  # server-only
    json.loads(done.stdout)


def test_the_command_offers_exactly_the_runtimes_formats() -> None:
    from blade_codegen import cli
    from blade_runtime.core.export import EXPORT_FORMATS

    assert cli.EXPORT_FORMATS == EXPORT_FORMATS
