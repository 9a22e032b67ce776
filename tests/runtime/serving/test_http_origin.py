"""Seed 002 over HTTP and MCP: a caller names the thread and the executing agent of its call
(``?thread_id=``, ``?agent_id=``; MCP ``_meta["io.blade"]``), the implementation reads them in
``ctx``, and the call and its pending action show them (their origin) to whom they belong."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_support import ALICE, CAROL, REFUND, ROOT, authenticate, runtime_of

from blade_runtime.runtime import Runtime
from blade_runtime.serving.http import create_app

TESTS = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TESTS))
import agent_tools  # noqa: E402


def test_a_call_names_its_thread_and_agent_and_its_action_shows_them(
    store: Any, example_package: Any
) -> None:
    """Memory, SQLite and PostgreSQL: the 202's action, the action read back, the listing,
    the call, a run's calls; carol (alice's tenant, not alice) sees none of it."""
    runtime, _ = runtime_of(store)
    app = create_app(runtime, authenticate=authenticate, allow_anonymous=False)
    origin = {"thread_id": "thread-7", "agent_id": "billing"}

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            made = await http.post(
                "/v1/tools/refund_payment/calls",
                params={**origin, "run_id": "r-1"},
                json=REFUND,
                headers=ALICE,
            )
            assert made.status_code == 202, made.text
            action = made.json()["action"]
            assert {k: action[k] for k in origin} == origin
            action_id, call_id = action["action_id"], made.json()["call_id"]
            one = (await http.get(f"/v1/actions/{action_id}", headers=ALICE)).json()
            assert {k: one[k] for k in origin} == origin
            (listed,) = (await http.get("/v1/actions", headers=ALICE)).json()["actions"]
            assert {k: listed[k] for k in origin} == origin
            call = (await http.get(f"/v1/calls/{call_id}", headers=ALICE)).json()
            assert {k: call[k] for k in origin} == origin
            (in_run,) = (await http.get("/v1/runs/r-1/calls", headers=ALICE)).json()["calls"]
            assert {k: in_run[k] for k in origin} == origin
            (seen,) = (await http.get("/v1/actions", headers=ROOT)).json()["actions"]
            assert seen["agent_id"] == "billing"  # the operator sees every tenant's

            assert (await http.get("/v1/actions", headers=CAROL)).json()["actions"] == []
            assert (await http.get(f"/v1/actions/{action_id}", headers=CAROL)).status_code == 404
            assert (await http.get(f"/v1/calls/{call_id}", headers=CAROL)).status_code == 404

            plain = await http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE)
            assert plain.status_code == 202
            unnamed = plain.json()["action"]
            assert (unnamed["thread_id"], unnamed["agent_id"]) == (None, None)

            async def listed_ids(**query: str) -> list[str]:
                page = await http.get("/v1/actions", params=query, headers=ALICE)
                return [a["action_id"] for a in page.json()["actions"]]

            assert await listed_ids(agent_id="billing") == [action_id]
            assert await listed_ids(thread_id="thread-7", agent_id="billing") == [action_id]
            assert await listed_ids(agent_id="support") == []
            assert len(await listed_ids()) == 2
            carols = await http.get("/v1/actions", params={"agent_id": "billing"}, headers=CAROL)
            assert carols.json()["actions"] == []  # a filter never widens what one sees

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "query",
    [{"agent_id": "a\nb"}, {"thread_id": ""}, {"agent_id": "x" * 201}, {"thread_id": "t\0"}],
)
def test_an_agent_or_thread_no_store_could_hold_is_refused_before_anything_runs(
    store: Any, example_package: Any, query: dict[str, str]
) -> None:
    """They are stored with the call's actions, so they are ids: 1 to 200 printable
    characters (PostgreSQL's text holds no NUL). Anything else is 400 and nothing ran."""
    runtime, tools = runtime_of(store)
    app = create_app(runtime, authenticate=authenticate, allow_anonymous=False)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            refused = await http.post(
                "/v1/tools/refund_payment/calls", params=query, json=REFUND, headers=ALICE
            )
            assert refused.status_code == 400, refused.text
            ((key, value),) = query.items()
            said = refused.json()["message"]
            if "\0" in value:  # the app refuses a NUL anywhere in a query first
                assert said == "The path or query holds a NUL character."
            else:
                assert said == f"{key} is 1 to 200 printable characters."
            assert (await http.get("/v1/actions", headers=ROOT)).json()["actions"] == []

    asyncio.run(scenario())
    assert tools.refund_entries == 0


def test_the_openapi_document_names_the_agent_parameter_and_the_origin_fields(
    example_package: Any,
) -> None:
    runtime, _ = runtime_of()
    app = create_app(runtime, authenticate=authenticate, allow_anonymous=False)

    async def scenario() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            answer = await http.get("/v1/openapi.json", headers=ALICE)
            assert answer.status_code == 200, answer.text
            document: dict[str, Any] = answer.json()
            return document

    document = asyncio.run(scenario())
    call = document["paths"]["/v1/tools/refund_payment/calls"]["post"]
    assert {"thread_id", "agent_id"} <= {p["name"] for p in call["parameters"]}
    schemas = document["components"]["schemas"]
    for shape in ("Action", "Call"):
        assert {"thread_id", "agent_id"} <= set(schemas[shape]["properties"])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_tools.built_package(tmp_path_factory)


def test_an_mcp_client_names_the_thread_and_agent_in_meta(built: Path) -> None:
    """The MCP SDK's own client: ``_meta["io.blade"]`` names them; the implementation reads
    ctx.agent_id and the call's thread; what is not a string is left out."""
    from blade_agent_specs.crm import find_v1
    from mcp import Client

    from blade_runtime.serving.mcp import mcp_server

    seen: list[tuple[str | None, str | None]] = []

    async def find(ctx: Any) -> Any:
        seen.append((ctx.agent_id, ctx.call.thread_id))
        return find_v1.FindOutput(id=ctx.input.customer_id, name="c")

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(find_v1.SPEC, find)
        async with Client(mcp_server(runtime)) as client:
            named = {"io.blade": {"thread_id": "th-1", "agent_id": "support"}}
            await client.call_tool("find", {"customer_id": 1}, meta=named)
            await client.call_tool("find", {"customer_id": 2}, meta={"io.blade": {"agent_id": 3}})
            await client.call_tool("find", {"customer_id": 3})
            odd = {"io.blade": {"thread_id": "t\0", "agent_id": "y" * 201}}
            await client.call_tool("find", {"customer_id": 4}, meta=odd)

    asyncio.run(scenario())
    assert seen == [("support", "th-1"), (None, None), (None, None), (None, None)]
