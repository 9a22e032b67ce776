"""Concurrency slots and resource locks (seed 000, "Interruption"), in one process and across
every worker of one store.

A tool may declare how many of its calls run at once (``concurrency``; a registration also
``worker_concurrency``, per runtime, as DBOS queues bound both) and which resources a
call locks (``locks``: JSON pointers into its final input; two calls whose pointers resolve to
equal values never run at once: ``"/path"`` is the seed's same-file lock). Each becomes a key
with a capacity: ``tool:<name>`` (the registration's name, ``concurrency``),
``worker:<owner>:<name>`` (``worker_concurrency``) and one key per lock
(capacity 1) of the value, the lock's resource name (by default its pointer) and the caller's
tenant (the calls of two tenants never wait on each other's resources).

The rules, as the seed has them:

- A call waits after its permission and its recorded start, before its deadline starts; what it
  waits is never counted against its timeout.
- The wait observes the call's cancellation: a cancelled waiter leaves its queues without
  consuming capacity or disturbing the order of the others; a grant that meets a cancellation
  is given back before the cancelled result returns.
- FIFO: the store orders the waiters of a key by when they first queued, and a call takes all
  its keys at once, never some (so queues never wait on each other in a cycle).
- Released on every exit: a result, an error, a timeout, a cancellation, a suspension (a
  suspended call runs nothing while a person decides; its entry after the answer queues again),
  a lost lease. An implementation that ignored its cancellation keeps its keys until it exits.

The queues are rows of the store (``Store.acquire_slots``: one transaction each time a waiter
looks), so every worker of a store shares them. A row lives under its runtime's lease: a waiter
renews its own as it looks again, and a heartbeat renews the rows of the calls this runtime
holds; a worker that dies stops renewing, and its rows count for nothing once the lease lapses.
A waiter holds no connection between looks: it sleeps with a growing back-off (a release in this
process wakes the waiters here at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from blade_runtime.core.cancel_scope import CancelScope
from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import SlotRecord, StoreError

log = logging.getLogger("blade_runtime")

FIRST_LOOK_S = 0.005
"""How long a waiter first sleeps before it looks again (doubled after each look)."""
LAST_LOOK_S = 0.5
"""The longest it sleeps between two looks: how late a release in another process is seen."""
_KEY_CHARS = 200  # a longer key is stored as its digest
_RESOURCE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

Key = tuple[str, int]
"""A slot key and its capacity."""


class LimitsError(ValueError):
    """A declaration of concurrency or locks that cannot hold (the message names the fix)."""


@dataclass(frozen=True, slots=True)
class Lock:
    """One declared lock: a resource name and the JSON pointer to its value in the input."""

    resource: str
    pointer: str
    tokens: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Lock:
        """``"/path"`` (the resource is the pointer itself) or ``"file:/path"`` (a named
        resource: tools whose pointers differ lock the same files)."""
        if not isinstance(text, str):
            raise LimitsError(f"a lock is a JSON pointer string like '/path', not {text!r}")
        resource, pointer = text, text
        if not text.startswith("/"):
            resource, _, pointer = text.partition(":")
            if not _RESOURCE.fullmatch(resource) or not pointer.startswith("/"):
                raise LimitsError(
                    f"the lock {text!r} is neither a JSON pointer ('/path') nor a named one "
                    "('file:/path', the name of letters, digits, '_', '.' or '-')"
                )
        tokens = tuple(
            token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/")
        )
        if re.search(r"~[^01]|~$", pointer):
            raise LimitsError(f"the lock {text!r}: '~' in a JSON pointer is '~0' or '~1' only")
        return cls(resource, pointer, tokens)

    def value(self, arguments: Mapping[str, Any]) -> tuple[bool, Any]:
        """(True, the value at the pointer) or (False, None) where the input has none."""
        found: Any = arguments
        for token in self.tokens:
            if isinstance(found, dict) and token in found:
                found = found[token]
            elif isinstance(found, list) and token.isdigit() and int(token) < len(found):
                if token != "0" and token.startswith("0"):
                    return False, None
                found = found[int(token)]
            else:
                return False, None
        return True, found


@dataclass(frozen=True, slots=True)
class Limits:
    """What a registration declares: at most ``concurrency`` calls at once in every worker of
    the store and ``worker_concurrency`` in each (None: no limit), and its ``locks``."""

    concurrency: int | None
    locks: tuple[Lock, ...]
    worker_concurrency: int | None = None

    @classmethod
    def of(
        cls,
        concurrency: int | None,
        locks: Collection[str],
        worker_concurrency: int | None = None,
    ) -> Limits | None:
        """The declaration checked (``LimitsError``), or None when it declares nothing."""
        for label, limit in (
            ("concurrency", concurrency),
            ("worker_concurrency", worker_concurrency),
        ):
            if limit is not None and (
                isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
            ):
                raise LimitsError(f"{label}={limit!r} is not a positive integer (None: no limit)")
        if isinstance(locks, str):
            raise LimitsError(f"locks={locks!r} is one string; pass a list: locks=[{locks!r}]")
        parsed = tuple(dict.fromkeys(Lock.parse(lock) for lock in locks))
        if concurrency is None and worker_concurrency is None and not parsed:
            return None
        return cls(concurrency, parsed, worker_concurrency)

    def keys(
        self, name: str, tenant: str, arguments: Mapping[str, Any], owner: str
    ) -> tuple[Key, ...]:
        """The keys a call of ``name`` with ``arguments`` (its final input) takes on the
        runtime ``owner``, sorted: a lock whose pointer finds nothing in the input locks
        nothing."""
        keys: dict[str, int] = {}
        if self.concurrency is not None:
            keys[_bounded(f"tool:{name}")] = self.concurrency
        if self.worker_concurrency is not None:
            keys[_bounded(f"worker:{owner}:{name}")] = self.worker_concurrency
        for lock in self.locks:
            there, value = lock.value(arguments)
            if there:
                named = json.dumps(
                    [tenant, lock.resource, value], sort_keys=True, separators=(",", ":")
                )
                keys[_bounded(f"lock:{named}")] = 1
        return tuple(sorted(keys.items()))


def _bounded(key: str) -> str:
    if len(key) <= _KEY_CHARS:
        return key
    kind = key.partition(":")[0]
    return f"{kind}:sha256:{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()}"


class Slots:
    """This runtime's side of the queues: its waiters, what its calls hold, the heartbeat."""

    def __init__(self, io: StoreAccess, owner: str, lease_s: float) -> None:
        self.io = io
        self.store = io.store
        self.owner = owner
        self.lease_s = lease_s
        self.held: dict[str, tuple[Key, ...]] = {}  # by call id: the keys it holds
        self.waiting: dict[str, CancelScope] = {}  # by call id: its scope, while it waits
        self._scopes: dict[str, CancelScope] = {}  # by call id: a holder's scope
        self._wake: asyncio.Event | None = None
        self._beat: asyncio.Task[None] | None = None
        self._leaving: set[asyncio.Task[None]] = set()
        self._lineage: dict[str, frozenset[str]] = {}  # by call id: what it and its parents hold

    def keys_of(self, call_id: str, keys: tuple[Key, ...], parent: str | None) -> tuple[Key, ...]:
        """A call's keys to wait for: a child's are less those its parent, or an ancestor,
        holds (else it would wait on its parent, which waits on it); what they hold is then
        the child's too, for its own children, until it ends (``release``)."""
        above = None if parent is None else self._lineage.get(parent)
        if not above:
            return keys
        self._lineage[call_id] = above
        return tuple(key for key in keys if key[0] not in above)

    async def acquire(
        self,
        entry: SlotRecord,
        keys: Sequence[Key],
        scope: CancelScope,
        waiting: Callable[[], Awaitable[None]],
    ) -> None:
        """Queue on ``keys`` and return once they are all held. ``waiting`` runs once, when the
        first look finds them taken. A cancellation leaves the queues (an attempt in flight is
        waited out first, then its rows deleted) and propagates; a ``StoreError`` too."""
        call_id = entry.call_id
        scope.bind()
        delay = FIRST_LOOK_S
        attempt: asyncio.Future[bool] | None = None
        try:
            while True:
                wake = self._event()
                attempt = asyncio.ensure_future(
                    self.io(self.store.acquire_slots, entry, keys, self.lease_s)
                )
                if await asyncio.shield(attempt):
                    break
                attempt = None
                if call_id not in self.waiting:
                    self.waiting[call_id] = scope
                    self._heartbeat()
                    await waiting()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)
                delay = min(delay * 2, LAST_LOOK_S)
        except BaseException:
            self.forget(call_id)
            await self._leave(call_id, attempt)
            raise
        finally:
            self.waiting.pop(call_id, None)
        self.held[call_id] = tuple(keys)
        self._lineage[call_id] = self._lineage.get(call_id, frozenset()) | {k for k, _ in keys}
        self._scopes[call_id] = scope
        self._heartbeat()
        if scope.reason is not None:  # granted as it was cancelled: give it all back first
            await self.release(call_id)
            raise asyncio.CancelledError

    async def release(self, call_id: str) -> None:
        """The call's entry ended here: leave every queue it is in, and wake the waiters here."""
        self._lineage.pop(call_id, None)
        self._scopes.pop(call_id, None)
        if self.held.pop(call_id, None) is not None:
            await self._leave(call_id)

    def forget(self, call_id: str) -> None:
        """The call ends without holding anything (its wait failed)."""
        self._lineage.pop(call_id, None)

    def release_later(self, call_id: str, detached: asyncio.Task[Any]) -> None:
        """Release once ``detached`` (an implementation that ignored its cancellation) exits."""
        detached.add_done_callback(lambda _: self._spawn(self.release(call_id)))

    async def _leave(self, call_id: str, attempt: asyncio.Future[Any] | None = None) -> None:
        async def leave() -> None:
            if attempt is not None:
                with contextlib.suppress(BaseException):
                    await attempt  # its rows are written before they are deleted
            try:
                await self.io(self.store.release_slots, call_id, self.owner)
            except StoreError as error:  # its rows lapse with the lease nobody renews now
                log.error("call %s: its slots could not be released: %s", call_id, error)
            wake, self._wake = self._wake, None
            if wake is not None:
                wake.set()

        task = self._spawn(leave())
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)

    def _spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)
        return task

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    def _heartbeat(self) -> None:
        if self._beat is None or self._beat.done():
            self._beat = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        """Every third of the lease while anything is held or waits here: renew their rows.
        A holder whose rows are gone (this process stalled past its lease and another worker
        took its place) is cancelled: two calls must not run where one may."""
        while self.held or self.waiting:
            await asyncio.sleep(self.lease_s / 3)
            asked = tuple(self.held)
            try:
                kept = await self.io(
                    self.store.renew_slots, self.owner, asked + tuple(self.waiting), self.lease_s
                )
            except StoreError as error:
                log.error("slot renewal failed: %s", error)
                continue
            for call_id in asked:
                scope = self._scopes.get(call_id)
                if call_id in kept or scope is None or call_id not in self.held:
                    continue
                log.error("call %s: its slots lapsed and were taken; cancelling it", call_id)
                scope.cancel("lease_lost", "its concurrency slot lapsed and was taken")

    def close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
