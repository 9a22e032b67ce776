"""The runtime: a registry of implementations, the call pipeline, and pending actions.

One call: resolve the handler -> ``pre_tool_use`` hooks -> validate the input (JSON Schema) ->
server context and permission -> record the start (durable stores: committed before the
implementation runs) -> the implementation under its deadline -> the output serialized to
lossless JSON and validated -> ``post_tool_use`` or ``post_tool_use_failure`` hooks -> a result.
An implementation that suspends, and a client-executed tool, leave a pending action; ``submit``
validates the payload before anything else, resolves the action exactly once and re-enters the
implementation (or completes the client call). Every expected outcome is a result; only a bug in
the runtime itself raises.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeAlias, TypeVar

from pydantic import BaseModel, JsonValue

from blade_runtime import actions
from blade_runtime.cancel_scope import GRACE_S, Abandoned, CancelScope
from blade_runtime.context import (
    ActionRef,
    CallInfo,
    CancellationSignal,
    InitialEntry,
    ResumeEntry,
    Suspended,
    SuspensionEpisode,
    ToolFailed,
)
from blade_runtime.events import EventHub, PendingAction, Subscription
from blade_runtime.execution import INITIAL, CallData, ChildToolError, ChildTools, ToolContext, now
from blade_runtime.export import ExportFormat, ToolExport, export_tools
from blade_runtime.hooks import (
    Hook,
    HookCallback,
    HookEvent,
    HookEventName,
    HookInput,
    HookRaised,
    HookTimedOut,
    HookVerdict,
    dispatch,
)
from blade_runtime.jsonvalue import NotJson, checked, model_of
from blade_runtime.registry import (
    NAME,
    ContextProvider,
    Registration,
    RegistrationError,
    registration,
)
from blade_runtime.results import (
    ErrorCode,
    ToolError,
    ToolPending,
    ToolResult,
    ToolSkipped,
    ToolSuccess,
    error_content,
    pending_content,
    skipped_content,
)
from blade_runtime.spec import BackendToolSpec, ClientToolSpec, JsonObject, ToolSpec
from blade_runtime.store import (
    ActionAlreadyResolved,
    ActionRecord,
    CallRecord,
    Event,
    MemoryStore,
    Resolution,
    Resolved,
    Store,
    UnknownAction,
)
from blade_runtime.validation import describe

log = logging.getLogger("blade_runtime")

IdT = TypeVar("IdT", bound=str)
InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT")
ContextT = TypeVar("ContextT")
ExecutionT = TypeVar("ExecutionT")

Permission: TypeAlias = Callable[["PermissionRequest"], Awaitable[str | None]]
"""Decides whether a validated call may run: ``None`` allows it, a sentence denies it."""
ErrorMapper: TypeAlias = Callable[[BaseException, CallInfo], str | None]
"""Turns an implementation's exception into a model-visible sentence (``None``: the generic one)."""
FallbackHandler: TypeAlias = Callable[["FallbackCall"], Awaitable[JsonValue]]
"""Handles calls to names nothing is registered under; returns the model-facing JSON."""

DEFAULT_TIMEOUT_MS = 600_000
GENERIC_ERROR = "The tool failed because of an internal error. Retrying is unlikely to help."
GENERIC_INVALID_OUTPUT = "The tool failed to produce a valid result."
INTERRUPTED_MESSAGE = (
    "The tool call was interrupted when its process stopped; it may or may not have taken "
    "effect. Check its effects (reconcile) before calling it again."
)

__all__ = ["Registration", "RegistrationError", "Runtime"]


@dataclass(frozen=True, slots=True)
class PermissionRequest:
    """What the permission callback decides on: the input that will execute, after hooks."""

    name: str
    spec_id: str | None
    call: CallInfo
    input: JsonObject


@dataclass(frozen=True, slots=True)
class FallbackCall:
    """A call to an unregistered name, handed to the app's fallback handler."""

    name: str
    arguments: JsonObject
    call: CallInfo
    signal: CancellationSignal


@dataclass(slots=True)
class _Attempt:
    """One entry of a call: whether the store holds it (so its end must be recorded there)."""

    recorded: bool = False
    data: CallData | None = None

    @property
    def stored(self) -> bool:
        return self.recorded or (self.data is not None and self.data.wrote)


