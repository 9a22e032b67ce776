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
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import JsonValue

from blade_runtime.core.caller import Principal
from blade_runtime.core.records import StoreIO, inline, mine, owner_of, tenant_of
from blade_runtime.core.store import ActionRecord, Event, Store

PayloadT = TypeVar("PayloadT")

WAIT_S = 1.0  # the longest a subscription waits before it looks at the store again
WINDOW = 1000
"""The most events a subscription holds for a reader that has not taken them: past it, it
reads no more from the store (they stay there, in order, for when the reader catches up) and
drops this process's transient events (progress, messages), which no store keeps."""


class Subscription:
    """An async iterator over one run's events, from the moment of subscribing (or after the
    sequence number ``after``) until closed; closing hands out what was committed before it.

    ``principal``: only the events of calls it may see (its tenant's, made for it or for
    nobody; an operator's or None: all), decided on the event's own record, in the store's
    query for what other processes committed. A reader that does not keep up costs at most
    ``window`` events of memory: the store is read a page at a time, as the reader makes
    room (``behind`` says since when it has been full, for a server to give up on it)."""

    def __init__(
        self,
        hub: EventHub,
        run_id: str,
        after: int | None,
        *,
        principal: Principal | None = None,
        window: int = WINDOW,
    ) -> None:
        self._hub = hub
        self.run_id = run_id
        self.principal = principal
        self.window = max(1, window)
        self._tenant = tenant_of(principal)
        self._owner = owner_of(principal)
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._closed = False
        self.after = 0
        self.dropped = 0  # transient events not handed out: the reader was a window behind
        self.behind: float | None = None  # monotonic time since when the window is full
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

    def _room(self) -> int:
        """How many more events the window takes now."""
        room = self.window - self._queue.qsize()
        if room <= 0:
            if self.behind is None:
                self.behind = time.monotonic()
            return 0
        return room

    def put(self, event: Event) -> None:
        """An event of this process: stored ones come after any earlier commit of another
        process (read from the store first), so the order is the commit order."""
        if self._closed or not mine(self.principal, event.tenant, event.principal):
            return
        if not self._hub.store.durable:
            if self._room():
                self._queue.put_nowait(event)
            else:
                self.dropped += 1
        elif event.seq == 0:
            if not self._room():
                self.dropped += 1
            elif self._held or self._known > self.after:
                self._held.append((self._known, event))
            else:
                self._queue.put_nowait(event)
        elif event.seq == self.after + 1 and self._room():
            self._release()
            self.after = event.seq
            self._queue.put_nowait(event)
            self._release()
        elif event.seq > self.after:  # others committed before it, or no room: read later
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
            self._catch_up(await self._hub.io(self._read_page))
            self._release(everything=True)
        self._stop()

    def drop(self) -> None:
        """Stop at once, reading nothing more (the reader is gone: a client disconnected). No
        await: a cancelled task's clean-up still ends the subscription."""
        if not self._closed:
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
        queued = self._queue.qsize()
        if queued >= self.window:
            if self.behind is None:
                self.behind = time.monotonic()
        elif self.behind is not None and queued <= self.window // 2:
            self.behind = None
            self.wake()  # room again: the pump reads on
        return event

    def _read_page(self) -> list[Event]:
        """The next page of the run's stored events this subscription may show (on the
        store's thread), as large as the room left in the window."""
        room = self._room()
        if not room:
            return []
        return self._hub.store.events(
            self.run_id, self.after, limit=room, tenant=self._tenant, principal=self._owner
        )

    def _catch_up(self, found: list[Event] | None = None) -> None:
        """Hand out the run's stored events after the last one handed out (``found``: read
        already, off the loop)."""
        if found is None:
            found = self._read_page()
        for event in found:
            if event.seq > self.after:  # put() may have handed it out meanwhile
                self._release()  # those that came before it
                self.after = event.seq
                self._queue.put_nowait(event)
        self._release()

    async def _read(self) -> None:
        """Hand out other processes' events of the run as the store reports their commits, a
        page at a time, as the reader makes room; idle, it waits on the store's notice (or its
        poll) using no CPU."""
        store = self._hub.store
        assert self._wake is not None
        while not self._closed:
            self._wake.clear()
            mark = store.mark()  # before the read: a commit after it ends the wait below at once
            found = await self._hub.io(self._read_page)
            self._catch_up(found)
            if len(found) and self._room():
                continue  # a full page: there may be more
            waiting: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._wake.wait())}
            if self._room():  # a full window waits for the reader only
                waiting.add(asyncio.ensure_future(store.changed(WAIT_S, mark)))
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pending in waiting:
                    pending.cancel()
                # gather, not suppress: a cancellation of this task that arrives meanwhile
                # must still end it (swallowed, the loop read the store forever)
                await asyncio.gather(*waiting, return_exceptions=True)


class EventHub:
    """Subscribers by run id."""

    def __init__(self, store: Store, io: StoreIO = inline) -> None:
        self.store = store
        self.io = io
        self._subscribers: dict[str, list[Subscription]] = {}
        self.active = False  # any subscriber at all: when not, no event is even built

    def subscribe(
        self,
        run_id: str,
        after: int | None = None,
        *,
        principal: Principal | None = None,
        window: int = WINDOW,
    ) -> Subscription:
        subscription = Subscription(self, run_id, after, principal=principal, window=window)
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
    """Where a pending action comes from: its call, and that call's thread and executing agent
    (None where the caller named none)."""

    name: str
    spec_id: str
    call_id: str
    run_id: str
    point: str | None
    suspended_at: str
    thread_id: str | None = None
    agent_id: str | None = None


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
            record.thread_id,
            record.agent_id,
        )
        return PendingAction(
            record.action_id, name, typed_input, record.payload, origin, record.state
        )
