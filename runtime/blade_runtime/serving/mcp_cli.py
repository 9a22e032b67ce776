"""``blade-runtime mcp MODULE:RUNTIME``: the MCP server as a service to leave running, on stdio or
on streamable HTTP (``--http HOST:PORT``).

Beside the server runs the runtime's recovery loop, as under ``serve``: an answer given anywhere
(the inbox, ``blade-runtime pending submit``, another worker) resumes its call here or on any
worker sharing the store, and a dead worker's calls are taken up by their side-effect contract.

SIGTERM and SIGINT stop it cleanly: nothing new is admitted, the requests in flight have
``--grace`` seconds to finish, then the calls still running are cancelled (each answered
CANCELLED, its record saying why) and the runtime closes as ``Runtime.close`` does (what
ignores its cancellation becomes claimable by other workers at once); exit 0. A client that
closes stdin ends it with exit 0 too; one that closes its end of stdout (a broken pipe) with one
line on stderr and exit 0.

With ``--temporal HOST:PORT`` (``blade-runtime[mcp,temporal]``) the tools run on Temporal's
workers (``blade_runtime.temporal``): RUNTIME is then the registrations those workers run (what
is listed, and each tool's side effect and timeout), and each call is a call workflow on
``--task-queue`` of ``--namespace`` (``TemporalBackend``). There is no recovery loop (Temporal
recovers), no progress or log notifications (no event stream) and no ``resources/read`` of
files. A server that cannot be reached is one line and exit 3.

What a client can make the server hold is bounded (see docs/mcp-and-adapters.md): over stdio a
message of at most ``--max-message-bytes`` (4 MiB, as an HTTP body) and ``--max-in-flight``
unanswered requests (64: past it reading stops); over HTTP at most ``--max-connections`` open
connections (256: more are closed at once, and as many requests in flight), a request's head
and body within ``--request-timeout`` seconds of its first byte (10), an idle kept-alive
connection closed after 5 s, a head of 64 KiB and a body of 4 MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from blade_runtime.core.caller import Principal
from blade_runtime.runtime import Runtime
from blade_runtime.serving.mcp_limits import GRACE_S, MAX_IN_FLIGHT, MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from blade_runtime.serving.mcp_temporal import TemporalBackend

MAX_CONNECTIONS = 256
REQUEST_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5.0
RECOVERY_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class Bounds:
    """The service's bounds (see the module's doc)."""

    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_in_flight: int = MAX_IN_FLIGHT
    max_connections: int = MAX_CONNECTIONS
    request_timeout_s: float = REQUEST_TIMEOUT_S
    grace_s: float = GRACE_S


@dataclass(frozen=True, slots=True)
class TemporalPlace:
    """Where the tools run with ``--temporal``: the frontend's address, the namespace and the
    workers' task queue."""

    address: str
    namespace: str = "default"
    task_queue: str = "blade"

    async def backend(self, runtime: Runtime) -> TemporalBackend | None:
        """The tools on Temporal, or None (said on stderr) when the server cannot be reached."""
        from temporalio.client import Client
        from temporalio.service import RPCError

        from blade_runtime.serving.mcp_temporal import TemporalBackend
        from blade_runtime.temporal import TemporalTools

        try:
            client = await Client.connect(self.address, namespace=self.namespace)
        except (RuntimeError, RPCError, OSError) as error:
            print(f"error: Temporal at {self.address}: {error}", file=sys.stderr)
            return None
        return TemporalBackend(TemporalTools(client, task_queue=self.task_queue, runtime=runtime))


def load_runtime(target: str, store_url: str | None) -> Runtime:
    """``MODULE:ATTRIBUTE``: a Runtime, or a function returning one (called with ``store=`` the
    opened ``store_url`` when given); found as ``serve`` finds it (the current folder is
    importable)."""
    from blade_runtime.serving.serve import ServeError, load

    try:
        found: Any = load(target, "MODULE:RUNTIME")
    except ServeError as error:
        raise ValueError(str(error)) from None
    if isinstance(found, Runtime):
        if store_url is not None:
            raise ValueError(f"{target} is a Runtime with its own store; --store needs a factory")
        return found
    if not callable(found):
        raise ValueError(f"{target} is neither a Runtime nor a function returning one")
    if store_url is None:
        made = found()
    else:
        from blade_runtime.stores.urls import open_store

        made = found(store=open_store(store_url))
    if not isinstance(made, Runtime):
        raise ValueError(f"{target}() did not return a Runtime")
    return made


