"""MCP over stdio, framed by us: every JSON-RPC message answered, and what a client can make the
server hold bounded.

The SDK's stdio transport reads a line whole (however long), drops what its parser refuses
without an answer, and starts a task per request with no limit. Here a line is read in chunks
and refused past ``max_message_bytes`` (never buffered whole); what does not parse is answered
-32700, what is not one request -32600 (a batch, ``[]``, an id that is null, a fraction or an
object), both with a null id as JSON-RPC 2.0 requires; a request whose id is still in flight is
refused -32600 and never run; and past ``max_in_flight`` unanswered requests reading stops
until one is answered (a client that never reads its answers stops being read). Everything
else goes to the SDK's server loop as it came.

A client's ``notifications/cancelled`` reaches the call with its reason (the call's record says
it). ``stop`` (SIGTERM, SIGINT) admits nothing new, lets the requests in flight finish for
``grace_s``, then cancels what still runs (each gets its CANCELLED answer) and returns. A client
that closes stdin ends the connection at once (its calls are cancelled); one that closes its
read end (a broken pipe) too, and ``serve_stdio`` says so with ``BrokenPipe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR
from pydantic import ValidationError

from blade_runtime.serving.mcp_limits import StdioLimits

log = logging.getLogger("blade_runtime.serving.mcp")

_CHUNK = 64 * 1024


class BrokenPipe(Exception):
    """The client closed its end of stdout: nothing more can be answered."""


def error_message(request_id: Any, code: int, message: str) -> bytes:
    """A JSON-RPC error response as one line (``request_id`` None: ``"id": null``)."""
    reply = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return json.dumps(reply, separators=(",", ":")).encode() + b"\n"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class Refused(Exception):
    """A message answered with an error instead of being served."""

    def __init__(self, request_id: Any, code: int, message: str) -> None:
        super().__init__(message)
        self.reply = error_message(request_id, code, message)


def read_message(line: bytes) -> tuple[types.JSONRPCMessage, Any]:
    """One line as a JSON-RPC message and its decoded form, or ``Refused`` with its answer."""
    try:
        decoded = json.loads(line, parse_constant=_refuse_constant)
    except RecursionError:
        raise Refused(None, PARSE_ERROR, "Parse error: the message is nested too deeply") from None
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise Refused(None, PARSE_ERROR, f"Parse error: {error}") from None
    if isinstance(decoded, list):
        raise Refused(None, INVALID_REQUEST, "Invalid Request: batches are not supported")
    if not isinstance(decoded, dict):
        raise Refused(None, INVALID_REQUEST, "Invalid Request: a message is a JSON object")
    request_id = decoded.get("id")
    if "id" in decoded and (not isinstance(request_id, str | int) or isinstance(request_id, bool)):
        raise Refused(None, INVALID_REQUEST, "Invalid Request: an id is a string or an integer")
    try:
        message = types.jsonrpc_message_adapter.validate_python(decoded, by_name=False)
    except (ValidationError, RecursionError):
        raise Refused(
            request_id, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request"
        ) from None
    return message, decoded


def _encoded(message: types.JSONRPCMessage) -> bytes:
    """A message as the SDK writes it, or with JSON escapes where text has no UTF-8 form."""
    try:
        return message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
    except (ValueError, UnicodeError):  # a lone surrogate (PydanticSerializationError)
        dumped = message.model_dump(mode="python", by_alias=True, exclude_unset=True)
        return json.dumps(dumped, separators=(",", ":")).encode() + b"\n"


class Requests(Protocol):
    """The calls of a connection's requests (``McpTools`` is one)."""

    def cancel_request(self, request_id: Any, reason: str | None) -> None:
        """The client cancelled ``request_id``: cancel its call, saying why."""

    def cancel_requests(self, reason: str) -> None:
        """Cancel every call still running."""

    def forget_request(self, request_id: Any) -> None:
        """``request_id`` was answered (or its answer withheld): its id is free again."""


