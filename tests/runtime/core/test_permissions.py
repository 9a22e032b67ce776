"""Permissions that can ask, the caller's context, lifecycle observers, and failing closed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from blade_runtime import CallContext, Principal, Runtime
from blade_runtime.core.hooks import HookInput, HookOutput
from blade_runtime.core.observers import Lifecycle
from blade_runtime.core.permissions import (
    ADMISSION,
    Allow,
    Ask,
    Deny,
    PermissionPrompt,
    PermissionRequest,
    by_kind,
)
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolSuccess
from blade_runtime.core.store import Store
from blade_runtime.stores.memory import MemoryStore
from blade_runtime.stores.sqlite import SQLiteStore

GOOD = {"service": "api", "version": "v1.2.3", "environment": "staging"}
ALICE = Principal("alice", "acme", frozenset({"support"}), {"team": "payments"})


class Deploys:
    """The deploy implementation, recording each entry's input."""

    def __init__(self, deploy: Any) -> None:
        self.deploy = deploy
        self.inputs: list[dict[str, Any]] = []

    async def __call__(self, ctx: Any) -> Any:
        self.inputs.append(ctx.input.model_dump(exclude_unset=True))
        return self.deploy.DeployServiceOutput(deployed=True, steps=1)


def runtime_of(deploy: Any, store: Store, **options: Any) -> tuple[Runtime, Deploys]:
    runtime = Runtime(store=store, permission=by_kind(), **options)
    deploys = Deploys(deploy)
    runtime.register(deploy.SPEC, deploys)
    return runtime, deploys


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def asked(result: Any) -> Any:
    assert isinstance(result, ToolPending), result
    assert result.action.origin.point == ADMISSION
    return result.action


def test_ask_then_approve_runs_once_and_the_request_is_a_typed_pending_action(
    deploy: Any, store: Store
) -> None:
    runtime, deploys = runtime_of(deploy, store)

    async def scenario() -> tuple[Any, Any]:
        action = asked(await runtime.call("deploy_service", GOOD, call_id="c1"))
        [listed] = runtime.pending()
        assert listed.action_id == action.action_id
        assert isinstance(listed.input, PermissionPrompt)
        assert listed.input.kind == "execute" and listed.input.side_effect == "idempotent"
        assert listed.input.input == GOOD and deploys.inputs == []  # nothing ran yet
        done = await runtime.submit(action.action_id, {"decision": "approve"})
        return action, done

    _, done = run(scenario())
    assert isinstance(done, ToolSuccess) and done.output.deployed
    assert deploys.inputs == [GOOD]
    assert runtime.pending() == []


