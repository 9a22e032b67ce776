"""The MCP server (blade_runtime.serving.mcp) through the SDK's own client: in memory, stdio and
HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from blade_runtime.core.caller import OPERATOR, CallContext, Principal
from blade_runtime.core.results import ToolSuccess
from blade_runtime.runtime import Runtime
from blade_runtime.serving.mcp import (
    McpTools,
    flat_form_schema,
    mcp_asgi_app,
    mcp_server,
)
from blade_runtime.stores.sqlite import SQLiteStore

TESTS = Path(__file__).resolve().parents[2]  # the tests folder: its helper modules
sys.path.insert(0, str(TESTS))
import agent_tools  # noqa: E402

BIN = Path(sys.executable).parent
ANN = Principal("ann", "acme")
SEND = {"to": "bob", "amount": 5}

Elicit = Callable[[Any, Any], Awaitable[types.ElicitResult]]


run = agent_tools.run


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_tools.built_package(tmp_path_factory)


@pytest.fixture
def runtime(built: Path) -> Runtime:
    return agent_tools.make_runtime()


def answers(*payloads: dict[str, Any] | str, seen: list[Any] | None = None) -> Elicit:
    """An elicitation callback answering with each payload in turn ("decline", "cancel")."""
    queue = list(payloads)

    async def elicit(ctx: Any, params: Any) -> types.ElicitResult:
        if seen is not None:
            seen.append(params)
        answer = queue.pop(0)
        if answer in ("decline", "cancel"):
            return types.ElicitResult(action=answer)  # type: ignore[arg-type]
        assert isinstance(answer, dict)
        return types.ElicitResult(action="accept", content=answer)

    return elicit


def structured(result: types.CallToolResult) -> Any:
    assert result.content and isinstance(result.content[0], types.TextContent)
    text = json.loads(result.content[0].text)
    if result.structured_content is not None:
        assert result.structured_content == text
    return text


# -- tools/list and plain calls -------------------------------------------------------------


def test_the_server_sends_the_tools_guidance_as_its_instructions(built: Path) -> None:
    """A tool set carries guidance for the model, sent with the tools (003, SkillsInput): the
    application's own first, then the spec package's."""

    async def main(runtime: Runtime) -> str | None:
        async with Client(mcp_server(runtime)) as client:
            return client.instructions

    assert run(main(agent_tools.make_runtime())) == agent_tools.GUIDANCE
    own = agent_tools.register(Runtime(guidance="Answer in French."))
    assert run(main(own)) == "Answer in French.\n\n" + agent_tools.GUIDANCE
    blade = own.export("blade").document
    assert isinstance(blade, dict) and blade["guidance"] == own.guidance
    # a runtime whose tools are all disallowed sends none of their guidance
    assert run(main(Runtime())) is None


def test_list_tools_carries_the_spec_schemas_and_annotations(runtime: Runtime) -> None:
    async def main() -> dict[str, types.Tool]:
        async with Client(mcp_server(runtime)) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = run(main())
    assert sorted(tools) == ["find", "plan", "transfer"]
    assert tools["transfer"].input_schema == agent_tools.TRANSFER["inputSchema"]
    assert tools["transfer"].output_schema == agent_tools.TRANSFER["outputSchema"]
    assert tools["plan"].output_schema is None
    find, transfer = tools["find"].annotations, tools["transfer"].annotations
    assert find is not None and transfer is not None
    assert find.read_only_hint is True and find.idempotent_hint is True
    assert transfer.read_only_hint is False and transfer.idempotent_hint is False
    assert transfer.destructive_hint is True


def test_calls_give_structured_content_and_errors_our_code(runtime: Runtime) -> None:
    async def main() -> tuple[types.CallToolResult, ...]:
        async with Client(mcp_server(runtime)) as client:
            ok = await client.call_tool("find", {"customer_id": 7})
            coerced = await client.call_tool("find", {"customer_id": "7"})
            unknown = await client.call_tool("nope", {})
            return ok, coerced, unknown

    ok, coerced, unknown = run(main())
    assert not ok.is_error and ok.structured_content == {"id": 7, "name": "customer 7"}
    assert structured(ok) == {"id": 7, "name": "customer 7"}
    assert coerced.is_error  # "7" is not an integer: the schema decides, nothing is coerced
    assert structured(coerced)["error"] == "INVALID_INPUT"
    assert "/customer_id" in structured(coerced)["message"]
    assert coerced.meta is not None and coerced.meta["io.blade"]["code"] == "INVALID_INPUT"
    assert structured(unknown)["error"] == "TOOL_HANDLER_NOT_FOUND"


# -- the input-required flow ----------------------------------------------------------------


def test_form_elicitation_asks_again_on_an_invalid_answer(runtime: Runtime, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    os.environ["BLADE_EFFECTS"] = str(effects)
    seen: list[Any] = []
    states: list[list[str]] = []

    async def elicit(ctx: Any, params: Any) -> types.ElicitResult:
        states.append([a.state for a in runtime.store.actions(state=None)])
        return await inner(ctx, params)

    inner = answers(
        {"approved": True, "approver": "Ann!"}, {"approved": True, "approver": "ann"}, seen=seen
    )

    async def main() -> types.CallToolResult:
        async with Client(
            mcp_server(runtime, principal=ANN), elicitation_callback=elicit
        ) as client:
            return await client.call_tool("transfer", SEND)

    try:
        result = run(main())
    finally:
        del os.environ["BLADE_EFFECTS"]
    assert not result.is_error and result.structured_content == {"status": "sent", "by": "ann"}
    assert [p.mode for p in seen] == ["form", "form"]
    assert seen[0].message == "Send 5 to bob?"
    assert seen[0].requested_schema == {
        "type": "object",
        "properties": {"approved": {"type": "boolean"}, "approver": {"type": "string"}},
        "required": ["approved", "approver"],
    }
    assert "must match the pattern" in seen[1].message  # the refusal, and the action still waits
    assert states == [["pending"], ["pending"]]
    assert effects.read_text().count("sent 5 to bob") == 1


def test_decline_cancels_and_dismissal_leaves_it_pending(runtime: Runtime) -> None:
    async def main() -> tuple[types.CallToolResult, types.CallToolResult]:
        server = mcp_server(runtime, principal=ANN)
        async with Client(server, elicitation_callback=answers("decline")) as client:
            declined = await client.call_tool("transfer", SEND)
        async with Client(server, elicitation_callback=answers("cancel")) as client:
            dismissed = await client.call_tool("transfer", SEND)
        return declined, dismissed

    declined, dismissed = run(main())
    assert declined.is_error and structured(declined)["error"] == "CANCELLED"
    waiting = runtime.pending()
    assert len(waiting) == 1 and structured(dismissed)["action_id"] == waiting[0].action_id
    assert dismissed.meta is not None and dismissed.meta["io.blade"]["status"] == "pending"
    states = sorted(a.state for a in runtime.store.actions(state=None))
    assert states == ["cancelled", "pending"]


def test_nested_resume_schema_is_a_url_elicitation_to_the_inbox(runtime: Runtime) -> None:
    seen: list[Any] = []

    async def at_the_inbox(ctx: Any, params: Any) -> types.ElicitResult:
        seen.append(params)
        # the user opens the page and submits there (the inbox runs runtime.submit)
        action_id = params.url.rsplit("/", 1)[1]
        submitted = await runtime.submit(action_id, {"steps": [{"title": "a"}, {"title": "b"}]})
        assert isinstance(submitted, ToolSuccess)
        return types.ElicitResult(action="accept")

    async def main() -> types.CallToolResult:
        server = mcp_server(runtime, principal=ANN, inbox_url="https://inbox.example/actions")
        async with Client(server, elicitation_callback=at_the_inbox) as client:
            return await client.call_tool("plan", {"goal": "ship"})

    result = run(main())
    assert [p.mode for p in seen] == ["url"]
    assert seen[0].url.startswith("https://inbox.example/actions/act_")
    assert structured(result) == {"steps": ["a", "b"]}


def test_no_inbox_or_no_elicitation_or_older_protocol_gets_the_pending_action(
    runtime: Runtime,
) -> None:
    async def main() -> list[types.CallToolResult]:
        got = []
        async with Client(mcp_server(runtime), elicitation_callback=answers()) as client:
            got.append(await client.call_tool("plan", {"goal": "x"}))  # nested, no inbox_url
        async with Client(mcp_server(runtime)) as client:  # cannot elicit
            got.append(await client.call_tool("transfer", SEND))
        async with Client(mcp_server(runtime), mode="legacy", elicitation_callback=answers()) as c:
            assert c.protocol_version not in ("2026-07-28",)
            got.append(await c.call_tool("transfer", SEND))
            got.append(await c.call_tool("plan", {"goal": "y"}))
        return got

    nested, blind, legacy, legacy_plan = run(main())
    pending = {a.action_id: a for a in runtime.pending()}
    assert len(pending) == 4
    for result in (nested, blind, legacy, legacy_plan):
        assert structured(result)["action_id"] in pending
        assert result.meta is not None and result.meta["io.blade"]["status"] == "pending"
    # a tool without an output schema: an ordinary result; with one, the client would refuse
    # content that does not match it, so the pending action is an isError result
    assert not nested.is_error and not legacy_plan.is_error
    assert structured(legacy_plan)["pending"] == "plan.review"
    assert (
        blind.is_error and legacy.is_error and structured(legacy)["pending"] == "transfer.confirm"
    )


def test_the_retry_is_checked_against_the_stored_principal(runtime: Runtime) -> None:
    async def first_leg(client: Client) -> types.InputRequiredResult:
        leg = await client.session.call_tool("transfer", SEND, allow_input_required=True)
        assert isinstance(leg, types.InputRequiredResult)
        return leg

    async def retry(server: Any, state: str | None, name: str = "transfer") -> Any:
        response = types.ElicitResult(action="accept", content={"approved": True, "approver": "x"})
        async with Client(server, elicitation_callback=answers()) as client:
            return await client.session.call_tool(
                name,
                SEND,
                input_responses={"confirm": response},
                request_state=state,
                allow_input_required=True,
            )

    key = b"k" * 32  # the servers share their signing key, as workers sharing a store would

    def server(who: Principal) -> Any:
        return mcp_server(runtime, principal=who, signing_key=key)

    async def main() -> list[Any]:
        async with Client(server(ANN), elicitation_callback=answers()) as c:
            leg = await first_leg(c)
        return [
            await retry(server(Principal("mallory", "acme")), leg.request_state),
            await retry(server(Principal("ann", "evil")), leg.request_state),
            await retry(server(Principal("op", "x", frozenset({OPERATOR}))), leg.request_state),
        ]

    *refused, by_operator = run(main())
    for result in refused:
        assert isinstance(result, types.CallToolResult) and result.is_error
        assert structured(result)["error"] == "UNKNOWN_ACTION"
    assert isinstance(by_operator, types.CallToolResult)
    assert by_operator.structured_content == {"status": "sent", "by": "x"}


def test_a_request_state_tampered_with_is_a_json_rpc_error_and_nothing_runs(
    runtime: Runtime, tmp_path: Path
) -> None:
    """Issue 50.2: the request state is signed; one changed anywhere, made for another tool, by
    another server's key or in the unsigned old form is refused (-32602), the action waits."""
    import base64

    import httpx
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    from blade_runtime.serving.mcp import FastPath

    effects = tmp_path / "effects"
    os.environ["BLADE_EFFECTS"] = str(effects)
    server = mcp_asgi_app(runtime, principal=ANN, signing_key=b"k" * 32)
    stranger = mcp_asgi_app(runtime, principal=ANN, signing_key=b"s" * 32)
    good = types.ElicitResult(action="accept", content={"approved": True, "approver": "ann"})

    @contextlib.asynccontextmanager
    async def client_of(app: FastPath) -> Any:
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http,
            Client(
                streamable_http_client("http://127.0.0.1:8000/mcp", http_client=http),
                elicitation_callback=answers(),
            ) as client,
        ):
            yield client

    async def retry(via: Any, state: str, name: str = "transfer") -> Any:
        async with client_of(via) as client:
            try:
                return await client.session.call_tool(
                    name,
                    SEND,
                    input_responses={"confirm": good},
                    request_state=state,
                    allow_input_required=True,
                )
            except MCPError as error:
                return error.error.code, error.error.message

    async def main() -> list[Any]:
        async with (
            server.app.router.lifespan_context(server.app),
            stranger.app.router.lifespan_context(stranger.app),
        ):
            return await legs()

    async def legs() -> list[Any]:
        async with client_of(server) as client:
            leg = await client.session.call_tool("transfer", SEND, allow_input_required=True)
        state = leg.request_state
        body, tag = state.removeprefix("blade2.").split(".")
        action = base64.urlsafe_b64decode(body + "==").decode().split("\0")[1]
        other = base64.urlsafe_b64encode(f"transfer\0{action}x".encode()).decode().rstrip("=")
        outcomes = []
        for via, forged, name in [
            (server, state + "-TAMPERED", "transfer"),
            (server, state[:-2] + ("AA" if not state.endswith("AA") else "BB"), "transfer"),
            (server, f"blade2.{other}.{tag}", "transfer"),
            (server, state, "plan"),
            (stranger, state, "transfer"),
            (server, "blade1." + base64.urlsafe_b64encode(action.encode()).decode(), "transfer"),
        ]:
            outcomes.append(await retry(via, forged, name))
        outcomes.append(await retry(server, state))  # the state as made: the answer goes in
        return outcomes

    try:
        *refused, done = run(main())
    finally:
        del os.environ["BLADE_EFFECTS"]
    assert refused == [(-32602, "Invalid or expired requestState")] * 6
    assert done.structured_content == {"status": "sent", "by": "ann"}
    assert effects.read_text().count("sent 5 to bob") == 1


