"""The runtime's one way to its store: the event loop never waits on it.

A store that does no I/O (``MemoryStore``) is called inline. A durable one is called in threads of
this runtime's own: a locked SQLite file or a PostgreSQL pool without a free connection then holds
up the calls that need the store, never the event loop, its other coroutines or the lease
heartbeat (which has a thread and a connection of its own: ``leases``). A store that can refuse
to wait (SQLite: ``inline_first``) is tried inline first, without waiting for its lock, and
handed to a thread only when it would have waited: an uncontended SQLite commit costs no thread
hop.

An observer with a ``store_operation(name, seconds)`` method (``Runtime.observe``) is told how
long each operation took, waits for a lock or a thread included: what the call waited.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from blade_runtime.core.store import Store, StoreBusy

T = TypeVar("T")
log = logging.getLogger("blade_runtime")

THREADS = 8
"""Store threads per runtime: calls waiting on a locked store queue behind this many."""


class StoreAccess:
    """``await io(store.method, *args)``: one store operation, never on the loop's time."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.waits = store.waits
        self.inline_first = store.waits and store.inline_first
        self._executor: ThreadPoolExecutor | None = None
        self.timers: list[Callable[[str, float], object]] = []

    async def __call__(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.timers:
            return await self._timed(self._call, method, args, kwargs)
        return await self._call(method, *args, **kwargs)

    async def _call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if not self.waits:
            return method(*args, **kwargs)
        if self.inline_first:
            try:
                with self.store.nowait():
                    return method(*args, **kwargs)
            except StoreBusy:
                pass  # it would wait for the lock: wait in a thread instead
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._threads(), functools.partial(method, *args, **kwargs)
        )

    async def thread(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One store operation that may read many rows (a listing's page, a prune): never on
        the event loop where the store does I/O, even where a write would be tried there
        first (SQLite's reads do not wait for a lock, so ``nowait()`` would not hand a long one
        to a thread)."""
        if self.timers:
            return await self._timed(self._thread, method, args, kwargs)
        return await self._thread(method, *args, **kwargs)

    async def _timed(
        self,
        way: Callable[..., Any],
        method: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        began = time.perf_counter()
        try:
            result: T = await way(method, *args, **kwargs)
            return result
        finally:
            elapsed = time.perf_counter() - began
            name = getattr(method, "__name__", "operation")
            for timer in self.timers:
                try:
                    timer(name, elapsed)
                except Exception:  # an observer's own failure never fails the operation
                    log.exception("the store_operation observer raised")

    async def _thread(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if not self.waits:
            return method(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._threads(), functools.partial(method, *args, **kwargs)
        )

    def _threads(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(THREADS, thread_name_prefix="blade-store")
        return self._executor

    def close(self) -> None:
        """Stop the threads once what they run has returned (the store stays open)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=False)
            self._executor = None