def run_cli(
    target: str,
    *,
    store_url: str | None = None,
    http: str | None = None,
    inbox_url: str | None = None,
    principal: str | None = None,
    bounds: Bounds | None = None,
    sessions: bool = False,
    temporal: TemporalPlace | None = None,
) -> int:
    """``blade-runtime mcp MODULE:RUNTIME [--store URL | --temporal HOST:PORT] [--http
    HOST:PORT]``: serve over stdio (or streamable HTTP on a loopback address, stateless unless
    ``sessions``) until the client or a signal ends it; with ``temporal``, the tools on
    Temporal (``RUNTIME`` their registrations)."""
    bounds = bounds or Bounds()
    from blade_runtime.core.store import StoreError
    from blade_runtime.serving.serve import (
        EXIT_BIND,
        EXIT_STORE,
        EXIT_USAGE,
        listen,
        port_number,
        url_of,
    )

    if importlib.util.find_spec("mcp") is None:  # the SDK itself is imported once listening
        print("error: No module named 'mcp': pip install 'blade-runtime[mcp]'", file=sys.stderr)
        return EXIT_USAGE
    if temporal is not None and importlib.util.find_spec("temporalio") is None:
        print(
            "error: No module named 'temporalio': pip install 'blade-runtime[mcp,temporal]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    who = None
    if principal is not None:
        ident, _, tenant = principal.partition("@")
        who = Principal(ident, tenant)
    listening = None
    if http is not None:  # the address first: a busy port is one line, before anything loads
        host, _, port = http.rpartition(":")
        number = port_number(port)
        if host not in ("127.0.0.1", "localhost", "::1") or number is None:
            print(
                f"error: --http {http}: a loopback HOST:PORT (elsewhere, serve mcp_asgi_app "
                "with authenticate= from your own ASGI server)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        try:
            listening = listen(host, number)
        except OSError as error:
            print(
                f"error: cannot listen on {url_of(host, number)}: {error.strerror}",
                file=sys.stderr,
            )
            return EXIT_BIND
    try:
        runtime = load_runtime(target, store_url)
    except (StoreError, ImportError, AttributeError, ValueError) as error:
        if listening is not None:
            listening.close()
        print(f"error: {error}", file=sys.stderr)
        return EXIT_STORE if isinstance(error, StoreError) else EXIT_USAGE
    try:
        if listening is None:
            return asyncio.run(_stdio(runtime, who, inbox_url, bounds, temporal))
        return _http(runtime, who, inbox_url, bounds, listening, target, sessions, temporal)
    finally:
        if store_url is not None:  # the store this command opened
            close = getattr(runtime.store, "close", None)
            if callable(close):
                close()


@contextlib.contextmanager
def _signals(on_signal: Any) -> Iterator[None]:
    """SIGTERM and SIGINT call ``on_signal`` on the running loop (no KeyboardInterrupt)."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum, None)
    try:
        yield
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def _served(
    runtime: Runtime, temporal: TemporalPlace | None
) -> Runtime | TemporalBackend | None:
    """What the server serves: the runtime, or its registrations' tools on Temporal (None: the
    server cannot be reached, said on stderr)."""
    return runtime if temporal is None else await temporal.backend(runtime)


@contextlib.asynccontextmanager
async def _running(served: Runtime | TemporalBackend, grace_s: float) -> AsyncIterator[None]:
    """A runtime's recovery loop while the server runs, and its close after; on Temporal,
    the last cancellations sent (Temporal recovers the calls itself)."""
    if not isinstance(served, Runtime):
        try:
            yield
        finally:
            await served.drain(grace_s)
        return
    recovery = asyncio.create_task(served.run_recovery(RECOVERY_INTERVAL_S))
    try:
        yield
    finally:
        recovery.cancel()
        await asyncio.gather(recovery, return_exceptions=True)
        await served.close(grace_s)


async def _stdio(
    runtime: Runtime,
    who: Principal | None,
    inbox_url: str | None,
    bounds: Bounds,
    temporal: TemporalPlace | None = None,
) -> int:
    import anyio

    from blade_runtime.serving.mcp import serve_stdio
    from blade_runtime.serving.mcp_limits import StdioLimits
    from blade_runtime.serving.mcp_stdio import BrokenPipe
    from blade_runtime.serving.serve import EXIT_STORE

    served = await _served(runtime, temporal)
    if served is None:
        return EXIT_STORE
    stop = anyio.Event()
    limits = StdioLimits(bounds.max_message_bytes, bounds.max_in_flight, bounds.grace_s)
    async with _running(served, bounds.grace_s):
        try:
            with _signals(lambda signum, frame: stop.set()):
                await serve_stdio(
                    served, principal=who, inbox_url=inbox_url, limits=limits, stop=stop
                )
        except BrokenPipe as error:
            print(f"blade-runtime mcp: {error}; stopped", file=sys.stderr, flush=True)
    return 0


def limited_h11_protocol(max_connections: int, request_timeout_s: float) -> Any:
    """uvicorn's h11 protocol with two more bounds: at most ``max_connections`` open (another
    is closed at once), and a request's head and body complete within ``request_timeout_s`` of
    its first byte (or of the connection's opening), else the connection is closed. uvicorn
    alone keeps a half-sent request open forever."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    received = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)

    class LimitedH11Protocol(H11Protocol):
        _request_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._request_timer is None:
                self._arm()
            super().data_received(data)
            if self.conn.their_state in received:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._request_timer = self.loop.call_later(request_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
                self._request_timer = None

        def _timed_out(self) -> None:
            self._request_timer = None
            if self.conn.their_state not in received and not self.transport.is_closing():
                self.transport.close()

    return LimitedH11Protocol


def _cancel_running(served: Runtime | TemporalBackend) -> None:
    running = served.calls.running if isinstance(served, Runtime) else served.running
    for call_id in list(running):
        served.cancel_call(call_id, "the MCP server is stopping")


def _http(
    runtime: Runtime,
    who: Principal | None,
    inbox_url: str | None,
    bounds: Bounds,
    listening: socket.socket,
    target: str,
    sessions: bool = False,
    temporal: TemporalPlace | None = None,
) -> int:
    import uvicorn

    from blade_runtime.serving.mcp import mcp_asgi_app
    from blade_runtime.serving.serve import EXIT_STORE, MAX_HEAD_BYTES, url_of

    host = listening.getsockname()[0]
    where = "" if temporal is None else f" on Temporal at {temporal.address}"
    endpoint = f"{url_of(host, listening.getsockname()[1])}/mcp"
    access = (
        "anonymous access on (loopback only)"
        if who is None
        else f"every request for {who.id}@{who.tenant}"
    )

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # a clean stop, exit 0 (not re-raised)
            with _signals(self.handle_exit):
                yield

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)  # nothing new admitted; requests in flight go on
            asyncio.get_running_loop().call_later(bounds.grace_s, _cancel_running, served)

        async def startup(self, sockets: list[Any] | None = None) -> None:
            await super().startup(sockets)
            if self.started:  # listening: say where, once
                print(
                    f"blade-runtime mcp serving {target}{where} on {endpoint}; {access}",
                    file=sys.stderr,
                    flush=True,
                )

    served: Runtime | TemporalBackend = runtime

    def config(app: Any) -> uvicorn.Config:
        return uvicorn.Config(
            app,
            log_level="warning",
            http=limited_h11_protocol(bounds.max_connections, bounds.request_timeout_s),
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            limit_concurrency=bounds.max_connections,
            timeout_keep_alive=int(KEEP_ALIVE_S),
            # past the grace the calls are cancelled, and their requests answered, before this
            timeout_graceful_shutdown=int(bounds.grace_s) + 10,
        )

    async def main() -> int:
        nonlocal served
        found = await _served(runtime, temporal)  # on the loop the server's calls run on
        if found is None:
            return EXIT_STORE
        served = found
        app = mcp_asgi_app(
            served,
            principal=who,
            anonymous=who is None,
            inbox_url=inbox_url,
            host="::1" if ":" in host else "127.0.0.1",
            max_body_bytes=bounds.max_message_bytes,
            stateless=not sessions,
        )
        async with _running(served, bounds.grace_s):
            await Server(config(app)).serve([listening])  # returns after a signal, drained
        return 0

    try:
        return asyncio.run(main())
    finally:
        listening.close()
