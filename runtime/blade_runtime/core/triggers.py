"""``ctx.trigger(input)``: a tool asks the application to continue generation on its call's thread,
without a connected client (a background job finished, a webhook arrived).

The trigger is a durable record and a ``trigger`` event of the call's run, committed together
while the call is still this runtime's (a worker that lost its lease triggers nothing). Its
thread, tenant and caller come from the call's stored context. It reaches the application twice
over: in the run's event stream (``subscribe``, the HTTP event stream), and through the
``Runtime(on_trigger=...)`` handler, delivered once across workers: a runtime with a handler
claims pending triggers in the store (a compare-and-set, like a pending action's resolution),
calls the handler, and marks each delivered (or failed, when the handler raises). A claim whose
runtime died before it finished is taken again once its lease (``DELIVERY_LEASE_S``) runs out, so
a handler should schedule the continuation and return, well within that lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from pydantic import JsonValue

from blade_runtime.core.caller import CallContext
from blade_runtime.core.context import CallInfo, event_of
from blade_runtime.core.fencing import LeaseNotHeld
from blade_runtime.core.jsonvalue import NotJson, checked
from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import Claim, Event, LeaseLost, TriggerRecord, now

log = logging.getLogger("blade_runtime")

DELIVERY_LEASE_S = 60.0
"""How long a runtime's claim on a trigger holds while its handler runs."""


class TriggerRejected(ValueError):
    """A trigger whose input is not JSON: nothing was recorded."""


@dataclass(frozen=True, slots=True)
class Trigger:
    """A trigger as the ``on_trigger`` handler receives it."""

    trigger_id: str
    call_id: str
    run_id: str
    tool: str
    thread_id: str | None
    input: JsonValue
    context: CallContext | None
    created_at: str

    @staticmethod
    def of(record: TriggerRecord) -> Trigger:
        return Trigger(
            record.trigger_id,
            record.call_id,
            record.run_id,
            record.name,
            record.thread_id,
            record.input,
            CallContext.from_json(record.context),
            record.created_at,
        )


TriggerHandler = Callable[[Trigger], Awaitable[None] | None]


class Triggers:
    """Records triggers, and delivers them to this runtime's handler (if it has one)."""

    def __init__(
        self,
        *,
        io: StoreAccess,
        publish: Callable[[Event], None],
        owner: str,
        handler: TriggerHandler | None,
        lease_s: float = DELIVERY_LEASE_S,
    ) -> None:
        self.io = io
        self.store = io.store
        self.publish = publish
        self.owner = owner
        self.handler = handler
        self.lease_s = lease_s
        self._pump: asyncio.Task[None] | None = None
        self._again = False

    async def request(
        self, call: CallInfo, input: JsonValue, *, claim: Claim | None, key: str | None = None
    ) -> str:
        """Record a trigger of ``call`` (``claim``: the entry's, which must still hold its call
        when the trigger commits, else it ends as LEASE_LOST); returns its id. ``key``: what
        makes the trigger the same when an entry runs again (its id comes from it, and a trigger
        recorded already is not recorded, nor announced, twice)."""
        try:
            value = checked(input)
        except NotJson as error:
            raise TriggerRejected(f"ctx.trigger: the input is not JSON: {error}") from None
        context = call.context
        call_id = call.parent or call.call_id  # a child's call is its parent's part
        trigger_id = (
            f"trg_{uuid.uuid4().hex}"
            if key is None
            else f"trg_{hashlib.sha256(key.encode()).hexdigest()[:32]}"
        )
        trigger = TriggerRecord(
            trigger_id,
            call_id,
            call.run_id,
            call.name,
            "" if context is None else context.tenant,
            value,
            now(),
            None if context is None else context.to_json(),
            None if context is None else context.thread_id,
        )
        payload: JsonValue = {
            "trigger_id": trigger.trigger_id,
            "thread_id": trigger.thread_id,
            "input": value,
        }
        event = replace(event_of(call, "trigger", payload, trigger.created_at), call_id=call_id)
        try:
            added = await self.io(self.store.add_trigger, trigger, event, claim=claim)
        except LeaseLost as lost:  # another worker holds the call: this entry ends
            raise LeaseNotHeld(lost.call_id, -1 if claim is None else claim.fence) from None
        if added is not None:
            self.publish(added)
            self.kick()
        return trigger.trigger_id

    def kick(self) -> None:
        """Deliver soon, on this loop (a delivery under way looks again when it is done)."""
        if self.handler is None:
            return
        if self._pump is not None and not self._pump.done():
            self._again = True
            return
        self._pump = asyncio.get_running_loop().create_task(self._deliver_all())

    async def _deliver_all(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            try:
                while await self.deliver():
                    pass
            except Exception as error:  # the store is down: the next kick or sweep retries
                log.error("trigger delivery failed: %s", error)
                return

    async def deliver(self, limit: int = 100) -> int:
        """Claim pending triggers and hand each to the handler; returns how many were
        claimed (0 without a handler)."""
        handler = self.handler
        if handler is None:
            return 0
        claimed = await self.io(self.store.claim_triggers, self.owner, self.lease_s, limit=limit)
        for record in claimed:
            error = None
            try:
                handled = handler(Trigger.of(record))
                if inspect.isawaitable(handled):
                    await handled
            except Exception as failure:
                log.error(
                    "on_trigger failed for trigger %s (call %s): %s",
                    record.trigger_id,
                    record.call_id,
                    type(failure).__name__,
                )
                error = type(failure).__name__
            await self.io(self.store.finish_trigger, record.trigger_id, self.owner, error=error)
        return len(claimed)

    async def run(self, interval_s: float = 0.5) -> None:
        """Deliver the triggers other processes record, every ``interval_s``, until cancelled."""
        while True:
            try:
                while await self.deliver():
                    pass
            except Exception as error:
                log.error("trigger delivery failed: %s", error)
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        pump, self._pump = self._pump, None
        if pump is not None and not pump.done():
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
