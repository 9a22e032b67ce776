"""A remote MCP server as an application names it, and the one connection the bridge keeps to it.

``McpServer.stdio(...)`` names a command to start (its arguments and environment), and
``McpServer.http(...)`` a streamable HTTP endpoint (with headers the application supplies: they
go on the wire, never into a log or an error message). A ``Connection`` holds one MCP client
session per server, shared by every call: one task owns it (the SDK's anyio context managers
are entered and left by the same task), opens it within the start-up timeout, pings it while it
is idle, and when the server dies or the connection breaks, reconnects (restarting a stdio
server) with exponential back-off. A stdio server's stderr goes to the ``blade_runtime.mcp``
logger, a line at a time, never to the terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

log = logging.getLogger("blade_runtime.mcp")
LogLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


@dataclass(frozen=True, repr=False)
class McpServer:
    """A remote MCP server: a stdio ``command`` (with ``args``, ``env``, ``cwd``) or a streamable
    HTTP ``url`` (with ``headers``). ``name`` names it in logs and in its tools' source
    (``mcp:<name>``). ``startup_timeout_s``: how long a connection may take to open;
    ``call_timeout_s``: how long one call waits for its answer (None: the tool's own timeout
    alone); ``ping_interval_s``: how often an idle connection is checked; ``backoff_s`` and
    ``max_backoff_s``: the first and longest wait between reconnection attempts; ``log_level``: the
    least important log message the server is asked to send with a call (None: none)."""

    name: str
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = field(default=None, repr=False)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # never logged
    startup_timeout_s: float = 30.0
    call_timeout_s: float | None = None
    ping_interval_s: float = 5.0
    backoff_s: float = 0.2
    max_backoff_s: float = 30.0
    log_level: LogLevel | None = "info"

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> McpServer:
        """A server started as ``command args`` and spoken to over its stdin and stdout."""
        return cls(name, command=command, args=tuple(args), env=env, cwd=cwd, **options)

    @classmethod
    def http(
        cls, name: str, url: str, *, headers: Mapping[str, str] | None = None, **options: Any
    ) -> McpServer:
        """A server at a streamable HTTP ``url``; ``headers`` go with every request."""
        return cls(name, url=url, headers=dict(headers or {}), **options)

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: name a command or a url (one of them)")

    def __repr__(self) -> str:  # no environment, header or URL credentials
        return f"McpServer({self.name!r}, {self.where!r})"

    @property
    def where(self) -> str:
        """What logs may say of it: the command, or the URL without credentials or query."""
        if self.command is not None:
            return self.command
        assert self.url is not None
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        return (
            f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
        )


class ServerUnavailable(Exception):
    """The server could not be reached (not started, gone, or reconnecting)."""


Opened = Callable[[Any], Awaitable[None]]
"""Called with each new client once it is connected (list the tools, compare them...)."""


class Connection:
    """One MCP client session to one server, shared by concurrent calls and kept open."""

    def __init__(self, server: McpServer, callbacks: Mapping[str, Any], opened: Opened) -> None:
        self.server = server
        self.callbacks = callbacks  # the Client's callbacks: message, elicitation, sampling...
        self.opened = opened
        self.client: Any = None
        self._ready = asyncio.Event()
        self._lost = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None  # why the last attempt failed
        self.connects = 0  # sessions opened so far (the first, and each reconnection)

    async def start(self) -> None:
        """Open the first session (raises ``ServerUnavailable`` past the start-up timeout);
        the connection then keeps itself open until ``close``."""
        self._task = asyncio.get_running_loop().create_task(
            self._keep(), name=f"mcp:{self.server.name}"
        )
        try:
            await self.ready(self.server.startup_timeout_s)
        except ServerUnavailable:
            await self.close()
            raise

    async def ready(self, timeout_s: float | None = None) -> Any:
        """The open client, waiting up to ``timeout_s`` (default: the start-up timeout) for a
        reconnection; ``ServerUnavailable`` when there is none by then."""
        if self.client is not None and not self._lost.is_set():
            return self.client
        if self._closing:
            raise ServerUnavailable(f"the MCP server {self.server.name!r} is closed")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s or self.server.startup_timeout_s)
        except TimeoutError:
            why = f": {_reason(self.failure)}" if self.failure is not None else ""
            raise ServerUnavailable(
                f"the MCP server {self.server.name!r} is not reachable{why}"
            ) from None
        if self.client is None:
            raise ServerUnavailable(f"the MCP server {self.server.name!r} is closed")
        return self.client

    def broken(self, client: Any) -> None:
        """A call found ``client``'s connection broken: open another (once, whoever says so)."""
        if client is self.client:
            self._ready.clear()
            self._lost.set()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Close the session and stop the server's process (if this connection started it)."""
        self._closing = True
        self._lost.set()
        task = self._task
        if task is None or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _keep(self) -> None:
        attempt = 0
        while not self._closing:
            try:
                async with self._session() as client:
                    self.client = client
                    self.connects += 1
                    self.failure = None
                    attempt = 0
                    await self.opened(client)
                    self._lost.clear()
                    self._ready.set()
                    log.info("MCP server %r connected (%s)", self.server.name, self.server.where)
                    await self._watch(client)
            except asyncio.CancelledError:
                if not self._closing:
                    raise
            except Exception as error:  # the server died, or never answered: try again
                self.failure = error
                log.warning(
                    "MCP server %r: connection %s: %s",
                    self.server.name,
                    "lost" if self.client is not None else "failed",
                    _reason(error),
                )
            finally:
                self.client = None
                self._ready.clear()
            if self._closing:
                break
            delay = min(self.server.max_backoff_s, self.server.backoff_s * 2**attempt)
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait_closing(), delay)
        self._ready.set()  # wake waiters: they find it closed

    async def _wait_closing(self) -> None:
        while not self._closing:
            self._lost.clear()
            await self._lost.wait()

    async def _watch(self, client: Any) -> None:
        """Until the connection is lost or closed, follow the server's tool list and notice its
        death: on a 2026-07-28 connection, a ``subscriptions/listen`` stream of tool-list
        changes (an abrupt end of it is the connection's); on an older one, the server's
        ``notifications/tools/list_changed`` (the bridge's message handler) and a ping whenever
        the connection has been idle a while; where neither is offered, a re-listing."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            listening = asyncio.get_running_loop().create_task(self._listen(client))
            try:
                await self._lost.wait()
            finally:
                listening.cancel()
                with contextlib.suppress(BaseException):
                    await listening
            return
        while not self._lost.is_set():
            try:
                await asyncio.wait_for(self._lost.wait(), self.server.ping_interval_s)
            except TimeoutError:
                await asyncio.wait_for(client.send_ping(), self.server.startup_timeout_s)

    async def _listen(self, client: Any) -> None:
        from mcp.shared.exceptions import MCPError

        try:
            try:
                async with client.listen(tools_list_changed=True) as changes:
                    async for _ in changes:
                        await self.opened(client)
            except MCPError as error:
                if error.code != -32601:  # anything but "method not found": the connection's
                    raise
                while True:  # no listen: the tool list, re-read now and then, is the heartbeat
                    await asyncio.sleep(self.server.ping_interval_s)
                    await asyncio.wait_for(self.opened(client), self.server.startup_timeout_s)
        except Exception as error:
            if not self._closing:
                log.warning("MCP server %r: connection lost: %s", self.server.name, _reason(error))
        finally:
            self.broken(client)

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[Any]:
        from mcp import Client

        async with contextlib.AsyncExitStack() as stack:
            transport: Any
            server = self.server
            if server.command is not None:
                from mcp import StdioServerParameters
                from mcp.client.stdio import stdio_client

                errlog = stack.enter_context(_stderr_to_log(server.name))
                parameters = StdioServerParameters(
                    command=server.command,
                    args=list(server.args),
                    env=dict(server.env) if server.env is not None else None,
                    cwd=server.cwd,
                )
                transport = stdio_client(parameters, errlog=errlog)
            else:
                from mcp.client.streamable_http import streamable_http_client
                from mcp.shared._httpx_utils import create_mcp_http_client

                assert server.url is not None
                http = await stack.enter_async_context(
                    create_mcp_http_client(headers=dict(server.headers))
                )
                transport = streamable_http_client(server.url, http_client=http)
            client = Client(
                transport,
                read_timeout_seconds=server.call_timeout_s,
                cache=None,  # a bridge reads the tool list itself, when the server says
                log_level=server.log_level,  # the log lines a 2026-07-28 server sends
                **self.callbacks,
            )
            async with asyncio.timeout(server.startup_timeout_s):
                await stack.enter_async_context(client)
            yield client


@contextlib.contextmanager
def _stderr_to_log(name: str) -> Any:
    """A file a child process writes its stderr to; each line goes to the log (a thread reads
    it until the last writer, the child, closes it)."""
    read_end, write_end = os.pipe()
    writer: IO[str] = os.fdopen(write_end, "w")

    def forward() -> None:
        with os.fdopen(read_end, "r", errors="replace") as lines:
            for line in lines:
                log.info("MCP server %r stderr: %s", name, line.rstrip("\n")[:2000])

    threading.Thread(target=forward, name=f"mcp-stderr:{name}", daemon=True).start()
    try:
        yield writer
    finally:
        writer.close()


def _reason(error: BaseException) -> str:
    """One line on why a connection failed (the first leaf of an exception group)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}{': ' + text[:300] if text else ''}"
