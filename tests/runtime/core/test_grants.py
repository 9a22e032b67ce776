"""``ctx.request_permission`` through the policy, and standing grants, on every store."""

from __future__ import annotations

import asyncio
from typing import Any

from blade_runtime import CallContext, Principal, Runtime
from blade_runtime.core.permissions import Allow, Ask, PermissionRequest, by_kind
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolSuccess
from blade_runtime.core.store import Store

GOOD = {"service": "api", "version": "v1.2.3", "environment": "staging"}
ALICE = Principal("alice", "acme")
BOB = Principal("bob", "acme")
EVE = Principal("eve", "other")


class Pushes:
    """A deploy that asks before pushing a service (the request's subject)."""

    def __init__(self, deploy: Any) -> None:
        self.deploy = deploy
        self.answers: list[tuple[str, bool]] = []

    async def __call__(self, ctx: Any) -> Any:
        target = ctx.input.service
        answer = await ctx.request_permission(f"Push to {target}?", {"t": target}, subject=target)
        self.answers.append((target, answer.approved))
        if not answer.approved:
            ctx.fail(answer.message or "declined")
        return self.deploy.DeployServiceOutput(deployed=True, steps=1)


def as_(principal: Principal) -> CallContext:
    return CallContext(principal)


def test_the_policy_decides_a_step_first_allow_goes_on_and_deny_ends(deploy: Any) -> None:
    asked: list[tuple[bool, str | None, str | None]] = []

    def policy(request: PermissionRequest) -> Any:
        if not request.step:
            return None  # the call itself may run
        asked.append((request.step, request.subject, request.prompt))
        return {"api": Allow(), "db": "Not from here."}.get(str(request.subject), Ask())

    pushes = Pushes(deploy)
    runtime = Runtime(permission=policy)
    runtime.register(deploy.SPEC, pushes)

    async def scenario() -> tuple[Any, Any, Any]:
        staging = await runtime.call("deploy_service", GOOD)
        prod = await runtime.call("deploy_service", {**GOOD, "service": "db"})
        other = await runtime.call("deploy_service", {**GOOD, "service": "web"})
        return staging, prod, other

    staging, prod, other = asyncio.run(scenario())
    assert isinstance(staging, ToolSuccess)  # allowed: no request, no waiting
    assert isinstance(prod, ToolError) and prod.code == ErrorCode.PERMISSION_DENIED
    assert prod.message == "Not from here."
    assert isinstance(other, ToolPending) and other.action.input.subject == "web"
    assert pushes.answers == [("api", True)]  # denied: the tool never went on
    assert [s for _, s, _ in asked] == ["api", "db", "web"]
    assert asked[0][2] == "Push to api?"


def test_a_policy_that_raises_on_a_step_fails_closed(deploy: Any) -> None:
    def policy(request: PermissionRequest) -> Any:
        if request.step:
            raise RuntimeError("policy bug")
        return None

    pushes = Pushes(deploy)
    runtime = Runtime(permission=policy)
    runtime.register(deploy.SPEC, pushes)
    result = asyncio.run(runtime.call("deploy_service", GOOD))
    assert isinstance(result, ToolError) and result.code == ErrorCode.POLICY_FAILED
    assert pushes.answers == []


