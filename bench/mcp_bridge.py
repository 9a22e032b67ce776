"""MCP bridge benchmark: a remote tool called through the bridge against the same call made with
the MCP SDK's client alone, in one run, over stdio and over streamable HTTP on 127.0.0.1.

The server is the bridge tests' fixture (``tests/mcp_remote_server.py``, the MCP SDK's own
``MCPServer``), one process per transport; both clients hold one session to it. Each round makes
``--calls`` sequential calls of ``echo`` (text content) and of ``forecast`` (structured output)
through each client, the clients taking turns; the best round of each is kept (so that a busy
moment of the machine hits them alike). The bridge's call is a whole ``Runtime.call``: input
validated before sending, the result mapped and its output validated, events published.
Target: within 1.3x the SDK's call over each transport. A third client, Pydantic AI's MCP
toolset (``MCPToolset.direct_call_tool``, on FastMCP's client), calls the same server, for
the figure a user pairing us with Pydantic AI would compare.

Usage: python bench/mcp_bridge.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

# bench/http.py would shadow the standard library's http for the MCP SDK: not on the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from fastmcp.client.transports import StdioTransport  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from pydantic_ai.mcp import MCPToolset  # noqa: E402

from blade_runtime import Runtime, ToolSuccess  # noqa: E402
from blade_runtime.remote import McpServer, connect_mcp  # noqa: E402

SERVER = Path(__file__).resolve().parents[1] / "tests" / "mcp_remote_server.py"
CALLS = {"echo": {"text": "hello, bench"}, "forecast": {"city": "Oslo"}}


@contextlib.contextmanager
def http_server() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, FIXTURE_MARKS=""),
    )
    try:
        for _ in range(600):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


async def best_round(
    runs: dict[str, Callable[[str, dict[str, Any]], Awaitable[Any]]], calls: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Per run and tool, the best round's wall time per call in µs (the runs taking turns)."""
    best: dict[str, dict[str, float]] = {run: {} for run in runs}
    for _ in range(rounds):
        for tool, arguments in CALLS.items():
            for run, call in runs.items():
                start = time.perf_counter()
                for _ in range(calls):
                    await call(tool, arguments)
                per_call = (time.perf_counter() - start) / calls * 1e6
                best[run][tool] = min(best[run].get(tool, per_call), per_call)
    return best


async def leg(
    transport: str,
    target: Any,
    toolset: MCPToolset[Any],
    server: McpServer,
    calls: int,
    rounds: int,
) -> None:
    runtime = Runtime()
    bridge = await connect_mcp(runtime, server)

    async def bridged(tool: str, arguments: dict[str, Any]) -> Any:
        result = await runtime.call(tool, arguments)
        assert isinstance(result, ToolSuccess), result
        return result

    try:
        async with Client(target, cache=None) as client, toolset:

            async def direct(tool: str, arguments: dict[str, Any]) -> Any:
                result = await client.call_tool(tool, arguments)
                assert not result.is_error
                return result

            async def pydantic_ai(tool: str, arguments: dict[str, Any]) -> Any:
                return await toolset.direct_call_tool(tool, arguments)

            runs = {"bridge": bridged, "sdk": direct, "pydantic_ai": pydantic_ai}
            for run in runs.values():
                await run("echo", CALLS["echo"])
            best = await best_round(runs, calls, rounds)
    finally:
        await bridge.close()
    for tool in CALLS:
        ours, theirs, pai = best["bridge"][tool], best["sdk"][tool], best["pydantic_ai"][tool]
        print(
            f"{transport:6} {tool:9} bridge {ours:6.0f} µs/call   MCP SDK client {theirs:6.0f} "
            f"µs/call   {ours / theirs:.2f}x (target <= 1.3x)   Pydantic AI's MCPToolset "
            f"{pai:6.0f} µs/call ({ours / pai:.2f}x)"
        )


async def main(calls: int, rounds: int) -> None:
    stdio = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio"])
    await leg(
        "stdio",
        stdio,
        MCPToolset(StdioTransport(sys.executable, [str(SERVER), "stdio"])),
        McpServer.stdio("bench", sys.executable, [str(SERVER), "stdio"]),
        calls,
        rounds,
    )
    with http_server() as url:
        await leg("http", url, MCPToolset(url), McpServer.http("bench", url), calls, rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.rounds))
