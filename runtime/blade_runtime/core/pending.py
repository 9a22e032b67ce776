"""Pending actions: submit, cancel and fail them; re-enter the implementation; expire them.

``submit`` validates the payload against the schema stored with the action before anything
else (an invalid payload leaves it pending), then resolves it with a compare-and-set that also
claims the call for this runtime (owner and lease, in the same transaction as its event): of
many concurrent submits, and of a submit racing a recovery sweep, exactly one wins, and only the
winner re-enters the implementation. An action past its deadline settles once as TIMEOUT, by
whichever runtime (or submit) sees it first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, JsonValue

from blade_runtime.core import actions, grants
from blade_runtime.core.behavior import Behavior
from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.calls import CallRunner
from blade_runtime.core.context import (
    ActionRef,
    CallInfo,
    CancellationSignal,
    ResumeEntry,
    SuspensionEpisode,
)
from blade_runtime.core.events import EventHub, PendingAction
from blade_runtime.core.interceptors import Interceptors
from blade_runtime.core.jsonvalue import NotJson, model_of
from blade_runtime.core.outcomes import error_result, log, nobody, submitted_json
from blade_runtime.core.permissions import ADMISSION, POINTS, STEP, STEP_POINT, PermissionPrompt
from blade_runtime.core.records import Records
from blade_runtime.core.registry import Registration
from blade_runtime.core.results import ErrorCode, ToolError, ToolResult, ToolSuccess
from blade_runtime.core.spec import JsonObject
from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import (
    ActionAlreadyResolved,
    ActionRecord,
    Event,
    Resolution,
    Resolved,
    StoreError,
    UnknownAction,
    clock,
)
from blade_runtime.core.tools import Tools


class PendingActions:
    """What happens to a call after it left a pending action."""

    def __init__(
        self,
        *,
        io: StoreAccess,
        runner: CallRunner,
        tools: Tools,
        interceptors: Interceptors,
        records: Records,
        events: EventHub,
        owner: str,
        lease_s: float,
    ) -> None:
        self.io = io
        self.store = io.store
        self.runner = runner
        self.tools = tools
        self.interceptors = interceptors
        self.records = records
        self.events = events
        self.owner = owner
        self.lease_s = lease_s

    async def submit(
        self,
        action_id: str,
        payload: JsonValue | BaseModel | str | bytes,
        *,
        principal: Principal | None = None,
    ) -> ToolResult[Any]:
        """Resolve a pending action with ``payload``: validated against the action's schema
        before anything else (an invalid payload leaves it pending). Exactly one of many
        concurrent submits wins; the others get ACTION_ALREADY_RESOLVED. A suspension re-enters
        its implementation with a typed resume entry; a client tool's call completes.
        ``principal``: who submits (another tenant's action is UNKNOWN_ACTION to it); None is
        the application itself. A store that cannot be reached is STORE_UNAVAILABLE."""
        try:
            return await self._submit(action_id, payload, principal)
        except StoreError as error:
            return _unavailable("submit", action_id, error)

    async def _submit(
        self,
        action_id: str,
        payload: JsonValue | BaseModel | str | bytes,
        principal: Principal | None,
    ) -> ToolResult[Any]:
        action = await self.records.action(action_id, principal=principal)
        if action is None:
            return error_result(
                nobody(), ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}."
            )
        call = _call_of(action)
        if action.state != "pending":
            return error_result(
                call, ErrorCode.ACTION_ALREADY_RESOLVED, actions.already_resolved(action)
            )
        if action.expires_at is not None and action.expires_at <= clock():
            expired = await self.expire(action)
            return error_result(call, ErrorCode.ACTION_ALREADY_RESOLVED, expired)
        try:
            value = submitted_json(payload)
        except NotJson as error:
            return error_result(call, ErrorCode.INVALID_SUBMISSION, str(error))
        invalid = actions.invalid_submission(action, value)
        if invalid is not None:
            return error_result(call, ErrorCode.INVALID_SUBMISSION, invalid)
        registration = self.tools.of(action.name, action.spec_id)
        if action.point is None:
            return await self._complete_client(registration, call, action, value)
        known = registration is not None and (
            action.point in POINTS or action.point in registration.points
        )
        if registration is None or not known:
            return error_result(
                call,
                ErrorCode.TOOL_HANDLER_NOT_FOUND,
                f"This runtime cannot resume {action.name}.{action.point}; it stays pending.",
            )
        if action.point in POINTS:  # the hooks and observers see the stored caller
            stored = await self.records.call(action.call_id)
            if stored is not None:
                call.context = CallContext.from_json(stored.context)
            refused = await self._answering(registration, call, action, value)
            if refused is not None:
                return refused
        resolution, event = actions.answer(action, value, self.owner, self.lease_s)
        if resolution.call_input is not None and registration.behavior is not None:
            # a person edited the input: its behaviour is narrowed again, for what will run
            call.behavior = renarrowed(registration, resolution.call_input)
            resolution = replace(
                resolution,
                call_kind=call.behavior.kind,
                call_side_effect=call.behavior.side_effect,
            )
        won = await self._resolve(action, resolution, event)
        if isinstance(won, str):
            return error_result(call, ErrorCode.ACTION_ALREADY_RESOLVED, won)
        standing = grants.from_answer(action, value, won.call_context)
        if standing is not None:  # "always allow": the next request is not asked
            await self.io(self.store.add_grant, standing)
        if resolution.call_state == "settled":  # a denied permission request
            denied = error_result(call, ErrorCode.PERMISSION_DENIED, str(resolution.reason))
            return await self.interceptors.settled(
                registration, call, won.call_input, denied, committed=True
            )
        call.context = CallContext.from_json(won.call_context)
        call.behavior = stored_behavior(won.call_kind, won.call_side_effect)
        if action.point == ADMISSION:  # approved: the first entry runs now, with the final input
            return await self.runner.run_claimed(
                registration, call, won.call_input, fence=won.call_fence
            )
        return await self.resume(registration, call, action, value, won.call_input, won.call_fence)

    async def _answering(
        self,
        registration: Registration[Any],
        call: CallInfo,
        action: ActionRecord,
        value: JsonValue,
    ) -> ToolResult[Any] | None:
        """A human's answer to a permission request, before it is accepted: the
        ``permission_request`` hooks and the ``permission_resolved`` observers see it."""
        assert isinstance(value, dict)
        decision = "allow" if value.get("decision") == "approve" else "deny"
        reason = value.get("message")
        arguments = action.payload.get("input") if isinstance(action.payload, dict) else None
        final = value.get("input") if isinstance(value.get("input"), dict) else arguments
        inputs: JsonObject = final if isinstance(final, dict) else {}
        text = reason if isinstance(reason, str) else None
        refused = await self.interceptors.permission_hooks(call, inputs, None, decision, text)
        if refused is None and self.interceptors.observers.permission_resolved:
            try:
                await self.interceptors.observing(
                    "permission_resolved",
                    self.interceptors.observers.permission_resolved,
                    registration,
                    call,
                    inputs,
                    decision,
                    text,
                    action.action_id,
                )
            except Exception as error:
                refused = self.interceptors.observer_failed("permission_resolved", call, error)
        return refused

    async def _resolve(
        self, action: ActionRecord, resolution: Resolution, event: Event
    ) -> Resolved | str:
        """Compare-and-set the action (with its call and event), or why it lost."""
        try:
            resolved: Resolved = await self.io(
                self.store.resolve, action.action_id, resolution, event
            )
            self.events.publish(resolved.event or event)
        except ActionAlreadyResolved as lost:
            return actions.already_resolved(lost.action)
        except UnknownAction:
            return f"No pending action {action.action_id!r}."
        return resolved

    async def resume(
        self,
        registration: Registration[Any],
        call: CallInfo,
        action: ActionRecord,
        value: JsonValue,
        arguments: JsonObject,
        fence: int = 0,
    ) -> ToolResult[Any]:
        assert action.point is not None
        point = STEP_POINT if action.point == STEP else registration.points[action.point]
        entry = ResumeEntry(
            action.point,
            model_of(point.resume.adapter.validate_python, value),
            ActionRef(action.action_id, call.call_id, call.run_id, action.point),
        )
        history: Callable[[], tuple[SuspensionEpisode, ...]]
        if self.io.waits and not self.io.inline_first:
            # A store that may wait for a connection is read now, off the loop (the tool reads
            # its history, a property, without awaiting). SQLite's WAL read never waits for a
            # writer: read when the tool asks, as every uncontended SQLite read is (StoreAccess).
            history = functools.partial(tuple, await self.io(self._history, call))
        else:  # read when the tool asks: it never waits (an in-memory or WAL read)
            history = functools.partial(self._history, call)
        return await self.runner.run_claimed(
            registration, call, arguments, entry, history, fence=fence
        )

    async def _complete_client(
        self,
        registration: Registration[Any] | None,
        call: CallInfo,
        action: ActionRecord,
        value: JsonValue,
    ) -> ToolResult[Any]:
        lost = await self._resolve(action, *actions.completion(action, value))
        if isinstance(lost, str):
            return error_result(call, ErrorCode.ACTION_ALREADY_RESOLVED, lost)
        typed = (
            value
            if registration is None
            else model_of(registration.output_adapter.validate_python, value)
        )
        result = ToolSuccess(call, typed, value)
        arguments = action.payload if isinstance(action.payload, dict) else {}
        finished = await self.interceptors.finish(
            registration, call, arguments, CancellationSignal(), result
        )
        return await self._observed(registration, call, action, finished)

    async def cancel(
        self, action_id: str, reason: str = "cancelled", *, principal: Principal | None = None
    ) -> ToolResult[Any]:
        """Settle the action's call as CANCELLED (exactly once, like submit)."""
        return await self._settle_by_id(action_id, principal, cancelled=True, reason=reason)

    async def fail(
        self, action_id: str, error: str | BaseException, *, principal: Principal | None = None
    ) -> ToolResult[Any]:
        """Settle the action's call as TOOL_FAILED with ``error`` as the model's sentence."""
        return await self._settle_by_id(action_id, principal, cancelled=False, reason=str(error))

    async def expire(self, action: ActionRecord) -> str:
        """Settle an action past its deadline as TIMEOUT (once, whoever asks first); returns
        the sentence a later submit gets."""
        resolution, event = actions.expiry(action)
        outcome = await self._resolve(action, resolution, event)
        return outcome if isinstance(outcome, str) else actions.already_resolved(outcome.action)

    async def _settle_by_id(
        self, action_id: str, principal: Principal | None, *, cancelled: bool, reason: str
    ) -> ToolResult[Any]:
        try:
            action = await self.records.action(action_id, principal=principal)
            if action is None:
                return error_result(
                    nobody(), ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}."
                )
            return await self.settle_action(action, cancelled=cancelled, reason=reason)
        except StoreError as error:
            return _unavailable("cancel" if cancelled else "fail", action_id, error)

    async def settle_action(
        self, action: ActionRecord, *, cancelled: bool, reason: str
    ) -> ToolResult[Any]:
        call = _call_of(action)
        settle = actions.cancellation if cancelled else actions.failure
        resolution, event, message = settle(action, reason)
        lost = await self._resolve(action, resolution, event)
        if isinstance(lost, str):
            return error_result(call, ErrorCode.ACTION_ALREADY_RESOLVED, lost)
        code = ErrorCode.CANCELLED if cancelled else ErrorCode.TOOL_FAILED
        registration = self.tools.of(action.name, action.spec_id)
        return await self._observed(registration, call, action, error_result(call, code, message))

    async def _observed(
        self,
        registration: Registration[Any] | None,
        call: CallInfo,
        action: ActionRecord,
        result: ToolResult[Any],
    ) -> ToolResult[Any]:
        """A call its action settled (committed): the ``settled`` observers see it, with the
        caller and input the store holds; what the caller is told stays what was recorded."""
        if registration is None or not self.interceptors.observers.settled:
            return result
        stored = await self.records.call(action.call_id)
        if stored is not None:
            call.context = CallContext.from_json(stored.context)
        arguments = stored.input if stored is not None else {}
        return await self.interceptors.settled(
            registration, call, arguments, result, committed=True
        )

    def pending(
        self,
        *,
        run_id: str | None = None,
        name: str | None = None,
        principal: Principal | None = None,
    ) -> list[PendingAction[Any]]:
        """Pending actions (all, of a run, or of a registration name), with typed inputs where
        this runtime knows the tool. ``principal``: only those it may see, of its tenant and
        of calls made for it (an operator's: all)."""
        found = self.records.actions_blocking(run_id=run_id, name=name, principal=principal)
        return [self.view(a) for a in found]

    async def apending(
        self,
        *,
        run_id: str | None = None,
        name: str | None = None,
        principal: Principal | None = None,
    ) -> list[PendingAction[Any]]:
        """``pending``, with the store read off the event loop."""
        found = await self.records.actions(run_id=run_id, name=name, principal=principal)
        return [self.view(a) for a in found]

    def view(self, action: ActionRecord) -> PendingAction[Any]:
        registration = self.tools.of(action.name, action.spec_id)
        typed: Any = action.payload
        if action.point in POINTS:
            typed = model_of(PermissionPrompt.model_validate, action.payload)
        elif registration is not None:
            if action.point is None:
                typed = model_of(registration.build_input, action.payload)
            elif action.point in registration.points:
                typed = model_of(
                    registration.points[action.point].suspend.adapter.validate_python,
                    action.payload,
                )
        return PendingAction.of(action, typed)

    def _history(self, call: CallInfo) -> tuple[SuspensionEpisode, ...]:
        return tuple(
            SuspensionEpisode(
                a.action_id,
                a.point or "",
                a.payload,
                a.suspended_at,
                a.state,
                a.resume,
                a.resolved_at,
            )
            for a in self.store.actions(state=None, call_id=call.call_id)
            if a.point is not None
        )


