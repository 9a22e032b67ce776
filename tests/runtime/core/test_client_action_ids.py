"""A client tool's action id (seed 002: "for an external-output client tool, actionId is its
toolCallId"): the model's tool call id when the caller gives one, unique in its run and refused
when reused, without telling one tenant anything of another's ids; else a new ``act_`` id."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from http_support import ALICE, BOB, authenticate

from blade_runtime import CallContext, Principal, Runtime
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolSuccess
from blade_runtime.core.store import Store

ANN = CallContext(principal=Principal("alice", "acme"))
BOB_CALLS = CallContext(principal=Principal("bob", "globex"))
PAGE = {"url": "https://example.com"}


def client_runtime(store: Store | None = None) -> Runtime:
    from blade_specs.browser import check_page_v1

    runtime = Runtime(store=store)
    runtime.register_client(check_page_v1.SPEC)
    return runtime


def test_a_client_tools_action_id_is_the_models_tool_call_id(
    example_package: Any, store: Store
) -> None:
    async def scenario() -> tuple[Any, ...]:
        runtime = client_runtime(store)
        waiting = await runtime.call(
            "check_page", PAGE, call_id="toolu_01A", run_id="r1", context=ANN
        )
        listed = await runtime.apending(run_id="r1")
        done = await runtime.submit("toolu_01A", {"status_code": 200})
        await runtime.close()
        return waiting, listed, done

    waiting, listed, done = asyncio.run(scenario())
    assert isinstance(waiting, ToolPending)
    assert waiting.action.action_id == "toolu_01A"
    assert waiting.content == {"pending": "check_page", "action_id": "toolu_01A"}
    assert [action.action_id for action in listed] == ["toolu_01A"]
    assert isinstance(done, ToolSuccess) and done.call.call_id == "toolu_01A"


def test_a_tool_call_id_reused_in_the_run_is_refused_and_the_first_action_stays(
    example_package: Any, store: Store
) -> None:
    async def scenario() -> tuple[Any, ...]:
        runtime = client_runtime(store)
        first = await runtime.call("check_page", PAGE, call_id="toolu_7", run_id="r", context=ANN)
        again = await runtime.call(
            "check_page", {"url": "https://other.example"}, call_id="toolu_7", run_id="r"
        )
        waiting = await runtime.apending(run_id="r")
        await runtime.close()
        return first, again, waiting

    first, again, waiting = asyncio.run(scenario())
    assert isinstance(first, ToolPending)
    assert isinstance(again, ToolError) and again.code is ErrorCode.DUPLICATE_CALL
    assert again.message == "call id 'toolu_7' is already recorded; nothing ran."
    [action] = waiting
    assert action.action_id == "toolu_7" and action.payload == PAGE  # the first one, unchanged


def test_without_a_tool_call_id_the_action_gets_a_new_id(example_package: Any) -> None:
    async def scenario() -> tuple[Any, ...]:
        runtime = client_runtime()
        made = await runtime.call("check_page", PAGE)
        adapter = await runtime.call("check_page", PAGE, call_id="run-1/toolu_2")
        namespace = await runtime.call("check_page", PAGE, call_id="act_mine")
        return made, adapter, namespace

    for result in asyncio.run(scenario()):
        assert isinstance(result, ToolPending)
        assert result.action.action_id.startswith("act_")
        assert result.action.action_id != result.call.call_id


def test_another_tenants_tool_call_id_tells_nothing_over_http(example_package: Any) -> None:
    """Bob reusing Alice's tool call id learns only what any reused call id answers (409, the
    same sentence for every call he may not see), never her action, and cannot read it."""
    from blade_runtime.serving.http import create_app

    async def scenario() -> tuple[Any, ...]:
        runtime = client_runtime()
        app = create_app(runtime, authenticate=authenticate)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            calls = "/v1/tools/check_page/calls"
            mine = await http.post(calls, json=PAGE, headers={**ALICE, "Idempotency-Key": "tc_1"})
            retried = await http.post(
                calls, json=PAGE, headers={**ALICE, "Idempotency-Key": "tc_1"}
            )
            theirs = await http.post(calls, json=PAGE, headers={**BOB, "Idempotency-Key": "tc_1"})
            unknown = await http.post(
                calls, json=PAGE, headers={**BOB, "Idempotency-Key": "tc_never_used"}
            )
            read = await http.get("/v1/actions/tc_1", headers=BOB)
            submitted = await http.post(
                "/v1/actions/tc_1/submit", json={"status_code": 200}, headers=ALICE
            )
        await runtime.close()
        return mine, retried, theirs, unknown, read, submitted

    mine, retried, theirs, unknown, read, submitted = asyncio.run(scenario())
    assert mine.status_code == 202 and mine.json()["action"]["action_id"] == "tc_1"
    assert retried.status_code == 202 and retried.json()["action"]["action_id"] == "tc_1"
    assert theirs.status_code == 409
    assert "tc_1" not in theirs.text and "example.com" not in theirs.text
    assert unknown.status_code == 202  # a fresh id is his own action
    assert read.status_code == 404
    assert submitted.status_code == 200 and submitted.json()["output"] == {"status_code": 200}
