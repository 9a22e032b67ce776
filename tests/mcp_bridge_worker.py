"""A worker process for the bridge's kill -9 test: a runtime on a SQLite store with the fixture
MCP server bridged, making one long non-idempotent call until it is killed.

``python mcp_bridge_worker.py STORE MARKS``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from blade_runtime import Runtime
from blade_runtime.remote import McpServer, connect_mcp
from blade_runtime.stores.sqlite import SQLiteStore

SERVER = Path(__file__).resolve().parent / "mcp_remote_server.py"


async def main(store: str, marks: str) -> None:
    runtime = Runtime(store=SQLiteStore(store), lease_s=1.0)
    server = McpServer.stdio(
        "fx", sys.executable, [str(SERVER), "stdio"], env={"FIXTURE_MARKS": marks}
    )
    await connect_mcp(runtime, server)
    await runtime.call("append", {"line": "once", "wait_s": 120}, call_id="c-kill", run_id="r-kill")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
