"""``ActivityStore``: the memory store a Temporal worker's runtime runs each activity on.

The workflow holds what waits (a suspended call, its actions and ToolData) as a snapshot, a plain
JSON document in its history; an activity loads it here, runs the runtime's own pipeline over it
(submit, resume, expire) and takes the call's records back out, so nothing of a call outlives
its activity in the worker and any worker can run the next step.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pydantic import JsonValue

from blade_runtime.core.store import ActionRecord, CallRecord, DataRecord, dump_json
from blade_runtime.stores.memory import MemoryStore
from blade_runtime.stores.sql import (
    ACTION_COLUMNS,
    CALL_COLUMNS,
    DATA_COLUMNS,
    action_params,
    action_record,
    call_params,
    call_record,
    data_record,
)

Snapshot = dict[str, Any]
"""``{"calls": [...], "actions": [...], "data": [...]}``: one call's records as JSON objects."""


class ActivityStore(MemoryStore):
    """A ``MemoryStore`` whose calls can be loaded from and taken out as snapshots."""

    # A grant would outlive the activity in this worker only: permission effects are refused.
    keeps_grants = False

    def __init__(self) -> None:
        super().__init__(keep_settled=None)  # a call is taken out whole: nothing to prune

    def load(self, snapshot: Snapshot) -> None:
        """Put one call's records back, as the activity that took them left them."""
        with self._transaction() as tx:
            for raw in snapshot.get("calls", ()):
                call = CallRecord(**raw)
                tx.run(
                    f"INSERT OR REPLACE INTO blade_calls ({CALL_COLUMNS}) "
                    f"VALUES ({_marks(CALL_COLUMNS)})",
                    call_params(call),
                )
            for raw in snapshot.get("actions", ()):
                action = ActionRecord(**raw)
                tx.run(
                    f"INSERT OR REPLACE INTO blade_actions ({ACTION_COLUMNS}) "
                    f"VALUES ({_marks(ACTION_COLUMNS)})",
                    action_params(action, self._schemas),
                )
            for raw in snapshot.get("data", ()):
                item = DataRecord(**raw)
                tx.run(
                    f"INSERT OR REPLACE INTO blade_data ({DATA_COLUMNS}, root_id) "
                    f"VALUES ({_marks(DATA_COLUMNS)}, :call_id)",
                    {
                        "call_id": item.call_id,
                        "channel": item.channel,
                        "item_id": item.item_id,
                        "value": dump_json(item.value),
                        "updated_at": item.updated_at,
                        "seq": item.seq,
                    },
                )

    def take(self, call_id: str) -> Snapshot:
        """The call's records as a snapshot, forgotten here (an activity leaves nothing)."""
        key = {"id": call_id}
        with self._transaction() as tx:
            calls = tx.run(
                f"DELETE FROM blade_calls WHERE call_id = :id RETURNING {CALL_COLUMNS}", key
            ).all()
            actions = tx.run(
                f"DELETE FROM blade_actions WHERE call_id = :id RETURNING {ACTION_COLUMNS}", key
            ).all()
            data = tx.run(
                f"DELETE FROM blade_data WHERE root_id = :id RETURNING {DATA_COLUMNS}", key
            ).all()
            for table in ("blade_events", "blade_files", "blade_triggers", "blade_effects"):
                tx.run(f"DELETE FROM {table} WHERE root_id = :id", key)
        return {
            "calls": [_json(call_record(row)) for row in calls],
            "actions": [
                _json(action_record(row, self._schemas))
                for row in sorted(actions, key=lambda r: (r[8], r[0]))
            ],
            "data": [_json(data_record(row)) for row in sorted(data, key=lambda r: r[5])],
        }


def _marks(columns: str) -> str:
    return ", ".join(f":{name.strip()}" for name in columns.split(","))


def _json(record: CallRecord | ActionRecord | DataRecord) -> dict[str, JsonValue]:
    found: dict[str, JsonValue] = asdict(record)
    return found
