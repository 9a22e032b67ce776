"""``MemoryStore``: everything in this process (tests, or apps that need no durability).

It keeps what waits (suspended and pending calls, their actions), the calls that wrote ToolData,
and the last ``keep_settled`` settled calls of those with their data and actions, so that a
settled call's data stays readable for a while; older settled calls are forgotten, oldest first.
Calls that neither wait nor write data are not recorded at all (the runtime's fast path), so
settling one is a no-op and its call id is not checked for duplicates. Events are not kept: live
subscribers in this process are their only consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace

from pydantic import JsonValue

from blade_runtime.core.store import (
    DEFAULT_LEASE_S,
    ActionAlreadyResolved,
    ActionRecord,
    ActionState,
    CallRecord,
    CallState,
    Claimed,
    DataRecord,
    DuplicateCall,
    Event,
    FileRecord,
    GrantRecord,
    LeaseLost,
    Resolution,
    Resolved,
    SaveStopped,
    TriggerRecord,
    TriggerState,
    UnknownAction,
    clock,
    lapsed_before,
    made_by,
    now,
)

DEFAULT_KEEP_SETTLED = 1000


class MemoryStore:
    """A store in this process's memory; one lock makes every method atomic."""

    durable = False
    waits = False  # one lock, held only while a dict is read or changed
    inline_first = False
    url = "memory:"

    def __init__(self, *, keep_settled: int = DEFAULT_KEEP_SETTLED) -> None:
        self.keep_settled = keep_settled
        self._lock = threading.Lock()
        self._calls: dict[str, CallRecord] = {}
        self._settled: OrderedDict[str, None] = OrderedDict()  # oldest first
        self._actions: dict[str, ActionRecord] = {}
        self._data: dict[tuple[str, str], dict[str, DataRecord]] = {}
        # By call id, so that forgetting a call costs its own records, not a scan of all.
        self._call_actions: dict[str, list[str]] = {}
        self._call_channels: dict[str, set[str]] = {}
        self._seq = 0
        # Files and triggers are kept until the process ends (they are not part of a call's
        # retirement: a file id may travel in an output long after the call).
        self._files: dict[str, tuple[FileRecord, bytes]] = {}
        self._triggers: dict[str, TriggerRecord] = {}  # in the order they were added
        self._grants: dict[tuple[str, ...], GrantRecord] = {}  # by their identity

    def begin(self, call: CallRecord, event: Event, *, lease_s: float = DEFAULT_LEASE_S) -> None:
        with self._lock:
            if call.call_id in self._calls:  # settled ones too, like the durable stores
                raise DuplicateCall(call.call_id)
            if call.state == "running":
                call.lease_until = clock() + lease_s
            self._calls[call.call_id] = replace(call)

    def suspend(
        self, call: CallRecord, action: ActionRecord, event: Event, *, known: bool = False
    ) -> None:
        with self._lock:
            stored = replace(call)
            if known:
                self._owned(call.call_id, call.owner)
                before = self._calls.get(call.call_id)
                stored.fence = call.fence if before is None else before.fence  # the claim's
            self._calls[call.call_id] = stored
            self._actions[action.action_id] = replace(action)
            self._call_actions.setdefault(action.call_id, []).append(action.action_id)

    def resolve(self, action_id: str, resolution: Resolution, event: Event) -> Resolved:
        with self._lock:
            action = self._actions.get(action_id)
            if action is None:
                raise UnknownAction(action_id)
            if action.state != "pending" or (
                resolution.only_if_expired
                and (action.expires_at is None or action.expires_at > clock())
            ):
                raise ActionAlreadyResolved(replace(action))
            action.state = resolution.state
            action.resume = resolution.resume
            action.resolved_at = resolution.resolved_at
            action.reason = resolution.reason
            call = self._calls[action.call_id]
            call.state = resolution.call_state
            call.entry = resolution.call_entry
            call.result = resolution.call_result
            if resolution.call_input is not None:
                call.input = dict(resolution.call_input)
            if resolution.call_side_effect is not None:
                call.kind, call.side_effect = resolution.call_kind, resolution.call_side_effect
            if resolution.call_owner is not None:
                call.owner = resolution.call_owner
                call.lease_until = clock() + resolution.lease_s
                call.fence += 1
            else:
                call.lease_until = 0.0
            if call.state == "settled":
                self._retire(call.call_id)
            return Resolved(replace(action), call.input, call.context, call.fence)

    def settle(self, call_id: str, result: JsonValue, event: Event, *, owner: str) -> None:
        with self._lock:
            call = self._calls.get(call_id)
            if call is None:  # not recorded (it only wrote data): keep its data for a while
                self._retire(call_id)
                return
            if call.state != "running" or call.owner != owner:
                raise LeaseLost(call_id, owner)
            call.state = "settled"
            call.result = result
            self._retire(call_id)

    def claim(
        self,
        owner: str,
        lease_s: float,
        *,
        dead: Collection[str] = (),
        names: Collection[str] | Mapping[str, str] | None = None,
        call_id: str | None = None,
        limit: int = 100,
        waited_s: float = 0.0,
    ) -> list[Claimed]:
        began = clock()  # leases are judged by the clock before the wait for the lock
        claimed: list[Claimed] = []
        with self._lock:
            granted = clock()
            until = granted + lease_s
            at = lapsed_before(began, granted, waited_s, lease_s)
            if call_id is None:
                candidates = list(self._calls.values())
            else:
                candidates = [self._calls[call_id]] if call_id in self._calls else []
            for call in candidates:
                if len(claimed) >= limit:
                    break
                orphaned = call.state == "running" and (call.lease_until < at or call.owner in dead)
                if call.state != "resumable" and not orphaned:
                    continue
                if names is not None and not made_by(call, names):
                    continue
                was, previous = call.state, call.owner
                call.state, call.owner, call.lease_until = "running", owner, until
                call.fence += 1
                claimed.append(Claimed(replace(call), was, previous))
        return claimed

    def renew(self, owner: str, lease_s: float) -> set[str]:
        held: set[str] = set()
        with self._lock:
            until = clock() + lease_s
            for call in self._calls.values():
                if call.owner == owner and call.state == "running":
                    call.lease_until = until
                    held.add(call.call_id)
        return held

    def renewer(self) -> MemoryRenewer:
        return MemoryRenewer(self)

    def held(self, call_id: str, owner: str, fence: int) -> bool:
        with self._lock:
            call = self._calls.get(call_id)
            return (
                call is not None
                and call.state == "running"
                and call.owner == owner
                and call.fence == fence
                and call.lease_until >= clock()
            )

    def add_grant(self, grant: GrantRecord) -> GrantRecord:
        key = (grant.tenant, grant.principal, grant.tool, grant.spec_id, grant.point, grant.subject)
        with self._lock:
            kept = self._grants.setdefault(key, replace(grant))
            return replace(kept)

    def find_grant(
        self, tenant: str, principal: str, tool: str, subject: str, *, spec_id: str, point: str
    ) -> GrantRecord | None:
        with self._lock:
            found = self._grants.get((tenant, principal, tool, spec_id, point, subject))
            return None if found is None else replace(found)

    def grants(
        self,
        *,
        tenant: str | None = None,
        principal: str | None = None,
        tool: str | None = None,
    ) -> list[GrantRecord]:
        with self._lock:
            found = [
                replace(g)
                for g in self._grants.values()
                if tenant in (None, g.tenant)
                and principal in (None, g.principal)
                and tool in (None, g.tool)
            ]
        return sorted(found, key=lambda g: (g.created_at, g.grant_id))

    def revoke_grant(
        self, grant_id: str, *, tenant: str | None = None, principal: str | None = None
    ) -> GrantRecord | None:
        with self._lock:
            for key, grant in self._grants.items():
                if (
                    grant.grant_id == grant_id
                    and tenant in (None, grant.tenant)
                    and principal in (None, grant.principal)
                ):
                    del self._grants[key]
                    return grant
        return None

    def nowait(self) -> contextlib.AbstractContextManager[None]:
        """A no-op: no operation here waits."""
        return contextlib.nullcontext()

    def expired(self, limit: int = 100) -> list[ActionRecord]:
        at = clock()
        with self._lock:
            found = [
                replace(a)
                for a in self._actions.values()
                if a.state == "pending" and a.expires_at is not None and a.expires_at <= at
            ]
        return sorted(found, key=lambda a: a.expires_at or 0.0)[:limit]

    def owners(self) -> set[str]:
        at = clock()
        with self._lock:
            return {
                c.owner
                for c in self._calls.values()
                if c.state == "running" and c.lease_until >= at
            }

    def alive(self, owner: str) -> bool | None:
        return None  # one process: every owner in it is a runtime that may still run

    def attach(self, owner: str) -> None:
        pass

    def detach(self, owner: str) -> None:
        pass

    def write_data(self, record: DataRecord, event: Event | None) -> None:
        with self._lock:
            items = self._data.setdefault((record.call_id, record.channel), {})
            self._call_channels.setdefault(record.call_id, set()).add(record.channel)
            previous = items.get(record.item_id)
            self._seq += 1
            items[record.item_id] = replace(record, seq=previous.seq if previous else self._seq)

    def data(self, call_id: str, channel: str | None = None) -> list[DataRecord]:
        with self._lock:
            channels = self._call_channels.get(call_id, ()) if channel is None else (channel,)
            found = [
                replace(item)
                for name in channels
                for item in self._data.get((call_id, name), {}).values()
            ]
        return sorted(found, key=lambda item: item.seq)

    def call(self, call_id: str) -> CallRecord | None:
        with self._lock:
            found = self._calls.get(call_id)
            return None if found is None else replace(found)

    def calls(
        self,
        states: Iterable[CallState] | None = None,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
    ) -> list[CallRecord]:
        wanted = None if states is None else set(states)
        with self._lock:
            found = [
                replace(c)
                for c in self._calls.values()
                if (wanted is None or c.state in wanted)
                and run_id in (None, c.run_id)
                and tenant in (None, c.tenant)
            ]
        return sorted(found, key=lambda c: c.started_at)

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
        tenant: str | None = None,
    ) -> list[ActionRecord]:
        with self._lock:
            chosen = (
                self._actions.values()
                if call_id is None
                else [self._actions[a] for a in self._call_actions.get(call_id, ())]
            )
            return [
                replace(a)
                for a in chosen
                if state in (None, a.state)
                and run_id in (None, a.run_id)
                and name in (None, a.name)
                and call_id in (None, a.call_id)
                and tenant in (None, a.tenant)
            ]

    # -- files and triggers ----------------------------------------------------------------

    def save_file(
        self, record: FileRecord, content: bytes, *, keep: Callable[[], bool] | None = None
    ) -> None:
        with self._lock:
            if keep is not None and not keep():
                raise SaveStopped(f"file {record.file_id} was not kept")
            self._files[record.file_id] = (replace(record), bytes(content))

    def file(self, file_id: str) -> FileRecord | None:
        with self._lock:
            found = self._files.get(file_id)
            return None if found is None else replace(found[0])

    def file_content(self, file_id: str) -> bytes | None:
        with self._lock:
            found = self._files.get(file_id)
            return None if found is None else found[1]

    def add_trigger(self, trigger: TriggerRecord, event: Event, *, owner: str | None) -> bool:
        with self._lock:
            if owner is not None:
                self._owned(trigger.call_id, owner)
            if trigger.trigger_id in self._triggers:
                return False
            self._triggers[trigger.trigger_id] = replace(trigger)
            return True

    def claim_triggers(
        self, owner: str, lease_s: float, *, limit: int = 100
    ) -> list[TriggerRecord]:
        with self._lock:
            at = clock()
            claimed: list[TriggerRecord] = []
            for trigger in self._triggers.values():
                if len(claimed) >= limit:
                    break
                if trigger.state == "pending" or (
                    trigger.state == "claimed" and trigger.claimed_until < at
                ):
                    trigger.state, trigger.owner = "claimed", owner
                    trigger.claimed_until = at + lease_s
                    claimed.append(replace(trigger))
            return claimed

    def finish_trigger(self, trigger_id: str, owner: str, *, error: str | None = None) -> bool:
        with self._lock:
            trigger = self._triggers.get(trigger_id)
            if trigger is None or trigger.state != "claimed" or trigger.owner != owner:
                return False
            trigger.state = "delivered" if error is None else "failed"
            trigger.finished_at, trigger.error = now(), error
            return True

    def trigger(self, trigger_id: str) -> TriggerRecord | None:
        with self._lock:
            found = self._triggers.get(trigger_id)
            return None if found is None else replace(found)

    def triggers(
        self, *, state: TriggerState | None = None, run_id: str | None = None
    ) -> list[TriggerRecord]:
        with self._lock:
            return [
                replace(t)
                for t in self._triggers.values()
                if state in (None, t.state) and run_id in (None, t.run_id)
            ]

    def events(self, run_id: str, after: int = 0) -> list[Event]:
        return []  # not kept: live subscribers are the only consumers

    def head(self, run_id: str | None = None) -> int:
        return 0

    async def changed(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)  # nothing outside this process writes here

    def close(self) -> None:
        pass

    # -- helpers (called with the lock held) ---------------------------------------------------

    def _owned(self, call_id: str, owner: str) -> None:
        call = self._calls.get(call_id)
        if call is not None and (call.state != "running" or call.owner != owner):
            raise LeaseLost(call_id, owner)

    def _retire(self, call_id: str) -> None:
        """A settled call is kept among the last ``keep_settled``; the oldest is forgotten."""
        self._settled[call_id] = None
        while len(self._settled) > self.keep_settled:
            old, _ = self._settled.popitem(last=False)
            self._calls.pop(old, None)
            for channel in self._call_channels.pop(old, ()):
                self._data.pop((old, channel), None)
            for action_id in self._call_actions.pop(old, ()):
                self._actions.pop(action_id, None)


class MemoryRenewer:
    """``MemoryStore.renewer()``: its renewals, from any thread."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def renew(self, owner: str, lease_s: float) -> set[str]:
        return self._store.renew(owner, lease_s)

    def close(self) -> None:
        pass
