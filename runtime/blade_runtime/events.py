"""Live tool events of a run, and the typed views of pending actions.

Events are published after the store committed them (durable stores also keep them, written in the
same transaction as what they report, numbered by ``seq``; transient data and events of a store that
keeps none have ``seq`` 0). Each subscriber has its own queue, so a slow subscriber never blocks a
call; events of one run arrive in the order they happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import JsonValue

from blade_runtime.store import ActionRecord, Event

PayloadT = TypeVar("PayloadT")


class Subscription:
    """An async iterator over one run's events, from the moment of subscribing until closed."""

    def __init__(self, hub: EventHub, run_id: str) -> None:
        self._hub = hub
        self.run_id = run_id
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()

    def put(self, event: Event) -> None:
        self._queue.put_nowait(event)

    def close(self) -> None:
        self._hub.unsubscribe(self)
        self._queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event


class EventHub:
    """Subscribers by run id."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[Subscription]] = {}
        self.active = False  # any subscriber at all: when not, no event is even built

    def subscribe(self, run_id: str) -> Subscription:
        subscription = Subscription(self, run_id)
        self._subscribers.setdefault(run_id, []).append(subscription)
        self.active = True
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        subscribers = self._subscribers.get(subscription.run_id, [])
        if subscription in subscribers:
            subscribers.remove(subscription)
        self.active = any(self._subscribers.values())

    def publish(self, event: Event) -> None:
        subscribers = self._subscribers.get(event.run_id)
        if not subscribers:
            return
        for subscription in subscribers:
            subscription.put(event)


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
