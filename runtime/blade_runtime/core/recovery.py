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
import math
import os
import time
import weakref
from typing import Any

from blade_runtime.core.caller import CallContext
from blade_runtime.core.calls import Attempt, CallRunner
from blade_runtime.core.context import CallInfo
from blade_runtime.core.events import EventHub
from blade_runtime.core.interceptors import Interceptors
from blade_runtime.core.outcomes import HOST, INTERRUPTED_MESSAGE, error_result, log
from blade_runtime.core.pending import PendingActions, stored_behavior
from blade_runtime.core.permissions import ADMISSION, DEFAULT_DENIAL
from blade_runtime.core.registry import Registration
from blade_runtime.core.results import ErrorCode, ToolError, ToolResult
from blade_runtime.core.retention import Retention, sweep
from blade_runtime.core.spec import JsonObject
from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import Claimed, patience
from blade_runtime.core.tools import Tools

_LIVE: weakref.WeakValueDictionary[str, Recovery] = weakref.WeakValueDictionary()
"""The runtimes of this process that are open, by owner id."""


class Recovery:
    """The recovery sweep, and the loop that runs it in the background."""

    def __init__(
        self,
        *,
        io: StoreAccess,
        runner: CallRunner,
        pending: PendingActions,
        tools: Tools,
        interceptors: Interceptors,
        events: EventHub,
        owner: str,
        lease_s: float,
    ) -> None:
        self.io = io
        self.store = io.store
        self.runner = runner
        self.pending = pending
        self.tools = tools
        self.interceptors = interceptors
        self.events = events
        self.owner = owner
        self.lease_s = lease_s
        self.closed = False
        self.retention: Retention | None = None  # swept by run_recovery
        # Until then, no lease counts as lapsed: a sweep was held up by the store, and so
        # may have been the owners' renewals; they get a whole lease to renew behind it.
        self._stalled_until = -math.inf
        _LIVE[owner] = self

    async def end(self, *, release: bool = True) -> None:
        """This runtime stops recovering. ``release``: its leases end now, so another worker may
        claim its calls at once (none of its implementations may still act: see
        ``Runtime.close``)."""
        self.closed = True
        _LIVE.pop(self.owner, None)
        if release:
            await self.io(self.store.renew, self.owner, 0.0)

    async def recover(self, *, replay: bool = True, limit: int = 100) -> list[ToolResult[Any]]:
        """One sweep: claim what needs a runtime and take it up here; returns the results.

        ``replay=False``: running ``pure`` and ``idempotent`` calls are not run again either;
        they settle as INTERRUPTED like the others. Calls of tools this runtime lacks are left
        for a runtime that has them."""
        await self._expire_due()
        claimed = await self._claim_batch(limit)
        return list(await asyncio.gather(*(self._take_up(c, replay) for c in claimed)))

    async def run_recovery(self, interval_s: float = 1.0) -> None:
        """Sweep every ``interval_s`` until cancelled (run it as a task beside the app): orphaned
        calls, operator-submitted actions and expired actions are taken up by some live worker
        within the interval, without a restart; with a ``retention``, settled history past it
        is deleted every ``retention.every_s``. A sweep that fails (the store is down) is
        logged and tried again next time."""
        running: set[asyncio.Task[Any]] = set()
        pruned_at = -math.inf
        while not self.closed:
            try:
                await self._expire_due()
                for claimed in await self._claim_batch():
                    task = asyncio.create_task(self._take_up(claimed, True))
                    running.add(task)
                    task.add_done_callback(running.discard)
            except Exception as error:
                log.error("recovery sweep failed: %s", error)
            retention = self.retention
            if retention is not None and time.monotonic() - pruned_at >= retention.every_s:
                pruned_at = time.monotonic()
                try:
                    pruned = await sweep(self.io, retention)
                    if pruned.calls:
                        log.info("retention: pruned %s", pruned)
                except Exception as error:
                    log.error("retention sweep failed: %s", error)
            await asyncio.sleep(interval_s)

    async def _claim_batch(self, limit: int = 100) -> list[Claimed]:
        # By name and spec: a call of another spec once registered under a name is not ours.
        names = {n: r.spec.id for n, r in self.tools.by_name.items() if r.implementation}
        if not names:
            return []
        began = time.monotonic()  # the reads before the claim may wait for the store too
        owners = await self.io(self.store.owners)
        dead = [owner for owner in owners if await self._dead(owner)]
        # Behind a stall, only calls whose owners are known dead or that wait to be resumed
        # (an infinite wait judges no lease: ``lapsed_before``).
        stalled = began < self._stalled_until
        claimed: list[Claimed] = await self.io(
            self.store.claim,
            self.owner,
            self.lease_s,
            dead=dead,
            names=names,
            limit=limit,
            waited_s=math.inf if stalled else time.monotonic() - began,
            running=frozenset(self.runner.running),
        )
        ended = time.monotonic()
        if ended - began > patience(self.lease_s):
            # Held up (a lock, a stalled disk): the owners' renewals queued behind the same
            # wait, and after it they race this sweep's next one for the store. Leases that
            # lapsed meanwhile say nothing of their owners until each has had a lease to renew.
            self._stalled_until = ended + self.lease_s
        return claimed

    async def _expire_due(self) -> None:
        for action in await self.io(self.store.expired):
            await self.pending.expire(action)

    async def _dead(self, owner: str) -> bool:
        """Whether the runtime ``owner`` is known to have stopped (else its lease decides)."""
        if owner == self.owner:
            return False
        host, _, rest = owner.partition(":")
        if host == HOST and rest.partition(":")[0] == str(os.getpid()):
            live = _LIVE.get(owner)
            return live is None or live.closed  # a runtime of this process: open, or gone
        return await self.io(self.store.alive, owner) is False

    async def _resolved(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        entry: dict[str, Any],
        decision: str,
        reason: str | None,
    ) -> ToolError | None:
        """The ``permission_request`` hooks and the ``permission_resolved`` observers see a
        decision made outside a runtime (one that fails stops the call)."""
        refused = await self.interceptors.permission_hooks(call, arguments, None, decision, reason)
        methods = self.interceptors.observers.permission_resolved
        if refused is not None or not methods:
            return refused
        action_id = entry.get("action_id")
        try:
            await self.interceptors.observing(
                "permission_resolved",
                methods,
                registration,
                call,
                arguments,
                decision,
                reason,
                action_id if isinstance(action_id, str) else None,
            )
        except Exception as error:
            return self.interceptors.observer_failed("permission_resolved", call, error)
        return None

    async def _denied(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        entry: dict[str, Any],
        answer: dict[str, Any],
        claimed: Claimed,
    ) -> ToolResult[Any]:
        """Settle a call whose permission request was denied outside a runtime: the
        ``permission_resolved`` observers (on its first take-up) and the ``settled`` ones see
        the denial, as they do one submitted to a runtime."""
        reason = _reason(answer)
        result: ToolResult[Any] | None = None
        if claimed.was == "resumable":
            result = await self._resolved(registration, call, arguments, entry, "deny", reason)
        if result is None:
            denied = error_result(call, ErrorCode.PERMISSION_DENIED, reason or DEFAULT_DENIAL)
            result = await self.interceptors.settled(registration, call, arguments, denied)
        return await self.runner.record_end(call, result, Attempt(claimed.call.claim))

    async def _take_up(self, claimed: Claimed, replay: bool) -> ToolResult[Any]:
        """Resume, replay or interrupt one call this runtime just claimed."""
        record = claimed.call
        registration = self.tools.by_name[record.name]
        call = CallInfo(
            record.call_id,
            record.run_id,
            record.name,
            record.spec_id,
            CallContext.from_json(record.context),
            behavior=stored_behavior(record.kind, record.side_effect),
        )
        if claimed.event is not None:  # committed with the claim
            self.events.publish(claimed.event)
        else:
            self.events.poke()
        entry = record.entry if isinstance(record.entry, dict) else {}
        admission = entry.get("point") == ADMISSION
        answer = entry.get("resume") if admission else None
        if isinstance(answer, dict) and answer.get("decision") == "deny":
            # Denied outside a runtime (the operators' CLI): the tool never ran nor runs; this
            # worker settles it, where the application's observers see it.
            return await self._denied(registration, call, record.input, entry, answer, claimed)
        safe = claimed.was == "resumable" or (
            replay and record.side_effect in ("pure", "idempotent")
        )
        if not safe:
            interrupted = error_result(call, ErrorCode.INTERRUPTED, INTERRUPTED_MESSAGE)
            return await self.runner.record_end(call, interrupted, Attempt(claimed.call.claim))
        if admission:
            # Its permission was granted (and the final input stored with the decision): the
            # first entry runs, without asking again. Granted from outside a runtime (the
            # operators' CLI), this worker is the first to see the decision.
            if claimed.was == "resumable":
                refused = await self._resolved(
                    registration, call, record.input, entry, "allow", _reason(answer)
                )
                if refused is not None:
                    return await self.runner.record_end(call, refused, Attempt(claimed.call.claim))
            return await self.runner.run_claimed(
                registration, call, record.input, fence=record.fence
            )
        if isinstance(entry, dict) and entry.get("action_id"):
            action = await self.io(self.store.action, str(entry["action_id"]))
            if action is not None:
                return await self.pending.resume(
                    registration, call, action, entry.get("resume"), record.input, record.fence
                )
        return await self.runner.run_claimed(registration, call, record.input, fence=record.fence)


def _reason(answer: Any) -> str | None:
    """A person's message with a permission decision, if any."""
    message = answer.get("message") if isinstance(answer, dict) else None
    return message if isinstance(message, str) and message else None
