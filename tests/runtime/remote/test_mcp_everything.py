"""The bridge against a server nobody here wrote: npm's reference MCP server "everything"
(``tests/mcp_everything``, installed by ``.ci/run`` with ``npm ci``; nothing is fetched when the
tests run), over stdio, through the public API."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from blade_runtime import Runtime, ToolSuccess
from blade_runtime.remote import McpServer, connect_mcp

PACKAGE = Path(__file__).resolve().parents[2] / "mcp_everything"
SERVER = PACKAGE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist"


@pytest.fixture(scope="module")
def everything() -> McpServer:
    if not (SERVER / "index.js").exists():
        pytest.fail(
            f"npm's MCP server everything is not installed: run `npm ci --prefix {PACKAGE}`"
        )
    return McpServer.stdio("everything", "node", [str(SERVER / "index.js"), "stdio"])


def blocks(result: Any) -> list[dict[str, Any]]:
    assert isinstance(result, ToolSuccess), result
    assert isinstance(result.content, list)
    return [block for block in result.content if isinstance(block, dict)]


def test_every_kind_of_answer_of_the_reference_server(everything: McpServer) -> None:
    async def scenario() -> dict[str, Any]:
        runtime = Runtime()
        bridge = await connect_mcp(runtime, everything, prefix="ev_")
        try:
            subscription = runtime.subscribe("r-long", after=0)
            found: dict[str, Any] = {
                "echo": await runtime.call("ev_echo", {"message": "hi"}),
                "sum": await runtime.call("ev_get-sum", {"a": 2, "b": 3}),
                "image": await runtime.call("ev_get-tiny-image", {}),
                "links": await runtime.call("ev_get-resource-links", {"count": 2}),
                "structured": await runtime.call(
                    "ev_get-structured-content", {"location": "New York"}
                ),
                "long": await runtime.call(
                    "ev_trigger-long-running-operation",
                    {"duration": 1, "steps": 2},
                    run_id="r-long",
                ),
                "wrong": await runtime.call("ev_get-sum", {"a": "two", "b": 3}),
            }
            events: list[Any] = []
            iterator = subscription.__aiter__()
            while not any(event.kind == "result" for event in events):
                events.append(await asyncio.wait_for(iterator.__anext__(), 20))
            subscription.drop()
            found["progress"] = [e.payload for e in events if e.kind == "progress"]
            return found
        finally:
            await bridge.close()

    found = asyncio.run(scenario())
    assert "hi" in blocks(found["echo"])[0]["text"]
    assert "5" in blocks(found["sum"])[0]["text"]
    images = [b for b in blocks(found["image"]) if b["type"] == "image"]
    assert images and images[0]["mimeType"] == "image/png" and images[0]["data"]
    links = [b for b in blocks(found["links"]) if b["type"] == "resource_link"]
    assert len(links) == 2 and all(link["uri"] for link in links)
    structured = found["structured"]
    assert isinstance(structured, ToolSuccess) and isinstance(structured.output, dict)
    assert len(found["progress"]) == 2
    assert found["wrong"].status == "error" and found["wrong"].code == "INVALID_INPUT"