def test_flat_form_schema() -> None:
    assert flat_form_schema({"type": "object", "properties": {"a": {"type": "object"}}}) is None
    assert flat_form_schema({"type": "object", "properties": {"a": {"$ref": "#/x"}}}) is None
    assert flat_form_schema({"type": "array"}) is None
    form = flat_form_schema(
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
                "when": {"type": "string", "format": "date", "pattern": "x"},
                "level": {"enum": ["low", "high"]},
            },
        }
    )
    assert form == {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
            "when": {"type": "string", "format": "date"},
            "level": {"type": "string", "enum": ["low", "high"]},
        },
    }


def test_http_app_needs_an_authenticator_or_anonymous(runtime: Runtime) -> None:
    with pytest.raises(ValueError, match="authenticate"):
        mcp_asgi_app(runtime)
    assert mcp_asgi_app(runtime, anonymous=True) is not None


# -- stdio and streamable HTTP, in other processes ------------------------------------------


def _env(built: Path, effects: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(built), str(TESTS), env.get("PYTHONPATH", "")])
    env["BLADE_EFFECTS"] = str(effects)
    env["BLADE_MCP_STATE_KEY"] = "a key the workers of these tests share, 32+ bytes"
    return env


def test_stdio_server_runs_the_flow(built: Path, tmp_path: Path) -> None:
    db = tmp_path / "blade.db"
    params = StdioServerParameters(
        command=str(BIN / "blade-runtime"),
        args=["mcp", "agent_tools:make_runtime", "--store", str(db), "--principal", "ann@acme"],
        env=_env(built, tmp_path / "effects"),
    )
    seen: list[Any] = []

    async def main() -> tuple[list[str], types.CallToolResult]:
        elicit = answers(
            {"approved": "yes", "approver": "ann"}, {"approved": True, "approver": "ann"}, seen=seen
        )
        async with Client(params, elicitation_callback=elicit) as client:
            # the spec package's guidance reaches the client as the server's instructions
            assert client.instructions == agent_tools.GUIDANCE
            names = [tool.name for tool in (await client.list_tools()).tools]
            return names, await client.call_tool("transfer", SEND)

    names, result = run(main())
    assert names == ["find", "plan", "transfer"]
    assert result.structured_content == {"status": "sent", "by": "ann"}
    assert len(seen) == 2 and "/approved" in seen[1].message
    store = SQLiteStore(db)
    try:
        (action,) = store.actions(state=None)
        assert action.state == "submitted" and action.tenant == "acme"
    finally:
        store.close()
    assert (tmp_path / "effects").read_text().count("sent") == 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def http_worker(
    built: Path, db: Path, effects: Path, target: str = "agent_tools:make_runtime"
) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [
            str(BIN / "blade-runtime"),
            "mcp",
            target,
            "--store",
            str(db),
            "--http",
            f"127.0.0.1:{port}",
            "--principal",
            "ann@acme",
        ],
        env=_env(built, effects),
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                assert process.stderr is not None
                raise AssertionError(process.stderr.read().decode())
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_http_first_leg_on_one_worker_retry_on_another(built: Path, tmp_path: Path) -> None:
    db, effects = tmp_path / "blade.db", tmp_path / "effects"
    SQLiteStore(db).close()  # both workers open the same file

    async def main(first: str, second: str) -> tuple[Any, Any, Any]:
        async with Client(first, elicitation_callback=answers()) as client:
            listed = [tool.name for tool in (await client.list_tools()).tools]
            assert listed == ["find", "plan", "transfer"]
            leg = await client.session.call_tool("transfer", SEND, allow_input_required=True)
        assert isinstance(leg, types.InputRequiredResult) and leg.input_requests
        ask = leg.input_requests["confirm"]
        assert isinstance(ask, types.ElicitRequest) and ask.params.mode == "form"
        bad = types.ElicitResult(action="accept", content={"approved": True, "approver": "B0b"})
        good = types.ElicitResult(action="accept", content={"approved": True, "approver": "bob"})
        async with Client(second, elicitation_callback=answers()) as client:
            again = await client.session.call_tool(
                "transfer",
                SEND,
                input_responses={"confirm": bad},
                request_state=leg.request_state,
                allow_input_required=True,
            )
            done = await client.call_tool(
                "transfer",
                SEND,
                input_responses={"confirm": good},
                request_state=leg.request_state,
            )
        return leg, again, done

    with http_worker(built, db, effects) as first, http_worker(built, db, effects) as second:
        leg, again, done = run(main(first, second))
    assert isinstance(again, types.InputRequiredResult)  # refused: asked again, still pending
    assert again.request_state == leg.request_state
    assert done.structured_content == {"status": "sent", "by": "bob"}
    lines = effects.read_text().splitlines()
    assert len(lines) == 1  # the side effect ran once, in the second worker
    store = SQLiteStore(db)
    try:
        (action,) = store.actions(state=None)
        call = store.call(action.call_id)
        assert call is not None and call.state == "settled"
        assert call.owner != "" and str(call.owner.split(":")[1]) in lines[0]
    finally:
        store.close()


