"""A tool's display name, aliases, group and exposure (seed 000's ToolDefinition ``displayName``,
``aliases``, ``group``, ``exposure``): declared in the spec or at registration; aliases are more
names of the same registration (the store records the name called); exposure decides where the
tool is listed; MCP shows the title, the inbox the display name, export carries them."""

from __future__ import annotations

import asyncio
import importlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import _import_package, add_spec, run_mypy, spec
from http_support import ALICE, authenticate

from blade_codegen.build import build
from blade_codegen.export import export_specs
from blade_codegen.resolve import SpecError, resolve_specs
from blade_runtime import CallContext, Principal, Runtime
from blade_runtime.core.registry import RegistrationError
from blade_runtime.core.results import ErrorCode, ToolError, ToolSuccess
from blade_runtime.core.store import Store

ANN = CallContext(principal=Principal("alice", "acme"))
PATH = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def _specs(root: Path) -> Path:
    add_spec(
        root / "specs",
        spec(
            "files.read-text.v1",
            name="read_text",
            description="Reads a file.",
            inputSchema=PATH,
            outputSchema=TEXT,
            sideEffect="pure",
            title="Read a file",
            aliases=["Read", "cat"],
            group="filesystem",
        ),
    )
    add_spec(
        root / "specs",
        spec(
            "files.purge-cache.v1",
            name="purge_cache",
            description="Purges the file cache.",
            inputSchema=PATH,
            outputSchema=TEXT,
            sideEffect="idempotent",
            title="Purge the cache",
            group="filesystem",
            exposure="operator",
        ),
    )
    return root / "specs"


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("presentation")
    build(_specs(root), root / "out", "presentation_pkg")
    _import_package(root / "out", "presentation_pkg")
    importlib.import_module("presentation_pkg.files.read_text_v1")
    importlib.import_module("presentation_pkg.files.purge_cache_v1")
    return importlib.import_module("presentation_pkg.files")


def implementation(package: Any, module: str) -> Any:
    spec = getattr(package, module).SPEC

    async def run(ctx: Any) -> Any:
        return spec.output_type(text=f"{ctx.call.name}:{ctx.input.path}")

    return run


def runtime_of(package: Any, store: Store | None = None) -> Runtime:
    runtime = Runtime(store=store)
    runtime.register(package.read_text_v1.SPEC, implementation(package, "read_text_v1"))
    runtime.register(package.purge_cache_v1.SPEC, implementation(package, "purge_cache_v1"))
    return runtime


def test_the_generated_spec_carries_them(package: Any) -> None:
    read = package.read_text_v1.SPEC
    purge = package.purge_cache_v1.SPEC
    assert (read.title, read.aliases, read.group, read.exposure) == (
        "Read a file",
        ("Read", "cat"),
        "filesystem",
        "model",
    )
    assert (purge.title, purge.aliases, purge.exposure) == ("Purge the cache", (), "operator")


