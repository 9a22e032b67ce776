"""Stalls: a worker stalled past its lease, in process (its heartbeat cannot reach the store), and a
store stalled by another connection holding its lock."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from typing import Any

import psycopg

from blade_runtime import Runtime
from blade_runtime.core.store import Store, StoreUnavailable
from blade_runtime.stores.urls import sqlite_path


class Stalled:
    """The store as a stalled worker reaches it: while ``stalled``, its heartbeat's renewal
    waits (as on a locked store; its lease runs out, and the runtime is not told so until the
    wait ends); everything else goes through to the real store."""

    waits = True  # a store that stalls waits: the runtime renews from a thread of its own

    def __init__(self, store: Store) -> None:
        self._store = store
        self._released = threading.Event()

    @property
    def stalled(self) -> bool:
        return not self._released.is_set()

    @stalled.setter
    def stalled(self, value: bool) -> None:
        if value:
            self._released.clear()
        else:
            self._released.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def renew(self, owner: str, lease_s: float) -> set[str]:
        if self.stalled:
            self._released.wait()
            raise StoreUnavailable("the worker was stalled")
        return self._store.renew(owner, lease_s)

    def renewer(self) -> Stalled:
        return self

    def close(self) -> None:
        """The renewer's close: the store itself stays open."""


async def taken_over(survivor: Runtime, call_id: str) -> list[Any]:
    """Sweep on the survivor until its recovery has taken ``call_id`` up (its lease lapsed)."""
    while True:
        results = await survivor.recover()
        if any(r.call.call_id == call_id for r in results):
            return results
        await asyncio.sleep(0.05)


def hold_lock(url: str, seconds: float, held: threading.Event) -> None:
    """Hold the store's lock from a connection of its own for ``seconds``."""
    if url.startswith("sqlite"):
        db = sqlite3.connect(sqlite_path(url), isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(seconds)
        db.execute("ROLLBACK")
        db.close()
        return
    with psycopg.connect(url) as db:
        db.execute("LOCK TABLE blade_calls IN ACCESS EXCLUSIVE MODE")
        held.set()
        time.sleep(seconds)
        db.rollback()
