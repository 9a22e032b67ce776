"""``MemoryStore``: everything in this process (tests, or apps that need no durability).

It is the SQLite dialect on a private in-memory database: the same rules as every store (which
calls are recorded, fencing, paging, retention), nothing on disk, nothing shared with another
process. What it records: the calls that wait or write ToolData, or whose spec asks for a lease
(calls that do none of these are not stored anywhere: the runtime's fast path), their actions,
data and events, files and triggers; the last ``keep_settled`` settled calls stay readable with
everything of theirs, older ones are pruned as more settle (a tenth of it at a time). Its
operations never wait for a lock another process holds, so the runtime calls it on its event
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue

from blade_runtime.core.store import Claim, Event, Resolution, Resolved
from blade_runtime.stores.sqlite import SQLiteStore, _Transaction

DEFAULT_KEEP_SETTLED = 1000
PRUNE_EVERY = 100  # commits between two sweeps of what ``keep_settled`` lets go


class MemoryStore(SQLiteStore):
    """A store in this process's memory; one lock makes every operation atomic."""

    durable = False
    waits = False  # one lock, held only while the database (in memory) is read or changed
    inline_first = False

    def __init__(self, *, keep_settled: int | None = DEFAULT_KEEP_SETTLED) -> None:
        self.keep_settled = keep_settled
        self._since_prune = 0
        self._lock = threading.RLock()
        self._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        super().__init__(":memory:")
        self.url = "memory:"

    def _connection(self) -> sqlite3.Connection:
        return self._db

    def _transaction(self) -> _Transaction:
        return _Locked(self, self._db)

    def _fetch(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        with self._lock:
            return super()._fetch(sql, params)

    def settle(self, claim: Claim, result: JsonValue, event: Event) -> Event:
        made = super().settle(claim, result, event)
        self._one_settled()
        return made

    def resolve(self, action_id: str, resolution: Resolution, event: Event) -> Resolved:
        resolved = super().resolve(action_id, resolution, event)
        if resolution.call_state == "settled":
            self._one_settled()
        return resolved

    def _one_settled(self) -> None:
        """Prune what ``keep_settled`` lets go once a tenth of it has settled since the last
        prune: the store holds at most 10% more settled calls than it keeps."""
        keep = self.keep_settled
        if keep is None:
            return
        self._since_prune += 1
        if self._since_prune >= max(1, keep // 10):
            self._since_prune = 0
            while self.prune(keep=keep).calls:
                pass

    def _committed(self) -> None:
        pass  # no file, no checkpoint

    def _pruned(self) -> None:
        pass  # memory is given back as rows go

    def nowait(self) -> contextlib.AbstractContextManager[None]:
        """A no-op: no operation here waits."""
        return contextlib.nullcontext()

    def renewer(self) -> MemoryRenewer:  # type: ignore[override]
        return MemoryRenewer(self)

    def alive(self, owner: str) -> bool | None:
        return None  # one process: every owner in it is a runtime that may still run

    async def changed(self, timeout_s: float, mark: int) -> None:
        await asyncio.sleep(timeout_s)  # nothing outside this process writes here

    def close(self) -> None:
        pass  # the data lives as long as the store object: a closed runtime's store stays

    def _open(self, busy_timeout_ms: int, *, shared: bool = True) -> sqlite3.Connection:
        return self._db


class _Locked(_Transaction):
    """A transaction under the store's lock (its one connection is shared by threads)."""

    __slots__ = ()

    def __enter__(self) -> Any:
        store = self._store
        assert isinstance(store, MemoryStore)
        store._lock.acquire()
        try:
            return super().__enter__()
        except BaseException:
            store._lock.release()
            raise

    def __exit__(self, *exc: Any) -> None:
        store = self._store
        assert isinstance(store, MemoryStore)
        try:
            super().__exit__(*exc)
        finally:
            store._lock.release()


class MemoryRenewer:
    """``MemoryStore.renewer()``: its renewals, from any thread."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def renew(self, owner: str, lease_s: float) -> set[str]:
        return self._store.renew(owner, lease_s)

    def close(self) -> None:
        pass
