"""``blade-runtime serve MODULE:RUNTIME --store URL``: the HTTP API with uvicorn, and the
background recovery loop beside it, until SIGTERM or SIGINT.

RUNTIME is a ``Runtime``, or a function returning one (called with ``store=`` the opened
store). ``--auth MODULE:FUNCTION`` names the application's ``authenticate(request)``; without
it, ``--allow-anonymous`` serves local development on a loopback address only.

On SIGTERM uvicorn stops accepting connections and lets the requests in flight finish (event
streams are closed after ``--grace`` seconds); then the recovery loop stops, the runtime tells
the store it is gone (its calls become claimable by other workers at once) and the store is
closed: what was committed stays committed, and nothing is left half-written.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

from blade_runtime.core.store import Store, StoreError
from blade_runtime.runtime import Runtime
from blade_runtime.stores.urls import masked, open_store

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_STORE = 3


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
    built = found(store=store)
    if not isinstance(built, Runtime):
        raise ServeError(f"{target}(store=...) returned {type(built).__name__}, not a Runtime")
    return built


def serve(
    target: str,
    *,
    store_url: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    auth: str | None = None,
    allow_anonymous: bool = False,
    recovery_interval_s: float = 1.0,
    grace_s: float = 5.0,
) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit code."""
    try:
        import uvicorn

        from blade_runtime.serving.http import create_app, loopback
    except ImportError as missing:
        print(f"error: {missing}: pip install 'blade-runtime[http]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        if auth is None and not allow_anonymous:
            raise ServeError("pass --auth MODULE:FUNCTION (or --allow-anonymous on loopback)")
        if allow_anonymous and not loopback(host):
            raise ServeError(f"--allow-anonymous is refused on {host}: bind to 127.0.0.1")
        authenticate = load(auth, "--auth") if auth else (lambda request: None)
        if not callable(authenticate):
            raise ServeError(f"--auth {auth} is not a function")
    except ServeError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        store = open_store(store_url)
    except StoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_STORE
    try:
        runtime = build_runtime(target, store)
    except ServeError as error:
        store.close()
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    app = create_app(runtime, authenticate=authenticate, allow_anonymous=allow_anonymous)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        timeout_graceful_shutdown=int(max(1, grace_s)),
        log_level="info",
    )
    api = app.state.api

    class Server(uvicorn.Server):
        """uvicorn, with SIGTERM and SIGINT a clean stop (exit 0) that also ends event streams
        at once rather than after the grace period."""

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
            api.close_streams()

    server = Server(config)

    async def main() -> None:
        recovery = asyncio.create_task(runtime.run_recovery(recovery_interval_s))
        try:
            await server.serve()  # returns after SIGTERM/SIGINT, once requests drained
        finally:
            recovery.cancel()
            await asyncio.gather(recovery, return_exceptions=True)
            await _drain(grace_s)
            await runtime.close()

    print(
        f"blade-runtime serving {target} over {masked(store.url)} on http://{host}:{port}",
        file=sys.stderr,
        flush=True,
    )
    try:
        asyncio.run(main())
    finally:
        store.close()
    print("blade-runtime stopped", file=sys.stderr, flush=True)
    return EXIT_OK


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
