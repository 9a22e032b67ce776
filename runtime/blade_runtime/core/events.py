"""Tool events of a run, to subscribers in any process, and the typed views of pending actions.

Events are committed with what they report (durable stores number them by ``seq``, in commit
order). A subscription of a durable store reads the store itself, so it receives the events that
other processes committed too, in commit order, never one of a rolled-back transaction, and can
resume after a sequence number; this process's own commits wake it at once, other processes'
commits when the store tells (PostgreSQL's NOTIFY) or polls (SQLite). Transient ToolData (never
stored, ``seq`` 0) and every event of a store that keeps none reach this process's subscribers
directly. Each subscriber has its own queue, so a slow subscriber never blocks a call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import JsonValue

from blade_runtime.core.records import StoreIO, inline
from blade_runtime.core.store import ActionRecord, Event, Store

PayloadT = TypeVar("PayloadT")

WAIT_S = 1.0  # the longest a subscription waits before it looks at the store again


class Subscription:
    """An async iterator over one run's events, from the moment of subscribing (or after the
    sequence number ``after``) until closed; closing hands out what was committed before it."""

    def __init__(self, hub: EventHub, run_id: str, after: int | None) -> None:
        self._hub = hub
        self.run_id = run_id
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._closed = False
        self.after = 0
        self._pump: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        # A transient event (progress, a message) waits here while a stored event this process
        # committed before it is still to be read from the store: it is handed out after it.
        self._known = 0  # the largest seq of this process's stored events put here
        self._held: list[tuple[int, Event]] = []  # (the seq it follows, the event)
        if hub.store.durable:
            self.after = hub.store.head(run_id) if after is None else after

    @property
    def last_seq(self) -> int:
        """The sequence number of the last stored event handed out (to resume from)."""
        return self.after

    def put(self, event: Event) -> None:
        """An event of this process: stored ones come after any earlier commit of another
        process (read from the store first), so the order is the commit order."""
        if self._closed:
            return
        if not self._hub.store.durable:
            self._queue.put_nowait(event)
        elif event.seq == 0:
            if self._held or self._known > self.after:
                self._held.append((self._known, event))
            else:
                self._queue.put_nowait(event)
        elif event.seq == self.after + 1:
            self._release()
            self.after = event.seq
            self._queue.put_nowait(event)
            self._release()
        elif event.seq > self.after:  # others committed before it: the pump reads them all
            self._known = max(self._known, event.seq)
            self.wake()

    def _release(self, *, everything: bool = False) -> None:
        """Hand out the held transient events whose stored predecessors are out."""
        held = self._held
        while held and (everything or held[0][0] <= self.after):
            self._queue.put_nowait(held.pop(0)[1])

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def close(self) -> None:
        """Stop, after handing out what was committed before (read on the caller's thread:
        from a coroutine, ``await aclose()``)."""
        if self._closed:
            return
        if self._hub.store.durable:
            self._catch_up()
            self._release(everything=True)
        self._stop()

    async def aclose(self) -> None:
        """``close``, with the last read of the store off the event loop."""
        if self._closed:
            return
        if self._hub.store.durable:
            self._catch_up(await self._hub.io(self._hub.store.events, self.run_id, self.after))
            self._release(everything=True)
        self._stop()

    def _stop(self) -> None:
        self._closed = True
        self._hub.unsubscribe(self)
        if self._pump is not None:
            self._pump.cancel()
        self._queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._hub.store.durable and self._pump is None and not self._closed:
            self._wake = asyncio.Event()
            self._pump = asyncio.get_running_loop().create_task(self._read())
        event = await self._queue.get()
        if event is None:
            self._queue.put_nowait(None)  # stay closed for every later call
            raise StopAsyncIteration
        return event

    def _catch_up(self, found: list[Event] | None = None) -> None:
        """Hand out the run's stored events after the last one handed out (``found``: read
        already, off the loop)."""
        if found is None:
            found = self._hub.store.events(self.run_id, self.after)
        for event in found:
            if event.seq > self.after:  # put() may have handed it out meanwhile
                self._release()  # those that came before it
                self.after = event.seq
                self._queue.put_nowait(event)
        self._release()

    async def _read(self) -> None:
        """Hand out other processes' events of the run as the store reports their commits."""
        store = self._hub.store
        assert self._wake is not None
        while not self._closed:
            self._wake.clear()
            mark = store.mark()  # before the read: a commit after it ends the wait below at once
            self._catch_up(await self._hub.io(store.events, self.run_id, self.after))
            changed = asyncio.ensure_future(store.changed(WAIT_S, mark))
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({changed, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in (changed, woken):
                    waiting.cancel()
                # gather, not suppress: a cancellation of this task that arrives meanwhile
                # must still end it (swallowed, the loop read the store forever)
                await asyncio.gather(changed, woken, return_exceptions=True)


class EventHub:
    """Subscribers by run id."""

    def __init__(self, store: Store, io: StoreIO = inline) -> None:
        self.store = store
        self.io = io
        self._subscribers: dict[str, list[Subscription]] = {}
        self.active = False  # any subscriber at all: when not, no event is even built

    def subscribe(self, run_id: str, after: int | None = None) -> Subscription:
        subscription = Subscription(self, run_id, after)
        self._subscribers.setdefault(run_id, []).append(subscription)
        self.active = True
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        subscribers = self._subscribers.get(subscription.run_id, [])
        if subscription in subscribers:
            subscribers.remove(subscription)
        self.active = any(self._subscribers.values())

    def publish(self, event: Event) -> None:
        """An event this process committed (or, ``seq`` 0, one that is never stored)."""
        subscribers = self._subscribers.get(event.run_id)
        if not subscribers:
            return
        for subscription in subscribers:
            subscription.put(event)

    def poke(self) -> None:
        """This process committed events it did not build here (a claim's): look now."""
        for subscribers in self._subscribers.values():
            for subscription in subscribers:
                subscription.wake()


@dataclass(frozen=True, slots=True)
class ActionOrigin:
    """Where a pending action comes from."""

    name: str
    spec_id: str
    call_id: str
    run_id: str
    point: str | None
    suspended_at: str


@dataclass(frozen=True, slots=True)
class PendingAction(Generic[PayloadT]):
    """A pending action as callers see it. ``input`` is the typed payload (the suspend payload,
    or a client tool's input) when this runtime knows the tool; ``payload`` is the stored JSON.

    ``name`` is ``<registration>.<point>``, or the registration name for a client tool.
    """

    action_id: str
    name: str
    input: PayloadT
    payload: JsonValue
    origin: ActionOrigin
    state: str

    @staticmethod
    def of(record: ActionRecord, typed_input: Any) -> PendingAction[Any]:
        name = record.name if record.point is None else f"{record.name}.{record.point}"
        origin = ActionOrigin(
            record.name,
            record.spec_id,
            record.call_id,
            record.run_id,
            record.point,
            record.suspended_at,
        )
        return PendingAction(
            record.action_id, name, typed_input, record.payload, origin, record.state
        )
