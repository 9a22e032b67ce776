"""The MCP bridge against a real MCP server (``tests/mcp_remote_server.py``, the MCP SDK's own
server) in its own process, over stdio and streamable HTTP on 127.0.0.1, driven through the
public API: a runtime, ``connect_mcp``, ``runtime.call``, subscriptions and records."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blade_runtime import (
    CallContext,
    ErrorCode,
    Principal,
    Runtime,
    SourcePolicy,
    ToolError,
    ToolPending,
    ToolSuccess,
)
from blade_runtime.core.permissions import Deny, PermissionRequest
from blade_runtime.remote import McpBridge, McpServer, ServerUnavailable, connect_mcp
from blade_runtime.stores.sqlite import SQLiteStore

SERVER = Path(__file__).resolve().parents[2] / "mcp_remote_server.py"
SECRET = "Bearer s3cr3t-token-never-logged"


def stdio_server(marks: Path | None = None, variant: str = "", **options: Any) -> McpServer:
    env = {"FIXTURE_MARKS": str(marks or ""), "FIXTURE_VARIANT": variant}
    return McpServer.stdio("fx", sys.executable, [str(SERVER), "stdio"], env=env, **options)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def http_server(marks: Path | None = None, variant: str = "") -> Iterator[str]:
    """The fixture server over streamable HTTP on 127.0.0.1; its URL."""
    port = free_port()
    env = dict(os.environ, FIXTURE_MARKS=str(marks or ""), FIXTURE_VARIANT=variant)
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert process.poll() is None, "the fixture HTTP server exited"
            assert time.monotonic() < deadline, "the fixture HTTP server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def blocks(result: Any) -> list[dict[str, Any]]:
    """The content blocks a successful call's model reads."""
    assert isinstance(result, ToolSuccess), result
    assert isinstance(result.content, list)
    return [block for block in result.content if isinstance(block, dict)]


def first_text(result: Any) -> str:
    text: str = blocks(result)[0]["text"]
    return text


def marks_of(path: Path) -> list[str]:
    return path.read_text("utf-8").splitlines() if path.exists() else []


