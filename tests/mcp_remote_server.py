"""A remote MCP server for the bridge's tests, written with the MCP SDK's own server (MCPServer,
formerly FastMCP), run over stdio or streamable HTTP in its own process.

``python mcp_remote_server.py stdio`` or ``python mcp_remote_server.py http PORT``.
``FIXTURE_VARIANT=changed`` is the same server a release later: ``forecast`` takes a new
required argument (incompatible for our callers), ``echo`` takes longer texts (compatible),
and ``gone`` is dropped. ``FIXTURE_MARKS``: a file each call that matters appends a line to
(``start <tool>``, ``cancelled <tool>``, ``done <tool>``), so tests see what the server saw.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from typing import Annotated

from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve, Sample
from mcp_types import CreateMessageResult, ImageContent, ResourceLink, SamplingMessage, TextContent
from pydantic import BaseModel, Field

CHANGED = os.environ.get("FIXTURE_VARIANT") == "changed"
MARKS = os.environ.get("FIXTURE_MARKS")
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()

server = MCPServer("fixture")


def mark(line: str) -> None:
    if MARKS:
        with open(MARKS, "a", encoding="utf-8") as marks:
            marks.write(line + "\n")


class Forecast(BaseModel):
    city: str
    celsius: float
    summary: str


if CHANGED:

    @server.tool(name="forecast", description="The weather in a city.")
    def forecast_in(city: str, units: str) -> Forecast:
        return Forecast(city=city, celsius=21.5, summary=f"sunny ({units})")

    @server.tool(name="echo", description="Say the text back.", structured_output=False)
    def echo_longer(text: Annotated[str, Field(max_length=1000)]) -> str:
        return text

else:

    @server.tool(description="The weather in a city.")
    def forecast(city: str) -> Forecast:
        return Forecast(city=city, celsius=21.5, summary="sunny")

    @server.tool(description="Say the text back.", structured_output=False)
    def echo(text: Annotated[str, Field(max_length=100)]) -> str:
        return text

    @server.tool(description="A tool the next release drops.", structured_output=False)
    def gone() -> str:
        return "still here"


@server.tool(description="A small picture and a link to a report.", structured_output=False)
def picture() -> list[ImageContent | ResourceLink | TextContent]:
    return [
        ImageContent(type="image", data=PNG, mime_type="image/png"),
        ResourceLink(type="resource_link", uri="file:///reports/q3.pdf", name="q3.pdf"),
        TextContent(type="text", text="the picture and the report"),
    ]


@server.tool(description="Count to n slowly, reporting progress.", structured_output=False)
async def slow(n: Annotated[int, Field(ge=1, le=1000)], ctx: Context) -> str:
    mark("start slow")
    try:
        for step in range(1, n + 1):
            await ctx.report_progress(step, n, f"step {step}")
            await ctx.info(f"counted {step}")
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        mark("cancelled slow")
        raise
    mark("done slow")
    return f"counted to {n}"


@server.tool(description="Append a line to a ledger (not idempotent).", structured_output=False)
async def append(line: str, wait_s: float = 0.0) -> str:
    mark(f"start append {line}")
    await asyncio.sleep(wait_s)
    mark(f"done append {line}")
    return "appended"


@server.tool(description="Always fails.", structured_output=False)
def broken() -> str:
    raise ValueError("the ledger is locked")


@server.tool(description="Ten megabytes of text.", structured_output=False)
def huge() -> str:
    return "x" * (10 * 1024 * 1024)


class Approval(BaseModel):
    approver: str
    note: str = ""


def ask(amount: int) -> Elicit[Approval]:
    return Elicit(f"Approve a transfer of {amount}?", Approval)


@server.tool(description="Transfer an amount, once a person approves.", structured_output=False)
def transfer(amount: int, approval: Annotated[ElicitationResult[Approval], Resolve(ask)]) -> str:
    if isinstance(approval, AcceptedElicitation):
        mark(f"transferred {amount}")
        return f"transferred {amount}, approved by {approval.data.approver}"
    return f"not transferred ({approval.action})"


def sample(text: str) -> Sample:
    prompt = TextContent(type="text", text=f"Summarize: {text}")
    return Sample([SamplingMessage(role="user", content=prompt)], max_tokens=50)


@server.tool(description="Summarize a text with the client's model.", structured_output=False)
def summarize(text: str, summary: Annotated[CreateMessageResult, Resolve(sample)]) -> str:
    content = summary.content
    return content.text if isinstance(content, TextContent) else "(no text)"


@server.tool(description="The server's process id.", structured_output=False)
def pid() -> str:
    return str(os.getpid())


@server.tool(description="Add a tool named `name` and say the list changed.")
async def grow(name: str, ctx: Context) -> str:
    def added() -> str:
        return f"I am {name}"

    server.add_tool(added, name=name, description=f"Added at run time: {name}")
    await ctx.notify_tools_changed()  # to subscriptions/listen streams (2026-07-28)
    return name


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.settings.log_level = "WARNING"
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
