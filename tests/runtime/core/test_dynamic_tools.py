"""Tools that change with the run: projections, dynamic availability, descriptions, children."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest
from conftest import _import_package, add_spec, spec

from blade_codegen.build import build
from blade_runtime import CallContext, Principal, Runtime
from blade_runtime.core.content import Image, ResourceLink, Text, to_anthropic, to_mcp
from blade_runtime.core.hooks import HookInput, HookOutput
from blade_runtime.core.registry import RegistrationError
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolSuccess
from blade_runtime.stores.sqlite import SQLiteStore

GOOD = {"service": "api", "version": "v1.2.3", "environment": "staging"}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def deployed(ctx: Any) -> Any:
    from blade_specs.deploy import deploy_service_v1

    return deploy_service_v1.DeployServiceOutput(deployed=True, steps=3, url="https://x/1")


def test_a_projection_is_what_the_model_reads_while_the_output_stays_whole(
    deploy: Any, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "p.db")
    runtime = Runtime(store=store)
    runtime.register(deploy.SPEC, deployed, project=lambda out: f"Deployed in {out.steps} steps.")
    result = run(runtime.call("deploy_service", GOOD, call_id="c1"))
    assert isinstance(result, ToolSuccess)
    assert result.content == "Deployed in 3 steps."
    assert result.output.steps == 3  # the typed output is whole
    stored = store.call("c1")
    assert stored is not None and isinstance(stored.result, dict)
    assert stored.result["content"] == "Deployed in 3 steps."
    assert stored.result["output"] == {"deployed": True, "steps": 3, "url": "https://x/1"}


def test_a_stored_call_is_projected_again_after_the_projection_changed(
    deploy: Any, tmp_path: Path
) -> None:
    path = tmp_path / "again.db"
    first = Runtime(store=SQLiteStore(path))
    first.register(deploy.SPEC, deployed, project=lambda out: f"{out.steps} steps")
    run(first.call("deploy_service", GOOD, call_id="c1"))
    later = Runtime(store=SQLiteStore(path))
    later.register(deploy.SPEC, deployed, project=lambda out: {"url": out.url})
    assert run(later.reproject("c1")) == {"url": "https://x/1"}
    with pytest.raises(KeyError):
        run(later.reproject("missing"))


def test_errors_bypass_the_projection(deploy: Any) -> None:
    async def fails(ctx: Any) -> Any:
        ctx.fail("The registry is down.")

    runtime = Runtime()
    runtime.register(deploy.SPEC, fails, project=lambda out: "never")
    failed = run(runtime.call("deploy_service", GOOD))
    assert isinstance(failed, ToolError) and failed.content == {
        "error": "TOOL_FAILED",
        "message": "The registry is down.",
    }


def test_a_projection_to_an_image_block_in_mcp_and_anthropic_shapes(deploy: Any) -> None:
    runtime = Runtime()
    runtime.register(
        deploy.SPEC,
        deployed,
        project=lambda out: [
            Text("The dashboard:"),
            Image(PNG, "image/png"),
            ResourceLink("https://x/1", "deployment"),
        ],
    )
    result = run(runtime.call("deploy_service", GOOD))
    assert isinstance(result, ToolSuccess)
    assert to_mcp(result.content) == [
        {"type": "text", "text": "The dashboard:"},
        {"type": "image", "data": PNG, "mimeType": "image/png"},
        {"type": "resource_link", "uri": "https://x/1", "name": "deployment"},
    ]
    assert to_anthropic(result.content) == [
        {"type": "text", "text": "The dashboard:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "text", "text": "deployment: https://x/1"},
    ]
    assert to_mcp({"a": 1}) == [{"type": "text", "text": '{"a": 1}'}]


def test_a_post_hook_rewrite_keeps_no_whole_output(deploy: Any, tmp_path: Path) -> None:
    async def redact(event: HookInput) -> HookOutput:
        return HookOutput(modified_output="[redacted]")

    store = SQLiteStore(tmp_path / "r.db")
    runtime = Runtime(store=store)
    runtime.register(deploy.SPEC, deployed, project=lambda out: f"at {out.url}")
    runtime.on("post_tool_use", redact)
    run(runtime.call("deploy_service", GOOD, call_id="c1"))
    stored = store.call("c1")
    assert stored is not None and stored.result == {"status": "success", "content": "[redacted]"}


def test_a_tool_disabled_for_one_run_and_enabled_for_another(deploy: Any) -> None:
    runtime = Runtime()
    runtime.register(deploy.SPEC, deployed, enabled=lambda call: call.run_id != "frozen")
    refused = run(runtime.call("deploy_service", GOOD, run_id="frozen"))
    assert isinstance(refused, ToolError) and refused.code == ErrorCode.TOOL_NOT_ALLOWED
    assert isinstance(run(runtime.call("deploy_service", GOOD, run_id="open")), ToolSuccess)
    assert runtime.export("mcp", run_id="frozen").document == {"tools": []}
    assert [t["name"] for t in runtime.export("mcp", run_id="open").document["tools"]] == [
        "deploy_service"
    ]


def test_a_description_computed_from_context_in_the_export(deploy: Any) -> None:
    ann = CallContext(principal=Principal("ann", "acme"))
    runtime = Runtime()
    runtime.register(
        deploy.SPEC,
        deployed,
        describe=lambda context: (
            f"Deploy for {context.principal.tenant}." if context and context.principal else "x"
        ),
    )
    [tool] = runtime.export("anthropic", context=ann).document  # type: ignore[misc]
    assert tool["description"] == "Deploy for acme."
    [static] = runtime.export("anthropic").document  # type: ignore[misc]
    assert static["description"] == "x"


def test_register_unregister_replace_and_changing_allow_lists(deploy: Any) -> None:
    runtime = Runtime()
    runtime.register(deploy.SPEC, deployed)
    runtime.disallowed = {"deploy_service"}
    refused = run(runtime.call("deploy_service", GOOD))
    assert isinstance(refused, ToolError) and refused.code == ErrorCode.TOOL_NOT_ALLOWED
    runtime.disallowed = set()
    runtime.allowed = {"deploy_service"}
    assert isinstance(run(runtime.call("deploy_service", GOOD)), ToolSuccess)

    async def other(ctx: Any) -> Any:
        return deploy.DeployServiceOutput(deployed=False, steps=0)

    runtime.replace(deploy.SPEC, other)
    replaced = run(runtime.call("deploy_service", GOOD))
    assert isinstance(replaced, ToolSuccess) and replaced.output.steps == 0
    runtime.unregister("deploy_service")
    gone = run(runtime.call("deploy_service", GOOD))
    assert isinstance(gone, ToolError) and gone.code == ErrorCode.TOOL_HANDLER_NOT_FOUND
    with pytest.raises(RegistrationError):
        runtime.unregister("deploy_service")


def test_a_replace_that_fails_for_any_reason_keeps_the_old_registration(deploy: Any) -> None:
    runtime = Runtime()
    runtime.register(deploy.SPEC, deployed)

    async def other(ctx: Any) -> Any:
        return deploy.DeployServiceOutput(deployed=False, steps=0)

    with pytest.raises(TypeError):
        runtime.replace(deploy.SPEC, other, projekt=lambda out: "typo")  # not an option
    with pytest.raises(RegistrationError):
        runtime.replace(deploy.SPEC, other, capability_config={"nope": {}})
    kept = run(runtime.call("deploy_service", GOOD))
    assert isinstance(kept, ToolSuccess) and kept.output.steps == 3  # the old one still runs


def test_an_unregistered_tools_waiting_call_is_resolved_by_a_runtime_that_has_it(
    example_package: Any, tmp_path: Path
) -> None:
    from blade_specs.payments import refund_payment_v1

    async def refund(ctx: Any) -> Any:
        if ctx.entry.__class__.__name__ == "InitialEntry":
            ctx.suspend(
                "approval",
                refund_payment_v1.RefundPaymentApprovalSuspend(
                    prompt="ok?", amount=ctx.input.amount
                ),
            )
        return {"status": "refunded", "refund_id": "re_9"}

    def runtime() -> Runtime:
        made = Runtime(store=SQLiteStore(tmp_path / "u.db"))
        made.register(refund_payment_v1.SPEC, refund, context=lambda call: {"operator_id": "o"})
        return made

    first = runtime()
    waiting = run(
        first.call(
            "refund_payment",
            {"payment_id": "p", "amount": {"amount_minor": 1, "currency": "EUR"}, "reason": "r"},
        )
    )
    assert isinstance(waiting, ToolPending)
    first.unregister("refund_payment")
    assert [a.action_id for a in first.pending()] == [waiting.action.action_id]  # readable
    stays = run(first.submit(waiting.action.action_id, {"approved": True, "approver": "a"}))
    assert isinstance(stays, ToolError) and stays.code == ErrorCode.TOOL_HANDLER_NOT_FOUND
    done = run(runtime().submit(waiting.action.action_id, {"approved": True, "approver": "a"}))
    assert isinstance(done, ToolSuccess)


def _family(root: Path) -> Any:
    number = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    specs = root / "specs"
    child: dict[str, Any] = {
        "name": "child",
        "sideEffect": "pure",
        "inputSchema": number,
        "outputSchema": {"type": "object", "properties": {"double": {"type": "integer"}}},
    }
    add_spec(specs, spec("fam.child.v1", **child))
    add_spec(
        specs,
        spec(
            "fam.waiter.v1",
            name="waiter",
            inputSchema=number,
            suspend={"gate": {"suspendSchema": number, "resumeSchema": number}},
        ),
    )
    add_spec(
        specs,
        spec(
            "fam.parent.v1",
            name="parent",
            inputSchema=number,
            outputSchema={"type": "object", "properties": {"sum": {"type": "integer"}}},
            children=["fam.child.v1"],
        ),
    )
    build(specs, root / "out", "fam_pkg")
    _import_package(root / "out", "fam_pkg")
    import importlib

    return (
        importlib.import_module("fam_pkg.fam.parent_v1"),
        importlib.import_module("fam_pkg.fam.child_v1"),
        importlib.import_module("fam_pkg.fam.waiter_v1"),
    )


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _family(tmp_path_factory.mktemp("family"))


def test_child_rules_no_orphan_actions_and_fatal_hook_failures(family: Any) -> None:
    parent_v1, child_v1, _ = family
    caught: list[str] = []

    async def parent(ctx: Any) -> Any:
        try:
            out = await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=ctx.input.n))
        except BaseException as error:  # even catching everything does not hide it
            caught.append(type(error).__name__)
            return parent_v1.ParentOutput(sum=-1)
        return parent_v1.ParentOutput(sum=out.double + 1)

    async def child(ctx: Any) -> Any:
        return child_v1.ChildOutput(double=2 * ctx.input.n)

    async def broken_hook(event: HookInput) -> HookOutput:
        raise RuntimeError("the audit log is down")

    runtime = Runtime()
    runtime.register(child_v1.SPEC, child)
    runtime.register(parent_v1.SPEC, parent)
    ok = run(runtime.call("parent", {"n": 2}))
    assert isinstance(ok, ToolSuccess) and ok.output.sum == 5
    runtime.on("pre_tool_use", broken_hook, tools=["child"])
    fatal = run(runtime.call("parent", {"n": 2}))
    assert caught == ["ChildHookFailed"]
    assert isinstance(fatal, ToolError) and fatal.code == ErrorCode.HOOK_FAILED


def test_a_child_that_could_suspend_is_refused_at_registration(family: Any) -> None:
    parent_v1, _, waiter_v1 = family

    async def impl(ctx: Any) -> Any:
        return None

    object.__setattr__(parent_v1.SPEC, "children", ("fam.child.v1", "fam.waiter.v1"))
    try:
        runtime = Runtime()
        runtime.register(waiter_v1.SPEC, impl)
        with pytest.raises(RegistrationError, match="could suspend"):
            runtime.register(parent_v1.SPEC, impl)
        later = Runtime()
        later.register(parent_v1.SPEC, impl)
        with pytest.raises(RegistrationError, match="child"):
            later.register(waiter_v1.SPEC, impl)
    finally:
        object.__setattr__(parent_v1.SPEC, "children", ("fam.child.v1",))


def test_a_child_asking_for_permission_never_leaves_an_orphan_request(family: Any) -> None:
    parent_v1, child_v1, _ = family
    from blade_runtime.core.permissions import Ask

    async def parent(ctx: Any) -> Any:
        try:
            await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=1))
        except Exception as error:
            return parent_v1.ParentOutput(sum=len(str(error)))
        return parent_v1.ParentOutput(sum=0)

    async def child(ctx: Any) -> Any:
        await ctx.request_permission("really?")

    runtime = Runtime()
    runtime.register(child_v1.SPEC, child)
    runtime.register(parent_v1.SPEC, parent, permission=lambda request: None)
    done = run(runtime.call("parent", {"n": 1}))
    assert isinstance(done, ToolSuccess) and done.output.sum > 0
    assert runtime.pending() == []  # the child's request was refused, not stored
    asking = Runtime(permission=lambda request: Ask() if request.name == "child" else None)

    async def quiet_child(ctx: Any) -> Any:
        return child_v1.ChildOutput(double=0)

    asking.register(child_v1.SPEC, quiet_child)
    asking.register(parent_v1.SPEC, parent)
    assert isinstance(run(asking.call("parent", {"n": 1})), ToolSuccess)
    assert asking.pending() == []


def test_a_childs_availability_is_fixed_for_the_parents_length(family: Any) -> None:
    parent_v1, child_v1, _ = family
    switch = {"on": True}
    outcomes: list[str] = []

    async def parent(ctx: Any) -> Any:
        for _ in range(2):
            try:
                await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=1))
                outcomes.append("ran")
            except Exception as error:
                outcomes.append(str(error))
            switch["on"] = not switch["on"]
        return parent_v1.ParentOutput(sum=0)

    async def child(ctx: Any) -> Any:
        return child_v1.ChildOutput(double=2)

    runtime = Runtime()
    runtime.register(child_v1.SPEC, child, enabled=lambda call: switch["on"])
    runtime.register(parent_v1.SPEC, parent)
    run(runtime.call("parent", {"n": 1}))  # decided when the parent starts: on, twice
    switch["on"] = False
    run(runtime.call("parent", {"n": 1}))  # off at the start: refused, twice
    assert outcomes[:2] == ["ran", "ran"]
    assert all("not enabled" in o for o in outcomes[2:])


def test_the_parents_cancellation_reaches_its_child(family: Any) -> None:
    parent_v1, child_v1, _ = family
    child_saw: list[str] = []

    async def parent(ctx: Any) -> Any:
        await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=1))
        return parent_v1.ParentOutput(sum=0)

    async def child(ctx: Any) -> Any:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            child_saw.append("cancelled")  # the parent's cancellation reached the child
            raise
        child_saw.append("finished")
        return child_v1.ChildOutput(double=0)

    runtime = Runtime()
    runtime.register(child_v1.SPEC, child)
    runtime.register(parent_v1.SPEC, parent)

    async def scenario() -> Any:
        task = asyncio.create_task(runtime.call("parent", {"n": 1}, call_id="p1"))
        await asyncio.sleep(0.05)
        assert runtime.cancel_call("p1")
        return await task

    result = run(scenario())
    assert isinstance(result, ToolError) and result.code == ErrorCode.CANCELLED
    assert child_saw == ["cancelled"]


def test_the_typed_client_carries_what_the_model_read(example_package: Any) -> None:
    from blade_specs.client import Client
    from blade_specs.deploy import deploy_service_v1

    runtime = Runtime()
    runtime.register(deploy_service_v1.SPEC, deployed, project=lambda out: f"{out.steps} steps")
    typed = run(Client(runtime).deploy_service(deploy_service_v1.DeployServiceInput(**GOOD)))
    assert typed.status == "success"
    assert typed.output.steps == 3 and typed.content == "3 steps"


def test_a_call_settled_before_a_projection_was_added_is_projected_by_it_now(
    deploy: Any, tmp_path: Path
) -> None:
    path = tmp_path / "added.db"
    first = Runtime(store=SQLiteStore(path))
    first.register(deploy.SPEC, deployed)  # no projection: the model read the whole output
    run(first.call("deploy_service", GOOD, call_id="c1"))
    assert run(first.reproject("c1")) == {"deployed": True, "steps": 3, "url": "https://x/1"}
    later = Runtime(store=SQLiteStore(path))
    later.register(deploy.SPEC, deployed, project=lambda out: {"steps": out.steps})
    assert run(later.reproject("c1")) == {"steps": 3}  # the url it hides now stays hidden


@pytest.mark.parametrize("later_is", ["unregistered", "replaced_without_projection", "failing"])
def test_reproject_never_hands_out_what_the_projection_hid(
    deploy: Any, tmp_path: Path, later_is: str
) -> None:
    path = tmp_path / "hidden.db"
    first = Runtime(store=SQLiteStore(path))
    first.register(deploy.SPEC, deployed, project=lambda out: {"steps": out.steps})
    run(first.call("deploy_service", GOOD, call_id="c1"))
    later = Runtime(store=SQLiteStore(path))
    if later_is == "replaced_without_projection":
        later.register(deploy.SPEC, deployed)
    elif later_is == "failing":

        def broken(out: Any) -> Any:
            raise RuntimeError(out.url)  # the hidden field must not leak through the error

        later.register(deploy.SPEC, deployed, project=broken)
    with pytest.raises(LookupError) as refused:
        run(later.reproject("c1"))
    assert "https://x/1" not in str(refused.value)


def test_an_enabled_or_describe_callback_that_raises_is_a_value_not_an_exception(
    deploy: Any,
) -> None:
    def enabled(call: Any) -> bool:
        raise RuntimeError("the feature-flag service is down")

    def describe(context: Any) -> str:
        raise RuntimeError("no template")

    runtime = Runtime()
    runtime.register(deploy.SPEC, deployed, enabled=enabled, describe=describe)
    result = run(runtime.call("deploy_service", GOOD))
    assert isinstance(result, ToolError) and result.code == ErrorCode.POLICY_FAILED
    assert "did not run" in result.message and "feature-flag" not in result.message
    assert runtime.export("openai").document == []  # the tool is left out: it fails closed
    shown = Runtime()
    shown.register(deploy.SPEC, deployed, describe=describe)
    (tool,) = shown.export("openai").document  # type: ignore[misc]
    assert tool["function"]["description"] == deploy.SPEC.description  # the spec's own


def test_a_lone_surrogate_in_a_string_value_is_invalid_input(deploy: Any) -> None:
    async def reads(ctx: Any) -> Any:
        ctx.input.service  # noqa: B018 - the typed input is built here
        return await deployed(ctx)

    runtime = Runtime()
    runtime.register(deploy.SPEC, reads)
    bad = GOOD | {"service": "api\ud800"}
    result = run(runtime.call("deploy_service", bad))
    assert isinstance(result, ToolError) and result.code == ErrorCode.INVALID_INPUT, result
    assert "lone surrogate" in result.message


def test_an_async_projection_reads_the_input_and_the_call_and_runs_again_alike(
    deploy: Any, tmp_path: Path
) -> None:
    async def project(out: Any, *, input: Any, call: Any) -> str:
        await asyncio.sleep(0)
        return (
            f"{input.service} {input.version} in {out.steps} steps ({call.call_id}, {call.run_id})"
        )

    path = tmp_path / "context.db"
    first = Runtime(store=SQLiteStore(path))
    first.register(deploy.SPEC, deployed, project=project)
    result = run(first.call("deploy_service", GOOD, call_id="c9", run_id="r9"))
    assert isinstance(result, ToolSuccess)
    assert result.content == "api v1.2.3 in 3 steps (c9, r9)"
    later = Runtime(store=SQLiteStore(path))  # after a restart: the same value from the store
    later.register(deploy.SPEC, deployed, project=project)
    assert run(later.reproject("c9")) == result.content
