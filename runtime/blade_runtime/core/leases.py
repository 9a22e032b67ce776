"""The heartbeat that keeps this runtime's claims on its running calls.

A durable call runs under a lease: its owner and an expiry, written with its start (or its
claim). While any such call runs here, the heartbeat renews every lease this runtime holds with
one store statement each third of the lease, so a call that runs for a second costs at most one
renewal. A call whose lease another worker took over (this process stalled past its lease) is
cancelled here: its late result would not be recorded anyway.

On a store that can wait (SQLite, PostgreSQL) the heartbeat is a thread with a connection of its
own (``Store.renewer``): neither a stalled event loop nor a store whose pool or lock the calls
are waiting on can starve it. ``confirmed_at`` says when a renewal last succeeded: a call whose
lease no renewal has confirmed for a whole lease (the store refused every one) may have been
taken over, so it is cancelled here rather than run on beside its new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from blade_runtime.core.cancel_scope import CancelScope
from blade_runtime.core.store import Store, clock

log = logging.getLogger("blade_runtime")


class Leases:
    """The calls this runtime holds leases on, and the heartbeat that renews them."""

    def __init__(self, store: Store, owner: str, lease_s: float) -> None:
        self.store = store
        self.owner = owner
        self.lease_s = lease_s
        self.confirmed_at = 0.0  # when the last renewal began that the store confirmed
        self._held: dict[str, CancelScope] = {}
        self._since: dict[str, float] = {}  # when each held call's lease was last written
        self._lock = threading.Lock()  # _held is read by the heartbeat thread
        self._threaded = store.waits
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self, scope: CancelScope) -> None:
        """Keep ``scope``'s call leased while it runs (the scope must be bound to its task)."""
        scope.bind()
        thread = None
        with self._lock:
            self._held[scope.call.call_id] = scope
            self._since[scope.call.call_id] = clock()
            if self._threaded and self._thread is None:
                thread = self._thread = threading.Thread(
                    target=self._heartbeat,
                    args=(asyncio.get_running_loop(),),
                    name="blade-leases",
                    daemon=True,
                )
        if thread is not None:
            thread.start()
        elif not self._threaded and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._beat())

    def release(self, call_id: str) -> None:
        """The call was settled or suspended here: its lease is no longer kept."""
        with self._lock:
            self._held.pop(call_id, None)
            self._since.pop(call_id, None)

    def holds(self, call_ids: tuple[str, ...]) -> bool:
        """Whether any of ``call_ids`` is still held (running, or its end being written)."""
        with self._lock:
            return any(call_id in self._held for call_id in call_ids)

    def unconfirmed(self, now: float) -> None:
        """Renewals failed: cancel each call whose lease no renewal has confirmed for a whole
        lease (another worker may hold it now; its outcome is the one the store records)."""
        for call_id, scope in list(self._held.items()):
            vouched = max(self.confirmed_at, self._since.get(call_id, now))
            if now - vouched <= self.lease_s or not scope.active:
                continue
            log.error(
                "%s (call %s): no renewal of its lease succeeded for %.1f s; cancelling it here",
                scope.call.name,
                call_id,
                now - vouched,
            )
            scope.cancel("lease_lost", "this runtime could not renew its lease")
            self.release(call_id)

    def renewed(self, asked: tuple[str, ...], held: set[str]) -> None:
        """A renewal of the calls ``asked`` kept ``held``: cancel the others still running."""
        for call_id in asked:
            scope = self._held.get(call_id)
            if call_id in held or scope is None or not scope.active:
                continue
            log.error(
                "%s (call %s): another worker claimed it after this runtime's lease lapsed; "
                "cancelling it here",
                scope.call.name,
                call_id,
            )
            scope.cancel("lease_lost", "another worker took the call over")
            self.release(call_id)

    def renew(self) -> None:
        """One renewal now, on this thread (a store that never waits)."""
        asked = self._asked()
        if asked:
            started = clock()
            held = self.store.renew(self.owner, self.lease_s)
            self.confirmed_at = started
            self.renewed(asked, held)

    def _asked(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._held)

    async def _beat(self) -> None:
        while self._held:
            await asyncio.sleep(self.lease_s / 3)
            try:
                self.renew()
            except Exception as error:  # the store is down: try again next beat
                log.error("lease renewal failed: %s", error)
                self.unconfirmed(clock())

    def _heartbeat(self, loop: asyncio.AbstractEventLoop) -> None:
        """The thread: renew every third of the lease while anything is held, on a connection
        of its own; what another worker took is cancelled on the loop. It ends when nothing has
        been held for a whole beat (the next ``hold`` starts another)."""
        renewer = self.store.renewer()
        try:
            while not self._stop.wait(self.lease_s / 3):
                with self._lock:
                    if not self._held:
                        self._thread = None  # the next hold starts another
                        return
                    asked = tuple(self._held)
                started = clock()
                try:
                    held = renewer.renew(self.owner, self.lease_s)
                except Exception as error:  # the store is down: try again next beat
                    log.error("lease renewal failed: %s", error)
                    try:
                        loop.call_soon_threadsafe(self.unconfirmed, clock())
                    except RuntimeError:  # the loop is closed
                        return
                    continue
                self.confirmed_at = started
                try:
                    loop.call_soon_threadsafe(self.renewed, asked, held)
                except RuntimeError:  # the loop is closed: nothing runs there any more
                    return
        finally:
            with contextlib.suppress(Exception):
                renewer.close()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._stop.set()
        with self._lock:
            self._held.clear()
            self._since.clear()