def test_the_generated_package_is_deterministic_and_typed(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    build(specs, tmp_path / "one", "shown")
    build(specs, tmp_path / "two", "shown")
    module = Path("shown", "files", "read_text_v1.py")
    first = (tmp_path / "one" / module).read_text("utf-8")
    assert first == (tmp_path / "two" / module).read_text("utf-8")
    assert "title='Read a file'" in first.replace('"', "'")
    manifest = json.loads((tmp_path / "one" / "shown" / "manifest.json").read_text("utf-8"))
    by_id = {tool["id"]: tool for tool in manifest["tools"]}
    assert by_id["files.read-text.v1"]["aliases"] == ["Read", "cat"]
    assert by_id["files.purge-cache.v1"]["exposure"] == "operator"
    checked = run_mypy(tmp_path / "one" / "shown", cwd=tmp_path / "one")
    assert checked.returncode == 0, checked.stdout


def test_a_call_by_an_alias_is_a_call_of_the_tool_and_the_store_records_the_name(
    package: Any, store: Store
) -> None:
    async def scenario() -> tuple[Any, ...]:
        runtime = runtime_of(package, store)
        by_name = await runtime.call("read_text", {"path": "a"}, call_id="c-name", context=ANN)
        by_alias = await runtime.call("cat", {"path": "b"}, call_id="c-alias", context=ANN)
        listed = [r.name for r in runtime.registrations()]
        await runtime.close()
        return by_name, by_alias, listed, store.call("c-alias")

    by_name, by_alias, listed, stored = asyncio.run(scenario())
    assert isinstance(by_name, ToolSuccess) and isinstance(by_alias, ToolSuccess)
    assert by_alias.output.text == "cat:b"  # the implementation sees the name called
    assert by_alias.call.spec_id == "files.read-text.v1"
    assert listed == ["read_text", "purge_cache"]  # registered once, listed once
    if stored is not None:
        assert (stored.name, stored.spec_id) == ("cat", "files.read-text.v1")


def test_an_alias_is_refused_wherever_its_tools_name_is(package: Any) -> None:
    async def scenario() -> Any:
        runtime = runtime_of(package)
        runtime.disallowed = ["read_text"]
        return await runtime.call("Read", {"path": "a"})

    refused = asyncio.run(scenario())
    assert isinstance(refused, ToolError) and refused.code is ErrorCode.TOOL_NOT_ALLOWED


def test_registration_overrides_the_spec_and_refuses_bad_values(package: Any) -> None:
    runtime = Runtime()
    read = package.read_text_v1.SPEC
    added = runtime.register(
        read, implementation(package, "read_text_v1"), title="Open", aliases=["open"]
    )
    assert (added.title, added.aliases, added.group) == ("Open", ("open",), "filesystem")
    assert runtime.tools.by_name["open"] is added
    with pytest.raises(RegistrationError, match=r"the alias 'open' is already a name of"):
        runtime.register(read, implementation(package, "read_text_v1"), name="o2", aliases=["open"])
    with pytest.raises(RegistrationError, match=r"exposure='hidden' is none of model, operator"):
        hidden: Any = "hidden"  # what an untyped caller might pass
        runtime.register(read, implementation(package, "read_text_v1"), name="o3", exposure=hidden)
    with pytest.raises(RegistrationError, match=r"the alias 'no spaces' must match"):
        runtime.register(
            read, implementation(package, "read_text_v1"), name="o4", aliases=["no spaces"]
        )
    with pytest.raises(RegistrationError, match=r"'open': it is an alias of 'read_text'"):
        runtime.unregister("open")
    runtime.unregister("read_text")
    assert "open" not in runtime.tools.by_name


def test_exposure_decides_where_a_tool_is_listed(package: Any) -> None:
    runtime = runtime_of(package)
    blade = runtime.export("blade").document
    assert isinstance(blade, dict)
    [tool] = blade["tools"]
    assert tool["name"] == "read_text"
    assert (tool["title"], tool["aliases"], tool["group"]) == (
        "Read a file",
        ["Read", "cat"],
        "filesystem",
    )
    assert [t["function"]["name"] for t in runtime.export("openai").document] == ["read_text"]  # type: ignore[index, union-attr]
    # the application still calls an operator tool
    called = asyncio.run(runtime.call("purge_cache", {"path": "/tmp"}))
    assert isinstance(called, ToolSuccess)


def test_the_spec_export_leaves_operator_tools_out_and_carries_the_rest(tmp_path: Path) -> None:
    document = export_specs(_specs(tmp_path), "mcp").document
    assert isinstance(document, dict)
    assert [(t["name"], t["title"]) for t in document["tools"]] == [("read_text", "Read a file")]


def test_an_mcp_client_sees_the_title_and_never_an_operator_tool(package: Any) -> None:
    from mcp import Client

    from blade_runtime.serving.mcp import mcp_server

    async def scenario() -> tuple[Any, ...]:
        runtime = runtime_of(package)
        async with Client(mcp_server(runtime, principal=ANN.principal)) as client:
            listed = (await client.list_tools()).tools
            by_alias = await client.call_tool("cat", {"path": "x"})
            hidden = await client.call_tool("purge_cache", {"path": "x"})
        return listed, by_alias, hidden

    listed, by_alias, hidden = asyncio.run(scenario())
    assert [(tool.name, tool.title) for tool in listed] == [("read_text", "Read a file")]
    assert not by_alias.is_error and by_alias.structured_content == {"text": "cat:x"}
    assert hidden.is_error and hidden.structured_content["error"] == "TOOL_HANDLER_NOT_FOUND"


def test_http_lists_them_and_the_inbox_gets_the_display_name(
    package: Any, example_package: Any
) -> None:
    from blade_runtime.serving.http import create_app

    async def scenario() -> tuple[Any, ...]:
        from blade_specs.browser import check_page_v1

        runtime = runtime_of(package)
        runtime.register_client(check_page_v1.SPEC, title="Check a page")
        app = create_app(runtime, authenticate=authenticate)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            tools = (await http.get("/v1/tools", headers=ALICE)).json()["tools"]
            waiting = await http.post(
                "/v1/tools/check_page/calls",
                json={"url": "https://example.com"},
                headers=ALICE,
            )
            actions = (await http.get("/v1/actions", headers=ALICE)).json()["actions"]
        return tools, waiting, actions

    tools, waiting, actions = asyncio.run(scenario())
    by_name = {tool["name"]: tool for tool in tools}
    assert by_name["purge_cache"]["exposure"] == "operator"  # the operators' surface lists it
    assert by_name["read_text"]["aliases"] == ["Read", "cat"]
    assert waiting.status_code == 202, waiting.text
    assert [action["title"] for action in actions] == ["Check a page"]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("exposure", "hidden", "exposure"),
        ("title", "", "title"),
        ("aliases", ["read_text"], "alias 'read_text' is its own name already"),
        ("aliases", ["has space"], "aliases/0"),
        ("group", 3, "group"),
    ],
)
def test_a_spec_with_a_bad_value_is_one_clear_problem(
    tmp_path: Path, field: str, value: Any, expected: str
) -> None:
    fields: dict[str, Any] = {field: value}
    add_spec(
        tmp_path / "specs",
        spec(
            "files.read-text.v1",
            name="read_text",
            description="Reads a file.",
            inputSchema=PATH,
            **fields,
        ),
    )
    with pytest.raises(SpecError) as raised:
        resolve_specs(tmp_path / "specs")
    text = str(raised.value)
    assert expected in text
    assert "files/read-text.v1.json" in text