def test_ask_then_approve_across_a_process_restart(deploy: Any, tmp_path: Path) -> None:
    path = tmp_path / "restart.db"
    first, _ = runtime_of(deploy, SQLiteStore(path))
    action = asked(run(first.call("deploy_service", GOOD, call_id="c1")))
    # The approval arrives from an operator's command line, in another process.
    approve = subprocess.run(
        [
            sys.executable,
            "-m",
            "blade_runtime.serving.cli",
            "pending",
            "submit",
            action.action_id,
            '{"decision": "approve", "input": {"service": "api", "version": "v2.0.0", '
            '"environment": "staging"}}',
            "--store",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert approve.returncode == 0, approve.stderr
    second, deploys = runtime_of(deploy, SQLiteStore(path))
    [result] = run(second.recover())
    assert isinstance(result, ToolSuccess)
    assert deploys.inputs == [{**GOOD, "version": "v2.0.0"}]  # the edited input, not re-asked
    assert run(second.recover()) == []


def test_deny_settles_permission_denied_with_the_sentence(deploy: Any, store: Store) -> None:
    runtime, deploys = runtime_of(deploy, store)

    async def scenario() -> Any:
        action = asked(await runtime.call("deploy_service", GOOD))
        return await runtime.submit(
            action.action_id, {"decision": "deny", "message": "Not during the freeze."}
        )

    denied = run(scenario())
    assert isinstance(denied, ToolError) and denied.code == ErrorCode.PERMISSION_DENIED
    assert denied.message == "Not during the freeze."
    assert deploys.inputs == [] and runtime.pending() == []


def test_edited_input_the_schema_refuses_leaves_it_pending_and_nothing_runs(
    deploy: Any, store: Store
) -> None:
    runtime, deploys = runtime_of(deploy, store)

    async def scenario() -> tuple[Any, Any]:
        action = asked(await runtime.call("deploy_service", GOOD))
        edited = {**GOOD, "environment": "moon"}
        refused = await runtime.submit(action.action_id, {"decision": "approve", "input": edited})
        return action, refused

    action, refused = run(scenario())
    assert isinstance(refused, ToolError) and refused.code == ErrorCode.INVALID_SUBMISSION
    assert "/input/environment" in refused.message
    assert deploys.inputs == []
    assert [p.action_id for p in runtime.pending()] == [action.action_id]


def test_a_racing_approve_and_deny_one_wins(deploy: Any, tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    runtime, deploys = runtime_of(deploy, SQLiteStore(path))
    action = asked(run(runtime.call("deploy_service", GOOD, call_id="c1")))
    outcomes: list[Any] = []
    start = threading.Barrier(2)

    def answer(value: dict[str, Any]) -> None:
        other = Runtime(store=SQLiteStore(path), permission=by_kind())
        other.register(deploy.SPEC, deploys)  # the same counter: every entry is counted
        start.wait()
        outcomes.append(run(other.submit(action.action_id, value)))

    threads = [
        threading.Thread(target=answer, args=({"decision": "approve"},)),
        threading.Thread(target=answer, args=({"decision": "deny", "message": "no"},)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    codes = sorted(getattr(o, "code", "success") for o in outcomes)
    assert ErrorCode.ACTION_ALREADY_RESOLVED in codes and len(codes) == 2
    won = next(o for o in outcomes if getattr(o, "code", None) != ErrorCode.ACTION_ALREADY_RESOLVED)
    assert len(deploys.inputs) == (1 if isinstance(won, ToolSuccess) else 0)


def test_a_policy_by_kind_is_one_line_and_honours_its_allowlist(
    deploy: Any, example_package: Any
) -> None:
    from blade_specs.crm import lookup_customer_v1

    async def lookup(ctx: Any) -> Any:
        return {"id": ctx.input.customer_id, "name": "Ann", "tier": "gold"}

    strict = Runtime(permission=by_kind())
    strict.register(deploy.SPEC, Deploys(deploy))
    strict.register(lookup_customer_v1.SPEC, lookup, context=lambda call: {"operator_id": "o"})
    relaxed = Runtime(permission=by_kind(allow=["deploy_service"]))
    relaxed.register(deploy.SPEC, Deploys(deploy))

    assert isinstance(run(strict.call("deploy_service", GOOD)), ToolPending)  # execute: asks
    assert isinstance(run(relaxed.call("deploy_service", GOOD)), ToolSuccess)  # allowlisted
    denying = Runtime(permission=by_kind(ask=(), deny=("execute",)))
    denying.register(deploy.SPEC, Deploys(deploy))
    refused = run(denying.call("deploy_service", GOOD))
    assert isinstance(refused, ToolError) and refused.code == ErrorCode.PERMISSION_DENIED


def test_the_policy_sees_kind_side_effect_principal_and_a_signal(deploy: Any) -> None:
    seen: list[PermissionRequest] = []

    async def policy(request: PermissionRequest) -> Allow:
        seen.append(request)
        return Allow()

    runtime = Runtime(permission=policy)
    runtime.register(deploy.SPEC, Deploys(deploy))
    context = CallContext(principal=ALICE, client_data={"ui": "web"}, thread_id="t1")
    assert isinstance(run(runtime.call("deploy_service", GOOD, context=context)), ToolSuccess)
    [request] = seen
    assert (request.kind, request.side_effect, request.spec_id) == (
        "execute",
        "idempotent",
        "deploy.deploy-service.v1",
    )
    assert request.principal == ALICE and request.signal is not None
    assert request.input == GOOD


def test_request_permission_mid_tool_resumes_with_the_decision(deploy: Any, store: Store) -> None:
    steps: list[str] = []

    async def careful(ctx: Any) -> Any:
        answer = ctx.permission
        if answer is None:
            steps.append("built")
            await ctx.request_permission("Push to production?", {"target": "prod"})
        steps.append("approved" if answer.approved else f"declined: {answer.message}")
        if not answer.approved:
            ctx.fail(answer.message or "declined")
        return deploy.DeployServiceOutput(deployed=True, steps=2)

    runtime = Runtime(store=store)
    runtime.register(deploy.SPEC, careful)

    async def scenario() -> tuple[Any, Any, Any]:
        first = await runtime.call("deploy_service", GOOD)
        assert isinstance(first, ToolPending)
        assert first.action.input.prompt == "Push to production?"
        assert first.action.input.details == {"target": "prod"}
        invalid = await runtime.submit(first.action.action_id, {"decision": "maybe"})
        done = await runtime.submit(first.action.action_id, {"decision": "approve"})
        second = await runtime.call("deploy_service", GOOD)
        assert isinstance(second, ToolPending)
        declined = await runtime.submit(
            second.action.action_id, {"decision": "deny", "message": "not now"}
        )
        return invalid, done, declined

    invalid, done, declined = run(scenario())
    assert isinstance(invalid, ToolError) and invalid.code == ErrorCode.INVALID_SUBMISSION
    assert isinstance(done, ToolSuccess) and done.output.steps == 2
    assert isinstance(declined, ToolError) and declined.message == "not now"
    assert steps == ["built", "approved", "built", "declined: not now"]


def test_permission_request_hooks_observe_every_decision(deploy: Any) -> None:
    seen: list[tuple[str | None, str | None]] = []

    async def hook(event: HookInput) -> HookOutput | None:
        seen.append((event.decision, event.reason))
        return None

    runtime, _ = runtime_of(deploy, MemoryStore())
    runtime.on("permission_request", hook)

    async def scenario() -> None:
        action = asked(await runtime.call("deploy_service", GOOD))
        await runtime.submit(action.action_id, {"decision": "deny", "message": "frozen"})

    run(scenario())
    assert seen == [("ask", None), ("deny", "frozen")]


def test_the_callers_context_reaches_the_provider_and_survives_recovery(
    example_package: Any, tmp_path: Path
) -> None:
    from blade_specs.payments import refund_payment_v1

    seen: list[CallContext | None] = []

    def provider(call: Any) -> Any:
        seen.append(call.context)
        return refund_payment_v1.RefundPaymentContext(operator_id=call.context.principal.id)

    async def refund(ctx: Any) -> Any:
        if ctx.entry.__class__.__name__ == "InitialEntry":
            ctx.suspend(
                "approval",
                refund_payment_v1.RefundPaymentApprovalSuspend(
                    prompt="Refund?", amount=ctx.input.amount
                ),
            )
        return {"status": "refunded", "refund_id": f"re_{ctx.context.operator_id}"}

    def runtime() -> Runtime:
        made = Runtime(store=SQLiteStore(tmp_path / "ctx.db"))
        made.register(refund_payment_v1.SPEC, refund, context=provider)
        return made

    context = CallContext(principal=ALICE, client_data={"locale": "fr"}, thread_id="th-9")
    refund_input = {
        "payment_id": "p1",
        "amount": {"amount_minor": 1250, "currency": "EUR"},
        "reason": "damaged",
    }
    waiting = run(runtime().call("refund_payment", refund_input, context=context))
    assert isinstance(waiting, ToolPending)
    stored = SQLiteStore(tmp_path / "ctx.db").call(waiting.call.call_id)
    assert stored is not None and stored.tenant == "acme"
    action = SQLiteStore(tmp_path / "ctx.db").action(waiting.action.action_id)
    assert action is not None and action.tenant == "acme"
    resolution_owner = runtime()  # another process: it submits, a third one recovers
    from blade_runtime.core import actions

    record = resolution_owner.store.action(waiting.action.action_id)
    assert record is not None
    resolution_owner.store.resolve(
        record.action_id, *actions.answer(record, {"approved": True, "approver": "bo"}, None)
    )
    [done] = run(runtime().recover())
    assert isinstance(done, ToolSuccess) and done.content["refund_id"] == "re_alice"
    assert [c.principal if c else None for c in seen] == [ALICE, ALICE]
    assert seen[-1] is not None and seen[-1].client_data == {"locale": "fr"}
    assert seen[-1].thread_id == "th-9"


class Recorder:
    def __init__(self, fail_at: str | None = None) -> None:
        self.seen: list[str] = []
        self.fail_at = fail_at

    async def _record(self, event: Lifecycle) -> None:
        self.seen.append(event.boundary)
        if event.boundary == self.fail_at:
            raise RuntimeError(f"cannot persist {event.boundary}")

    scheduled = permission_requested = permission_resolved = _record
    execution_started = settled = _record


@pytest.mark.parametrize(
    "fail_at",
    [
        None,
        "scheduled",
        "permission_requested",
        "permission_resolved",
        "execution_started",
        "settled",
    ],
)
def test_an_observer_failing_at_each_boundary_stops_that_call_only(
    deploy: Any, tmp_path: Path, fail_at: str | None
) -> None:
    store = SQLiteStore(tmp_path / "obs.db")
    runtime = Runtime(store=store, permission=lambda request: Ask("deploy?"))
    deploys = Deploys(deploy)
    runtime.register(deploy.SPEC, deploys)
    recorder = Recorder(fail_at)
    runtime.observe(recorder)
    order = [
        "scheduled",
        "permission_requested",
        "permission_resolved",
        "execution_started",
        "settled",
    ]

    async def scenario() -> Any:
        first = await runtime.call("deploy_service", GOOD, call_id="c1")
        if not isinstance(first, ToolPending):
            return first
        return await runtime.submit(first.action.action_id, {"decision": "approve"})

    result = run(scenario())
    if fail_at is None:
        assert isinstance(result, ToolSuccess) and recorder.seen == order
        return
    assert isinstance(result, ToolError) and result.code == ErrorCode.OBSERVER_FAILED
    stopped = order.index(fail_at)
    # A stopped entry is still seen settling, except where the call waits on (or never made)
    # its request: before the answer is accepted nothing of the call ended.
    settles = fail_at in ("scheduled", "permission_requested", "execution_started")
    assert recorder.seen == order[: stopped + 1] + (["settled"] if settles else [])
    ran = fail_at == "settled"
    assert len(deploys.inputs) == (1 if ran else 0)  # a failure before the start blocks it
    if fail_at == "permission_resolved":  # the answer was not accepted: it still waits
        assert [p.origin.call_id for p in runtime.pending()] == ["c1"]
    if stopped >= order.index("execution_started"):
        stored = store.call("c1")
        assert stored is not None and stored.state == "settled"
        assert isinstance(stored.result, dict) and stored.result["code"] == "OBSERVER_FAILED"
    # Another call is not broken by it.
    recorder.fail_at = None
    other = run(runtime.call("deploy_service", GOOD))
    assert isinstance(other, ToolPending)


def test_a_policys_allow_crosses_no_permission_boundary_and_a_denial_does(deploy: Any) -> None:
    for policy, expected in (
        (lambda request: Allow(), ["scheduled", "execution_started", "settled"]),
        (lambda request: Deny("no"), ["scheduled", "permission_resolved", "settled"]),
    ):
        runtime = Runtime(permission=policy)
        runtime.register(deploy.SPEC, Deploys(deploy))
        recorder = Recorder()
        runtime.observe(recorder)
        run(runtime.call("deploy_service", GOOD))
        assert recorder.seen == expected


def test_invalid_json_never_enters_the_lifecycle(deploy: Any) -> None:
    runtime = Runtime()
    runtime.register(deploy.SPEC, Deploys(deploy))
    recorder = Recorder()
    runtime.observe(recorder)
    refused = run(runtime.call("deploy_service", "{not json"))
    assert isinstance(refused, ToolError) and refused.code == ErrorCode.INVALID_INPUT
    assert recorder.seen == []


def test_a_hook_that_swallows_cancellation_fails_closed(deploy: Any) -> None:
    release = asyncio.Event()

    async def stubborn(event: HookInput) -> HookOutput | None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await release.wait()  # swallows the cancellation and keeps running
        return None

    runtime = Runtime(hook_timeout_ms=20)
    deploys = Deploys(deploy)
    runtime.register(deploy.SPEC, deploys)
    runtime.on("pre_tool_use", stubborn)

    async def scenario() -> tuple[Any, Any, float, Any]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = await runtime.call("deploy_service", GOOD)
        took = loop.time() - started
        second = await runtime.call("deploy_service", GOOD)  # refused while the hook runs
        release.set()
        await asyncio.sleep(0.01)
        runtime.interceptors.hooks[next(iter(runtime.interceptors.hooks))].clear()
        runtime.interceptors.pre_any = False
        third = await runtime.call("deploy_service", GOOD)
        return first, second, took, third

    first, second, took, third = run(scenario())
    assert isinstance(first, ToolError) and first.code == ErrorCode.HOOK_TIMEOUT
    assert took < 0.5  # the budget held although the hook swallowed its cancellation
    assert isinstance(second, ToolError) and second.code == ErrorCode.HOOK_TIMEOUT
    assert isinstance(third, ToolSuccess)
    assert len(deploys.inputs) == 1  # only the call after the hook ended ran


def test_close_stops_new_calls_and_reports_a_call_that_ignores_cancellation(
    deploy: Any,
) -> None:
    async def ignores(ctx: Any) -> Any:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # ignores it for a while
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    runtime = Runtime(cleanup_grace_s=2.0)
    runtime.register(deploy.SPEC, ignores)

    async def scenario() -> tuple[Any, Any, Any]:
        running = asyncio.create_task(runtime.call("deploy_service", GOOD, call_id="slow"))
        await asyncio.sleep(0.05)
        report = await runtime.close(timeout_s=0.1)
        refused = await runtime.call("deploy_service", GOOD)
        result = await running
        return report, refused, result

    report, refused, result = run(scenario())
    assert report.abandoned == ("slow",)
    assert isinstance(refused, ToolError) and refused.code == ErrorCode.TOOL_UNAVAILABLE
    assert isinstance(result, ToolError) and result.code == ErrorCode.CANCELLED


def test_deny_and_ask_decisions_from_an_async_policy(deploy: Any) -> None:
    async def policy(request: PermissionRequest) -> Ask | Deny:
        await asyncio.sleep(0)
        return (
            Deny("no deploys on Fridays")
            if request.input["environment"] == "production"
            else Ask("ok?")
        )

    runtime = Runtime(permission=policy)
    runtime.register(deploy.SPEC, Deploys(deploy))
    denied = run(runtime.call("deploy_service", {**GOOD, "environment": "production"}))
    assert isinstance(denied, ToolError) and denied.message == "no deploys on Fridays"
    action = asked(run(runtime.call("deploy_service", GOOD)))
    assert action.input.prompt == "ok?"


def test_the_typed_client_lists_and_answers_permission_requests(deploy: Any) -> None:
    from blade_specs.client import Client

    from blade_runtime.client import CallPending, CallSuccess, PermissionRequestAction

    runtime, deploys = runtime_of(deploy, MemoryStore())
    client = Client(runtime)

    async def scenario() -> tuple[Any, Any, Any]:
        waiting = await client.deploy_service(deploy.DeployServiceInput(**GOOD), run_id="r1")
        assert isinstance(waiting, CallPending)
        assert isinstance(waiting.action, PermissionRequestAction)
        [listed] = client.permission_requests(run_id="r1")
        assert listed.input.kind == "execute" and listed.input.input == GOOD
        assert client.pending(run_id="r1") == []  # the package's own actions are apart
        edited = {**GOOD, "version": "v9.9.9"}
        done = await listed.approve(edited)  # with edited input
        second = await client.deploy_service(deploy.DeployServiceInput(**GOOD))
        assert isinstance(second, CallPending)
        denied = await second.action.deny("Not now.")  # type: ignore[union-attr]
        return done, denied, waiting

    done, denied, _ = run(scenario())
    assert isinstance(done, CallSuccess) and deploys.inputs == [{**GOOD, "version": "v9.9.9"}]
    assert denied.status == "error" and denied.code == ErrorCode.PERMISSION_DENIED


@pytest.mark.parametrize("policy_is", ["raising", "async_raising", "not_a_decision"])
def test_a_policy_that_fails_is_policy_failed_and_nothing_runs(deploy: Any, policy_is: str) -> None:
    def raising(request: Any) -> Any:
        raise RuntimeError("the rules service is down")

    async def async_raising(request: Any) -> Any:
        raise RuntimeError("the rules service is down")

    def not_a_decision(request: Any) -> Any:
        return 42

    policies = {"raising": raising, "async_raising": async_raising}
    runtime = Runtime(permission=policies.get(policy_is, not_a_decision))
    deploys = Deploys(deploy)
    runtime.register(deploy.SPEC, deploys)
    result = run(runtime.call("deploy_service", GOOD))
    assert isinstance(result, ToolError) and result.code == ErrorCode.POLICY_FAILED
    assert deploys.inputs == []  # the implementation never ran
    assert "rules service" not in result.message  # the details go to the log only


def test_a_person_s_denial_through_submit_is_observed_as_settled(deploy: Any) -> None:
    runtime = Runtime(permission=lambda request: Ask("deploy?"))
    deploys = Deploys(deploy)
    runtime.register(deploy.SPEC, deploys)
    recorder = Recorder()
    runtime.observe(recorder)

    async def scenario() -> Any:
        action = asked(await runtime.call("deploy_service", GOOD))
        return await runtime.submit(action.action_id, {"decision": "deny", "message": "frozen"})

    denied = run(scenario())
    assert isinstance(denied, ToolError) and denied.code == ErrorCode.PERMISSION_DENIED
    assert recorder.seen == [
        "scheduled",
        "permission_requested",
        "permission_resolved",
        "settled",
    ]


def test_a_person_s_answer_is_seen_with_the_stored_caller_by_hooks_and_observers(
    deploy: Any,
) -> None:
    """Answered through submit (no caller of its own), the hooks and observers see the caller
    the store recorded for the call, not None."""
    runtime = Runtime(permission=lambda request: Ask("deploy?"))
    runtime.register(deploy.SPEC, Deploys(deploy))
    seen: list[tuple[str, Principal | None]] = []

    async def hook(event: HookInput) -> HookOutput | None:
        seen.append((f"hook {event.decision}", event.call.context and event.call.context.principal))
        return None

    class Callers:
        async def permission_resolved(self, event: Lifecycle) -> None:
            seen.append(("resolved", event.call.context and event.call.context.principal))

        async def settled(self, event: Lifecycle) -> None:
            seen.append(("settled", event.call.context and event.call.context.principal))

    runtime.on("permission_request", hook)
    runtime.observe(Callers())
    context = CallContext(principal=ALICE)

    async def scenario() -> Any:
        action = asked(await runtime.call("deploy_service", GOOD, context=context))
        return await runtime.submit(action.action_id, {"decision": "deny", "message": "no"})

    denied = run(scenario())
    assert isinstance(denied, ToolError) and denied.code == ErrorCode.PERMISSION_DENIED
    assert seen == [
        ("hook ask", ALICE),
        ("hook deny", ALICE),
        ("resolved", ALICE),
        ("settled", ALICE),
    ]


def test_a_failing_settled_observer_after_a_denial_leaves_the_caller_told_what_is_stored(
    deploy: Any,
) -> None:
    """The denial is committed before the settled observers see it: one that raises is
    logged, and the caller is told PERMISSION_DENIED, as the store records."""
    runtime = Runtime(permission=lambda request: Ask("deploy?"))
    runtime.register(deploy.SPEC, Deploys(deploy))
    runtime.observe(Recorder(fail_at="settled"))

    async def scenario() -> tuple[Any, Any]:
        action = asked(await runtime.call("deploy_service", GOOD, call_id="d1"))
        told = await runtime.submit(action.action_id, {"decision": "deny", "message": "no"})
        return told, runtime.store.call("d1")

    told, stored = run(scenario())
    assert isinstance(told, ToolError) and told.code == ErrorCode.PERMISSION_DENIED, told
    assert stored is not None and stored.result["code"] == "PERMISSION_DENIED"  # type: ignore[call-overload,index]


def test_an_approval_through_the_operators_cli_is_observed_by_the_worker_taking_it_up(
    deploy: Any, tmp_path: Path
) -> None:
    from blade_runtime.serving import cli

    path = tmp_path / "cli.db"
    asking = Runtime(store=SQLiteStore(path), permission=lambda request: Ask("deploy?"))
    asking.register(deploy.SPEC, Deploys(deploy))
    action = asked(run(asking.call("deploy_service", GOOD)))
    approve = json.dumps({"decision": "approve", "message": "go"})
    assert cli.main(["pending", "submit", action.action_id, approve, "--store", str(path)]) == 0
    worker = Runtime(store=SQLiteStore(path), permission=lambda request: Ask("deploy?"))
    deploys = Deploys(deploy)
    worker.register(deploy.SPEC, deploys)
    recorder = Recorder()
    worker.observe(recorder)
    hooked: list[tuple[str | None, str | None]] = []

    async def hook(event: HookInput) -> HookOutput | None:
        hooked.append((event.decision, event.reason))
        return None

    worker.on("permission_request", hook)
    (result,) = run(worker.recover())
    assert isinstance(result, ToolSuccess) and len(deploys.inputs) == 1
    assert recorder.seen == ["permission_resolved", "execution_started", "settled"]
    assert hooked == [("allow", "go")]  # the hooks see the decision as the observers do


def test_a_denial_through_the_operators_cli_is_observed_by_the_worker_settling_it(
    deploy: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Denied outside a runtime, the call waits for a worker: its recovery settles it as
    PERMISSION_DENIED where permission_resolved and settled observers see it; the tool never
    runs."""
    from blade_runtime.serving import cli

    path = tmp_path / "deny.db"
    asking = Runtime(store=SQLiteStore(path), permission=lambda request: Ask("deploy?"))
    asking.register(deploy.SPEC, Deploys(deploy))
    action = asked(run(asking.call("deploy_service", GOOD)))
    deny = json.dumps({"decision": "deny", "message": "not during the freeze"})
    assert cli.main(["pending", "submit", action.action_id, deny, "--store", str(path)]) == 0
    assert "settles it as denied" in capsys.readouterr().out
    worker = Runtime(store=SQLiteStore(path), permission=lambda request: Ask("deploy?"))
    deploys = Deploys(deploy)
    worker.register(deploy.SPEC, deploys)
    recorder = Recorder()
    worker.observe(recorder)
    (result,) = run(worker.recover())
    assert isinstance(result, ToolError) and result.code == ErrorCode.PERMISSION_DENIED, result
    assert result.message == "not during the freeze"
    assert deploys.inputs == [] and recorder.seen == ["permission_resolved", "settled"]
    stored = worker.store.call(action.origin.call_id)
    assert stored is not None and stored.state == "settled"
    assert stored.result is not None and stored.result["code"] == "PERMISSION_DENIED"  # type: ignore[call-overload,index]