def test_an_always_answer_makes_a_standing_grant_for_that_principal_tool_and_subject(
    deploy: Any, store: Store
) -> None:
    pushes = Pushes(deploy)
    runtime = Runtime(store=store)  # no policy: a person is asked, unless a grant allows
    runtime.register(deploy.SPEC, pushes)

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        first = await runtime.call("deploy_service", GOOD, context=as_(ALICE))
        assert isinstance(first, ToolPending)
        seen["first"] = await runtime.submit(
            first.action.action_id, {"decision": "approve", "always": True}
        )
        seen["again"] = await runtime.call("deploy_service", GOOD, context=as_(ALICE))
        seen["bob"] = await runtime.call("deploy_service", GOOD, context=as_(BOB))
        web = {**GOOD, "service": "web"}
        seen["prod"] = await runtime.call("deploy_service", web, context=as_(ALICE))
        seen["anonymous"] = await runtime.call("deploy_service", GOOD)
        seen["listed"] = await runtime.grants()
        seen["eve sees"] = await runtime.grants(principal=EVE)
        seen["bob sees"] = await runtime.grants(principal=BOB)
        seen["alice sees"] = await runtime.grants(principal=ALICE)
        [grant] = seen["listed"]
        seen["eve revokes"] = await runtime.revoke_grant(grant.grant_id, principal=EVE)
        seen["bob revokes"] = await runtime.revoke_grant(grant.grant_id, principal=BOB)
        seen["alice revokes"] = await runtime.revoke_grant(grant.grant_id, principal=ALICE)
        seen["after"] = await runtime.call("deploy_service", GOOD, context=as_(ALICE))
        await runtime.close()
        return seen

    seen = asyncio.run(scenario())
    assert isinstance(seen["first"], ToolSuccess)
    assert isinstance(seen["again"], ToolSuccess)  # granted: nobody asked again
    for waits in ("bob", "prod", "anonymous", "after"):  # other principal, subject, none, revoked
        assert isinstance(seen[waits], ToolPending), waits
    [grant] = seen["listed"]
    assert (grant.tenant, grant.principal, grant.tool, grant.subject) == (
        "acme",
        "alice",
        "deploy_service",
        "api",
    )
    assert grant.action_id is not None
    assert seen["eve sees"] == [] and seen["eve revokes"] is None  # another tenant's: not there
    assert seen["bob sees"] == [] and seen["bob revokes"] is None  # another principal's: neither
    assert seen["alice sees"] == [grant]
    assert seen["alice revokes"] is not None and seen["alice revokes"].grant_id == grant.grant_id
    assert store.grants() == []
    assert pushes.answers == [("api", True), ("api", True)]


def test_a_grant_allows_a_call_the_policy_would_ask_about_but_never_one_it_denies(
    deploy: Any, store: Store
) -> None:
    runs: list[str] = []

    async def deploys(ctx: Any) -> Any:
        runs.append(ctx.input.environment)
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    def policy(request: PermissionRequest) -> Any:
        return "No production." if request.input.get("environment") == "production" else Ask()

    runtime = Runtime(store=store, permission=policy)
    runtime.register(deploy.SPEC, deploys)

    async def scenario() -> tuple[Any, Any, Any]:
        await runtime.grant(ALICE, "deploy_service")  # the call as a whole: subject ""
        allowed = await runtime.call("deploy_service", GOOD, context=as_(ALICE))
        denied = await runtime.call(
            "deploy_service", {**GOOD, "environment": "production"}, context=as_(ALICE)
        )
        asked = await runtime.call("deploy_service", GOOD, context=as_(BOB))
        await runtime.close()
        return allowed, denied, asked

    allowed, denied, asked = asyncio.run(scenario())
    assert isinstance(allowed, ToolSuccess) and runs == ["staging"]
    assert isinstance(denied, ToolError) and denied.code == ErrorCode.PERMISSION_DENIED
    assert isinstance(asked, ToolPending)


def test_an_admission_request_answered_always_is_not_asked_again(deploy: Any, store: Store) -> None:
    runs: list[str] = []

    async def deploys(ctx: Any) -> Any:
        runs.append(ctx.input.environment)
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    runtime = Runtime(store=store, permission=by_kind())
    runtime.register(deploy.SPEC, deploys)

    async def scenario() -> tuple[Any, Any]:
        first = await runtime.call("deploy_service", GOOD, context=as_(ALICE))
        assert isinstance(first, ToolPending)
        await runtime.submit(first.action.action_id, {"decision": "approve", "always": True})
        again = await runtime.call("deploy_service", GOOD, context=as_(ALICE))
        other = await runtime.call("deploy_service", GOOD, context=as_(EVE))
        await runtime.close()
        return again, other

    again, other = asyncio.run(scenario())
    assert isinstance(again, ToolSuccess) and runs == ["staging", "staging"]
    assert isinstance(other, ToolPending)
    [grant] = store.grants()
    assert grant.subject == "" and grant.principal == "alice"