def _unavailable(verb: str, action_id: str, error: StoreError) -> ToolError:
    log.error("%s of action %s: the store is unavailable: %s", verb, action_id, error)
    return error_result(
        nobody(),
        ErrorCode.STORE_UNAVAILABLE,
        f"The store is unavailable, so the {verb} of {action_id!r} may not have been recorded; "
        "read the action, or try again.",
    )


def renarrowed(registration: Registration[Any], arguments: JsonObject) -> Behavior:
    """The registration's behaviour for ``arguments``, or its spec's when the callback fails."""
    spec = registration.spec
    try:
        return registration.narrowed(arguments)
    except Exception as error:
        log.error(
            "%s: its behavior callback failed on an edited input: %s", registration.name, error
        )
        return Behavior(spec.kind, spec.side_effect)


def stored_behavior(kind: str | None, side_effect: str | None) -> Behavior | None:
    """The behaviour a call's record holds (what its start, or an edited input's answer,
    decided), for whatever reads the call again: the policy, observers, recovery."""
    if side_effect not in ("pure", "idempotent", "non_idempotent"):
        return None
    return Behavior(kind, side_effect)  # type: ignore[arg-type]


def _call_of(action: ActionRecord) -> CallInfo:
    return CallInfo(action.call_id, action.run_id, action.name, action.spec_id)
