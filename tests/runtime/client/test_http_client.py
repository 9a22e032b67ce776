"""The generated typed Client over HTTP: the same typed calls, results, pending-action classes
and submit as in process, against a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from http_support import REFUND, Tools, authenticate, runtime_of, serving

from blade_runtime.client import CallError, CallPending, CallSuccess
from blade_runtime.runtime import Runtime
from blade_runtime.serving.http import HttpTransport, RemoteRefused, create_app
from blade_runtime.stores.memory import MemoryStore
from blade_runtime.stores.sqlite import SQLiteStore


def with_deploy(runtime: Runtime) -> Runtime:
    from blade_specs.deploy import deploy_service_v1 as deploy

    async def impl(ctx: Any) -> Any:
        progress = deploy.DeployServiceProgressData
        await ctx.data.write("progress", progress(step="build", status="done"), id="build")
        await ctx.data.write("log", deploy.DeployServiceLogData(line="built"))
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    runtime.register(deploy.SPEC, impl)
    return runtime


def _comparable(dto: Any) -> Any:
    """A DTO's JSON without what differs between two runtimes (generated ids, timestamps)."""
    data = dto.model_dump(mode="json")
    action = data.get("action")
    if isinstance(action, dict):
        for key in ("action_id", "call_id", "suspended_at"):
            action.pop(key, None)
    return data


async def sequence(client: Any, tools: Tools) -> list[Any]:
    """The same typed calls, whichever transport the client has; returns the DTOs."""
    from blade_specs.browser import check_page_v1 as page
    from blade_specs.crm import lookup_customer_v1 as lookup
    from blade_specs.deploy import deploy_service_v1 as deploy
    from blade_specs.payments import refund_payment_v1 as refund

    seen: list[Any] = []
    found = await client.lookup_customer(
        lookup.LookupCustomerInput(customer_id="cus_1"), call_id="look-1", run_id="r"
    )
    assert isinstance(found, CallSuccess), found
    assert found.output == lookup.LookupCustomerOutput(found=False)
    assert (found.call_id, found.run_id) == ("look-1", "r")
    seen.append(found)

    bad = await client.lookup_customer(
        lookup.LookupCustomerInput.model_construct(customer_id="nope"), call_id="look-2", run_id="r"
    )
    assert isinstance(bad, CallError) and bad.code == "INVALID_INPUT"
    assert (bad.call_id, bad.run_id) == ("look-2", "r")
    seen.append(bad)

    waiting = await client.refund_payment(
        refund.RefundPaymentInput.model_validate(REFUND), call_id="refund-1", run_id="r"
    )
    assert isinstance(waiting, CallPending), waiting
    action = waiting.action
    assert isinstance(action, refund.RefundPaymentApprovalAction)
    assert action.input.prompt == "Refund 1250?"
    assert action.kind == "payments.refund-payment.v1#approval"
    seen.append(waiting)
    listed = client.pending(run_id="r")
    assert listed == [action]
    again = client.action(listed[0].model_dump(mode="json"))
    done = await again.submit(refund.RefundPaymentApprovalResume(approved=True, approver="ann"))
    assert isinstance(done, CallSuccess), done
    assert isinstance(done.output, refund.RefundPaymentOutputRefunded)
    assert done.call_id == "refund-1"
    seen.append(done)
    late = await action.cancel("too late")
    assert isinstance(late, CallError) and late.code == "ACTION_ALREADY_RESOLVED"
    assert late.call_id == "refund-1"

    second = await client.refund_payment(
        refund.RefundPaymentInput.model_validate(REFUND), call_id="refund-2", run_id="r"
    )
    assert isinstance(second, CallPending)
    cancelled = await second.action.cancel("duplicate")
    assert isinstance(cancelled, CallError) and cancelled.code == "CANCELLED"
    seen.append(cancelled)

    checking = await client.check_page(
        page.CheckPageInput(url="https://example.com"), call_id="page-1", run_id="r"
    )
    assert isinstance(checking, CallPending)
    assert isinstance(checking.action, page.CheckPageAction)
    checked = await checking.action.submit(page.CheckPageOutput(status_code=200, title="Example"))
    assert isinstance(checked, CallSuccess) and checked.output.title == "Example"
    seen.append(checked)
    failing = await client.check_page(
        page.CheckPageInput(url="https://example.org"), call_id="page-2", run_id="r"
    )
    assert isinstance(failing, CallPending)
    failed = await failing.action.fail("no browser")
    assert failed.code == "TOOL_FAILED" and failed.message == "no browser"
    seen.append(failed)

    deployed = await client.deploy_service(
        deploy.DeployServiceInput(service="api", version="v1.0.0", environment="staging"),
        call_id="deploy-1",
        run_id="r",
    )
    assert isinstance(deployed, CallSuccess) and deployed.output.steps == 1
    data = client.deploy_service_data("deploy-1")
    assert [item.value.step for item in data.progress] == ["build"]
    assert [item.value.line for item in data.log] == ["built"]
    seen.append(deployed)
    assert client.pending() == []
    assert tools.lookups == 1 and tools.refund_entries == 3
    return seen


