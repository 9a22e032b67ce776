"""``blade-codegen import --from mcp --server ...``: a live MCP server's tools, and whether the
specs imported from it still match them (``--check``).

The listing is read with the MCP SDK's own client (``blade-runtime[mcp]``), from a command
started over stdio or a streamable HTTP URL, every page of it, and handed to the importer as the
``tools/list`` result it is. The check compares each spec the import would write with the one on
disk by ``check``'s rules (``compat``): the input is what callers send (a change that narrows it
breaks them), the output what readers parse (a change that widens it breaks them); a spec whose
tool the server no longer lists breaks its callers too. Nothing is written.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blade_codegen.compat import Direction, compare


class LiveError(Exception):
    """The server could not be read; the message is one line, with no header value in it."""


def listing(server: str, headers: Sequence[str] = (), timeout_s: float = 60.0) -> str:
    """The ``tools/list`` result of the server ``server`` (a URL, else a command line), as
    JSON text. ``headers``: ``Name: value`` lines for a URL."""
    try:
        from mcp import Client, StdioServerParameters
    except ImportError:
        raise LiveError(
            "reading a live MCP server needs the MCP SDK: pip install 'blade-runtime[mcp]'"
        ) from None
    sent: dict[str, str] = {}
    for header in headers:
        name, colon, value = header.partition(":")
        if not colon or not name.strip():
            raise LiveError(f"--header {name.strip()!r}...: write it as 'Name: value'")
        sent[name.strip()] = value.strip()
    web = server.startswith(("http://", "https://"))
    if headers and not web:
        raise LiveError("--header goes with a server URL, not a command")

    async def read() -> list[Any]:
        target: Any
        if web:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            http = create_mcp_http_client(headers=sent)
            target = streamable_http_client(server, http_client=http)
        else:
            words = shlex.split(server)
            if not words:
                raise LiveError("--server is empty: give a command line or a URL")
            from mcp.client.stdio import stdio_client

            parameters = StdioServerParameters(command=words[0], args=words[1:])
            target = stdio_client(parameters, errlog=errlog)
        tools: list[Any] = []
        async with asyncio.timeout(timeout_s), Client(target, cache=None) as client:
            cursor = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(
                    tool.model_dump(mode="json", by_alias=True, exclude_none=True)
                    for tool in page.tools
                )
                cursor = page.next_cursor
                if cursor is None:
                    return tools

    errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
    try:  # (closed in the finally below: read() needs it open, and its text after a failure)
        tools = asyncio.run(read())
    except LiveError:
        raise
    except BaseException as error:  # anything the connection raised: one line
        while isinstance(error, BaseExceptionGroup) and error.exceptions:
            error = error.exceptions[0]
        if isinstance(error, KeyboardInterrupt):
            raise
        reason = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
        errlog.seek(0)
        said = [line.strip() for line in errlog.read().splitlines() if line.strip()]
        if said:  # what the server said last, on its stderr
            reason += f" (its stderr: {said[-1][:300]})"
        where = server.split("?")[0] if web else shlex.split(server)[0]
        raise LiveError(f"cannot read the MCP server {where}: {reason}") from None
    finally:
        errlog.close()
    return json.dumps({"tools": tools}, indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class Finding:
    """One difference between a spec on disk and what importing the server now would write."""

    path: str
    pointer: str
    message: str
    breaking: bool

    def line(self) -> str:
        verdict = "breaking" if self.breaking else "compatible"
        return f"{self.path}: {self.pointer}: {self.message} ({verdict})"


SLOTS: tuple[tuple[str, Direction], ...] = (
    ("inputSchema", "accepting"),
    ("outputSchema", "emitting"),
)


def drift(specs: Path, imported: Sequence[Any]) -> tuple[list[Finding], int]:
    """The findings for ``imported`` (the importer's files) against ``specs``, and how many
    specs are unchanged. A spec file in the same folders, imported from MCP, that the server
    no longer lists is a breaking finding."""
    findings: list[Finding] = []
    unchanged = 0
    folders = {(specs / file.path).parent for file in imported}
    for file in imported:
        path = specs / file.path
        if not path.exists():
            findings.append(Finding(str(path), "/", "a tool the specs do not have yet", False))
            continue
        old, new = json.loads(path.read_text("utf-8")), json.loads(file.text)
        if old == new:
            unchanged += 1
            continue
        before = len(findings)
        for slot, direction in SLOTS:
            if old.get(slot) is None:
                continue
            if new.get(slot) is None:
                findings.append(Finding(str(path), f"/{slot}", "the server dropped it", True))
                continue
            for change in compare(old[slot], new[slot]):
                if change.effect == "none":
                    continue
                pointer = "/" + "/".join([slot, *(str(p) for p in change.schema_path)])
                message = f"{change.rule}: {change.detail}"
                findings.append(Finding(str(path), pointer, message, change.breaks(direction)))
        if len(findings) == before:
            findings.append(Finding(str(path), "/", "changed outside its schemas", False))
    written = {(specs / file.path).resolve() for file in imported}
    for folder in sorted(folders):
        for path in sorted(folder.glob("*.json")):
            if path.resolve() in written:
                continue
            try:
                origin = json.loads(path.read_text("utf-8")).get("importedFrom", {})
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(origin, dict) and origin.get("format") == "mcp":
                name = origin.get("name")
                findings.append(Finding(str(path), "/", f"the server no longer lists {name}", True))
    return findings, unchanged
