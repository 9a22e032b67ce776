"""``ActivityStore``: the memory store a Temporal worker's runtime runs each activity on.

The workflow holds what waits (a suspended call, its actions and ToolData) as a snapshot, a plain
JSON document in its history; an activity loads it here, runs the runtime's own pipeline over it
(submit, resume, expire) and takes the call's records back out, so nothing of a call outlives
its activity in the worker and any worker can run the next step.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from pydantic import JsonValue

from blade_runtime.core.store import ActionRecord, CallRecord, DataRecord
from blade_runtime.stores.memory import MemoryStore

Snapshot = dict[str, Any]
"""``{"calls": [...], "actions": [...], "data": [...]}``: one call's records as JSON objects."""


class ActivityStore(MemoryStore):
    """A ``MemoryStore`` whose calls can be loaded from and taken out as snapshots."""

    def load(self, snapshot: Snapshot) -> None:
        """Put one call's records back, as the activity that took them left them."""
        with self._lock:
            for raw in snapshot.get("calls", ()):
                call = CallRecord(**raw)
                self._calls[call.call_id] = call
                self._settled.pop(call.call_id, None)
            for raw in snapshot.get("actions", ()):
                action = ActionRecord(**raw)
                self._actions[action.action_id] = action
                listed = self._call_actions.setdefault(action.call_id, [])
                if action.action_id not in listed:
                    listed.append(action.action_id)
            for raw in snapshot.get("data", ()):
                item = DataRecord(**raw)
                self._data.setdefault((item.call_id, item.channel), {})[item.item_id] = item
                self._call_channels.setdefault(item.call_id, set()).add(item.channel)
                self._seq = max(self._seq, item.seq)

    def take(self, call_id: str) -> Snapshot:
        """The call's records as a snapshot, forgotten here (an activity leaves nothing)."""
        with self._lock:
            self._settled.pop(call_id, None)
            call = self._calls.pop(call_id, None)
            actions = [self._actions.pop(a) for a in self._call_actions.pop(call_id, ())]
            data = [
                item
                for channel in sorted(self._call_channels.pop(call_id, ()))
                for item in self._data.pop((call_id, channel), {}).values()
            ]
        return {
            "calls": [] if call is None else [_json(call)],
            "actions": [_json(action) for action in actions],
            "data": [_json(item) for item in sorted(data, key=lambda d: d.seq)],
        }


def _json(record: CallRecord | ActionRecord | DataRecord) -> dict[str, JsonValue]:
    found: dict[str, JsonValue] = asdict(replace(record))
    return found