def test_adding_the_same_grant_twice_keeps_one(deploy: Any, store: Store) -> None:
    async def scenario() -> tuple[Any, Any]:
        runtime = Runtime(store=store)
        runtime.register(deploy.SPEC, Pushes(deploy))
        first = await runtime.grant(ALICE, "deploy_service", "prod")
        second = await runtime.grant(ALICE, "deploy_service", "prod")
        await runtime.close()
        return first, second

    first, second = asyncio.run(scenario())
    assert first.grant_id == second.grant_id and len(store.grants()) == 1
    key = {"spec_id": deploy.SPEC.id, "point": "@permission-step"}
    assert store.find_grant("acme", "alice", "deploy_service", "prod", **key) == first
    assert store.find_grant("acme", "alice", "deploy_service", "qa", **key) is None
    other_spec = {**key, "spec_id": "deploy.other.v1"}
    assert store.find_grant("acme", "alice", "deploy_service", "prod", **other_spec) is None
    before_it_runs = {**key, "point": "@permission"}
    assert store.find_grant("acme", "alice", "deploy_service", "prod", **before_it_runs) is None
    assert store.grants(tenant="other") == []


def test_permission_request_hooks_see_every_step_decision(deploy: Any) -> None:
    from blade_runtime.core.hooks import HookInput, HookOutput

    seen: list[tuple[str | None, str | None]] = []

    async def hook(event: HookInput) -> HookOutput | None:
        seen.append((event.decision, event.reason))
        return None

    def policy(request: PermissionRequest) -> Any:
        if not request.step:
            return None
        return {"api": Allow(), "db": "Not from here."}.get(str(request.subject), Ask())

    runtime = Runtime(permission=policy)
    runtime.register(deploy.SPEC, Pushes(deploy))
    runtime.on("permission_request", hook)

    async def scenario() -> None:
        await runtime.grant(ALICE, "deploy_service", "granted")
        for service in ("api", "db", "web", "granted"):
            await runtime.call("deploy_service", {**GOOD, "service": service}, context=as_(ALICE))

    asyncio.run(scenario())
    allowed = ("allow", None)  # each call's admission first, then its step
    assert seen[0::2] == [allowed] * 4
    assert seen[1::2] == [allowed, ("deny", "Not from here."), ("ask", None), allowed]


class TwoSteps:
    """A deploy that asks before building and again before rolling out, then suspends."""

    def __init__(self, deploy: Any, then_suspend: bool = False) -> None:
        self.deploy = deploy
        self.then_suspend = then_suspend
        self.answers: list[list[tuple[str, bool]]] = []

    async def __call__(self, ctx: Any) -> Any:
        build = await ctx.request_permission("Build the image?", subject="build")
        entry = [("build", build.approved)]
        self.answers.append(entry)
        roll = await ctx.request_permission("Roll out to production?", subject="production")
        entry.append(("production", roll.approved))
        return self.deploy.DeployServiceOutput(deployed=roll.approved, steps=2)


def test_a_tool_that_asks_two_steps_gets_each_its_own_answer(deploy: Any, store: Store) -> None:
    steps = TwoSteps(deploy)
    runtime = Runtime(store=store)
    runtime.register(deploy.SPEC, steps)

    async def scenario() -> tuple[Any, Any, Any]:
        first = await runtime.call("deploy_service", GOOD, context=as_(ALICE))
        assert isinstance(first, ToolPending)
        assert first.action.input.prompt == "Build the image?"
        second = await runtime.submit(first.action.action_id, {"decision": "approve"})
        assert isinstance(second, ToolPending), second
        assert second.action.input.prompt == "Roll out to production?"
        done = await runtime.submit(second.action.action_id, {"decision": "deny"})
        await runtime.close()
        return first, second, done

    _, _, done = asyncio.run(scenario())
    assert isinstance(done, ToolSuccess) and done.output.deployed is False, done
    # each entry hands each request the answer given to it: build approved, production denied
    assert steps.answers == [[("build", True)], [("build", True), ("production", False)]]


