"""MCP on Temporal against a real dev server: ``blade-runtime serve --temporal`` (the HTTP app
with its MCP endpoint, on a real uvicorn on 127.0.0.1) and ``blade-runtime mcp --temporal`` over
stdio, each a process of its own, the tools run by worker processes. The MCP SDK's own client
lists the tools and calls them; a call that suspends is answered through MCP's input-required
flow after the worker that ran it is gone, and a worker process that never saw it resumes it;
another tenant sees and answers nothing; a cancelled request cancels the call's workflow."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from http_support import ALICE, BOB, process_env
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from temporal_mcp_tools import make_runtime
from temporal_support import DevServer, Workers, free_port
from temporalio.client import Client as TemporalClient

from blade_runtime.serving.mcp import mcp_server
from blade_runtime.temporal import TemporalTools

BIN = Path(sys.executable).parent / "blade-runtime"
SUSPENDING = {"n": 5, "suspend": True}


@pytest.fixture
def workers(
    temporal_server: DevServer, temporal_package: Path, tmp_path: Path
) -> Iterator[Workers]:
    started = Workers(
        temporal_server.address, f"q-{uuid.uuid4().hex[:8]}", tmp_path, temporal_package
    )
    try:
        yield started
    finally:
        started.kill_all()
        anyio.run(_terminate_left, started)


async def _terminate_left(workers: Workers) -> None:
    """End the workflows a test left waiting on its queue: the dev server is shared, and the
    other tests list every waiting call of it (visibility shows a new one a moment late)."""
    client = await TemporalClient.connect(workers.address)
    query = f"TaskQueue = '{workers.task_queue}' AND ExecutionStatus = 'Running'"
    deadline = time.monotonic() + 30
    while True:
        running = [w async for w in client.list_workflows(query)]
        if not running and (time.monotonic() > deadline or await _settled_twice(client, query)):
            return
        for found in running:
            handle = client.get_workflow_handle(found.id, run_id=found.run_id)
            with contextlib.suppress(Exception):  # ended meanwhile
                await handle.terminate("the test is over")
        await anyio.sleep(0.2)


async def _settled_twice(client: TemporalClient, query: str) -> bool:
    """Nothing running, still, a moment later (what visibility had not shown yet has shown)."""
    await anyio.sleep(1.0)
    return not [w async for w in client.list_workflows(query)]


def run(main: Any, *args: Any) -> Any:
    return anyio.run(main, *args)


def _env(workers: Workers) -> dict[str, str]:
    return process_env(workers.package, BLADE_ENTRIES=str(workers.entries_file))


@contextlib.contextmanager
def serving(workers: Workers, *options: str) -> Iterator[str]:
    """``blade-runtime serve --temporal`` on a free loopback port: its base URL."""
    port = free_port()
    log = workers.folder / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN), "serve", "temporal_mcp_tools:make_runtime", "--temporal",
             workers.address, "--task-queue", workers.task_queue, "--port", str(port),
             "--auth", "http_support:authenticate", *options],
            env=_env(workers), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "blade-runtime serving" not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(log.read_text())
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


async def _listing() -> list[types.Tool]:
    """What the Runtime-backed server lists for the same registrations."""
    async with Client(mcp_server(make_runtime())) as client:
        return list((await client.list_tools()).tools)


def _dumped(tools: list[types.Tool]) -> list[dict[str, Any]]:
    return [tool.model_dump(mode="json", exclude_none=True) for tool in tools]


async def _never(ctx: Any, params: Any) -> types.ElicitResult:
    raise AssertionError("this test answers the input request itself")


def _accept(payload: dict[str, Any]) -> dict[str, types.ElicitResult]:
    return {"approval": types.ElicitResult(action="accept", content=payload)}


def _listed_action(url: str, headers: dict[str, str], tool: str) -> str:
    """The one pending action of ``tool`` the principal of ``headers`` sees, once Temporal's
    visibility store has it."""
    deadline = time.monotonic() + 60
    while True:
        found = httpx.get(f"{url}/v1/actions", params={"tool": tool}, headers=headers, timeout=30)
        assert found.status_code == 200, found.text
        actions = found.json()["actions"]
        if actions or time.monotonic() > deadline:
            (action,) = actions
            return str(action["action_id"])
        time.sleep(0.1)


@pytest.mark.slow  # worker processes
def test_an_mcp_client_on_serve_temporal_has_a_suspended_call_answered_on_another_worker(
    workers: Workers,
) -> None:
    workers.spawn(1)
    first = workers.procs[0].pid
    with serving(workers) as url:
        mcp_url = f"{url}/mcp"

        async def first_leg() -> tuple[Any, ...]:
            async with (
                httpx.AsyncClient(headers=ALICE, timeout=60) as http,
                Client(streamable_http_client(mcp_url, http_client=http)) as client,
            ):
                listed = list((await client.list_tools()).tools)
                fetched = await client.call_tool("fetch", {"n": 1})
                refused = await client.call_tool("fetch", {"n": "one"})
                # a client that cannot elicit gets the pending action, its id to answer by
                waiting = await client.call_tool("fetch", {"n": 2, "suspend": True})
            async with (
                httpx.AsyncClient(headers=ALICE, timeout=60) as http,
                Client(
                    streamable_http_client(mcp_url, http_client=http),
                    elicitation_callback=_never,
                ) as client,
            ):
                leg = await client.session.call_tool("sync", SUSPENDING, allow_input_required=True)
            return listed, fetched, refused, waiting, leg

        listed, fetched, refused, waiting, leg = run(first_leg)
        assert _dumped(listed) == _dumped(run(_listing))  # as a runtime lists them
        assert not fetched.is_error
        assert fetched.structured_content == {"n": 1, "entry": "initial", "note": "ok"}
        assert refused.is_error and refused.structured_content["error"] == "INVALID_INPUT"
        ours = waiting.meta["io.blade"]
        assert ours["status"] == "pending" and waiting.is_error  # it announces an output schema
        assert json.loads(waiting.content[0].text) == {
            "pending": "fetch.approval",
            "action_id": ours["action_id"],
        }
        assert isinstance(leg, types.InputRequiredResult)
        ask = leg.input_requests["approval"]
        assert isinstance(ask, types.ElicitRequest) and ask.params.mode == "form"
        assert "sync 5?" in ask.params.message
        action_id = _listed_action(url, ALICE, "sync")

        # the worker that ran the first step is gone; another process takes the call on
        workers.kill_all()
        workers.spawn(1, hang=("charge",))
        second = workers.procs[-1].pid

        # another tenant sees nothing, and its answer under alice's request state is refused
        assert httpx.get(f"{url}/v1/actions/{action_id}", headers=BOB).status_code == 404

        async def retry(headers: dict[str, str], payload: dict[str, Any]) -> Any:
            async with (
                httpx.AsyncClient(headers=headers, timeout=60) as http,
                Client(
                    streamable_http_client(mcp_url, http_client=http),
                    elicitation_callback=_never,
                ) as client,
            ):
                return await client.session.call_tool(
                    "sync",
                    SUSPENDING,
                    input_responses=_accept(payload),
                    request_state=leg.request_state,
                    allow_input_required=True,
                )

        bobs = run(retry, BOB, {"approved": True, "note": "bob"})
        assert bobs.is_error and bobs.structured_content["error"] == "UNKNOWN_ACTION"
        invalid = run(retry, ALICE, {"approved": "yes"})
        assert isinstance(invalid, types.InputRequiredResult)  # asked again, nothing recorded
        done = run(retry, ALICE, {"approved": True, "note": "over MCP"})
        assert not done.is_error, done
        assert done.structured_content == {"n": 5, "entry": "resume", "note": "over MCP"}
        # a retry of an answered action gets what its call came to; the tool is not entered
        again = run(retry, ALICE, {"approved": False, "note": "late"})
        assert again.structured_content == done.structured_content
        entries = {(e[1], e[2]): int(e[3]) for e in workers.entries()}
        assert len(workers.entries()) == 4  # fetch 1, fetch 2, sync's first step and resume
        assert entries[("initial", "sync")] == first and entries[("resume", "sync")] == second

        # a request the client gives up on (it closes it) cancels the call's workflow
        async def abandon() -> None:
            async with (
                httpx.AsyncClient(headers=ALICE, timeout=60) as http,
                Client(streamable_http_client(mcp_url, http_client=http)) as client,
            ):
                await _cancelled_once_running(client, workers)

        run(abandon)
        assert run(_charged, workers) == {"status": "error", "code": "CANCELLED"}


async def _cancelled_once_running(client: Client, workers: Workers) -> None:
    """Call ``charge`` (it blocks on the worker) and give the request up once it runs."""
    async with anyio.create_task_group() as group:
        group.start_soon(client.call_tool, "charge", {"n": 7})
        await anyio.to_thread.run_sync(workers.wait_for_entry, "charge")
        group.cancel_scope.cancel()


async def _charged(workers: Workers) -> dict[str, Any]:
    """How the ``charge`` call settled, as its workflow returned it."""
    (call_id,) = [e[0] for e in workers.entries() if e[2] == "charge"]
    client = await TemporalClient.connect(workers.address)
    with anyio.fail_after(60):
        found = await TemporalTools(client, task_queue=workers.task_queue).result(call_id)
    return {key: found.get(key) for key in ("status", "code")}


@pytest.mark.slow  # worker processes
def test_mcp_temporal_over_stdio_lists_calls_asks_and_cancels(workers: Workers) -> None:
    """``blade-runtime mcp --temporal`` on stdio: the client's form answers (one refused by the
    resume schema, asked again) resume the call on a worker; a cancelled request (the client's
    notifications/cancelled) cancels the call's workflow."""
    workers.spawn(1, hang=("charge",))
    params = StdioServerParameters(
        command=str(BIN),
        args=[
            "mcp",
            "temporal_mcp_tools:make_runtime",
            "--temporal",
            workers.address,
            "--task-queue",
            workers.task_queue,
            "--principal",
            "alice@acme",
        ],
        env=_env(workers),
    )
    asked: list[str] = []
    answers = [{"approved": "yes"}, {"approved": True, "note": "on stdio"}]

    async def elicit(ctx: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content=answers.pop(0))

    progress: list[Any] = []

    async def on_progress(*reported: Any) -> None:
        progress.append(reported)

    async def main() -> tuple[list[str], types.CallToolResult, types.CallToolResult]:
        async with Client(params, elicitation_callback=elicit) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            # progress asked for: answered without one (there is no event stream to read)
            fetched = await client.call_tool("fetch", {"n": 4}, progress_callback=on_progress)
            with pytest.raises(MCPError) as unknown:  # files are not served from Temporal
                await client.read_resource("blade://files/file_1")
            assert unknown.value.error.code == -32002
            done = await client.call_tool("sync", {"n": 3, "suspend": True})
            await _cancelled_once_running(client, workers)
            return names, fetched, done

    names, fetched, done = run(main)
    assert names == [tool.name for tool in run(_listing)]
    assert fetched.structured_content == {"n": 4, "entry": "initial", "note": "ok"}
    assert done.structured_content == {"n": 3, "entry": "resume", "note": "on stdio"}
    assert len(asked) == 2 and "The last answer was refused" in asked[1]
    assert run(_charged, workers) == {"status": "error", "code": "CANCELLED"}

    # the same command on streamable HTTP (--http), every request for --principal
    port = free_port()
    log = workers.folder / "mcp-http.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN), *params.args, "--http", f"127.0.0.1:{port}"],
            env=_env(workers), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "blade-runtime mcp serving" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert f"on Temporal at {workers.address}" in log.read_text()

        async def over_http() -> types.CallToolResult:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                return await client.call_tool("fetch", {"n": 6})

        assert run(over_http).structured_content == {"n": 6, "entry": "initial", "note": "ok"}
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0, log.read_text()


