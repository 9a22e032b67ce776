"""The application's ``authenticate(request)``, called so that it never blocks the event loop.

An ``async def`` (or an object whose ``__call__`` is one) runs on the loop: it must not block.
A plain function may (a password hash of an API key, a blocking lookup): it runs in a worker
thread of a pool of its own, ``threads`` at most, so that one slow check never holds up another
tenant's request, nor the event streams, nor the server's own work. Whatever it raises, a
``CancelledError`` included, is the application's bug: 500 ``INTERNAL``, its message (which may
hold a credential) only named by type in the log.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeAlias

from starlette.requests import Request

from blade_runtime.core.caller import Principal
from blade_runtime.serving.http.errors import HttpError

log = logging.getLogger("blade_runtime.serving.http")

Authenticate: TypeAlias = Callable[[Request], "Principal | Awaitable[Principal | None] | None"]

DEFAULT_AUTH_THREADS: Final = 16


class AuthenticationFailed(Exception):
    """``authenticate`` raised: the request is answered 500 ``INTERNAL``."""

    code = HttpError.INTERNAL
    message = "Authentication failed on the server."


class Authenticator:
    """Calls ``authenticate``: on the loop if it is async, else in a bounded thread pool."""

    def __init__(self, authenticate: Authenticate, threads: int = DEFAULT_AUTH_THREADS) -> None:
        if not callable(authenticate):
            raise TypeError("authenticate must be a function of the request")
        if threads < 1:
            raise ValueError(f"auth_threads must be at least 1, not {threads}")
        self.authenticate = authenticate
        self.on_loop = is_async(authenticate)
        self.pool = (
            None
            if self.on_loop
            else ThreadPoolExecutor(threads, thread_name_prefix="blade-authenticate")
        )

    async def __call__(self, request: Request) -> Principal | None:
        """The request's principal, None when ``authenticate`` gave none (or not a Principal),
        ``AuthenticationFailed`` when it raised."""
        try:
            if self.pool is None:
                found: Any = self.authenticate(request)
            else:
                loop = asyncio.get_running_loop()
                found = await loop.run_in_executor(self.pool, self.authenticate, request)
            if inspect.isawaitable(found):
                found = await found
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this request is being cancelled (the server stops), not a failure
            log.error("authenticate raised CancelledError")
            raise AuthenticationFailed() from None
        except Exception as error:  # the application's bug: say so without its message
            log.error("authenticate raised %s", type(error).__name__)
            raise AuthenticationFailed() from None
        return found if isinstance(found, Principal) else None


def is_async(function: Any) -> bool:
    """Whether calling ``function`` returns a coroutine (an ``async def``, also behind
    ``functools.partial`` or as an object's ``async def __call__``)."""
    while isinstance(function, functools.partial):
        function = function.func
    call = None if inspect.isroutine(function) else type(function).__call__
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)