class StdioConnection:
    """One client on a pair of file descriptors, bridged to the SDK server's streams."""

    def __init__(self, wire_in: int, wire_out: int, limits: StdioLimits, calls: Requests) -> None:
        self.wire_in = wire_in
        self.wire_out = wire_out
        self.limits = limits
        self.calls = calls
        self.in_flight: set[Any] = set()
        self.withheld: set[Any] = set()  # requests the client cancelled: their answer is not sent
        self.slots = asyncio.Semaphore(limits.max_in_flight)
        self.idle = asyncio.Event()
        self.idle.set()
        self.broken = asyncio.Event()
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)
        self._lines: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=16)

    # -- the pipe ends: daemon threads, so that a blocked read or write never holds the exit --

    def start_threads(self, loop: asyncio.AbstractEventLoop) -> None:
        threading.Thread(target=self._read_pipe, args=(loop,), daemon=True).start()
        threading.Thread(target=self._write_pipe, args=(loop,), daemon=True).start()

    def _read_pipe(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                chunk = os.read(self.wire_in, _CHUNK)
            except OSError:
                chunk = b""
            try:  # waits while the connection does not take more (backpressure)
                asyncio.run_coroutine_threadsafe(self._chunks.put(chunk), loop).result()
            except BaseException:
                return  # the loop is gone
            if not chunk:
                return

    def _write_pipe(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                line = asyncio.run_coroutine_threadsafe(self._lines.get(), loop).result()
            except BaseException:
                return
            if line is None:
                return
            try:
                view = memoryview(line)
                while view:
                    written = os.write(self.wire_out, view)
                    view = view[written:]
            except OSError:  # EPIPE (Python ignores SIGPIPE), or the descriptor is gone
                loop.call_soon_threadsafe(self.broken.set)
                return

    async def write(self, line: bytes) -> None:
        if not self.broken.is_set():
            await self._lines.put(line)

    async def close_writer(self, timeout_s: float) -> None:
        """Let what is queued go out (at most ``timeout_s``), then end the writer."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._lines.put(None)
                while not self._lines.empty() and not self.broken.is_set():
                    await asyncio.sleep(0.01)

    # -- reading -------------------------------------------------------------------------------

    async def lines(self) -> Any:
        """The client's lines as they come, each at most ``max_message_bytes`` (a longer one is
        answered as refused and skipped, never held whole); ends at EOF."""
        limit = self.limits.max_message_bytes
        pending = bytearray()
        skipping = False
        while True:
            chunk = await self._chunks.get()
            if not chunk:
                if pending.strip() and not skipping:
                    yield bytes(pending)
                return
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                if not skipping:
                    if len(pending) + len(piece) > limit:
                        skipping = True
                        pending.clear()
                        await self.write(
                            error_message(
                                None,
                                INVALID_REQUEST,
                                f"Invalid Request: the message is larger than {limit} bytes",
                            )
                        )
                    else:
                        pending += piece
                if end < 0:
                    break
                if not skipping and pending.strip():
                    yield bytes(pending)
                pending.clear()
                skipping = False
                start = end + 1

    async def admit(
        self, send: MemoryObjectSendStream[SessionMessage | Exception], stop: anyio.Event
    ) -> None:
        """Read, check and hand the client's messages to the SDK until EOF or ``stop``."""
        async for line in self.lines():
            if stop.is_set():
                return
            try:
                message, decoded = read_message(line)
            except Refused as refused:
                await self.write(refused.reply)
                continue
            inner = message
            if isinstance(inner, types.JSONRPCRequest):
                key = coerce_request_id(inner.id)
                if key in self.in_flight:
                    await self.write(
                        error_message(
                            inner.id,
                            INVALID_REQUEST,
                            f"Invalid Request: request id {inner.id!r} is already in flight; "
                            "each request needs an id of its own",
                        )
                    )
                    continue
                await self.slots.acquire()  # past the limit, reading waits here
                if stop.is_set():
                    self.slots.release()
                    return
                self.in_flight.add(key)
                self.idle.clear()
            if (
                isinstance(inner, types.JSONRPCNotification)
                and inner.method == "notifications/cancelled"
            ):
                self._cancelled(decoded.get("params"))
                continue
            await send.send(SessionMessage(message))

    def _cancelled(self, params: Any) -> None:
        """The client gave up a request: its call is cancelled here, with the client's reason
        (the SDK's own handling of the notification cancels it without one, racing the call's
        record), and the one answer the SDK then gives is not sent: the protocol wants none.
        The id stays in flight until that answer, so that a new request cannot take it."""
        if not isinstance(params, dict):
            return
        request_id = params.get("requestId")
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            return
        key = coerce_request_id(request_id)
        if key not in self.in_flight:
            return
        reason = params.get("reason")
        self.withheld.add(key)
        self.calls.cancel_request(key, reason if isinstance(reason, str) else None)

    def _settled(self, key: Any) -> None:
        self.calls.forget_request(key)
        if key in self.in_flight:
            self.in_flight.discard(key)
            self.slots.release()
            if not self.in_flight:
                self.idle.set()

    # -- writing -------------------------------------------------------------------------------

    async def answer(self, receive: MemoryObjectReceiveStream[SessionMessage]) -> None:
        """Write what the SDK sends, in order; an answer frees its request's slot."""
        async with receive:
            async for session_message in receive:
                message = session_message.message
                answered = isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
                request_id = getattr(message, "id", None) if answered else None
                key = None if request_id is None else coerce_request_id(request_id)
                if key in self.withheld:
                    self.withheld.discard(key)
                else:
                    await self.write(_encoded(message))
                if key is not None:
                    self._settled(key)


async def serve_connection(
    server: Any,
    wire: tuple[int, int],
    limits: StdioLimits,
    calls: Requests,
    stop: anyio.Event,
) -> None:
    """Serve one client on ``wire`` (its input and output descriptors) with ``server`` (the
    SDK's low-level Server) until it closes stdin, its read end breaks (``BrokenPipe``), or
    ``stop`` is set; ``calls`` are its requests' calls (cancelled as the client asks, and all
    when the connection ends)."""
    conn = StdioConnection(wire[0], wire[1], limits, calls)
    conn.start_threads(asyncio.get_running_loop())
    to_server, server_reads = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    server_writes, from_server = anyio.create_memory_object_stream[SessionMessage](0)
    ended = anyio.Event()

    async def admitting() -> None:
        await conn.admit(to_server, stop)
        ended.set()

    async def until(event: Any) -> None:
        await event.wait()
        ended.set()

    async with anyio.create_task_group() as served:
        served.start_soon(conn.answer, from_server)
        served.start_soon(
            server.run, server_reads, server_writes, server.create_initialization_options()
        )
        async with anyio.create_task_group() as watchers:
            watchers.start_soon(admitting)
            watchers.start_soon(until, conn.broken)
            watchers.start_soon(until, stop)
            await ended.wait()
            watchers.cancel_scope.cancel()
        if conn.broken.is_set():
            calls.cancel_requests("the MCP client closed its end of the connection")
        elif stop.is_set():  # nothing new is admitted; what runs may finish, then is cancelled
            with anyio.move_on_after(limits.grace_s):
                await conn.idle.wait()
            calls.cancel_requests("the MCP server is stopping")
        else:
            calls.cancel_requests("the MCP client closed its input (stdin)")
        with anyio.move_on_after(limits.grace_s):
            await conn.idle.wait()  # the cancelled calls' answers
        await to_server.aclose()  # EOF for the SDK's loop: it ends what is left
        served.cancel_scope.deadline = anyio.current_time() + limits.grace_s
    await conn.close_writer(1.0)
    if conn.broken.is_set():
        raise BrokenPipe("the MCP client closed its end of stdout (broken pipe)")


@contextlib.contextmanager
def claimed_stdio() -> Iterator[tuple[int, int]]:
    """The wire's descriptors, private duplicates of 0 and 1, while fd 0 reads the null device
    and fd 1 writes to stderr: a tool's ``print`` (or a child process's output) cannot corrupt
    the protocol. Both are restored on exit."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    try:
        yield wire_in, wire_out
    finally:
        for saved, fd in ((saved_in, 0), (saved_out, 1)):
            with contextlib.suppress(OSError):
                os.dup2(saved, fd)
            os.close(saved)