def test_the_commands_on_temporal_say_what_is_wrong_in_one_line(
    temporal_server: DevServer, temporal_package: Path, tmp_path: Path
) -> None:
    """No server at the address: exit 3; a target that is not the registrations, or
    ``--store`` beside ``--temporal``: exit 2; each one line on stderr, no traceback."""
    unreachable = f"127.0.0.1:{free_port()}"
    here = temporal_server.address
    target = "temporal_mcp_tools:make_runtime"
    anonymous = ["--allow-anonymous", "--port", str(free_port())]
    cases = [
        (["mcp", target, "--temporal", unreachable], 3, f"error: Temporal at {unreachable}"),
        (["mcp", target, "--temporal", unreachable, "--http", f"127.0.0.1:{free_port()}"], 3,
         f"error: Temporal at {unreachable}"),
        (["serve", target, "--temporal", unreachable, *anonymous], 3,
         f"error: Temporal at {unreachable}"),
        (["mcp", "temporal_mcp_tools:nothing", "--temporal", here], 2, "has no nothing"),
        (["serve", "no_such_module:make", "--temporal", here, *anonymous], 2, "cannot import"),
        (["serve", target, "--temporal", here, "--store", str(tmp_path / "x.db")], 2,
         "not allowed with argument"),
    ]  # fmt: skip
    env = process_env(temporal_package)
    for argv, code, says in cases:
        done = subprocess.run(
            [str(BIN), *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        lines = done.stderr.strip().splitlines()
        assert (done.returncode, says in lines[-1]) == (code, True), (argv, done.stderr)
        assert "Traceback" not in done.stderr and lines[-1].startswith(("error:", "blade-runtime"))


@pytest.mark.slow  # a worker process
def test_files_a_tool_saved_on_temporal_are_served_to_its_tenant_over_http_and_mcp(
    workers: Workers,
) -> None:
    """A worker saves a file in the folder the workers share; an app whose registrations name
    the same folder serves it to the caller's tenant (``GET /v1/files/{id}``, MCP
    ``resources/read``) and to nobody else; one whose registrations name none answers 501."""
    from http_support import authenticate

    from blade_runtime import Principal
    from blade_runtime.serving.http.temporal import create_temporal_app
    from blade_runtime.serving.mcp_temporal import TemporalBackend

    folder = workers.folder / "files"
    workers.spawn(1, files=folder)

    async def main() -> tuple[Any, ...]:
        client = await TemporalClient.connect(workers.address)
        tools = TemporalTools(client, task_queue=workers.task_queue, runtime=make_runtime(folder))
        blind = TemporalTools(client, task_queue=workers.task_queue, runtime=make_runtime())
        served = {}
        for name, app in (
            ("shared", create_temporal_app(tools, authenticate)),
            ("blind", create_temporal_app(blind, authenticate)),
        ):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                if name == "shared":
                    done = await http.post(
                        "/v1/tools/audit/calls", json={"n": 1}, headers=ALICE, timeout=60
                    )
                    assert done.status_code == 200, done.text
                    [meta] = folder.glob("*.json")
                    file_id = meta.stem
                served[name] = [
                    await http.get(f"/v1/files/{file_id}", headers=who) for who in (ALICE, BOB)
                ]
        backend = TemporalBackend(tools)
        async with Client(mcp_server(backend, principal=Principal("alice", "acme"))) as mine:
            read = await mine.read_resource(f"blade://files/{file_id}")
        async with Client(mcp_server(backend, principal=Principal("bob", "globex"))) as theirs:
            with pytest.raises(MCPError):
                await theirs.read_resource(f"blade://files/{file_id}")
        return served, read

    served, read = run(main)
    mine, theirs = served["shared"]
    assert mine.status_code == 200 and json.loads(mine.content)["who"] is not None
    assert mine.headers["content-type"].startswith("application/json")
    assert theirs.status_code == 404 and theirs.json()["code"] == "UNKNOWN_FILE"
    assert [r.status_code for r in served["blind"]] == [501, 501]
    assert json.loads(read.contents[0].text)["pid"] == json.loads(mine.content)["pid"]