async def wait_for(condition: Any, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


def names(runtime: Runtime, context: CallContext | None = None) -> set[str]:
    document: Any = runtime.export(context=context).document
    return {tool["name"] for tool in document["tools"]}


# -- dynamic binding, over both transports ----------------------------------------------------


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_dynamic_binding_maps_every_kind_of_answer(
    transport: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's tools become tools at connect (prefix, filter); structured output is the
    typed output, text/image/resource-link blocks are what the model reads; isError is a
    failure the model reads; invalid input never reaches the server; a 10 MB text is a clear
    failure; the HTTP headers never reach the log."""
    marks = tmp_path / "marks"
    caplog.set_level(logging.DEBUG)

    async def scenario(server: McpServer) -> None:
        runtime = Runtime()
        bridge = await connect_mcp(
            runtime, server, prefix="fx_", include=lambda tool: tool.name != "pid"
        )
        try:
            listed = names(runtime)
            assert {"fx_forecast", "fx_echo", "fx_picture", "fx_append"} <= listed
            assert "fx_pid" not in listed and "forecast" not in listed

            weather = await runtime.call("fx_forecast", {"city": "Oslo"})
            assert isinstance(weather, ToolSuccess)
            assert weather.output == {"city": "Oslo", "celsius": 21.5, "summary": "sunny"}

            echoed = await runtime.call("fx_echo", {"text": "héllo"})
            assert isinstance(echoed, ToolSuccess)
            assert echoed.content == [{"type": "text", "text": "héllo"}]

            picture = blocks(await runtime.call("fx_picture", {}))
            assert [block["type"] for block in picture] == ["image", "resource_link", "text"]
            assert picture[0]["mimeType"] == "image/png" and picture[0]["data"]
            assert picture[1]["uri"] == "file:///reports/q3.pdf"

            failed = await runtime.call("fx_broken", {})
            assert isinstance(failed, ToolError) and failed.code == ErrorCode.TOOL_FAILED
            assert "broken" in failed.message

            invalid = await runtime.call("fx_append", {"line": 7})
            assert isinstance(invalid, ToolError) and invalid.code == ErrorCode.INVALID_INPUT
            assert not any("append" in line for line in marks_of(marks))  # never sent

            huge = await runtime.call("fx_huge", {})
            assert isinstance(huge, ToolError) and huge.code == ErrorCode.INVALID_OUTPUT
            assert len(huge.message) < 300

            again = await runtime.call("fx_echo", {"text": "still fine"})  # nothing crashed
            assert isinstance(again, ToolSuccess)
        finally:
            await bridge.close()
            await runtime.close()

    if transport == "stdio":
        asyncio.run(scenario(stdio_server(marks)))
        deadline = time.monotonic() + 10  # its stderr (the failing tool's traceback), logged
        while not any("stderr" in record.getMessage() for record in caplog.records):
            assert time.monotonic() < deadline, "the server's stderr never reached the log"
            time.sleep(0.05)
    else:
        with http_server(marks) as url:
            asyncio.run(scenario(McpServer.http("fx", url, headers={"Authorization": SECRET})))
    assert "s3cr3t" not in caplog.text
    assert any("connected" in record.getMessage() for record in caplog.records)


def test_the_tool_list_follows_list_changed(tmp_path: Path) -> None:
    """A tool the server adds (and announces with notifications/tools/list_changed) is
    registered under the prefix; the filter applies to it too."""

    async def scenario() -> None:
        runtime = Runtime()
        bridge = await connect_mcp(
            runtime, stdio_server(), prefix="fx_", include=lambda tool: tool.name != "hidden"
        )
        try:
            assert "fx_extra" not in names(runtime)
            grown = await runtime.call("fx_grow", {"name": "extra"})
            assert isinstance(grown, ToolSuccess)
            await runtime.call("fx_grow", {"name": "hidden"})
            await wait_for(lambda: "fx_extra" in names(runtime))
            assert "fx_hidden" not in names(runtime)
            extra = await runtime.call("fx_extra", {})
            assert isinstance(extra, ToolSuccess)
            assert extra.output == {"result": "I am extra"}
        finally:
            await bridge.close()

    asyncio.run(scenario())


def test_progress_reaches_a_subscriber_and_cancellation_reaches_the_server(
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"

    async def scenario() -> tuple[list[Any], ToolError]:
        runtime = Runtime()
        bridge = await connect_mcp(runtime, stdio_server(marks))
        try:
            subscription = runtime.subscribe("r-progress", after=0)
            done = await runtime.call("slow", {"n": 3}, run_id="r-progress")
            assert isinstance(done, ToolSuccess)
            seen: list[Any] = []
            iterator = subscription.__aiter__()
            while not any(event.kind == "result" for event in seen):
                seen.append(await asyncio.wait_for(iterator.__anext__(), 20))
            subscription.drop()

            call = asyncio.ensure_future(
                runtime.call("slow", {"n": 1000}, call_id="c-slow", run_id="r-cancel")
            )
            await wait_for(lambda: marks_of(marks).count("start slow") == 2)
            assert runtime.cancel_call("c-slow", "the user changed their mind")
            cancelled = await call
            assert isinstance(cancelled, ToolError)
            await wait_for(lambda: "cancelled slow" in marks_of(marks))
            return seen, cancelled
        finally:
            await bridge.close()

    seen, cancelled = asyncio.run(scenario())
    progress: list[Any] = [event.payload for event in seen if event.kind == "progress"]
    assert [p["completed"] for p in progress] == [1, 2, 3]
    assert progress[0]["total"] == 3 and progress[0]["message"] == "step 1"
    logged: list[Any] = [event.payload for event in seen if event.kind == "message"]
    assert {"level": "info", "data": "counted 2"} in logged  # the server's log, the call's
    assert cancelled.code == ErrorCode.CANCELLED
    assert "done slow" not in marks_of(marks)[-1:]


# -- connections ------------------------------------------------------------------------------


def test_a_killed_server_is_restarted_and_calls_in_flight_fail_with_a_code(
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"

    async def scenario() -> None:
        runtime = Runtime()
        bridge = await connect_mcp(runtime, stdio_server(marks, backoff_s=0.05))
        try:
            pid = int(first_text(await runtime.call("pid", {})))
            in_flight = asyncio.ensure_future(runtime.call("append", {"line": "a", "wait_s": 30}))
            await wait_for(lambda: "start append a" in marks_of(marks))
            os.kill(pid, signal.SIGKILL)
            lost = await asyncio.wait_for(in_flight, 30)  # a code, not a hang
            assert isinstance(lost, ToolError) and lost.code == ErrorCode.TOOL_UNAVAILABLE
            second = await runtime.call("pid", {})  # a new process, after back-off
            assert int(first_text(second)) != pid
            assert bridge.connection.connects == 2
        finally:
            await bridge.close()
        assert bridge.connection.client is None

    asyncio.run(scenario())


def test_close_stops_the_server_and_a_server_that_never_starts_is_a_clear_error(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        runtime = Runtime()
        bridge = await connect_mcp(runtime, stdio_server())
        pid = int(first_text(await runtime.call("pid", {})))
        await bridge.close()
        await wait_for(lambda: not _alive(pid), 10)
        after = await runtime.call("pid", {})
        assert isinstance(after, ToolError) and after.code == ErrorCode.TOOL_UNAVAILABLE

        missing = McpServer.stdio("nowhere", str(tmp_path / "no-such-server"), startup_timeout_s=2)
        with pytest.raises(ServerUnavailable, match=r"nowhere.*not reachable"):
            await connect_mcp(Runtime(), missing)

    asyncio.run(scenario())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    return True


# -- source and trust -------------------------------------------------------------------------


def test_a_source_policy_keeps_remote_tools_out_and_the_policy_sees_trust() -> None:
    asked: list[tuple[str, str, str]] = []

    def policy(request: PermissionRequest) -> Deny | None:
        asked.append((request.name, request.source, request.trust))
        return Deny("no remote writes") if request.trust == "remote" else None

    async def scenario() -> None:
        runtime = Runtime(sources=SourcePolicy(trust={"trusted", "workspace"}), permission=policy)
        bridge = await connect_mcp(runtime, stdio_server(), prefix="fx_")
        try:
            assert not any(name.startswith("fx_") for name in names(runtime))
            refused = await runtime.call("fx_echo", {"text": "x"})
            assert isinstance(refused, ToolError) and refused.code == ErrorCode.TOOL_NOT_ALLOWED
            assert asked == []  # refused before any policy ran

            runtime.sources = SourcePolicy(sources={"spec", "mcp:*"})
            assert "fx_echo" in names(runtime)
            denied = await runtime.call("fx_echo", {"text": "x"})
            assert isinstance(denied, ToolError) and denied.code == ErrorCode.PERMISSION_DENIED
            assert asked == [("fx_echo", "mcp:fx", "remote")]

            runtime.sources = SourcePolicy(sources={"mcp:other"})
            assert not names(runtime)
        finally:
            await bridge.close()

    asyncio.run(scenario())


def test_a_tenant_never_sees_another_tenant_s_bridged_calls(tmp_path: Path) -> None:
    ann = CallContext(Principal("ann", "acme"))
    bob = CallContext(Principal("bob", "globex"))

    async def scenario() -> None:
        runtime = Runtime(store=SQLiteStore(str(tmp_path / "calls.db")))
        bridge = await connect_mcp(runtime, stdio_server())
        try:
            mine = await runtime.call("echo", {"text": "ann's"}, call_id="c-ann", context=ann)
            theirs = await runtime.call("echo", {"text": "bob's"}, call_id="c-bob", context=bob)
            assert isinstance(mine, ToolSuccess) and isinstance(theirs, ToolSuccess)
            assert ann.principal is not None and bob.principal is not None
            seen = await runtime.records.calls(principal=ann.principal)
            assert [record.call_id for record in seen] == ["c-ann"]
            assert await runtime.records.call("c-bob", principal=ann.principal) is None
            bobs = await runtime.records.calls(principal=bob.principal)
            assert [record.call_id for record in bobs] == ["c-bob"]
        finally:
            await bridge.close()
            await runtime.close()
            runtime.store.close()

    asyncio.run(scenario())


def test_bridge_options_are_checked() -> None:
    with pytest.raises(ValueError, match="a command or a url"):
        McpServer("x")
    with pytest.raises(ValueError, match="a command or a url"):
        McpServer("x", command="a", url="http://b")
    server = McpServer.http("x", "https://user:pw@example.com:8443/mcp?key=1", headers={"A": "b"})
    assert server.where == "https://example.com:8443/mcp"
    assert "pw" not in repr(server) and "'b'" not in repr(server)
    assert isinstance(McpBridge(Runtime(), server), McpBridge)


# -- typed binding and drift ------------------------------------------------------------------


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The fixture server's tools imported as a user would (its tools/list through the MCP
    SDK's client, ``blade-codegen import --from mcp``) and built; the generated package."""
    import importlib

    from click.testing import CliRunner
    from mcp import Client, StdioServerParameters

    from blade_codegen.build import build
    from blade_codegen.cli import main

    root = tmp_path_factory.mktemp("imported")

    async def listing() -> Any:
        parameters = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio"])
        async with Client(parameters) as client:
            return (await client.list_tools()).model_dump(
                mode="json", by_alias=True, exclude_none=True
            )

    (root / "tools.json").write_text(json.dumps(asyncio.run(listing())), "utf-8")
    arguments = ["import", "--from", "mcp", str(root / "tools.json"), "--namespace", "fixture"]
    ran = CliRunner().invoke(main, [*arguments, "--out", str(root / "specs")])
    assert ran.exit_code == 0, ran.output
    build(root / "specs", root / "out", "bridged_fixture_tools")
    sys.path.insert(0, str(root / "out"))
    try:
        return {
            name: importlib.import_module(f"bridged_fixture_tools.fixture.{name}_v1").SPEC
            for name in ("forecast", "echo", "gone")
        }
    finally:
        sys.path.remove(str(root / "out"))


def test_typed_binding_returns_the_generated_types_and_catches_drift(
    imported: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Specs imported from the server are registered with a forwarding implementation: the
    output is the generated model. Against the server's next release, the tool whose input
    gained a required argument and the tool it dropped are unavailable (one log line each,
    naming the tool, the pointer and the change); the compatibly changed one is used."""
    forecast, echo, gone = imported["forecast"], imported["echo"], imported["gone"]
    caplog.set_level(logging.INFO, logger="blade_runtime.mcp")

    async def scenario(variant: str) -> dict[str, Any]:
        runtime = Runtime()
        bridge = await connect_mcp(
            runtime, stdio_server(variant=variant), specs=[forecast, echo, gone]
        )
        try:
            assert {"forecast", "echo", "gone"} <= names(runtime)
            found: dict[str, Any] = {"forecast": await runtime.call("forecast", {"city": "Oslo"})}
            found["echo"] = await runtime.call("echo", {"text": "typed"})
            found["gone"] = await runtime.call("gone", {})
            found["registration"] = runtime.registration_of(forecast.id)
            return found
        finally:
            await bridge.close()

    same = asyncio.run(scenario(""))
    weather = same["forecast"]
    assert isinstance(weather, ToolSuccess)
    assert isinstance(weather.output, forecast.output_type)
    assert weather.output.city == "Oslo" and weather.output.celsius == 21.5
    assert isinstance(same["gone"], ToolSuccess)
    assert same["registration"].source == "mcp:fx" and same["registration"].trust == "remote"
    assert same["registration"].spec.side_effect == "non_idempotent"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

    caplog.clear()
    changed = asyncio.run(scenario("changed"))
    for tool in ("forecast", "gone"):
        result = changed[tool]
        assert isinstance(result, ToolError) and result.code == ErrorCode.TOOL_UNAVAILABLE
    assert isinstance(changed["echo"], ToolSuccess)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(
        "forecast" in line and "/inputSchema/properties/units" in line and "REQUIRED" in line
        for line in errors
    ), errors
    assert any("gone" in line and "dropped" in line for line in errors), errors
    assert not any("echo" in line for line in errors)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("echo" in line and "compatibly" in line for line in infos), infos


# -- durability -------------------------------------------------------------------------------


def test_kill_9_of_the_worker_mid_call_settles_interrupted_and_never_runs_twice(
    tmp_path: Path,
) -> None:
    """A bridged tool is non_idempotent (the server's hints prove nothing): when the worker
    holding the call dies, recovery on another worker settles the call INTERRUPTED instead of
    sending it to the server again."""
    store, marks = tmp_path / "calls.db", tmp_path / "marks"
    SQLiteStore(str(store)).close()
    worker = subprocess.Popen(
        [sys.executable, str(SERVER.parent / "mcp_bridge_worker.py"), str(store), str(marks)],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while "start append once" not in marks_of(marks):
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # the worker and the server it started
        worker.wait(10)

    async def recover() -> Any:
        runtime = Runtime(store=SQLiteStore(str(store)), lease_s=1.0)
        bridge = await connect_mcp(runtime, stdio_server(marks))
        try:
            deadline = time.monotonic() + 30
            while True:
                settled = [r for r in await runtime.recover() if r.call.call_id == "c-kill"]
                if settled:
                    return settled[0]
                assert time.monotonic() < deadline, "recovery never took the call up"
                await asyncio.sleep(0.3)
        finally:
            await bridge.close()
            await runtime.close()
            runtime.store.close()

    result = asyncio.run(recover())
    assert isinstance(result, ToolError) and result.code == ErrorCode.INTERRUPTED
    assert marks_of(marks).count("start append once") == 1


# -- a server's questions ---------------------------------------------------------------------


def test_a_server_s_form_is_a_pending_action_answered_on_another_worker(tmp_path: Path) -> None:
    """The server asks (elicitation/create in a 2026-07-28 input_required result): the call
    suspends with the form's schema as what an answer must meet; an answer that does not meet
    it is refused and the action stays; a valid answer on another worker (its own connection
    to the server, the same store) resumes the call there and goes back to the server, which
    acts once."""
    store, marks = tmp_path / "calls.db", tmp_path / "marks"
    SQLiteStore(str(store)).close()

    async def scenario(url: str) -> None:
        first = Runtime(store=SQLiteStore(str(store)))
        second = Runtime(store=SQLiteStore(str(store)))
        bridges = [
            await connect_mcp(runtime, McpServer.http("fx", url)) for runtime in (first, second)
        ]
        try:
            asked = await first.call("transfer", {"amount": 5}, call_id="c-transfer")
            assert isinstance(asked, ToolPending), asked
            action = await second.records.action(asked.action.action_id)
            assert action is not None and action.point == "elicitation"
            assert action.submit_schema["required"] == ["approver"]  # the server's form
            payload: Any = action.payload
            assert payload["message"] == "Approve a transfer of 5?"

            refused = await second.submit(action.action_id, {"note": "no approver"})
            assert isinstance(refused, ToolError)
            assert refused.code == ErrorCode.INVALID_SUBMISSION
            assert "transferred 5" not in marks_of(marks)

            done = await second.submit(action.action_id, {"approver": "ann"})
            assert first_text(done) == "transferred 5, approved by ann"
            assert marks_of(marks).count("transferred 5") == 1
            stored = await first.records.call("c-transfer")
            assert stored is not None and stored.state == "settled"
        finally:
            for bridge in bridges:
                await bridge.close()
            for runtime in (first, second):
                await runtime.close()
                runtime.store.close()

    with http_server(marks) as url:
        asyncio.run(scenario(url))


def test_sampling_is_refused_unless_the_application_gives_a_callback() -> None:
    import mcp_types as types

    async def model(context: Any, params: Any) -> types.CreateMessageResult:
        asked = params.messages[0].content.text
        answer = types.TextContent(type="text", text=f"short ({asked})")
        return types.CreateMessageResult(role="assistant", content=answer, model="a-model")

    async def scenario() -> tuple[Any, Any]:
        results = []
        for sampling in (None, model):
            runtime = Runtime()
            bridge = await connect_mcp(runtime, stdio_server(), sampling=sampling)
            try:
                results.append(await runtime.call("summarize", {"text": "a long text"}))
            finally:
                await bridge.close()
        return results[0], results[1]

    refused, answered = asyncio.run(scenario())
    assert isinstance(refused, ToolError) and refused.code == ErrorCode.TOOL_ERROR
    assert "sampling" in refused.message.lower()
    assert first_text(answered) == "short (Summarize: a long text)"


def test_a_bridged_tool_served_over_our_mcp_server_forwards_progress_and_observers_see_trust(
    tmp_path: Path,
) -> None:
    """A remote tool re-served by our own MCP server (a gateway): an MCP client of ours calls
    it and receives the remote server's progress; lifecycle observers see source and trust."""
    from mcp import Client

    from blade_runtime.serving.mcp import mcp_server

    seen: list[tuple[str, str, str]] = []

    class Audit:
        async def scheduled(self, event: Any) -> None:
            seen.append((event.call.name, event.source, event.trust))

    async def scenario() -> tuple[list[float], Any]:
        runtime = Runtime()
        runtime.observe(Audit())
        bridge = await connect_mcp(runtime, stdio_server(), prefix="remote_")
        reported: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reported.append(progress)

        try:
            async with Client(mcp_server(runtime)) as ours:
                listed = {tool.name for tool in (await ours.list_tools()).tools}
                assert "remote_slow" in listed
                result = await ours.call_tool(
                    "remote_slow", {"n": 3}, progress_callback=on_progress
                )
            return reported, result
        finally:
            await bridge.close()

    progress, result = asyncio.run(scenario())
    assert not result.is_error
    # each remote progress, then its log line (our server sends messages as progress too)
    assert progress == sorted(progress) and set(progress) == {1, 2, 3}
    assert seen == [("remote_slow", "mcp:fx", "remote")]


def test_a_call_past_its_timeout_settles_timeout_and_the_server_hears_of_it(
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"

    async def scenario() -> Any:
        runtime = Runtime()
        bridge = await connect_mcp(runtime, stdio_server(marks, call_timeout_s=0.5))
        try:
            late = await runtime.call("slow", {"n": 1000})
            await wait_for(lambda: "cancelled slow" in marks_of(marks))
            return late
        finally:
            await bridge.close()

    late = asyncio.run(scenario())
    assert isinstance(late, ToolError) and late.code == ErrorCode.TIMEOUT
