"""Stores: where calls, pending actions, ToolData and events live.

A store is a small transactional interface. Each method is one transaction: resolving an action,
recording what follows from it and appending its event happen together or not at all, and the
resolution is a compare-and-set, so of many concurrent submits exactly one wins. ``MemoryStore``
keeps everything in the process (tests, or apps that need no durability); ``SQLiteStore``
(``blade_runtime.sqlite``) is the embedded durable default.

Call states: ``running`` (an entry of the implementation has begun; written before it runs),
``suspended`` (waiting on a pending action), ``pending`` (a client tool waiting for its output),
``resumable`` (its action was submitted, the re-entry has not begun) and ``settled``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeAlias

from pydantic import JsonValue

from blade_runtime.spec import JsonObject

CallState: TypeAlias = Literal["running", "suspended", "pending", "resumable", "settled"]
ActionState: TypeAlias = Literal["pending", "submitted", "cancelled", "failed"]


@dataclass(slots=True)
class CallRecord:
    """One tool call as stored. ``entry`` is null for the initial entry, else the resume."""

    call_id: str
    run_id: str
    name: str
    spec_id: str
    side_effect: str
    execution: str
    input: JsonObject
    state: CallState
    started_at: str
    owner: str = ""
    entry: JsonValue = None
    result: JsonValue = None


@dataclass(slots=True)
class ActionRecord:
    """A pending action: a suspension (``point`` set) or a client tool's output (``point`` None).

    ``payload`` is what the action shows (the suspend payload, or the client tool's input);
    ``submit_schema`` validates what resolves it (the resume schema, or the output schema), and
    is stored so that an operator tool can validate a submission without the implementation.
    """

    action_id: str
    call_id: str
    run_id: str
    name: str
    spec_id: str
    point: str | None
    payload: JsonValue
    submit_schema: JsonObject
    suspended_at: str
    state: ActionState = "pending"
    resume: JsonValue = None
    resolved_at: str | None = None
    reason: str | None = None


@dataclass(slots=True)
class DataRecord:
    """One ToolData item; ``seq`` keeps the order of first writes."""

    call_id: str
    channel: str
    item_id: str
    value: JsonValue
    updated_at: str
    seq: int = 0


@dataclass(slots=True)
class Event:
    """One tool event of a run, in order: started, data, suspended, pending, resumed, result."""

    run_id: str
    call_id: str
    kind: str
    payload: JsonValue
    at: str
    seq: int = 0


class StoreError(Exception):
    """A store operation that cannot be carried out."""


class UnknownAction(StoreError):
    def __init__(self, action_id: str) -> None:
        super().__init__(f"no pending action {action_id!r}")
        self.action_id = action_id


class ActionAlreadyResolved(StoreError):
    """Another submit, cancel or fail won: ``action`` says how it was resolved, and when."""

    def __init__(self, action: ActionRecord) -> None:
        super().__init__(
            f"action {action.action_id} was already {action.state} at {action.resolved_at}"
        )
        self.action = action


@dataclass(frozen=True, slots=True)
class Resolution:
    """What resolving an action does to its call, in the same transaction."""

    state: ActionState
    resolved_at: str
    resume: JsonValue = None
    reason: str | None = None
    call_state: CallState = "resumable"
    call_entry: JsonValue = None
    call_result: JsonValue = None
    call_owner: str | None = None  # the runtime that re-enters the call, when it does


@dataclass(frozen=True, slots=True)
class Resolved:
    """A resolution that won: the action as it now is, and its call's input (for re-entry)."""

    action: ActionRecord
    call_input: JsonObject


class Store(Protocol):
    """The runtime's persistence. Every method is atomic; the runtime adds no locking."""

    durable: bool
    """Whether records outlive the process. A non-durable store only keeps what waits."""

    def begin(self, call: CallRecord, event: Event) -> None:
        """Record that an entry of ``call`` starts (insert, or replace a resumable call)."""
        ...

    def suspend(
        self, call: CallRecord, action: ActionRecord, event: Event, *, known: bool = False
    ) -> None:
        """Store the pending ``action`` and its call (now suspended or pending). ``known``: the
        store already holds the call (its start was recorded), only its state changes."""
        ...

    def resolve(self, action_id: str, resolution: Resolution, event: Event) -> Resolved:
        """Compare-and-set the pending action, update its call, append ``event``."""
        ...

    def settle(self, call_id: str, result: JsonValue, event: Event) -> None: ...

    def write_data(self, record: DataRecord, event: Event | None) -> None:
        """Insert or update (same call, channel and item id: in place) one ToolData item."""
        ...

    def data(self, call_id: str, channel: str | None = None) -> list[DataRecord]: ...

    def call(self, call_id: str) -> CallRecord | None: ...

    def calls(self, states: Iterable[CallState]) -> list[CallRecord]: ...

    def action(self, action_id: str) -> ActionRecord | None: ...

    def actions(
        self,
        *,
        state: ActionState | None = "pending",
        run_id: str | None = None,
        name: str | None = None,
        call_id: str | None = None,
    ) -> list[ActionRecord]: ...

    def events(self, run_id: str, after: int = 0) -> list[Event]: ...

    def close(self) -> None: ...


class MemoryStore:
    """Everything in this process. Calls that never wait are not recorded at all."""

    durable = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, CallRecord] = {}
        self._actions: dict[str, ActionRecord] = {}
        self._data: dict[tuple[str, str], dict[str, DataRecord]] = {}
        self._seq = 0

    def begin(self, call: CallRecord, event: Event) -> None:
        with self._lock:
            self._calls[call.call_id] = replace(call)

    def suspend(
        self, call: CallRecord, action: ActionRecord, event: Event, *, known: bool = False
    ) -> None:
        with self._lock:
            self._calls[call.call_id] = replace(call)
            self._actions[action.action_id] = replace(action)

    def resolve(self, action_id: str, resolution: Resolution, event: Event) -> Resolved:
        with self._lock:
            action = self._actions.get(action_id)
            if action is None:
                raise UnknownAction(action_id)
            if action.state != "pending":
                raise ActionAlreadyResolved(replace(action))
            action.state = resolution.state
            action.resume = resolution.resume
            action.resolved_at = resolution.resolved_at
            action.reason = resolution.reason
            call = self._calls[action.call_id]
            call.state = resolution.call_state
            call.entry = resolution.call_entry
            call.result = resolution.call_result
            if resolution.call_owner is not None:
                call.owner = resolution.call_owner
            return Resolved(replace(action), call.input)

    def settle(self, call_id: str, result: JsonValue, event: Event) -> None:
        with self._lock:
            # Nothing waits on a settled call: forget it, its actions and its data.
            self._calls.pop(call_id, None)
            for key in [k for k in self._data if k[0] == call_id]:
                del self._data[key]
            for action_id in [a for a, r in self._actions.items() if r.call_id == call_id]:
                del self._actions[action_id]

    def write_data(self, record: DataRecord, event: Event | None) -> None:
        with self._lock:
            items = self._data.setdefault((record.call_id, record.channel), {})
            previous = items.get(record.item_id)
            self._seq += 1
            items[record.item_id] = replace(record, seq=previous.seq if previous else self._seq)

    def data(self, call_id: str, channel: str | None = None) -> list[DataRecord]:
        with self._lock:
            found = [
                replace(item)
                for (call, name), items in self._data.items()
                if call == call_id and channel in (None, name)
                for item in items.values()
            ]
        return sorted(found, key=lambda item: item.seq)

    def call(self, call_id: str) -> CallRecord | None:
        with self._lock:
            found = self._calls.get(call_id)
            return None if found is None else replace(found)

    def calls(self, states: Iterable[CallState]) -> list[CallRecord]:
        wanted = set(states)
        with self._lock:
            return [replace(c) for c in self._calls.values() if c.state in wanted]

    def action(self, action_id: str) -> ActionRecord | None:
        with self._lock:
            found = self._actions.get(action_id)
            return None if found is None else replace(found)

    def actions(
        self,
        *,
        state: ActionState | None = "pending",
        run_id: str | None = None,
        name: str | None = None,
        call_id: str | None = None,
    ) -> list[ActionRecord]:
        with self._lock:
            return [
                replace(a)
                for a in self._actions.values()
                if state in (None, a.state)
                and run_id in (None, a.run_id)
                and name in (None, a.name)
                and call_id in (None, a.call_id)
            ]

    def events(self, run_id: str, after: int = 0) -> list[Event]:
        return []  # not durable: live subscribers are the only consumers

    def close(self) -> None:
        pass
