"""Tools as Temporal activities: each step of a call runs the runtime's own pipeline.

A worker holds one ``Runtime`` (its registrations, hooks, permission policy, projections) on an
``ActivityStore``. ``blade.call`` is ``Runtime.call``; ``blade.resume`` is ``Runtime.submit`` on
the call's snapshot (validation, claim, re-entry); ``blade.expire`` and ``blade.settle`` settle a
pending action as the runtime does (TIMEOUT, CANCELLED, TOOL_FAILED). What the call leaves
pending goes back to the workflow as a snapshot: nothing stays in the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue
from temporalio import activity

from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.outcomes import result_json
from blade_runtime.core.results import ToolPending, ToolResult
from blade_runtime.core.store import ActionRecord, clock
from blade_runtime.runtime import Runtime
from blade_runtime.temporal.store import ActivityStore, Snapshot

CALL, RESUME, EXPIRE, SETTLE = "blade.call", "blade.resume", "blade.expire", "blade.settle"
CANCELLED_HERE = "the call was cancelled through Temporal"


@dataclass
class CallInput:
    name: str
    arguments: dict[str, Any]
    call_id: str
    run_id: str = "default"
    context: Any = None  # CallContext.to_json(): the principal travels with the call


@dataclass
class ResumeInput:
    snapshot: Snapshot
    action_id: str
    payload: Any
    principal: Any = None  # Principal.to_json(), or None for the application


@dataclass
class SettleInput:
    snapshot: Snapshot
    action_id: str
    cancelled: bool = False  # else failed
    reason: str = ""


@dataclass
class Step:
    """What one activity left: the result as stored (``result_json``; a pending one names its
    action), and for a pending result the call's snapshot and the action it waits on."""

    result: Any
    snapshot: Snapshot | None = None
    action: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class ToolActivities:
    """The activities of one worker, over ``runtime`` (built with ``store=ActivityStore()``)."""

    def __init__(self, runtime: Runtime) -> None:
        if not isinstance(runtime.store, ActivityStore):
            raise TypeError(
                "a Temporal worker's runtime keeps nothing of its own: build it with "
                "Runtime(store=blade_runtime.temporal.ActivityStore())"
            )
        self.runtime = runtime
        self.store: ActivityStore = runtime.store

    def activities(self) -> list[Any]:
        return [self.call, self.resume, self.expire, self.settle]

    @activity.defn(name=CALL)
    async def call(self, start: CallInput) -> Step:
        context = CallContext.from_json(start.context)
        work = self.runtime.call(
            start.name, start.arguments, call_id=start.call_id, run_id=start.run_id, context=context
        )
        return await self._step(start.call_id, work)

    @activity.defn(name=RESUME)
    async def resume(self, request: ResumeInput) -> Step:
        call_id = self._load(request.snapshot)
        principal = Principal.from_json(request.principal)
        work = self.runtime.submit(request.action_id, request.payload, principal=principal)
        return await self._step(call_id, work)

    @activity.defn(name=EXPIRE)
    async def expire(self, request: SettleInput) -> Step:
        call_id = self._load(request.snapshot)
        action = self.store.action(request.action_id)
        assert action is not None, f"the snapshot of {call_id} holds no {request.action_id}"
        if action.expires_at is not None and action.expires_at > clock():
            # The workflow's timer and this machine's clock may differ by a little.
            await asyncio.sleep(action.expires_at - clock())
        await self.runtime.expire(action)
        return self._settled(call_id)

    @activity.defn(name=SETTLE)
    async def settle(self, request: SettleInput) -> Step:
        call_id = self._load(request.snapshot)
        action = self.store.action(request.action_id)
        assert action is not None, f"the snapshot of {call_id} holds no {request.action_id}"
        settled = await self.runtime.actions.settle_action(
            action, cancelled=request.cancelled, reason=request.reason
        )
        return Step(result_json(settled), extra=_kept(self.store.take(call_id)))

    def _load(self, snapshot: Snapshot) -> str:
        self.store.load(snapshot)
        call_id: str = snapshot["calls"][0]["call_id"]
        return call_id

    def _settled(self, call_id: str) -> Step:
        taken = self.store.take(call_id)
        calls = taken["calls"]
        return Step(calls[0]["result"] if calls else None, extra=_kept(taken))

    async def _step(self, call_id: str, work: Any) -> Step:
        """Run ``work`` (a runtime coroutine returning a ToolResult) beside a heartbeat; a
        cancellation of the activity cancels the call (``ctx.signal``) and returns its result."""
        task: asyncio.Task[ToolResult[Any]] = asyncio.ensure_future(work)
        beat = asyncio.ensure_future(_heartbeat(call_id))
        try:
            while True:
                try:
                    result = await asyncio.shield(task)
                    break
                except asyncio.CancelledError:
                    if task.done():
                        raise
                    self.runtime.cancel_call(call_id, CANCELLED_HERE)
        finally:
            beat.cancel()
            if not task.done():  # only when this activity itself is torn down
                task.cancel()
        try:
            return _step_of(result, self.store.take(call_id))
        finally:
            with contextlib.suppress(Exception):
                self.store.take(call_id)


def _step_of(result: ToolResult[Any], snapshot: Snapshot) -> Step:
    if isinstance(result, ToolPending):
        action_id = result.action.action_id
        record = next(a for a in snapshot["actions"] if a["action_id"] == action_id)
        pending: dict[str, JsonValue] = {
            "status": "pending",
            "content": result.content,
            "action_id": action_id,
            "action": record,
        }
        return Step(pending, snapshot, record)
    return Step(result_json(result), extra=_kept(snapshot))


def _kept(taken: Snapshot) -> dict[str, Any]:
    """What of a settled call stays readable in its workflow: its ToolData, and its actions
    (the call's suspension episodes)."""
    return {key: taken[key] for key in ("data", "actions") if taken.get(key)}


async def _heartbeat(call_id: str) -> None:
    """Heartbeats while the call runs: a worker that stops sending them is taken for dead."""
    timeout = activity.info().heartbeat_timeout
    interval = 1.0 if timeout is None else max(0.05, timeout.total_seconds() / 3)
    while True:
        # First after an interval: a call that settles sooner sends none (a heartbeat the SDK
        # still holds back delays the activity's completion).
        await asyncio.sleep(interval)
        activity.heartbeat(call_id)


def action_record(raw: dict[str, Any]) -> ActionRecord:
    return ActionRecord(**raw)