def test_cli_refuses_a_bad_target(built: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "blade-runtime"), "mcp", "agent_tools"],
        env=_env(built, tmp_path / "e"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "MODULE:RUNTIME" in done.stderr


def test_the_cli_finds_the_application_in_the_current_folder_as_serve_does(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`blade-runtime mcp myapp:make_runtime` run beside myapp.py, as docs/mcp-and-adapters.md
    shows."""
    from blade_runtime.serving.mcp_cli import load_runtime

    (tmp_path / "blade_mcp_app_here.py").write_text(
        "from blade_runtime import Runtime\n\n\ndef make_runtime(store=None):\n"
        "    return Runtime(store=store)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "blade_mcp_app_here", raising=False)
    made = load_runtime("blade_mcp_app_here:make_runtime", f"sqlite:///{tmp_path / 'a.db'}")
    assert isinstance(made, Runtime) and made.store.durable
    made.store.close()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="has no nothing"):
        load_runtime("blade_mcp_app_here:nothing", None)


def test_pending_flow_in_process_keeps_the_typed_view(runtime: Runtime) -> None:
    async def main() -> Any:
        async with Client(mcp_server(runtime, principal=ANN)) as client:
            await client.call_tool("transfer", SEND)
        return runtime.pending(principal=ANN)

    (action,) = run(main())
    assert action.name == "transfer.confirm" and action.input.prompt == "Send 5 to bob?"
    assert runtime.pending(principal=Principal("eve", "other")) == []


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "sdk-path"])
def test_a_request_authenticate_vouches_for_nobody_is_refused_not_served_anonymously(
    runtime: Runtime, fast: bool
) -> None:
    """mcp_asgi_app(authenticate=f): where f returns None (no token, a wrong one) the request
    is refused, as the HTTP API's 401, instead of running tools for an anonymous tenant ""."""
    import httpx
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    def authenticate(req: Any) -> Principal | None:
        header = "" if req.http is None else req.http.headers.get("authorization", "")
        return ANN if header == "Bearer ann" else None

    app = mcp_asgi_app(runtime, authenticate=authenticate, fast_path=fast)
    inner = getattr(app, "app", app)
    agent_tools.ENTRIES.clear()

    async def session(token: str | None) -> list[str]:
        headers = {} if token is None else {"authorization": f"Bearer {token}"}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, headers=headers) as http:
            url = "http://127.0.0.1:8000/mcp"
            async with Client(streamable_http_client(url, http_client=http)) as client:
                refusals = []
                for attempt in (
                    client.list_tools(),
                    client.call_tool("find", {"customer_id": 4}),
                    client.call_tool("transfer", SEND),
                ):
                    try:
                        await attempt
                    except MCPError as error:
                        refusals.append(error.message)
                return refusals

    async def main() -> tuple[list[list[str]], list[Any], list[str]]:
        async with inner.router.lifespan_context(inner):
            refused = [await session(None), await session("wrong")]
            left = [*agent_tools.ENTRIES, *runtime.store.actions(state=None)]
            return refused, left, await session("ann")

    refused, left, served = run(main())
    assert refused == [["Authentication required."] * 3] * 2
    assert left == []  # nothing ran, nothing waits
    assert served == [] and agent_tools.ENTRIES  # the principal it vouches for is served


def test_a_client_cancelling_a_tool_call_over_stateless_http_cancels_the_call(
    runtime: Runtime,
) -> None:
    """Over stateless streamable HTTP a client's notifications/cancelled has no session to
    reach the call by; the request it abandons is closed, and that cancels the call (the
    2026-07-28 protocol's tool calls, which the fast path serves), as it does on stdio."""
    import asyncio

    import anyio
    import httpx
    from blade_agent_specs.crm import find_v1
    from http_support import serving
    from mcp.client.streamable_http import streamable_http_client

    seen: list[str] = []

    async def slow(ctx: Any) -> Any:
        seen.append("started")
        try:
            await asyncio.sleep(20)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        seen.append("finished")
        return find_v1.FindOutput(id=1, name="late")

    runtime.register(find_v1.SPEC, slow, name="slow_find")

    async def cancel_after_a_second(url: str) -> None:
        async with (
            httpx.AsyncClient(timeout=30) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            with anyio.move_on_after(1):
                await client.call_tool("slow_find", {"customer_id": 1})
            for _ in range(100):  # the server sees the closed request and cancels
                if "cancelled" in seen:
                    break
                await anyio.sleep(0.05)

    with serving(mcp_asgi_app(runtime, principal=ANN), lifespan="on") as server:
        run(cancel_after_a_second(f"{server.url}/mcp"))
    assert seen == ["started", "cancelled"]
    assert all(c.state != "running" for c in runtime.store.calls())  # nothing left running


def test_an_authenticate_that_reads_the_body_still_gets_it_on_the_fast_path(
    runtime: Runtime,
) -> None:
    """The fast path's watch for a closed request reads the server's own receive, never the
    replayed body an application's authenticate may read (it took the body, and such an
    authenticate then waited for the client to go away)."""
    import anyio
    import httpx
    from mcp.client.streamable_http import streamable_http_client

    bodies: list[bytes] = []

    async def authenticate(req: Any) -> Principal | None:
        await anyio.sleep(0.01)  # a lookup first (the watch then reads before it)
        bodies.append(await req.http.body())  # e.g. a signature over the body
        return ANN

    app = mcp_asgi_app(runtime, authenticate=authenticate)
    inner = getattr(app, "app", app)

    async def main() -> Any:
        transport = httpx.ASGITransport(app=app)
        async with (
            inner.router.lifespan_context(inner),
            httpx.AsyncClient(transport=transport) as http,
            Client(streamable_http_client("http://127.0.0.1:8000/mcp", http_client=http)) as c,
        ):
            with anyio.fail_after(10):
                return await c.call_tool("find", {"customer_id": 4})

    result = run(main())
    assert result.structured_content == {"id": 4, "name": "customer 4"}
    assert any(b'"tools/call"' in body for body in bodies)


def test_http_fast_path_answers_as_the_sdk_does(runtime: Runtime) -> None:
    import httpx
    from mcp.client.streamable_http import streamable_http_client

    from blade_runtime.serving.mcp import FastPath

    async def exchange(fast: bool) -> list[dict[str, Any]]:
        app = mcp_asgi_app(runtime, principal=ANN, fast_path=fast)
        assert isinstance(app, FastPath) is fast
        inner = app.app if isinstance(app, FastPath) else app
        bodies: list[dict[str, Any]] = []

        async def keep(response: httpx.Response) -> None:
            await response.aread()
            if response.request.method == "POST" and b'"tools/call"' in response.request.content:
                bodies.append(json.loads(response.content))

        transport = httpx.ASGITransport(app=app)
        async with (
            inner.router.lifespan_context(inner),
            httpx.AsyncClient(transport=transport, event_hooks={"response": [keep]}) as http,
        ):
            url = "http://127.0.0.1:8000/mcp"
            elicit = answers(
                {"approved": True, "approver": "X"}, {"approved": True, "approver": "a"}
            )
            async with Client(
                streamable_http_client(url, http_client=http), elicitation_callback=elicit
            ) as c:
                await c.call_tool("find", {"customer_id": 4})
                await c.call_tool("find", {"customer_id": "4"})
                await c.call_tool("transfer", SEND)
        if isinstance(app, FastPath):
            assert app.served == 5  # every tools/call took the fast path
        return bodies

    fast, sdk = run(exchange(True)), run(exchange(False))
    assert len(fast) == len(sdk) == 5  # find, find, transfer: asked, asked again, done

    def shape(body: dict[str, Any]) -> Any:
        result = body["result"]
        state = result.pop("requestState", None)
        assert state is None or state.startswith("blade2.")
        return {
            **body,
            "id": None,
            "result": json.loads(re.sub(r"act_[0-9a-f]+", "act", json.dumps(result))),
        }

    assert [shape(b) for b in fast] == [shape(b) for b in sdk]
    assert fast[0]["result"]["structuredContent"] == {"id": 4, "name": "customer 4"}
    assert fast[2]["result"]["resultType"] == "input_required"


def test_a_body_the_fast_path_cannot_parse_gets_the_sdks_own_answer(runtime: Runtime) -> None:
    """The fast path parses bodies with pydantic-core, which refuses what json.loads reads
    (a UTF-8 byte-order mark, a lone surrogate's escape): such a tools/call goes to the SDK's
    app, whose answer it gets, as with the fast path off."""
    import httpx

    from blade_runtime.serving.mcp import FastPath

    meta = (
        b'"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
        b'"io.modelcontextprotocol/clientCapabilities":{}}'
    )
    body = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"find",' + (
        b'"arguments":{"customer_id":4},' + meta + b"}}"
    )
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "find",
    }

    async def post(fast: bool, content: bytes) -> tuple[int, Any, int]:
        app = mcp_asgi_app(runtime, principal=ANN, fast_path=fast)
        inner = app.app if isinstance(app, FastPath) else app
        async with (
            inner.router.lifespan_context(inner),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http,
        ):
            response = await http.post(
                "http://127.0.0.1:8000/mcp", content=content, headers=headers
            )
        served = app.served if isinstance(app, FastPath) else 0
        return response.status_code, response.json(), served

    status, answer, served = run(post(True, body))
    assert (status, served) == (200, 1)  # the fast path answers the plain body
    assert answer["result"]["structuredContent"] == {"id": 4, "name": "customer 4"}
    marked = b"\xef\xbb\xbf" + body
    status, answer, served = run(post(True, marked))
    assert served == 0  # the SDK's app answered it
    assert (status, answer, 0) == run(post(False, marked))


_MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}
_CALL_HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2026-07-28",
    "mcp-method": "tools/call",
}


def _tools_call(name: str, arguments: Any, **params: Any) -> bytes:
    body = {"name": name, "arguments": arguments, "_meta": _MODERN_META, **params}
    return json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": body}).encode()


async def _both(
    make: Callable[[bool], Any], name: str, content: bytes | Callable[[], Any]
) -> list[tuple[int, Any]]:
    """The answer (status, JSON or text) of the fast path, then of the SDK's app, to one
    tools/call post."""
    import httpx

    from blade_runtime.serving.mcp import FastPath

    answers = []
    for fast in (True, False):
        app = make(fast)
        inner = app.app if isinstance(app, FastPath) else app
        async with (
            inner.router.lifespan_context(inner),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http,
        ):
            response = await http.post(
                "http://127.0.0.1:8000/mcp",
                content=content if isinstance(content, bytes) else content(),
                headers={**_CALL_HEADERS, "mcp-name": name},
            )
        json_body = response.headers.get("content-type", "").startswith("application/json")
        answers.append((response.status_code, response.json() if json_body else response.text))
    return answers


@pytest.mark.parametrize(
    "params",
    [
        {"_meta": {**_MODERN_META, "io.modelcontextprotocol/clientInfo": 5}},
        {"_meta": {**_MODERN_META, "io.modelcontextprotocol/clientCapabilities": []}},
        {"_meta": {**_MODERN_META, "io.modelcontextprotocol/logLevel": "bogus"}},
        {"request_state": "blade1.garbage"},  # a field's Python name is no wire name
    ],
    ids=["client-info", "capabilities", "log-level", "request_state"],
)
def test_the_fast_path_checks_a_request_as_the_sdk_does(
    runtime: Runtime, params: dict[str, Any]
) -> None:
    """Found by sending both apps a thousand variants of tools/call: what the SDK's parse of
    the request for its version refuses (or ignores), the fast path refuses (or ignores)."""
    body = json.loads(_tools_call("find", {"customer_id": 4}))
    body["params"].update(params)

    def make(fast: bool) -> Any:
        return mcp_asgi_app(runtime, principal=ANN, fast_path=fast)

    fast, sdk = run(_both(make, "find", json.dumps(body).encode()))
    assert fast == sdk