class Runtime:
    """Registered tools, their calls and pending actions.

    ``store``: where calls, pending actions, ToolData and events live; the default MemoryStore
    keeps only what waits, in this process. Use a runtime from one event loop; like asyncio
    itself, it is not thread-safe (threads and processes may share a SQLiteStore file).
    """

    def __init__(
        self,
        *,
        store: Store | None = None,
        allowed: Collection[str] | None = None,
        disallowed: Collection[str] = (),
        timeout_ms: int | None = None,
        hook_timeout_ms: int = DEFAULT_TIMEOUT_MS,
        permission: Permission | None = None,
        error_mapper: ErrorMapper | None = None,
        fallback: FallbackHandler | None = None,
        cleanup_grace_s: float = GRACE_S,
    ) -> None:
        """``allowed``: when given, only these names may be called (empty: none);
        ``disallowed`` always wins. ``timeout_ms`` overrides every spec's own timeout."""
        self.store: Store = MemoryStore() if store is None else store
        self._durable = self.store.durable
        self.allowed = None if allowed is None else frozenset(allowed)
        self.disallowed = frozenset(disallowed)
        self._restricted = self.allowed is not None or bool(self.disallowed)
        self.timeout_ms = timeout_ms
        self.hook_timeout_s = hook_timeout_ms / 1000
        self.permission = permission
        self.error_mapper = error_mapper
        self.fallback = fallback
        self.cleanup_grace_s = cleanup_grace_s
        self._registrations: dict[str, Registration[Any]] = {}
        self._by_spec: dict[str, Registration[Any]] = {}  # the first registration of each id
        self._hooks: dict[HookEvent, list[Hook]] = {event: [] for event in HookEvent}
        self._pre_any = self._post_any = False
        self._running: dict[str, CancelScope] = {}  # by call id; a call enters when it suspends
        self._events = EventHub()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        prefix = f"call_{uuid.uuid4().hex[:12]}"
        self._ids = map(f"{prefix}_{{}}".format, itertools.count(1))  # C-level: no Python frame

    # -- registry --------------------------------------------------------------------------

    def register(
        self,
        spec: BackendToolSpec[IdT, InputT, OutputT, ContextT, ExecutionT],
        implementation: Callable[[ExecutionT], Awaitable[OutputT]],
        *,
        name: str | None = None,
        context: ContextProvider[ContextT] | None = None,
        timeout_ms: int | None = None,
    ) -> Registration[OutputT]:
        """Bind ``implementation`` to ``spec`` under ``name`` (default: the spec's name).

        One spec may be registered under several names. Refused here rather than at the first
        call: a taken or malformed name, and a spec that needs server context without a
        ``context`` provider.
        """
        registered = spec.name if name is None else name
        where = f"registering {spec.id} as {registered!r}"
        if not isinstance(spec, BackendToolSpec):
            raise RegistrationError(
                f"{where}: a client executes {spec.id}; use register_client(spec)"
            )
        if spec.context_schema is not None and context is None:
            raise RegistrationError(
                f"{where}: the spec declares a contextSchema, so pass context= (a function of "
                "the CallInfo returning the context model)"
            )
        if not callable(implementation):
            raise RegistrationError(f"{where}: the implementation is not callable")
        return self._add(spec, registered, implementation, context, timeout_ms)

    def register_client(
        self,
        spec: ClientToolSpec[IdT, InputT, OutputT],
        *,
        name: str | None = None,
        timeout_ms: int | None = None,
    ) -> Registration[OutputT]:
        """Offer a client-executed tool: a call becomes a pending action whose submission
        (validated against the output schema) completes it."""
        registered = spec.name if name is None else name
        if not isinstance(spec, ClientToolSpec):
            raise RegistrationError(
                f"registering {spec.id} as {registered!r}: the backend executes it; use register"
            )
        return self._add(spec, registered, None, None, timeout_ms)

    def _add(
        self,
        spec: Any,
        name: str,
        implementation: Callable[[Any], Awaitable[Any]] | None,
        context: ContextProvider[Any] | None,
        timeout_ms: int | None,
    ) -> Registration[Any]:
        where = f"registering {spec.id} as {name!r}"
        if name in self._registrations:
            other = self._registrations[name].spec.id
            raise RegistrationError(
                f"{where}: the name is already registered for {other}; pass name= to register "
                "it under another name"
            )
        if not NAME.fullmatch(name):
            raise RegistrationError(f"{where}: a name must match {NAME.pattern}")
        limit = timeout_ms or self.timeout_ms or spec.timeout_ms or DEFAULT_TIMEOUT_MS
        added = registration(spec, name, implementation, context, limit)
        self._registrations[name] = added
        self._by_spec.setdefault(spec.id, added)
        return added

    def registrations(self) -> Iterator[Registration[Any]]:
        return iter(self._registrations.values())

    def registration_of(self, spec_id: str) -> Registration[Any] | None:
        """The first registration of the spec ``spec_id`` (typed clients and child calls find
        tools by id, whatever name they were registered under)."""
        return self._by_spec.get(spec_id)

    def is_allowed(self, name: str) -> bool:
        if name in self.disallowed:
            return False
        return self.allowed is None or name in self.allowed

    def on(
        self,
        event: HookEvent | HookEventName,
        callback: HookCallback,
        *,
        tools: Collection[str] | None = None,
    ) -> None:
        """Add a hook for ``event`` (optionally only for some names); hooks run in this order."""
        self._hooks[HookEvent(event)].append(
            Hook(HookEvent(event), callback, None if tools is None else frozenset(tools))
        )
        self._pre_any = bool(self._hooks[HookEvent.PRE_TOOL_USE])
        self._post_any = bool(
            self._hooks[HookEvent.POST_TOOL_USE] or self._hooks[HookEvent.POST_TOOL_USE_FAILURE]
        )

    def export(self, format: ExportFormat = "blade") -> ToolExport:
        """The callable tools (registered and allowed) as a model-facing tool list."""
        return export_tools(
            (r.exported() for r in self._registrations.values() if self.is_allowed(r.name)),
            format,
        )

    def subscribe(self, run_id: str) -> Subscription:
        """The run's tool events from now on: started, data, suspended, pending, resumed, result."""
        return self._events.subscribe(run_id)

    # -- cancellation ----------------------------------------------------------------------

    def cancel_call(self, call_id: str, reason: str = "the call was cancelled") -> bool:
        """Cancel one running call; it settles as CANCELLED. False if it is not running."""
        scope = self._running.get(call_id)
        return scope is not None and scope.cancel("cancelled", reason)

    def cancel_run(self, run_id: str, reason: str = "the run was cancelled") -> int:
        """Cancel every running call of ``run_id`` and every pending action it waits on;
        returns how many were cancelled."""
        calls = [call for call, scope in self._running.items() if scope.call.run_id == run_id]
        cancelled = sum(self.cancel_call(call, reason) for call in calls)
        for action in self.store.actions(run_id=run_id):
            settled = self._settle_action(action, cancelled=True, reason=reason)
            cancelled += isinstance(settled, ToolError) and settled.code == ErrorCode.CANCELLED
        return cancelled

    # -- calling ---------------------------------------------------------------------------

    async def call(
        self,
        name: str,
        arguments: JsonObject | str | bytes,
        *,
        call_id: str | None = None,
        run_id: str = "default",
    ) -> ToolResult[Any]:
        """Call the tool registered as ``name`` with the model's arguments (a JSON object or
        its text). Never raises for an expected outcome: the result says what happened."""
        registration = self._registrations.get(name)
        spec_id = "" if registration is None else registration.spec.id
        call = CallInfo(next(self._ids) if call_id is None else call_id, run_id, name, spec_id)
        if registration is None or self._restricted or registration.detached:
            refused = self._refuse(registration, call)
            if refused is not None:
                return refused
        parsed = arguments if type(arguments) is dict else _parse_arguments(arguments)
        if isinstance(parsed, str):
            return _error(call, ErrorCode.INVALID_INPUT, parsed)
        if call.call_id in self._running:
            raise ValueError(f"call id {call.call_id!r} is already running")

        scope = CancelScope(call, self._running, registration)
        if self.cleanup_grace_s != GRACE_S:
            scope.grace_s = self.cleanup_grace_s
        try:
            if registration is None:
                result = await self._fallback(call, parsed, scope)
            else:
                admitted = await self._admit(call, parsed, scope) if self._pre_any else parsed
                if isinstance(admitted, _RESULTS):
                    result = admitted
                elif registration.input_validator.is_valid(admitted):
                    result = await self._enter(registration, call, admitted, scope)
                else:
                    result = self._invalid(registration, call, admitted)
        except (asyncio.CancelledError, Abandoned) as stopped:
            result = self._stopped(call, scope, stopped)
        finally:
            scope.close()
        if not self._post_any:
            return result
        return await self._finish(registration, call, parsed, scope.signal, result)

    async def _call_child(self, tool: ToolSpec[Any, Any, Any], input: Any, call: CallInfo) -> Any:
        """One ``ctx.tools.call``: a full call of the child's registration, its output or a
        ChildToolError."""
        registration = self.registration_of(tool.id)
        if registration is None:
            raise ChildToolError(
                tool.id, "TOOL_HANDLER_NOT_FOUND", "this runtime has no registration of it"
            )
        arguments = input.model_dump(by_alias=True, exclude_unset=True)
        result = await self.call(
            registration.name, arguments, call_id=call.call_id, run_id=call.run_id
        )
        if isinstance(result, ToolSuccess):
            return result.output
        if isinstance(result, ToolError):
            raise ChildToolError(tool.id, result.code.value, result.message)
        if isinstance(result, ToolSkipped):
            raise ChildToolError(tool.id, "SKIPPED", result.reason)
        raise ChildToolError(tool.id, "PENDING", "a child tool cannot wait on a pending action")

    def _refuse(self, registration: Registration[Any] | None, call: CallInfo) -> ToolError | None:
        """Why the call cannot even start: no handler, not allowed, or unavailable."""
        name = call.name
        if registration is None:
            if self.fallback is None:
                return _error(
                    call, ErrorCode.TOOL_HANDLER_NOT_FOUND, f"There is no tool named {name!r}."
                )
            return None
        if self._restricted and not self.is_allowed(name):
            return _error(call, ErrorCode.TOOL_NOT_ALLOWED, f"The tool {name!r} is not enabled.")
        if registration.detached:
            return _error(
                call,
                ErrorCode.TOOL_UNAVAILABLE,
                f"The tool {name!r} is temporarily unavailable; try again later.",
            )
        return None

    async def _admit(
        self, call: CallInfo, arguments: JsonObject, scope: CancelScope
    ) -> JsonObject | ToolResult[Any]:
        """Pre-hooks: the arguments to validate (possibly modified), or the hooks' result."""
        scope.bind()
        verdict = await self._pre_hooks(call, arguments, scope.signal)
        if not isinstance(verdict, HookVerdict):
            return verdict
        return arguments if verdict.input is None else verdict.input

    @staticmethod
    def _invalid(
        registration: Registration[Any], call: CallInfo, arguments: JsonObject
    ) -> ToolError:
        """INVALID_INPUT naming every failing path and what was expected there."""
        problems = describe(registration.input_validator.violations(arguments))
        return _error(
            call, ErrorCode.INVALID_INPUT, f"Invalid arguments for {call.name}: {problems}."
        )

    async def _enter(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        entry: InitialEntry | ResumeEntry[Any, Any] = INITIAL,
        history: Callable[[], tuple[SuspensionEpisode, ...]] | None = None,
    ) -> ToolResult[Any]:
        """Run one entry of the implementation (or open a client tool's pending action)."""
        context = None
        if registration.context is not None or (self.permission is not None and entry is INITIAL):
            context, refused = await self._prepare(registration, call, arguments, scope, entry)
            if refused is not None:
                return refused
        if registration.implementation is None:
            return self._await_client(registration, call, arguments)
        attempt = None
        if self._durable or registration.data or entry is not INITIAL:
            attempt = scope.stored = self._start(registration, call, arguments, entry)
        elif self._events.active:
            self._events.publish(self._event(call, "started", None))
        ctx = ToolContext(registration.spec.input_type, arguments, call, scope, registration.points)
        if context is not None:
            ctx.context = context
        if attempt is not None:
            ctx.data = attempt.data
        if entry is not INITIAL:
            ctx.entry = entry
        if history is not None:
            ctx._history = history
        if registration.children:
            ctx.tools = ChildTools(self._call_child, call, registration.children)
        try:
            output = await scope.run(registration.implementation(ctx), registration.timeout_s)
        except ToolFailed as failure:
            result: ToolResult[Any] = _error(call, ErrorCode.TOOL_FAILED, failure.message)
        except Suspended as suspended:
            return self._suspend(registration, call, arguments, suspended, attempt)
        except Exception as error:
            result = self._tool_error(call, error)
        else:
            result = self._output(registration, call, output, ctx._display)
        finally:
            scope.stop()
        if attempt is None and not self._events.active:
            return result
        return self._settled(call, result, attempt)

    async def _prepare(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        entry: InitialEntry | ResumeEntry[Any, Any],
    ) -> tuple[Any, ToolResult[Any] | None]:
        """The server context, and the permission of an initial entry: (context, None), or
        (None, the result that ends the call)."""
        try:
            context = None
            if registration.context is not None:
                context = registration.context(call)
                if inspect.isawaitable(context):
                    scope.bind()
                    context = await context
            if self.permission is not None and entry is INITIAL:
                scope.bind()
                request = PermissionRequest(call.name, registration.spec.id, call, arguments)
                denied = await self.permission(request)
                if denied is not None:
                    return None, _error(call, ErrorCode.PERMISSION_DENIED, denied)
        except Exception as error:
            return None, self._tool_error(call, error)
        if scope.reason is not None:
            return None, self._cancelled(call, scope)
        return context, None

    def _start(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        entry: InitialEntry | ResumeEntry[Any, Any],
    ) -> _Attempt:
        """Record the start of an entry where the store keeps it (committed before the tool
        runs), announce it, and open its ToolData writer."""
        resumed = entry is not INITIAL
        attempt = _Attempt(self._durable or resumed)
        if attempt.recorded and not resumed:  # a resume's start was recorded with its submission
            record = self._record(registration, call, arguments, "running")
            self._emit(self.store.begin, record, self._event(call, "started", None))
        elif not resumed and self._events.active:
            self._events.publish(self._event(call, "started", None))
        if registration.data:
            attempt.data = CallData(call, registration.data, self.store, self._events.publish)
        return attempt

    def _output(
        self, registration: Registration[Any], call: CallInfo, output: Any, display: JsonValue
    ) -> ToolResult[Any]:
        # JSON-mode serialization (pydantic, in Rust) on the hot path; ToolData and suspend
        # payloads, which are stored, get the stricter lossless check instead.
        try:
            content = registration.output_adapter.serializer.to_python(
                output, mode="json", by_alias=True, exclude_unset=True, warnings=False
            )
        except Exception as error:
            log.error("%s (call %s): the output is not JSON: %s", call.name, call.call_id, error)
            return _error(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        validator = registration.output_validator
        if validator is not None and not validator.is_valid(content):
            log.error(
                "%s (call %s): the output violates the output schema of %s: %s",
                call.name,
                call.call_id,
                registration.spec.id,
                describe(validator.violations(content)),
            )
            return _error(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        return ToolSuccess(call, output, content, display)

    def _settled(
        self, call: CallInfo, result: ToolResult[Any], attempt: _Attempt | None
    ) -> ToolResult[Any]:
        """Record the end of a stored call (with its event), or just announce it."""
        if attempt is not None and attempt.stored:
            event = self._event(call, "result", _result_json(result))
            self._emit(self.store.settle, call.call_id, event.payload, event)
        elif self._events.active:
            self._events.publish(self._event(call, "result", _result_json(result)))
        return result

    def _stopped(
        self, call: CallInfo, scope: CancelScope, stopped: BaseException
    ) -> ToolResult[Any]:
        """The result of a call a cancellation or a deadline ended (or the exception to raise)."""
        attempt: _Attempt | None = scope.stored
        if isinstance(stopped, Abandoned):
            log.error(
                "%s (call %s, run %s) ignored cancellation for %.1f s; the registration refuses "
                "new calls until it exits",
                call.name,
                call.call_id,
                call.run_id,
                self.cleanup_grace_s,
            )
            return self._settled(call, self._cancelled(call, scope), attempt)
        if scope.release() > 0:
            raise stopped  # the caller's own task was cancelled from outside: not ours to absorb
        if scope.reason is None:
            result = self._tool_error(call, asyncio.CancelledError("raised by the tool"))
        else:
            result = self._cancelled(call, scope)
        return self._settled(call, result, attempt)

    async def _finish(
        self,
        registration: Registration[Any] | None,
        call: CallInfo,
        arguments: JsonObject,
        signal: CancellationSignal,
        result: ToolResult[Any],
    ) -> ToolResult[Any]:
        """Post-hooks, for results the tool itself produced."""
        if not self._post_any or isinstance(result, ToolSkipped | ToolPending):
            return result
        if isinstance(result, ToolError) and result.code in _HOOK_CODES:
            return result
        return await self._post_hooks(registration, call, arguments, signal, result)

    async def _fallback(
        self, call: CallInfo, arguments: JsonObject, scope: CancelScope
    ) -> ToolResult[Any]:
        assert self.fallback is not None
        scope.bind()
        if self._pre_any:
            verdict = await self._pre_hooks(call, arguments, scope.signal)
            if not isinstance(verdict, HookVerdict):
                return verdict
            if verdict.input is not None:
                arguments = verdict.input
        request = FallbackCall(call.name, arguments, call, scope.signal)
        limit = (self.timeout_ms or DEFAULT_TIMEOUT_MS) / 1000
        try:
            content = await scope.run(self.fallback(request), limit)
        except ToolFailed as failure:
            return _error(call, ErrorCode.TOOL_FAILED, failure.message)
        except Exception as error:
            return self._tool_error(call, error)
        finally:
            scope.stop()
        try:
            content = checked(content)
        except NotJson as error:
            log.error("fallback for %s returned a value that is not JSON: %s", call.name, error)
            return _error(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        return ToolSuccess(call, content, content)

    # -- suspensions and client tools ------------------------------------------------------

    def _suspend(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        suspended: Suspended,
        attempt: _Attempt | None,
    ) -> ToolResult[Any]:
        point = registration.points[suspended.point]  # ctx.suspend checked the name
        action = self._action(call, suspended.point, suspended.payload, point.resume.schema)
        record = self._record(registration, call, arguments, "suspended")
        payload: JsonValue = {"action_id": action.action_id, "point": action.point}
        try:
            event = self._event(call, "suspended", payload)
            known = attempt is not None and attempt.recorded
            self.store.suspend(record, action, event, known=known)
            self._events.publish(event)
        except Exception as error:
            return self._settled(call, self._tool_error(call, error), attempt)
        typed = model_of(point.suspend.adapter.validate_python, suspended.payload)
        view = PendingAction.of(action, typed)
        return ToolPending(call, view, pending_content(view))

    def _await_client(
        self, registration: Registration[Any], call: CallInfo, arguments: JsonObject
    ) -> ToolResult[Any]:
        assert registration.output is not None  # client specs always have an output schema
        action = self._action(call, None, dict(arguments), registration.output.schema)
        record = self._record(registration, call, arguments, "pending")
        payload: JsonValue = {"action_id": action.action_id}
        try:
            self._emit(self.store.suspend, record, action, self._event(call, "pending", payload))
        except Exception as error:
            return self._tool_error(call, error)
        view = PendingAction.of(
            action, model_of(registration.spec.input_type.model_validate, arguments)
        )
        return ToolPending(call, view, pending_content(view))

    async def submit(
        self, action_id: str, payload: JsonValue | BaseModel | str | bytes
    ) -> ToolResult[Any]:
        """Resolve a pending action with ``payload``: validated against the action's schema
        before anything else (an invalid payload leaves it pending). Exactly one of many
        concurrent submits wins; the others get ACTION_ALREADY_RESOLVED. A suspension re-enters
        its implementation with a typed resume entry; a client tool's call completes."""
        action = self.store.action(action_id)
        if action is None:
            return _error(_nobody(), ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}.")
        call = CallInfo(action.call_id, action.run_id, action.name, action.spec_id)
        if action.state != "pending":
            return _error(call, ErrorCode.ACTION_ALREADY_RESOLVED, actions.already_resolved(action))
        value = _submitted_json(payload)
        if isinstance(value, str):
            return _error(call, ErrorCode.INVALID_SUBMISSION, value)
        invalid = actions.invalid_submission(action, value)
        if invalid is not None:
            return _error(call, ErrorCode.INVALID_SUBMISSION, invalid)
        registration = self._registrations.get(action.name)
        if action.point is None:
            return await self._complete_client(registration, call, action, value)
        point = None if registration is None else registration.points.get(action.point)
        if registration is None or point is None:
            return _error(
                call,
                ErrorCode.TOOL_HANDLER_NOT_FOUND,
                f"This runtime cannot resume {action.name}.{action.point}; it stays pending.",
            )
        won = self._resolve(action, *actions.resumption(action, value, self.owner))
        if isinstance(won, str):
            return _error(call, ErrorCode.ACTION_ALREADY_RESOLVED, won)
        return await self._resume(registration, call, action, value, won.call_input)

    def _resolve(
        self, action: ActionRecord, resolution: Resolution, event: Event
    ) -> Resolved | str:
        """Compare-and-set the action (with its call and event), or why it lost."""
        try:
            resolved: Resolved = self._emit(self.store.resolve, action.action_id, resolution, event)
        except ActionAlreadyResolved as lost:
            return actions.already_resolved(lost.action)
        except UnknownAction:
            return f"No pending action {action.action_id!r}."
        return resolved

    async def _resume(
        self,
        registration: Registration[Any],
        call: CallInfo,
        action: ActionRecord,
        value: JsonValue,
        arguments: JsonObject,
    ) -> ToolResult[Any]:
        assert action.point is not None
        point = registration.points[action.point]
        entry = ResumeEntry(
            action.point,
            model_of(point.resume.adapter.validate_python, value),
            ActionRef(action.action_id, call.call_id, call.run_id, action.point),
        )
        return await self._run(registration, call, arguments, entry, lambda: self._history(call))

    async def _run(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        entry: InitialEntry | ResumeEntry[Any, Any] = INITIAL,
        history: Callable[[], tuple[SuspensionEpisode, ...]] | None = None,
    ) -> ToolResult[Any]:
        """One entry of an admitted call (a resume, or a replay), under its own cancel scope."""
        scope = CancelScope(call, self._running, registration)
        try:
            result = await self._enter(registration, call, arguments, scope, entry, history)
        except (asyncio.CancelledError, Abandoned) as stopped:
            result = self._stopped(call, scope, stopped)
        finally:
            scope.close()
        return await self._finish(registration, call, arguments, scope.signal, result)

    async def _complete_client(
        self,
        registration: Registration[Any] | None,
        call: CallInfo,
        action: ActionRecord,
        value: JsonValue,
    ) -> ToolResult[Any]:
        lost = self._resolve(action, *actions.completion(action, value))
        if isinstance(lost, str):
            return _error(call, ErrorCode.ACTION_ALREADY_RESOLVED, lost)
        typed = (
            value
            if registration is None
            else model_of(registration.output_adapter.validate_python, value)
        )
        result = ToolSuccess(call, typed, value)
        arguments = action.payload if isinstance(action.payload, dict) else {}
        return await self._finish(registration, call, arguments, CancellationSignal(), result)

    def cancel(self, action_id: str, reason: str = "cancelled") -> ToolResult[Any]:
        """Settle the action's call as CANCELLED (exactly once, like submit)."""
        return self._settle_by_id(action_id, cancelled=True, reason=reason)

    def fail(self, action_id: str, error: str | BaseException) -> ToolResult[Any]:
        """Settle the action's call as TOOL_FAILED with ``error`` as the model's sentence."""
        return self._settle_by_id(action_id, cancelled=False, reason=str(error))

    def _settle_by_id(self, action_id: str, *, cancelled: bool, reason: str) -> ToolResult[Any]:
        action = self.store.action(action_id)
        if action is None:
            return _error(_nobody(), ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}.")
        return self._settle_action(action, cancelled=cancelled, reason=reason)

    def _settle_action(
        self, action: ActionRecord, *, cancelled: bool, reason: str
    ) -> ToolResult[Any]:
        call = CallInfo(action.call_id, action.run_id, action.name, action.spec_id)
        settle = actions.cancellation if cancelled else actions.failure
        resolution, event, message = settle(action, reason)
        lost = self._resolve(action, resolution, event)
        if isinstance(lost, str):
            return _error(call, ErrorCode.ACTION_ALREADY_RESOLVED, lost)
        return _error(call, ErrorCode.CANCELLED if cancelled else ErrorCode.TOOL_FAILED, message)

    def pending(
        self, *, run_id: str | None = None, name: str | None = None
    ) -> list[PendingAction[Any]]:
        """Pending actions (all, of a run, or of a registration name), with typed inputs where
        this runtime knows the tool."""
        return [self._view(a) for a in self.store.actions(run_id=run_id, name=name)]

    def _view(self, action: ActionRecord) -> PendingAction[Any]:
        registration = self._registrations.get(action.name)
        typed: Any = action.payload
        if registration is not None:
            if action.point is None:
                typed = model_of(registration.spec.input_type.model_validate, action.payload)
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

    # -- recovery --------------------------------------------------------------------------

    async def recover(self, *, replay: bool = True) -> list[ToolResult[Any]]:
        """Settle the calls a stopped process left behind (seed 000's side-effect contract).

        A call whose action was submitted but not yet resumed is resumed. A call that was running:
        ``pure`` and ``idempotent`` ones are run again from the entry they were in (when
        ``replay``); ``non_idempotent`` ones are never run again: they settle as INTERRUPTED, for
        reconciliation. Calls of live processes and of tools this runtime lacks are left alone.
        """
        results: list[ToolResult[Any]] = []
        for record in self.store.calls(["running", "resumable"]):
            registration = self._registrations.get(record.name)
            if registration is None or registration.implementation is None:
                log.warning(
                    "recovery: %s (call %s) is not registered here", record.name, record.call_id
                )
                continue
            if record.state == "running" and _alive(record.owner, self.owner):
                continue
            call = CallInfo(record.call_id, record.run_id, record.name, record.spec_id)
            safe = record.state == "resumable" or record.side_effect in ("pure", "idempotent")
            if record.state == "running" and not (safe and replay):
                if record.side_effect == "non_idempotent":
                    interrupted = _error(call, ErrorCode.INTERRUPTED, INTERRUPTED_MESSAGE)
                    results.append(self._settled(call, interrupted, _Attempt(recorded=True)))
                continue
            results.append(await self._rerun(registration, call, record))
        return results

    async def _rerun(
        self, registration: Registration[Any], call: CallInfo, record: CallRecord
    ) -> ToolResult[Any]:
        entry = record.entry
        if isinstance(entry, dict) and entry.get("action_id"):
            action = self.store.action(str(entry["action_id"]))
            if action is not None:
                if record.state == "resumable" or record.owner != self.owner:
                    self._emit(
                        self.store.begin,
                        replace(record, state="running", owner=self.owner),
                        self._event(call, "resumed", {"action_id": action.action_id}),
                    )
                resume = entry.get("resume")
                return await self._resume(registration, call, action, resume, record.input)
        return await self._run(registration, call, record.input)

    # -- records and events ----------------------------------------------------------------

    def _record(
        self, registration: Registration[Any], call: CallInfo, arguments: JsonObject, state: Any
    ) -> CallRecord:
        spec = registration.spec
        return CallRecord(
            call.call_id,
            call.run_id,
            call.name,
            spec.id,
            spec.side_effect,
            spec.execution,
            arguments,
            state,
            now(),
            self.owner,
        )

    def _action(
        self, call: CallInfo, point: str | None, payload: JsonValue, schema: JsonObject
    ) -> ActionRecord:
        return ActionRecord(
            _action_id(),
            call.call_id,
            call.run_id,
            call.name,
            call.spec_id,
            point,
            payload,
            schema,
            now(),
        )

    def _event(self, call: CallInfo, kind: str, payload: JsonValue) -> Event:
        return Event(call.run_id, call.call_id, kind, payload, now())

    def _emit(self, write: Callable[..., Any], *args: Any) -> Any:
        """Commit ``write`` (its last argument is the event), then tell live subscribers."""
        written = write(*args)
        self._events.publish(args[-1])
        return written

    # -- hooks -----------------------------------------------------------------------------

    def _hooks_for(self, event: HookEvent, name: str) -> list[Hook]:
        hooks = self._hooks[event]
        return [hook for hook in hooks if hook.applies_to(name)] if hooks else hooks

    async def _pre_hooks(
        self, call: CallInfo, arguments: JsonObject, signal: CancellationSignal
    ) -> HookVerdict | ToolResult[Any]:
        hooks = self._hooks_for(HookEvent.PRE_TOOL_USE, call.name)
        if not hooks:
            return HookVerdict()
        event = HookInput(
            HookEvent.PRE_TOOL_USE, call.name, call.spec_id or None, call, arguments, signal
        )
        try:
            verdict = await dispatch(hooks, event, self.hook_timeout_s)
        except HookRaised as raised:
            log.error("pre_tool_use %s for %s (call %s)", raised, call.name, call.call_id)
            return _error(call, ErrorCode.HOOK_FAILED, GENERIC_ERROR)
        except HookTimedOut as timed_out:
            log.error("%s for %s (call %s)", timed_out, call.name, call.call_id)
            return _error(call, ErrorCode.HOOK_TIMEOUT, "The tool call timed out before it ran.")
        if verdict.action == "skip":
            reason = verdict.reason or "skipped by a hook"
            return ToolSkipped(call, reason, skipped_content(reason))
        if verdict.action == "abort":
            reason = verdict.reason or "The tool call was blocked."
            return _error(call, ErrorCode.HOOK_ABORTED, reason)
        return verdict

    async def _post_hooks(
        self,
        registration: Registration[Any] | None,
        call: CallInfo,
        arguments: JsonObject,
        signal: CancellationSignal,
        result: ToolResult[Any],
    ) -> ToolResult[Any]:
        success = isinstance(result, ToolSuccess)
        event = HookEvent.POST_TOOL_USE if success else HookEvent.POST_TOOL_USE_FAILURE
        hooks = self._hooks_for(event, call.name)
        if not hooks:
            return result
        spec_id = None if registration is None else registration.spec.id
        hook_input = HookInput(
            event,
            call.name,
            spec_id,
            call,
            arguments,
            signal,
            output=result.content,
            error=result if isinstance(result, ToolError) else None,
        )
        try:
            verdict = await dispatch(hooks, hook_input, self.hook_timeout_s)
        except (HookRaised, HookTimedOut) as problem:
            log.error("%s %s for %s (call %s)", event, problem, call.name, call.call_id)
            if not success:
                return result  # a failing failure hook never hides the original error
            code = (
                ErrorCode.HOOK_TIMEOUT
                if isinstance(problem, HookTimedOut)
                else ErrorCode.HOOK_FAILED
            )
            return _error(call, code, GENERIC_ERROR)
        if success and verdict.action == "abort":
            return _error(
                call, ErrorCode.HOOK_ABORTED, verdict.reason or "The tool result was withheld."
            )
        if verdict.output is None:
            return result
        if isinstance(result, ToolSuccess):
            return ToolSuccess(result.call, result.output, verdict.output, result.display)
        assert isinstance(result, ToolError)
        return ToolError(result.call, result.code, result.message, verdict.output, result.display)

    # -- outcomes --------------------------------------------------------------------------

    def _tool_error(self, call: CallInfo, error: BaseException) -> ToolError:
        log.error(
            "%s (call %s, run %s) raised %s",
            call.name,
            call.call_id,
            call.run_id,
            type(error).__name__,
            exc_info=error,
        )
        message = None
        if self.error_mapper is not None:
            try:
                message = self.error_mapper(error, call)
            except Exception:
                log.exception("the error mapper raised for %s (call %s)", call.name, call.call_id)
        return _error(call, ErrorCode.TOOL_ERROR, message or GENERIC_ERROR)

    def _cancelled(self, call: CallInfo, scope: CancelScope) -> ToolError:
        if scope.reason == "timeout":
            registration = self._registrations.get(call.name)
            limit = registration.timeout_ms if registration else self.timeout_ms
            seconds = (limit or DEFAULT_TIMEOUT_MS) / 1000
            return _error(call, ErrorCode.TIMEOUT, f"The tool did not finish within {seconds:g} s.")
        return _error(
            call, ErrorCode.CANCELLED, f"The tool call was cancelled: {scope.signal.reason}."
        )


_HOOK_CODES = frozenset({ErrorCode.HOOK_ABORTED, ErrorCode.HOOK_FAILED, ErrorCode.HOOK_TIMEOUT})
_RESULTS = (ToolSuccess, ToolSkipped, ToolError, ToolPending)


def _action_id() -> str:
    """Unique and time-ordered, so that a new action lands at the end of the store's index
    instead of on a random page of it (a third of the cost of inserting it, measured)."""
    return f"act_{time.time_ns():016x}{secrets.token_hex(6)}"


def _error(call: CallInfo, code: ErrorCode, message: str) -> ToolError:
    return ToolError(call, code, message, error_content(code, message))


def _nobody() -> CallInfo:
    return CallInfo("", "", "", "")


def _result_json(result: ToolResult[Any]) -> JsonValue:
    """How a result is stored and announced."""
    if isinstance(result, ToolError):
        return actions.error_json(result.code, result.message)
    return actions.success_json(result.content)


def _parse_arguments(arguments: JsonObject | str | bytes) -> JsonObject | str:
    """The arguments as a JSON object, or a sentence saying why they are not one."""
    if isinstance(arguments, str | bytes):
        try:
            arguments = json.loads(arguments)
        except ValueError as error:
            return f"The arguments are not valid JSON: {error}."
    if not isinstance(arguments, dict):
        return "The arguments must be a JSON object."
    return arguments


def _submitted_json(payload: JsonValue | BaseModel | str | bytes) -> JsonValue | str:
    """A submission as lossless JSON, or a sentence saying why it is not JSON.

    Text is parsed as JSON; a model is serialized (unset fields left out)."""
    try:
        if isinstance(payload, BaseModel):
            return checked(payload.model_dump(mode="python", by_alias=True, exclude_unset=True))
        if isinstance(payload, bytes | str):
            return checked(json.loads(payload))
        return checked(payload)
    except (ValueError, NotJson) as error:
        return f"The submission is not JSON: {error}"


def _alive(owner: str, me: str) -> bool:
    """Whether the runtime that wrote ``owner`` may still be running (so its calls are its own).

    Only a process on this host can be checked; one on another host is taken to be alive."""
    if owner == me:
        return True
    host, _, rest = owner.partition(":")
    pid, _, _ = rest.partition(":")
    my_host, _, my_rest = me.partition(":")
    if host != my_host or not pid.isdigit():
        return host != my_host
    if pid == my_rest.partition(":")[0]:
        return False  # another runtime object of this process left it: it is not running
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