def test_the_typed_client_over_http_is_the_one_in_process(
    tmp_path: Path, example_package: Any
) -> None:
    from blade_specs.client import Client
    from blade_specs.crm import lookup_customer_v1 as lookup

    remote_runtime, remote_tools = runtime_of(SQLiteStore(tmp_path / "remote.db"))
    app = create_app(with_deploy(remote_runtime), authenticate=authenticate)
    local_runtime, local_tools = runtime_of(MemoryStore())
    with_deploy(local_runtime)

    with serving(app) as server:

        async def scenario() -> tuple[list[Any], list[Any]]:
            async with HttpTransport(server.url, token="token-alice") as transport:
                remote = await sequence(Client(transport), remote_tools)
                # a retry of a call id the server has seen: its first result, no second run
                again = await Client(transport).lookup_customer(
                    lookup.LookupCustomerInput(customer_id="cus_1"), call_id="look-1", run_id="r"
                )
                assert again == remote[0] and remote_tools.lookups == 1
            local = await sequence(Client(local_runtime), local_tools)
            return remote, local

        remote, local = asyncio.run(scenario())
    assert [_comparable(r) for r in remote] == [_comparable(r) for r in local]


def test_the_remote_client_is_refused_what_the_api_refuses(
    tmp_path: Path, example_package: Any
) -> None:
    from blade_specs.client import Client
    from blade_specs.payments import refund_payment_v1 as refund

    runtime, tools = runtime_of(SQLiteStore(tmp_path / "s.db"))
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server:

        async def scenario() -> None:
            alice = Client(HttpTransport(server.url, token="token-alice"))
            bob = Client(HttpTransport(server.url, token="token-bob"))
            nobody = Client(HttpTransport(server.url, token="token-wrong"))
            waiting = await alice.refund_payment(refund.RefundPaymentInput.model_validate(REFUND))
            assert isinstance(waiting, CallPending)
            with pytest.raises(RemoteRefused) as refused:
                await nobody.refund_payment(refund.RefundPaymentInput.model_validate(REFUND))
            assert refused.value.status == 401 and refused.value.code == "UNAUTHENTICATED"
            assert "token-wrong" not in str(refused.value)
            with pytest.raises(RemoteRefused):
                nobody.pending()
            assert bob.pending() == []
            stolen = bob.action(waiting.action.model_dump(mode="json"))
            taken = await stolen.submit(
                refund.RefundPaymentApprovalResume(approved=True, approver="mallory")
            )
            assert isinstance(taken, CallError) and taken.code == "UNKNOWN_ACTION"
            cancelled = await stolen.cancel()
            assert cancelled.code == "UNKNOWN_ACTION"
            assert [a.action_id for a in alice.pending()] == [waiting.action.action_id]
            # an idempotency key already used by another tenant
            with pytest.raises(RemoteRefused) as conflict:
                await bob.refund_payment(
                    refund.RefundPaymentInput.model_validate(REFUND), call_id=waiting.call_id
                )
            assert conflict.value.code == "IDEMPOTENCY_CONFLICT"

        asyncio.run(scenario())
    assert tools.refund_entries == 1
    record = runtime.store.action(runtime.store.actions()[0].action_id)
    assert record is not None and record.state == "pending"


def test_the_typed_client_names_its_agent_and_thread_and_reads_them_on_each_action(
    tmp_path: Path, example_package: Any
) -> None:
    """Seed 002's PendingActionOrigin: the typed action of a call carries the thread and the
    agent the client named (``thread_id=``, ``agent_id=`` on its transport), over HTTP and in
    process alike; another tenant's client lists none of them."""
    from blade_specs.client import Client
    from blade_specs.payments import refund_payment_v1 as refund

    from blade_runtime import Principal
    from blade_runtime.client import RuntimeTransport

    runtime, _ = runtime_of(SQLiteStore(tmp_path / "s.db"))
    app = create_app(runtime, authenticate=authenticate)
    arguments = refund.RefundPaymentInput.model_validate(REFUND)
    placed = {"thread_id": "thread-4", "agent_id": "refunds-bot"}
    with serving(app) as server:

        async def scenario() -> None:
            remote = HttpTransport(server.url, token="token-alice", **placed)
            local = RuntimeTransport(runtime, Principal("alice", "acme"), **placed)
            for transport in (remote, local):
                waiting = await Client(transport).refund_payment(arguments)
                assert isinstance(waiting, CallPending)
                action = waiting.action
                assert isinstance(action, refund.RefundPaymentApprovalAction)
                assert (action.thread_id, action.agent_id) == ("thread-4", "refunds-bot")
            listed = Client(remote).pending()
            assert len(listed) == 2
            assert {(a.thread_id, a.agent_id) for a in listed} == {("thread-4", "refunds-bot")}
            assert Client(HttpTransport(server.url, token="token-bob")).pending() == []
            unnamed = await Client(HttpTransport(server.url, token="token-alice")).refund_payment(
                arguments
            )
            assert isinstance(unnamed, CallPending)
            assert (unnamed.action.thread_id, unnamed.action.agent_id) == (None, None)
            await remote.aclose()

        asyncio.run(scenario())