def test_the_fast_path_answers_an_error_with_the_sdks_http_status(runtime: Runtime) -> None:
    def make(fast: bool) -> Any:
        return mcp_asgi_app(runtime, authenticate=lambda req: None, fast_path=fast)

    fast, sdk = run(_both(make, "find", _tools_call("find", {"customer_id": 4})))
    assert fast == sdk
    assert fast[0] == 400 and fast[1]["error"]["message"] == "Authentication required."


def test_a_chunked_body_over_the_limit_is_the_sdks_413_and_calls_nothing(
    runtime: Runtime,
) -> None:
    """A chunked body has no length to refuse it by: read past the limit, it goes whole to
    the SDK's app, which refuses it (it had been handed only the rest of the stream)."""
    from blade_runtime.serving.mcp import MAX_BODY_BYTES

    padding = b" " * (MAX_BODY_BYTES + 1)

    async def chunks() -> Any:
        yield padding
        yield _tools_call("transfer", SEND)

    def make(fast: bool) -> Any:
        return mcp_asgi_app(runtime, principal=ANN, fast_path=fast)

    fast, sdk = run(_both(make, "transfer", chunks))
    assert fast == sdk and fast[0] == 413
    assert run(runtime.records.calls()) == []


def test_text_without_a_utf8_form_is_served_as_json_escapes(built: Path) -> None:
    """A projection's lone surrogate (no UTF-8 form) goes as a JSON escape, as the SDK sends it,
    not as a failed response."""
    from blade_agent_specs.crm import find_v1

    projecting = Runtime()
    projecting.register(
        find_v1.SPEC, agent_tools.find_secret, name="find", project=lambda out: "lone \ud800"
    )

    def make(fast: bool) -> Any:
        return mcp_asgi_app(projecting, principal=ANN, fast_path=fast)

    fast, sdk = run(_both(make, "find", _tools_call("find", {"customer_id": 4})))
    assert fast == sdk
    assert fast[1]["result"]["content"][0]["text"] == "lone \ud800"


