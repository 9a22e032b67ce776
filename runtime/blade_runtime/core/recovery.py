"""Recovery: take up the calls other runtimes cannot finish, by claims, never twice.

A sweep claims, in one store transaction, the calls that need a runtime and that this one can
run (their registration name is registered here): resumable calls (an operator or another
process submitted their action), and running calls whose lease expired or whose owner is known
dead. The claim is a compare-and-set, so of many workers sweeping at once exactly one takes each
call. Then seed 000's side-effect contract: a resumable call is resumed; a running ``pure`` or
``idempotent`` call is run again from the entry it was in; a running ``non_idempotent`` one is
never run again: it settles as INTERRUPTED, for reconciliation. The same sweep settles pending
actions past their deadline as TIMEOUT.

Death is known without waiting for a lease where it can be checked: a runtime of this process
that is gone, a process of this host that is gone (its pid), or a PostgreSQL session whose
advisory lock was released. Nothing trusts a pid from another host.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any

from blade_runtime.core.caller import CallContext
from blade_runtime.core.context import CallInfo
from blade_runtime.core.pending import PendingActions
from blade_runtime.core.permissions import ADMISSION
from blade_runtime.core.results import ErrorCode, ToolResult
from blade_runtime.core.shared import HOST, INTERRUPTED_MESSAGE, Attempt, error_result, log
from blade_runtime.core.store import Claimed

_LIVE: weakref.WeakValueDictionary[str, Recovery] = weakref.WeakValueDictionary()
"""The runtimes of this process that are open, by owner id."""


class Recovery(PendingActions):
    """The recovery sweep, and the loop that runs it in the background."""

    _closed: bool

    def _live(self) -> None:
        _LIVE[self.owner] = self

    def _gone(self) -> None:
        """This runtime stops: its leases end now, so another worker may claim its calls at
        once (a late result of an abandoned call is then refused by the store, LeaseLost)."""
        _LIVE.pop(self.owner, None)
        self.store.renew(self.owner, 0.0)

    async def recover(self, *, replay: bool = True, limit: int = 100) -> list[ToolResult[Any]]:
        """One sweep: claim what needs a runtime and take it up here; returns the results.

        ``replay=False``: running ``pure`` and ``idempotent`` calls are not run again either;
        they settle as INTERRUPTED like the others. Calls of tools this runtime lacks are left
        for a runtime that has them."""
        self._expire_due()
        claimed = self._claim_batch(limit)
        return list(await asyncio.gather(*(self._take_up(c, replay) for c in claimed)))

    async def run_recovery(self, interval_s: float = 1.0) -> None:
        """Sweep every ``interval_s`` until cancelled (run it as a task beside the app): orphaned
        calls, operator-submitted actions and expired actions are taken up by some live worker
        within the interval, without a restart. A sweep that fails (the store is down) is
        logged and tried again next time."""
        running: set[asyncio.Task[Any]] = set()
        while not self._closed:
            try:
                self._expire_due()
                for claimed in self._claim_batch():
                    task = asyncio.create_task(self._take_up(claimed, True))
                    running.add(task)
                    task.add_done_callback(running.discard)
            except Exception as error:
                log.error("recovery sweep failed: %s", error)
            await asyncio.sleep(interval_s)

    def _claim_batch(self, limit: int = 100) -> list[Claimed]:
        names = [r.name for r in self._registrations.values() if r.implementation is not None]
        if not names:
            return []
        dead = [owner for owner in self.store.owners() if self._dead(owner)]
        return self.store.claim(self.owner, self.lease_s, dead=dead, names=names, limit=limit)

    def _expire_due(self) -> None:
        for action in self.store.expired():
            self.expire(action)

    def _dead(self, owner: str) -> bool:
        """Whether the runtime ``owner`` is known to have stopped (else its lease decides)."""
        if owner == self.owner:
            return False
        host, _, rest = owner.partition(":")
        if host == HOST and rest.partition(":")[0] == str(os.getpid()):
            live = _LIVE.get(owner)
            return live is None or live._closed  # a runtime of this process: open, or gone
        return self.store.alive(owner) is False

    async def _take_up(self, claimed: Claimed, replay: bool) -> ToolResult[Any]:
        """Resume, replay or interrupt one call this runtime just claimed."""
        record = claimed.call
        registration = self._registrations[record.name]
        call = CallInfo(
            record.call_id,
            record.run_id,
            record.name,
            record.spec_id,
            CallContext.from_json(record.context),
        )
        self._events.poke()  # the claim's event was committed with it
        safe = claimed.was == "resumable" or (
            replay and record.side_effect in ("pure", "idempotent")
        )
        if not safe:
            interrupted = error_result(call, ErrorCode.INTERRUPTED, INTERRUPTED_MESSAGE)
            return self._settled(call, interrupted, Attempt(recorded=True))
        entry = record.entry
        if isinstance(entry, dict) and entry.get("point") == ADMISSION:
            # Its permission was granted (and the final input stored with the decision): the
            # first entry runs, without asking again.
            return await self._run(registration, call, record.input)
        if isinstance(entry, dict) and entry.get("action_id"):
            action = self.store.action(str(entry["action_id"]))
            if action is not None:
                return await self._resume(
                    registration, call, action, entry.get("resume"), record.input
                )
        return await self._run(registration, call, record.input)
