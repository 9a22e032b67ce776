"""``blade-runtime serve MODULE:RUNTIME --store URL``: the HTTP API with uvicorn, and the
background recovery loop beside it, until SIGTERM or SIGINT.

RUNTIME is a ``Runtime``, or a function returning one (called with ``store=`` the opened
store). ``--auth MODULE:FUNCTION`` names the application's ``authenticate(request)``; without
it, ``--allow-anonymous`` serves local development on a loopback address only.

On SIGTERM uvicorn stops accepting connections and lets the requests in flight finish (event
streams are closed after a grace period, 5 s); then the recovery loop stops, the runtime tells
the store it is gone (its calls become claimable by other workers at once) and the store is
closed: what was committed stays committed, and nothing is left half-written.

Every error the API promises as JSON is JSON, also those uvicorn answers before the app sees
the request: ``uvicorn_options()`` (which ``serve`` uses; pass it to your own ``uvicorn.run``)
serves HTTP/1.1 with h11 and request heads (request line and headers) of up to 64 KiB (h11's own
default is 16 KiB): a larger head is ``431 {"code": "HEADERS_TOO_LARGE", ...}`` (from the app,
``blade_runtime.serving.http.MAX_HEADER_BYTES``, or, for a head too large to reach it, from
the server, connection then closed), a request that is not HTTP ``400 {"code":
"MALFORMED_REQUEST", ...}``, each on one line.

``serve`` prints ``blade-runtime serving ... on http://HOST:PORT`` once the socket listens; a
port it cannot bind (in use, or not allowed) is one line on stderr and exit code 4
(``EXIT_BIND``), nothing served.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from blade_runtime.core.store import Store, StoreError
from blade_runtime.runtime import Runtime
from blade_runtime.stores.urls import masked, open_store

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_BIND = 4

MAX_HEAD_BYTES = 64 * 1024
"""h11's limit of a request head still incomplete (the app refuses a complete head over
``MAX_HEADER_BYTES``, the same 64 KiB, with the same 431)."""


class ServeError(Exception):
    """A usage error of ``serve``: one line, exit 2."""


def port_number(text: str) -> int | None:
    """``text`` as a TCP port (0 to 65535), or None: the commands' usage error, not a traceback
    from the server (serve's --port, mcp's --http HOST:PORT)."""
    return int(text) if text.isascii() and text.isdigit() and int(text) <= 65535 else None


def load(target: str, what: str) -> Any:
    """``module:attribute`` (the current folder is importable, as with ``python -m``)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ServeError(f"{what} is MODULE:NAME, not {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ServeError(f"{what} {target}: cannot import {module_name}: {error}") from None
    found = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ServeError(f"{what} {target}: {module_name} has no {attribute}")
        found = getattr(found, part)
    return found


_PROTOCOL: Any = None
LINGER_S = 2.0  # how long a refused connection's remaining request is read and dropped


def json_h11_protocol() -> Any:
    """uvicorn's h11 protocol, with its own refusals (a request head over the limit, a request
    that is not HTTP) answered as the API's JSON errors instead of ``400 text/plain``."""
    global _PROTOCOL
    if _PROTOCOL is not None:
        return _PROTOCOL
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JsonH11Protocol(H11Protocol):
        refused = False

        def send_400_response(self, msg: str) -> None:
            head = len(self.conn.trailing_data[0])
            if head > MAX_HEAD_BYTES:
                status, code = 431, "HEADERS_TOO_LARGE"
                message = f"The request's headers are larger than {MAX_HEAD_BYTES} bytes."
            else:
                status, code, message = 400, "MALFORMED_REQUEST", "The request is not HTTP/1.1."
            body = json.dumps({"code": code, "message": message}, separators=(",", ":"))
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            try:
                self.transport.write(
                    self.conn.send(h11.Response(status_code=status, headers=headers))
                )
                self.transport.write(self.conn.send(h11.Data(data=body.encode())))
                self.transport.write(self.conn.send(h11.EndOfMessage()))
            except h11.LocalProtocolError:  # no response can be sent on this connection now
                self.transport.close()
                return
            # Closing with the rest of the request unread would reset the connection, and the
            # client, still sending, would lose the answer: end the answer, read and drop what
            # still comes for a moment, then close.
            self.refused = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if not self.refused:
                super().data_received(data)

    _PROTOCOL = JsonH11Protocol
    return _PROTOCOL


def uvicorn_options() -> dict[str, Any]:
    """What ``uvicorn.Config`` (or ``uvicorn.run``) needs to serve the API so that every error
    is JSON: the h11 protocol above and its head limit (see the module's doc)."""
    return {"http": json_h11_protocol(), "h11_max_incomplete_event_size": MAX_HEAD_BYTES}


def build_runtime(target: str, store: Store) -> Runtime:
    found = load(target, "RUNTIME")
    if isinstance(found, Runtime):
        if found.store.url != store.url:
            raise ServeError(
                f"{target} is a Runtime over {found.store.url}, not {store.url}: make it a "
                "function taking store= to serve it over --store"
            )
        return found
    if not callable(found):
        raise ServeError(f"{target} is neither a Runtime nor a function returning one")
    if not takes_store(found):
        raise ServeError(
            f"{target} cannot be called with store=: make it a function taking the opened "
            "store as store= (def make_runtime(store): return Runtime(store=store)), or a Runtime"
        )
    built = found(store=store)
    if not isinstance(built, Runtime):
        raise ServeError(f"{target}(store=...) returned {type(built).__name__}, not a Runtime")
    return built


def takes_store(factory: Any) -> bool:
    """Whether ``factory(store=...)`` binds (a factory whose signature cannot be read is
    taken at its word)."""
    try:
        inspect.signature(factory).bind(store=None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin)
        return True
    return True


def serve(
    target: str,
    *,
    store_url: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    auth: str | None = None,
    allow_anonymous: bool = False,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    recovery_interval_s: float = 1.0,
    grace_s: float = 5.0,
) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit code. It answers the loopback
    names, ``host`` when it is an address or a name (not a wildcard such as 0.0.0.0) and
    ``allowed_hosts``; browser pages of its own origin and ``allowed_origins``."""
    try:
        import uvicorn

        from blade_runtime.serving.http import create_app
    except ImportError as missing:
        print(f"error: {missing}: pip install 'blade-runtime[http]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        authenticate, sites = _access(host, auth, allow_anonymous, allowed_hosts, allowed_origins)
    except (ValueError, ServeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    listening = _listening(host, port)
    if listening is None:
        return EXIT_BIND
    try:
        store = open_store(store_url)
    except StoreError as error:
        listening.close()
        print(f"error: {error}", file=sys.stderr)
        return EXIT_STORE
    try:
        runtime = build_runtime(target, store)
    except ServeError as error:
        listening.close()
        store.close()
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    app = create_app(
        runtime,
        authenticate=authenticate,
        allow_anonymous=allow_anonymous,
        allowed_hosts=sites.hosts,
        allowed_origins=sites.origins,
    )
    _wildcard_note(host, allowed_hosts)
    config = uvicorn.Config(
        app,
        lifespan="off",
        timeout_graceful_shutdown=int(max(1, grace_s)),
        log_level="info",
        **uvicorn_options(),
    )
    api = app.state.api
    where = url_of(host, listening.getsockname()[1])

    banner = f"blade-runtime serving {target} over {masked(store.url)} on {where}"
    # event streams end at the signal rather than after the grace period
    server = _stopping_server(config, banner, api.close_streams)

    async def main() -> None:
        recovery = asyncio.create_task(runtime.run_recovery(recovery_interval_s))
        try:
            await server.serve([listening])  # returns after SIGTERM/SIGINT, requests drained
        finally:
            recovery.cancel()
            await asyncio.gather(recovery, return_exceptions=True)
            await _drain(grace_s)
            await runtime.close()

    try:
        asyncio.run(main())
    finally:
        listening.close()
        store.close()
    print("blade-runtime stopped", file=sys.stderr, flush=True)
    return EXIT_OK


def _access(
    host: str,
    auth: str | None,
    allow_anonymous: bool,
    allowed_hosts: Sequence[str],
    allowed_origins: Sequence[str],
) -> tuple[Any, Any]:
    """The application's ``authenticate`` and the sites the server answers (``ServeError`` or
    ``ValueError``: a usage error)."""
    from blade_runtime.serving.http import Sites, loopback

    if auth is None and not allow_anonymous:
        raise ServeError("pass --auth MODULE:FUNCTION (or --allow-anonymous on loopback)")
    if allow_anonymous and not loopback(host):
        raise ServeError(f"--allow-anonymous is refused on {host}: bind to 127.0.0.1")
    authenticate = load(auth, "--auth") if auth else _nobody
    if not callable(authenticate):
        raise ServeError(f"--auth {auth} is not a function")
    hosts = [*allowed_hosts] if _wildcard(host) else [host, *allowed_hosts]
    return authenticate, Sites.of(hosts, allowed_origins)


def _wildcard_note(host: str, allowed_hosts: Sequence[str]) -> None:
    if _wildcard(host) and not allowed_hosts:
        print(
            f"note: bound to {host}, this server answers only requests addressed to a loopback "
            "name: name the others with --allowed-host",
            file=sys.stderr,
        )


def _stopping_server(config: Any, banner: str, on_exit: Any = None) -> Any:
    """uvicorn's server, with SIGTERM and SIGINT a clean stop (exit 0), ``on_exit`` run at the
    signal, and ``banner`` printed once the socket listens."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.handle_exit, signum, None)
            try:
                yield
            finally:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            if on_exit is not None:
                on_exit()

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:  # listening: say where, once
                print(banner, file=sys.stderr, flush=True)

    return Server(config)