async def _projected_calls(client: Client) -> tuple[dict[str, types.Tool], dict[str, Any]]:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    results = {}
    for name in ("find_json", "find_line", "find_blocks", "find_whole"):
        results[name] = await client.call_tool(name, {"customer_id": 2})
    return tools, results


def _check_projected(tools: dict[str, types.Tool], results: dict[str, Any]) -> None:
    """What the client gets is the projection (issue 29.2): the field it removes reaches the
    client in no content and no structured content, and a projecting tool announces no output
    schema (the projection need not have the output's shape)."""
    for name in ("find_json", "find_line", "find_blocks"):
        result = results[name]
        assert not result.is_error, result
        assert agent_tools.SECRET not in result.model_dump_json(), (name, result)
        assert tools[name].output_schema is None, name
    assert results["find_json"].structured_content == {"id": 2}
    assert structured(results["find_json"]) == {"id": 2}
    line = results["find_line"]
    assert line.structured_content is None
    assert [c.model_dump(exclude_none=True) for c in line.content] == [
        {"type": "text", "text": "Customer #2."}
    ]
    blocks = results["find_blocks"]
    assert blocks.structured_content is None
    assert [c.type for c in blocks.content] == ["text", "resource_link"]
    assert isinstance(blocks.content[1], types.ResourceLink)
    assert blocks.content[1].uri == "crm://c/2"
    # without a projection the whole output is what the model reads, announced with its schema
    whole = {"id": 2, "name": f"{agent_tools.SECRET} 2"}
    assert results["find_whole"].structured_content == whole
    assert tools["find_whole"].output_schema == agent_tools.LOOKUP["outputSchema"]


def test_a_projection_is_all_an_mcp_client_gets_in_memory(built: Path) -> None:
    runtime = agent_tools.make_projecting_runtime()

    async def main() -> tuple[dict[str, types.Tool], dict[str, Any]]:
        async with Client(mcp_server(runtime)) as client:
            return await _projected_calls(client)

    _check_projected(*run(main()))


def test_a_projection_is_all_an_mcp_client_gets_over_stdio(built: Path, tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=str(BIN / "blade-runtime"),
        args=["mcp", "agent_tools:make_projecting_runtime", "--store", str(tmp_path / "p.db")],
        env=_env(built, tmp_path / "effects"),
    )

    async def main() -> tuple[dict[str, types.Tool], dict[str, Any]]:
        async with Client(params) as client:
            return await _projected_calls(client)

    _check_projected(*run(main()))


def test_a_projection_is_all_an_mcp_client_gets_over_streamable_http(
    built: Path, tmp_path: Path
) -> None:
    async def main(url: str) -> tuple[dict[str, types.Tool], dict[str, Any]]:
        async with Client(url) as client:
            return await _projected_calls(client)

    db = tmp_path / "p.db"
    with http_worker(built, db, tmp_path / "effects", "agent_tools:make_projecting_runtime") as url:
        _check_projected(*run(main(url)))


def test_mounted_at_mcp_in_the_http_app_behind_its_authentication(runtime: Runtime) -> None:
    import httpx
    from mcp.client.streamable_http import streamable_http_client
    from starlette.requests import Request

    from blade_runtime.serving.http import create_app

    def authenticate(request: Request) -> Principal | None:
        return ANN if request.headers.get("authorization") == "Bearer ann" else None

    app = create_app(runtime, authenticate=authenticate, mcp=True, allowed_hosts=["tools.example"])
    seen: list[Any] = []

    async def main() -> tuple[int, types.CallToolResult]:
        async def at_the_inbox(ctx: Any, params: Any) -> types.ElicitResult:
            seen.append(params)
            return types.ElicitResult(action="accept")

        transport = httpx.ASGITransport(app=app)
        base = "http://tools.example:8000"
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=transport) as anonymous:
                refused = await anonymous.post(f"{base}/mcp", json={})
            http = httpx.AsyncClient(transport=transport, headers={"authorization": "Bearer ann"})
            async with (
                http,
                Client(
                    streamable_http_client(f"{base}/mcp", http_client=http),
                    elicitation_callback=at_the_inbox,
                ) as client,
            ):
                names = [t.name for t in (await client.list_tools()).tools]
                assert names == ["find", "plan", "transfer"]
                waiting = await client.call_tool("plan", {"goal": "ship"})
        return refused.status_code, waiting

    status, waiting = run(main())
    assert status == 401
    (action,) = runtime.pending(principal=ANN)  # recorded for the authenticated principal
    assert seen[0].url == f"http://tools.example:8000/inbox#action={action.action_id}"
    assert structured(waiting)["action_id"] == action.action_id  # the user has not answered yet


def test_tools_list_is_the_callers_own(runtime: Runtime) -> None:
    from blade_agent_specs.crm import find_v1

    from blade_runtime.core.context import CallInfo

    def acme_only(call: CallInfo) -> bool:
        principal = None if call.context is None else call.context.principal
        return principal is not None and principal.tenant == "acme"

    def described(context: CallContext | None) -> str:
        principal = None if context is None else context.principal
        return f"Find a customer of {principal.tenant if principal else 'nobody'}."

    runtime.register(
        find_v1.SPEC, agent_tools.find, name="find_acme", enabled=acme_only, describe=described
    )

    async def listed(who: Principal) -> tuple[dict[str, str | None], types.CallToolResult]:
        async with Client(mcp_server(runtime, principal=who)) as client:
            tools = {t.name: t.description for t in (await client.list_tools()).tools}
            return tools, await client.call_tool("find_acme", {"customer_id": 1})

    (acme, called), (other, refused) = run(listed(ANN)), run(listed(Principal("bo", "other")))
    assert acme["find_acme"] == "Find a customer of acme."
    assert "find_acme" not in other and "find" in other
    assert called.structured_content == {"id": 1, "name": "customer 1"}
    assert refused.is_error  # not there for this caller: the runtime refuses the call too


