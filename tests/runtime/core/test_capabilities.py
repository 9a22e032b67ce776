"""Declared capabilities: the services a tool needs, bound by the runtime, typed in ctx."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import _import_package, add_spec, run_mypy, spec

from blade_codegen.build import build
from blade_codegen.problems import SpecError
from blade_codegen.resolve import resolve_specs
from blade_runtime import Runtime
from blade_runtime.core.capabilities import CapabilityUse, shared
from blade_runtime.core.registry import RegistrationError
from blade_runtime.core.results import ErrorCode, ToolError, ToolSuccess

CONFIG = {"type": "object", "properties": {"image": {"type": "string"}}, "required": ["image"]}
SANDBOXED = {
    "name": "run_code",
    "kind": "execute",
    "outputSchema": {"type": "object", "properties": {"out": {"type": "string"}}},
    "capabilities": {
        "sandbox": {"description": "Runs code in isolation.", "configSchema": CONFIG},
        "http": {},
    },
}


def _specs(root: Path, **overrides: Any) -> Path:
    specs = root / "specs"
    add_spec(specs, spec("cap.run-code.v1", **{**SANDBOXED, **overrides}))
    return specs


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("caps")
    build(_specs(root), root / "out", "cap_pkg")
    _import_package(root / "out", "cap_pkg")
    return root / "out", importlib.import_module("cap_pkg.cap.run_code_v1")


class Sandbox:
    def __init__(self) -> None:
        self.events: list[str] = []

    @asynccontextmanager
    async def __call__(self, use: CapabilityUse) -> AsyncIterator[str]:
        self.events.append(f"acquire {use.name} {use.config} {use.call.call_id}")
        try:
            yield f"sandbox:{use.config['image']}"  # type: ignore[index,call-overload]
        finally:
            self.events.append(f"release cancelled={use.signal.cancelled}")


def test_the_spec_types_ctx_capabilities_for_mypy(built: tuple[Path, Any], tmp_path: Path) -> None:
    out, module = built
    assert sorted(module.SPEC.capabilities) == ["http", "sandbox"]
    assert module.SPEC.capabilities["sandbox"].config_schema == CONFIG
    good = tmp_path / "good.py"
    good.write_text(
        "from cap_pkg.cap import run_code_v1 as m\n\n\n"
        "async def run(ctx: m.RunCodeExecution) -> m.RunCodeOutput:\n"
        "    sandbox = ctx.capabilities.sandbox\n"
        "    return m.RunCodeOutput(out=str(sandbox) + str(ctx.capabilities.http))\n"
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from cap_pkg.cap import run_code_v1 as m\n\n\n"
        "async def run(ctx: m.RunCodeExecution) -> m.RunCodeOutput:\n"
        "    return m.RunCodeOutput(out=str(ctx.capabilities.database))\n"
    )
    assert run_mypy(good, cwd=out).returncode == 0, run_mypy(good, cwd=out).stdout
    refused = run_mypy(bad, cwd=out)
    assert refused.returncode == 1 and '"database"' in refused.stdout


def test_capabilities_are_server_side_so_not_part_of_the_fingerprint(tmp_path: Path) -> None:
    with_caps = resolve_specs(_specs(tmp_path / "a")).specs[0]
    without = resolve_specs(_specs(tmp_path / "b", capabilities=None)).specs[0]
    assert with_caps.fingerprint == without.fingerprint


def test_a_client_tool_cannot_declare_capabilities_nor_a_keyword_name(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="client tool cannot have capabilities"):
        resolve_specs(_specs(tmp_path / "c", execution="client"))
    with pytest.raises(SpecError, match="keyword"):
        resolve_specs(_specs(tmp_path / "k", capabilities={"class": {}}))


def test_registration_is_refused_for_an_unbound_capability(built: tuple[Path, Any]) -> None:
    _, module = built

    async def impl(ctx: Any) -> Any:
        return module.RunCodeOutput(out="x")

    runtime = Runtime(capabilities={"http": shared(object())})
    with pytest.raises(RegistrationError, match="no binding of its capabilities sandbox"):
        runtime.register(module.SPEC, impl)
    bound = Runtime(capabilities={"http": shared(object()), "sandbox": Sandbox()})
    with pytest.raises(RegistrationError, match="configSchema"):
        bound.register(module.SPEC, impl, capability_config={"sandbox": {"image": 3}})
    with pytest.raises(RegistrationError, match="does not declare"):
        bound.register(module.SPEC, impl, capability_config={"gpu": {}})


def test_bindings_are_acquired_before_and_released_after_even_on_cancel(
    built: tuple[Path, Any],
) -> None:
    _, module = built
    sandbox = Sandbox()
    client = object()
    seen: list[Any] = []

    async def impl(ctx: Any) -> Any:
        seen.append((ctx.capabilities.sandbox, ctx.capabilities.http is client))
        if ctx.input.q == "slow":
            await asyncio.sleep(10)
        return module.RunCodeOutput(out="ok")

    runtime = Runtime(capabilities={"sandbox": sandbox, "http": shared(client)})
    runtime.register(module.SPEC, impl, capability_config={"sandbox": {"image": "py3"}})

    async def scenario() -> tuple[Any, Any]:
        done = await runtime.call("run_code", {"q": "fast"}, call_id="c1")
        slow = asyncio.create_task(runtime.call("run_code", {"q": "slow"}, call_id="c2"))
        await asyncio.sleep(0.05)
        assert runtime.cancel_call("c2")
        return done, await slow

    done, cancelled = asyncio.run(scenario())
    assert isinstance(done, ToolSuccess)
    assert isinstance(cancelled, ToolError) and cancelled.code == ErrorCode.CANCELLED
    assert seen == [("sandbox:py3", True), ("sandbox:py3", True)]
    assert sandbox.events == [
        "acquire sandbox {'image': 'py3'} c1",
        "release cancelled=False",
        "acquire sandbox {'image': 'py3'} c2",
        "release cancelled=True",
    ]


def test_a_binding_that_fails_to_acquire_fails_the_call(built: tuple[Path, Any]) -> None:
    _, module = built
    ran: list[bool] = []

    @asynccontextmanager
    async def broken(use: CapabilityUse) -> AsyncIterator[Any]:
        raise ConnectionError("no sandbox host")
        yield  # pragma: no cover

    async def impl(ctx: Any) -> Any:
        ran.append(True)
        return module.RunCodeOutput(out="x")

    runtime = Runtime(capabilities={"sandbox": broken, "http": shared(None)})
    runtime.register(module.SPEC, impl, capability_config={"sandbox": {"image": "py"}})
    failed = asyncio.run(runtime.call("run_code", {"q": "x"}))
    assert isinstance(failed, ToolError) and failed.code == ErrorCode.TOOL_ERROR
    assert ran == []


def test_a_capabilitys_ctx_name_is_apart_from_its_binding_id(tmp_path: Path) -> None:
    """Seed 002: the map key is the tool-local ctx name and is aliasable ({box: sandbox} reads
    as ctx.capabilities.box); the capability's id is the binding key at the runtime."""
    aliased = {
        "box": {"binding": "sandbox", "configSchema": CONFIG},
        "web": {"binding": "http"},
    }
    root = tmp_path / "aliased"
    build(_specs(root, capabilities=aliased), root / "out", "cap_alias_pkg")
    _import_package(root / "out", "cap_alias_pkg")
    module = importlib.import_module("cap_alias_pkg.cap.run_code_v1")
    assert module.SPEC.capabilities["box"].key == "sandbox"
    good = tmp_path / "good_alias.py"
    good.write_text(
        "from cap_alias_pkg.cap import run_code_v1 as m\n\n\n"
        "async def run(ctx: m.RunCodeExecution) -> m.RunCodeOutput:\n"
        "    return m.RunCodeOutput(out=str(ctx.capabilities.box) + str(ctx.capabilities.web))\n"
    )
    assert run_mypy(good, cwd=root / "out").returncode == 0

    async def impl(ctx: Any) -> Any:
        return module.RunCodeOutput(out=f"{ctx.capabilities.box} {ctx.capabilities.web}")

    with pytest.raises(RegistrationError, match="no binding of its capabilities sandbox"):
        Runtime(capabilities={"http": shared("h"), "box": Sandbox()}).register(module.SPEC, impl)
    sandbox = Sandbox()
    runtime = Runtime(capabilities={"sandbox": sandbox, "http": shared("client")})
    runtime.register(module.SPEC, impl, capability_config={"box": {"image": "py3"}})
    result = asyncio.run(runtime.call("run_code", {"q": "x"}, call_id="c-alias"))
    assert isinstance(result, ToolSuccess) and result.output.out == "sandbox:py3 client"
    assert sandbox.events[0] == "acquire box {'image': 'py3'} c-alias"

    with pytest.raises(SpecError, match="binding"):
        resolve_specs(_specs(tmp_path / "bad", capabilities={"box": {"binding": "not an id"}}))