def test_a_step_with_a_prompt_that_is_not_text_is_a_tool_error_and_nothing_waits(
    deploy: Any,
) -> None:
    async def odd(ctx: Any) -> Any:
        await ctx.request_permission("Use canary?", subject=5)
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    runtime = Runtime()
    runtime.register(deploy.SPEC, odd)
    result = asyncio.run(runtime.call("deploy_service", GOOD))
    assert isinstance(result, ToolError) and result.code == ErrorCode.TOOL_ERROR, result
    assert runtime.pending() == [] and runtime.store.actions() == []  # nothing left waiting


class PushesWithoutSubject:
    """A deploy that asks one step with no subject."""

    def __init__(self, deploy: Any) -> None:
        self.deploy = deploy

    async def __call__(self, ctx: Any) -> Any:
        answer = await ctx.request_permission("Also drop the production database?")
        return self.deploy.DeployServiceOutput(deployed=answer.approved, steps=1)


def test_a_grant_before_a_call_runs_never_allows_a_step_nor_the_other_way(
    deploy: Any, store: Store
) -> None:
    runtime = Runtime(store=store, permission=lambda request: None if request.step else Ask("ok?"))
    runtime.register(deploy.SPEC, PushesWithoutSubject(deploy))
    alice = as_(ALICE)

    async def scenario() -> tuple[Any, Any]:
        first = await runtime.call("deploy_service", GOOD, context=alice)
        assert isinstance(first, ToolPending) and first.action.origin.point == "@permission"
        step = await runtime.submit(first.action.action_id, {"decision": "approve", "always": True})
        # the policy allows the step: the call as a whole was what was granted; now the step
        strict = Runtime(store=store, permission=lambda request: Ask("ok?"))
        strict.register(deploy.SPEC, PushesWithoutSubject(deploy))
        again = await strict.call("deploy_service", GOOD, context=alice)
        await runtime.close()
        await strict.close()
        return step, again

    step, again = asyncio.run(scenario())
    assert isinstance(step, ToolSuccess), step
    # admitted by the grant, the step is still asked: the grant was not for it
    assert isinstance(again, ToolPending) and again.action.origin.point == "@permission-step"


def test_a_grant_never_allows_another_spec_registered_under_the_same_name(
    deploy: Any, store: Store, example_package: Any
) -> None:
    from blade_specs.crm import lookup_customer_v1 as lookup

    async def lookup_impl(ctx: Any) -> Any:
        return lookup.LookupCustomerOutput(found=True)

    runtime = Runtime(store=store, permission=lambda request: Ask("ok?"))
    runtime.register(deploy.SPEC, Pushes(deploy), name="ops_tool")

    async def scenario() -> Any:
        await runtime.grant(ALICE, "ops_tool")
        runtime.replace(
            lookup.SPEC,
            lookup_impl,
            name="ops_tool",
            context=lambda call: lookup.LookupCustomerContext(tenant_id="t"),
        )
        other = await runtime.call("ops_tool", {"customer_id": "cus_1"}, context=as_(ALICE))
        await runtime.close()
        return other

    other = asyncio.run(scenario())
    assert isinstance(other, ToolPending), other  # asked: the grant was for deploy's spec


def test_a_grant_before_a_call_runs_is_an_allow_to_hooks_and_no_request_to_observers(
    deploy: Any,
) -> None:
    from blade_runtime.core.hooks import HookInput, HookOutput
    from blade_runtime.core.observers import Lifecycle

    seen: list[str] = []

    async def hook(event: HookInput) -> HookOutput | None:
        seen.append(f"hook {event.decision}")
        return None

    class Boundaries:
        async def permission_requested(self, event: Lifecycle) -> None:
            seen.append("permission_requested")

        async def permission_resolved(self, event: Lifecycle) -> None:
            seen.append("permission_resolved")

    async def deploys(ctx: Any) -> Any:
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    runtime = Runtime(permission=lambda request: Ask("deploy?"))
    runtime.register(deploy.SPEC, deploys)
    runtime.on("permission_request", hook)
    runtime.observe(Boundaries())

    async def scenario() -> Any:
        await runtime.grant(ALICE, "deploy_service")
        return await runtime.call("deploy_service", GOOD, context=as_(ALICE))

    result = asyncio.run(scenario())
    assert isinstance(result, ToolSuccess) and runtime.pending() == []
    assert seen == ["hook allow"]  # an allow crosses no permission boundary
