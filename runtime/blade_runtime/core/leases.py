"""The heartbeat that keeps this runtime's claims on its running calls.

A durable call runs under a lease: its owner and an expiry, written with its start (or its
claim). While any such call runs here, one task renews every lease this runtime holds with one
store statement each third of the lease, so a call that runs for a second costs at most one
renewal. A call whose lease another worker took over (this process stalled past its lease) is
cancelled here: its late result would not be recorded anyway.
"""

from __future__ import annotations

import asyncio
import logging

from blade_runtime.core.cancel_scope import CancelScope
from blade_runtime.core.store import Store

log = logging.getLogger("blade_runtime")


class Leases:
    """The calls this runtime holds leases on, and the task that renews them."""

    def __init__(self, store: Store, owner: str, lease_s: float) -> None:
        self.store = store
        self.owner = owner
        self.lease_s = lease_s
        self._held: dict[str, CancelScope] = {}
        self._task: asyncio.Task[None] | None = None

    def hold(self, scope: CancelScope) -> None:
        """Keep ``scope``'s call leased while it runs (the scope must be bound to its task)."""
        scope.bind()
        self._held[scope.call.call_id] = scope
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._beat())

    def release(self, call_id: str) -> None:
        """The call was settled or suspended here: its lease is no longer kept."""
        self._held.pop(call_id, None)

    def renew(self) -> None:
        """One renewal now; calls another worker took over are cancelled."""
        if not self._held:
            return
        held = self.store.renew(self.owner, self.lease_s)
        for call_id, scope in list(self._held.items()):
            if call_id not in held and scope.active:
                log.error(
                    "%s (call %s): another worker claimed it after this runtime's lease "
                    "lapsed; cancelling it here",
                    scope.call.name,
                    call_id,
                )
                scope.cancel("cancelled", "another worker took the call over")
                del self._held[call_id]

    async def _beat(self) -> None:
        while self._held:
            await asyncio.sleep(self.lease_s / 3)
            try:
                self.renew()
            except Exception as error:  # the store is down: try again next beat
                log.error("lease renewal failed: %s", error)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._held.clear()