def serve_temporal(
    target: str,
    *,
    temporal: str,
    namespace: str = "default",
    task_queue: str = "blade",
    host: str = "127.0.0.1",
    port: int = 8000,
    auth: str | None = None,
    allow_anonymous: bool = False,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    grace_s: float = 5.0,
) -> int:
    """``serve --temporal HOST:PORT``: ``create_temporal_app`` over the tools of ``target``
    (the registrations Temporal's workers run; a Runtime or a function returning one) on the
    task queue ``task_queue`` of ``namespace``, with the MCP endpoint at ``/mcp`` where
    ``blade-runtime[mcp]`` is installed, until SIGTERM/SIGINT. A Temporal server that cannot be
    reached is one line and exit 3; there is no recovery loop (Temporal recovers calls)."""
    try:
        import uvicorn
        from temporalio.client import Client
        from temporalio.service import RPCError

        from blade_runtime.serving.http.temporal import create_temporal_app
        from blade_runtime.temporal import TemporalTools
    except ImportError as missing:
        print(f"error: {missing}: pip install 'blade-runtime[http,temporal]'", file=sys.stderr)
        return EXIT_USAGE
    from blade_runtime.serving.mcp_cli import load_runtime

    try:
        authenticate, sites = _access(host, auth, allow_anonymous, allowed_hosts, allowed_origins)
        runtime = load_runtime(target, None)
    except (ValueError, ServeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    listening = _listening(host, port)
    if listening is None:
        return EXIT_BIND
    mcp = importlib.util.find_spec("mcp") is not None
    where = url_of(host, listening.getsockname()[1])

    async def main() -> int:
        try:  # on the loop the server's calls run on
            client = await Client.connect(temporal, namespace=namespace)
        except (RuntimeError, RPCError, OSError) as error:
            print(f"error: Temporal at {temporal}: {error}", file=sys.stderr)
            return EXIT_STORE
        tools = TemporalTools(client, task_queue=task_queue, runtime=runtime)
        app = create_temporal_app(
            tools,
            authenticate,
            allowed_hosts=sites.hosts,
            allowed_origins=sites.origins,
            mcp=mcp,
            allow_anonymous=allow_anonymous,
        )
        _wildcard_note(host, allowed_hosts)
        config = uvicorn.Config(
            app,
            lifespan="on" if mcp else "off",  # the MCP SDK's session manager
            timeout_graceful_shutdown=int(max(1, grace_s)),
            log_level="info",
            **uvicorn_options(),
        )
        served = f"{target} on Temporal at {temporal} (task queue {task_queue}) on {where}"
        server = _stopping_server(config, f"blade-runtime serving {served}")
        await server.serve([listening])  # returns after SIGTERM/SIGINT, requests drained
        await _drain(grace_s)
        return EXIT_OK

    try:
        code = asyncio.run(main())
    finally:
        listening.close()
    if code == EXIT_OK:
        print("blade-runtime stopped", file=sys.stderr, flush=True)
    return code


def _listening(host: str, port: int) -> socket.socket | None:
    """``listen``, or None once the one line saying why is printed (exit ``EXIT_BIND``)."""
    try:
        return listen(host, port)
    except OSError as error:
        print(f"error: cannot listen on {url_of(host, port)}: {error.strerror}", file=sys.stderr)
        return None


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (OSError when it cannot be: the port is in use, or
    not this process's to bind), before anything else starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP, and an accepted socket inherits the listener's. Without it a kept-alive connection
    # waited ~40 ms for each answer (uvicorn writes the head and the body in two sends:
    # Nagle held the body back until the client's delayed ACK of the head).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def _nobody(request: Any) -> None:
    """--allow-anonymous: no request is anyone's (async: it needs no worker thread)."""


def _wildcard(host: str) -> bool:
    """An address that stands for every interface (it names no host a request is sent to)."""
    return host.strip("[]") in ("0.0.0.0", "::", "")


def url_of(host: str, port: int) -> str:
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}"


async def _drain(grace_s: float) -> None:
    """Let the tasks still running (resumptions the recovery loop started) finish within the
    grace period; what is left is cancelled by ``asyncio.run`` and gets its cleanup there."""
    current = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if others:
        _, pending = await asyncio.wait(others, timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=grace_s)