def test_mcp_over_http_says_where_it_listens_and_a_busy_port_is_one_line(
    built: Path, tmp_path: Path
) -> None:
    """Issue 31.5: ``blade-runtime mcp --http`` printed nothing. It says its URL (with the
    /mcp path) and whether anonymous access is on, once listening; a busy port is one line,
    exit code 4."""
    from blade_runtime.serving.serve import EXIT_BIND

    env = _env(built, tmp_path / "effects")
    command = [str(BIN / "blade-runtime"), "mcp", "agent_tools:make_runtime"]
    for extra, access in (([], "anonymous access on"), (["--principal", "ann@acme"], "ann@acme")):
        port = _free_port()
        process = subprocess.Popen(
            [*command, "--http", f"127.0.0.1:{port}", *extra],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stderr is not None
            said = process.stderr.readline()
            assert f"on http://127.0.0.1:{port}/mcp" in said and access in said, said

            async def main(url: str) -> list[str]:
                async with Client(url) as client:
                    return [tool.name for tool in (await client.list_tools()).tools]

            assert run(main(f"http://127.0.0.1:{port}/mcp")) == ["find", "plan", "transfer"]
        finally:
            process.terminate()
            process.wait(timeout=10)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = subprocess.run(
            [*command, "--http", f"127.0.0.1:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert busy.returncode == EXIT_BIND, busy.stderr
    assert busy.stderr.strip().splitlines() == [
        f"error: cannot listen on http://127.0.0.1:{port}: Address already in use"
    ]


def test_progress_reaches_a_client_that_sent_a_progress_token(built: Path) -> None:
    from blade_agent_specs.crm import find_v1

    async def slow_find(ctx: Any) -> Any:
        for step in (1, 2):
            ctx.progress(f"looking {step}", completed=step, total=2)
        ctx.message("found")
        return find_v1.FindOutput(id=ctx.input.customer_id, name="Ann")

    runtime = Runtime()
    runtime.register(find_v1.SPEC, slow_find)
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def main() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with Client(mcp_server(runtime)) as client:
            watched = await client.call_tool("find", {"customer_id": 7}, progress_callback=progress)
            unwatched = await client.call_tool("find", {"customer_id": 8})
            return watched, unwatched

    watched, unwatched = run(main())
    assert not watched.is_error and not unwatched.is_error
    assert seen == [(1.0, 2.0, "looking 1"), (2.0, 2.0, "looking 2"), (2.0, 2.0, "found")]


def test_progress_over_mcp_never_goes_back(built: Path) -> None:
    """A message, a progress without ``completed`` and a smaller ``completed`` each go with the
    largest value sent so far: MCP wants a request's progress to increase."""
    from blade_agent_specs.crm import find_v1

    async def find(ctx: Any) -> Any:
        ctx.message("starting")
        ctx.progress("built", completed=50, total=100)
        ctx.message("canary healthy")
        ctx.progress("waiting")
        ctx.progress("retrying", completed=10, total=100)
        ctx.progress("rolled out", completed=100, total=100)
        return find_v1.FindOutput(id=ctx.input.customer_id, name="Ann")

    runtime = Runtime()
    runtime.register(find_v1.SPEC, find)
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def main() -> types.CallToolResult:
        async with Client(mcp_server(runtime)) as client:
            return await client.call_tool("find", {"customer_id": 7}, progress_callback=progress)

    assert not run(main()).is_error
    assert seen == [
        (0.0, None, "starting"),
        (50.0, 100.0, "built"),
        (50.0, 100.0, "canary healthy"),
        (50.0, 100.0, "waiting"),
        (50.0, 100.0, "retrying"),
        (100.0, 100.0, "rolled out"),
    ]


def test_a_child_calls_progress_reaches_the_client_of_its_parent_call(tmp_path: Path) -> None:
    """The child's progress and messages are sent as the parent's are, with the request's last
    value: the child counts its own work, and MCP's progress never goes back."""
    import files_tools

    files_tools.build(tmp_path)
    runtime = Runtime()
    files_tools.register(runtime)
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def main() -> types.CallToolResult:
        async with Client(mcp_server(runtime)) as client:
            batch = {"job": "j", "steps": 2}
            return await client.call_tool("notify_batch", batch, progress_callback=progress)

    assert not run(main()).is_error
    assert seen == [
        (1.0, 2.0, "batch"),
        (1.0, 2.0, "step 1"),
        (1.0, 2.0, "step 2"),
        (1.0, 2.0, '{"note": "almost there"}'),
    ]


def test_a_listing_follows_another_tool_registered_under_a_listed_name(built: Path) -> None:
    """As many tools, the same names: the listing and the input schema the SDK checks headers
    with follow the tool registered now."""
    from blade_agent_specs.bank import transfer_v1

    runtime = agent_tools.make_runtime()
    tools = McpTools(runtime)
    assert tools.input_schema("find") == agent_tools.LOOKUP["inputSchema"]
    runtime.unregister("find")
    runtime.register(transfer_v1.SPEC, agent_tools.transfer, name="find")
    listed = {tool.name: tool for tool in tools.listing().result.tools}
    assert listed["find"].input_schema == agent_tools.TRANSFER["inputSchema"]
    assert tools.input_schema("find") == agent_tools.TRANSFER["inputSchema"]


def test_a_listing_follows_a_replaced_registration_under_the_same_name(built: Path) -> None:
    """tools/list is cached while the registrations stay as they are; replacing one under the
    same name with a projection withdraws its output schema, and the call is projected."""
    from blade_agent_specs.crm import find_v1

    runtime = Runtime()
    runtime.register(find_v1.SPEC, agent_tools.find_secret, name="find")

    async def main() -> tuple[types.Tool, types.Tool, types.CallToolResult]:
        async with Client(mcp_server(runtime)) as client:
            (before,) = (await client.list_tools()).tools
            runtime.replace(
                find_v1.SPEC, agent_tools.find_secret, name="find", project=lambda o: {"id": o.id}
            )
            (after,) = (await client.list_tools()).tools
            return before, after, await client.call_tool("find", {"customer_id": 3})

    before, after, result = run(main())
    assert before.output_schema == agent_tools.LOOKUP["outputSchema"]
    assert after.output_schema is None
    assert result.structured_content == {"id": 3}
    assert agent_tools.SECRET not in result.model_dump_json()


def _events(status: int, body: Any) -> Any:
    """An SSE body as the JSON of its events (ids and pings aside); JSON as it is."""
    if not isinstance(body, str):
        return status, body
    events = [json.loads(row[5:]) for row in body.splitlines() if row.startswith("data:")]
    return status, events


@pytest.mark.parametrize(
    ("name", "arguments", "params", "headers"),
    [
        ("charge", {"cents": 1, "note": "x"}, {}, {}),  # its Mcp-Param header missing
        ("charge", {"cents": 1, "note": "x"}, {}, {"mcp-param-note": "y"}),  # not the value
        ("charge", {"cents": 1, "note": "x"}, {}, {"mcp-param-note": "x"}),
        ("charge", {"cents": 2, "steps": 2}, {"_meta": {**_MODERN_META, "progressToken": 5}}, {}),
        ("charge", {"cents": "2"}, {}, {}),
        ("nope", {}, {}, {}),
    ],
    ids=["param-missing", "param-wrong", "param-given", "progress", "invalid", "unknown"],
)
def test_the_fast_path_and_the_sdks_path_answer_alike(
    built: Path, name: str, arguments: Any, params: dict[str, Any], headers: dict[str, str]
) -> None:
    """Issue 50.1: the fast path gives way where it has no channel or check of its own (a
    progress token: the notifications stream as SSE; a tool whose schema declares Mcp-Param
    headers: SEP-2243's check), and answers alike elsewhere."""
    import httpx

    from blade_runtime.serving.mcp import FastPath

    answers = []
    for fast in (True, False):
        runtime = agent_tools.make_service_runtime()
        app = mcp_asgi_app(runtime, principal=ANN, fast_path=fast)
        inner = app.app if isinstance(app, FastPath) else app

        async def post(app: Any = app, inner: Any = inner) -> httpx.Response:
            async with (
                inner.router.lifespan_context(inner),
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client,
            ):
                return await client.post(
                    "http://127.0.0.1:8000/mcp",
                    content=_tools_call(name, arguments, **params),
                    headers={**_CALL_HEADERS, "mcp-name": name, **headers},
                )

        response = run(post())
        sse = response.headers.get("content-type", "").startswith("text/event-stream")
        body = response.text if sse else response.json()
        answers.append(_events(response.status_code, body))
    fast, sdk = answers
    assert fast == sdk
    if params:  # the progress reached the client, then the result
        _, events = fast
        assert [e.get("method") for e in events] == ["notifications/progress"] * 3 + [None]


def test_audio_and_embedded_resources_reach_the_client(built: Path) -> None:
    from blade_agent_specs.crm import find_v1

    from blade_runtime.core.content import Audio, EmbeddedResource, Text

    runtime = Runtime()
    runtime.register(
        find_v1.SPEC,
        agent_tools.find,
        project=lambda out: [
            Text("found"),
            Audio("UklGRg==", "audio/wav"),
            EmbeddedResource(f"crm://c/{out.id}", "text/plain", text=out.name),
            EmbeddedResource("crm://raw", "application/octet-stream", blob="AAE="),
        ],
    )

    async def main() -> types.CallToolResult:
        async with Client(mcp_server(runtime)) as client:
            return await client.call_tool("find", {"customer_id": 2})

    result = run(main())
    text, audio, resource, raw = result.content
    assert isinstance(text, types.TextContent) and text.text == "found"
    assert isinstance(audio, types.AudioContent)
    assert (audio.data, audio.mime_type) == ("UklGRg==", "audio/wav")
    assert isinstance(resource, types.EmbeddedResource)
    assert isinstance(resource.resource, types.TextResourceContents)
    assert (str(resource.resource.uri), resource.resource.text) == ("crm://c/2", "customer 2")
    assert isinstance(raw.resource, types.BlobResourceContents) and raw.resource.blob == "AAE="


@pytest.mark.parametrize(
    ("mode", "level", "meta", "expected"),
    [
        ("legacy", None, {}, ["charged"]),  # the older versions: a server may send every level
        ("legacy", "warning", {}, []),  # turned down by logging/setLevel
        (None, None, {"io.modelcontextprotocol/logLevel": "info"}, ["charged"]),
        (None, None, {}, []),  # 2026-07-28: only where the request asks for them
    ],
    ids=["legacy", "legacy-set-level", "modern-asked", "modern-not-asked"],
)
def test_a_tools_messages_are_log_notifications_where_the_client_takes_them(
    built: Path, tmp_path: Path, mode: str | None, level: str | None, meta: Any, expected: Any
) -> None:
    """Issue 50.2: ``ctx.message`` is the tool's log message (``notifications/message``,
    level info, the tool's name as the logger), over stdio."""
    params = StdioServerParameters(
        command=str(BIN / "blade-runtime"),
        args=["mcp", "agent_tools:make_service_runtime", "--store", str(tmp_path / "l.db")],
        env=_env(built, tmp_path / "effects"),
    )
    logged: list[Any] = []

    async def on_log(params: Any) -> None:
        logged.append(params)

    async def main() -> types.CallToolResult:
        options: dict[str, Any] = {} if mode is None else {"mode": mode}
        async with Client(params, logging_callback=on_log, **options) as client:
            if level is not None:
                await client.set_logging_level(level)  # type: ignore[arg-type]
            return await client.call_tool("charge", {"cents": 1, "steps": 1}, meta=meta or None)

    assert run(main()).structured_content == {"charged": 1}
    assert [entry.data for entry in logged] == expected
    assert all(entry.level == "info" and entry.logger == "charge" for entry in logged)


def test_an_elicitation_without_a_prompt_shows_the_fields_as_words() -> None:
    from types import SimpleNamespace

    from blade_runtime.serving.mcp import _message

    def action(payload: Any) -> Any:
        return SimpleNamespace(name="deploy", point="approve", payload=payload)

    assert _message(action({"question": "Ship it?", "x": 1}), None) == "Ship it?"
    assert _message(action({"service": "api", "regions": ["eu", "us"], "n": 2}), None) == (
        "deploy.approve asks for your answer.\nservice: api\nregions: eu, us\nn: 2"
    )
    assert _message(action({"service": "api"}), "too late").endswith(
        "\n\nThe last answer was refused: too late"
    )
