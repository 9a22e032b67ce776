"""The runtime: a registry of implementations and the call pipeline.

One call: resolve the handler -> ``pre_tool_use`` hooks -> validate the input (JSON Schema) ->
typed input model, server context, permission -> run the implementation under its deadline ->
serialize and validate the output -> ``post_tool_use`` or ``post_tool_use_failure`` hooks -> a
result value. Every expected outcome is a result; only a bug in the runtime itself raises.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, NoReturn, TypeAlias, TypeVar

from pydantic import BaseModel, JsonValue, TypeAdapter, ValidationError

from blade_runtime.cancel_scope import GRACE_S, Abandoned, CancelScope
from blade_runtime.context import (
    CallInfo,
    CancellationSignal,
    DataItem,
    InitialEntry,
    Suspended,
    SuspensionEpisode,
    ToolFailed,
)
from blade_runtime.export import ExportedTool, ExportFormat, ToolExport, export_tools
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
from blade_runtime.results import (
    ErrorCode,
    ToolError,
    ToolResult,
    ToolSkipped,
    ToolSuccess,
    error_content,
    skipped_content,
)
from blade_runtime.spec import BackendToolSpec, JsonObject
from blade_runtime.validation import SchemaValidator, describe

log = logging.getLogger("blade_runtime")

IdT = TypeVar("IdT", bound=str)
InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT")
ContextT = TypeVar("ContextT")
ExecutionT = TypeVar("ExecutionT")

ContextProvider: TypeAlias = Callable[[CallInfo], ContextT | Awaitable[ContextT]]
"""Builds a tool's server context for one call (sync or async)."""
Permission: TypeAlias = Callable[["PermissionRequest"], Awaitable[str | None]]
"""Decides whether a validated call may run: ``None`` allows it, a sentence denies it."""
ErrorMapper: TypeAlias = Callable[[BaseException, CallInfo], str | None]
"""Turns an implementation's exception into a model-visible sentence (``None``: the generic one)."""
FallbackHandler: TypeAlias = Callable[["FallbackCall"], Awaitable[JsonValue]]
"""Handles calls to names nothing is registered under; returns the model-facing JSON."""

DEFAULT_TIMEOUT_MS = 600_000
GENERIC_ERROR = "The tool failed because of an internal error. Retrying is unlikely to help."
GENERIC_INVALID_OUTPUT = "The tool failed to produce a valid result."


class RegistrationError(ValueError):
    """A registration the runtime refuses; the message says why and what to do."""


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


@dataclass(eq=False, slots=True)
class Registration(Generic[OutputT]):
    """One name bound to one spec and its implementation."""

    name: str
    spec: BackendToolSpec[Any, Any, OutputT, Any, Any]
    implementation: Callable[[Any], Awaitable[OutputT]]
    context: ContextProvider[Any] | None
    timeout_ms: int
    input_validator: SchemaValidator
    output_validator: SchemaValidator | None
    output_adapter: TypeAdapter[Any]
    data: Mapping[str, _Channel]
    timeout_s: float = field(init=False)
    detached: set[asyncio.Task[None]] = field(default_factory=set)
    """Implementations abandoned after ignoring cancellation and still running."""

    def __post_init__(self) -> None:
        self.timeout_s = self.timeout_ms / 1000

    def track(self, task: asyncio.Task[None]) -> None:
        """Refuse calls until the abandoned implementation running in ``task`` exits."""
        self.detached.add(task)
        task.add_done_callback(self._exited)

    def _exited(self, task: asyncio.Task[None]) -> None:
        self.detached.discard(task)
        error = None if task.cancelled() else task.exception()
        log.warning(
            "%s: an abandoned implementation exited%s; the registration accepts calls again",
            self.name,
            f" raising {type(error).__name__}: {error}" if error else "",
        )

    def exported(self) -> ExportedTool:
        spec = self.spec
        return ExportedTool(
            name=self.name,
            id=spec.id,
            description=spec.description,
            input_schema=spec.input_schema,
            output_schema=spec.output_schema,
            kind=spec.kind,
            side_effect=spec.side_effect,
            execution=spec.execution,
            timeout_ms=self.timeout_ms,
        )


@dataclass(frozen=True, slots=True)
class _Channel:
    validator: SchemaValidator
    adapter: TypeAdapter[Any]


class DataRejected(ValueError):
    """A ToolData record its channel schema rejects (an implementation bug: a TOOL_ERROR)."""


class _CallData:
    """``ctx.data``: the call's ToolData records, validated per channel and kept in write order."""

    __slots__ = ("_channels", "_counter", "_items")

    def __init__(self, channels: Mapping[str, _Channel]) -> None:
        self._channels = channels
        self._items: dict[str, dict[str, DataItem[Any]]] = {}
        self._counter = itertools.count(1)

    async def write(
        self, channel: str, value: Any, *, id: str | None = None, transient: bool = False
    ) -> None:
        spec = self._channel(channel)
        record = spec.adapter.dump_python(
            value, mode="json", by_alias=True, exclude_unset=True, warnings=False
        )
        if not spec.validator.is_valid(record):
            problems = describe(spec.validator.violations(record))
            raise DataRejected(f"ToolData channel {channel!r} rejected a record: {problems}")
        if transient:
            return
        items = self._items.setdefault(channel, {})
        key = id if id is not None else f"{channel}-{next(self._counter)}"
        items[key] = DataItem(key, value, _now())

    async def list(self, channel: str) -> Sequence[DataItem[Any]]:
        self._channel(channel)
        return list(self._items.get(channel, {}).values())

    def _channel(self, channel: str) -> _Channel:
        try:
            return self._channels[channel]
        except KeyError:
            known = ", ".join(sorted(self._channels)) or "none"
            raise DataRejected(f"no ToolData channel {channel!r} (channels: {known})") from None


class InputModelMismatch(Exception):
    """The generated input model rejected input its JSON Schema accepted: a toolchain bug."""


class ToolContext:
    """The ``ctx`` an implementation receives; it satisfies every generated Execution protocol.

    ``input`` is built from the validated arguments on first access: the typed model costs about
    as much as the rest of a call, and a tool that never reads it should not pay for it.
    """

    __slots__ = (
        "_arguments",
        "_display",
        "_input",
        "_input_type",
        "call",
        "context",
        "data",
        "entry",
        "signal",
    )

    suspend_history: Sequence[SuspensionEpisode] = ()

    def __init__(
        self,
        input_type: type[BaseModel],
        arguments: JsonObject,
        context: Any,
        call: CallInfo,
        signal: CancellationSignal,
        data: Any,
    ) -> None:
        self._input_type = input_type
        self._arguments = arguments
        self._input: BaseModel | None = None
        self.context = context
        self.call = call
        self.signal = signal
        self.data = data
        self.entry = _INITIAL
        self._display: JsonValue = None

    @property
    def input(self) -> Any:
        if self._input is None:
            try:
                self._input = self._input_type.model_validate(self._arguments)
            except ValidationError as error:
                raise InputModelMismatch(
                    f"{self.call.spec_id}: the generated input model rejected input its JSON "
                    f"Schema accepts (rebuild with the current blade-codegen): {error}"
                ) from None
        return self._input

    def fail(self, message: str) -> NoReturn:
        raise ToolFailed(message)

    def display(self, content: JsonValue) -> None:
        self._display = content

    def suspend(self, point: str, payload: Any) -> NoReturn:
        raise Suspended(point, payload)


class Runtime:
    """Registered tools, and the pipeline that calls them.

    Use a runtime from one event loop; like asyncio itself, it is not thread-safe.
    """

    def __init__(
        self,
        *,
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
        self._hooks: dict[HookEvent, list[Hook]] = {event: [] for event in HookEvent}
        self._pre_any = self._post_any = False
        self._running: dict[str, CancelScope] = {}  # by call id; a call enters when it suspends
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
        call: a taken name, a spec that needs server context without a ``context`` provider, and a
        spec with suspend points (pending actions need a durable store).
        """
        registered = spec.name if name is None else name
        where = f"registering {spec.id} as {registered!r}"
        if not isinstance(spec, BackendToolSpec):
            raise RegistrationError(
                f"{where}: only backend tools have implementations; a client executes {spec.id}"
            )
        if registered in self._registrations:
            other = self._registrations[registered].spec.id
            raise RegistrationError(
                f"{where}: the name is already registered for {other}; pass name= to register "
                "it under another name"
            )
        if not _NAME.fullmatch(registered):
            raise RegistrationError(f"{where}: a name must match {_NAME.pattern}")
        if spec.context_schema is not None and context is None:
            raise RegistrationError(
                f"{where}: the spec declares a contextSchema, so pass context= (a function of "
                "the CallInfo returning the context model)"
            )
        if spec.suspend:
            raise RegistrationError(
                f"{where}: suspend points ({', '.join(sorted(spec.suspend))}) need a durable "
                "pending-action store, which this runtime does not have yet"
            )
        if not callable(implementation):
            raise RegistrationError(f"{where}: the implementation is not callable")
        limit = timeout_ms or self.timeout_ms or spec.timeout_ms or DEFAULT_TIMEOUT_MS
        registration: Registration[OutputT] = Registration(
            name=registered,
            spec=spec,
            implementation=implementation,
            context=context,
            timeout_ms=limit,
            input_validator=_compiled(spec.input_schema),
            output_validator=None if spec.output_schema is None else _compiled(spec.output_schema),
            output_adapter=_adapter(Any if spec.output_type is None else spec.output_type),
            data={
                channel.name: _Channel(_compiled(channel.schema), _adapter(channel.type))
                for channel in spec.data.values()
            },
        )
        self._registrations[registered] = registration
        return registration

    def registrations(self) -> Iterator[Registration[Any]]:
        return iter(self._registrations.values())

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

    # -- cancellation ----------------------------------------------------------------------

    def cancel_call(self, call_id: str, reason: str = "the call was cancelled") -> bool:
        """Cancel one running call; it settles as CANCELLED. False if it is not running."""
        scope = self._running.get(call_id)
        return scope is not None and scope.cancel("cancelled", reason)

    def cancel_run(self, run_id: str, reason: str = "the run was cancelled") -> int:
        """Cancel every running call of ``run_id``; returns how many were cancelled."""
        calls = [call for call, scope in self._running.items() if scope.call.run_id == run_id]
        return sum(self.cancel_call(call, reason) for call in calls)

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

        signal = CancellationSignal()
        track = _ignore if registration is None else registration.track
        scope = CancelScope(call, signal, self._running, track)
        if self.cleanup_grace_s != GRACE_S:
            scope.grace_s = self.cleanup_grace_s
        try:
            if registration is None:
                result = await self._fallback(call, parsed, scope)
            else:
                result = await self._execute(registration, call, parsed, scope)
        except asyncio.CancelledError:
            if scope.release() > 0:
                raise  # the caller's own task was cancelled from outside: not ours to absorb
            result = (
                self._cancelled(call, scope)
                if scope.reason is not None
                else self._tool_error(call, asyncio.CancelledError("raised by the tool"))
            )
        except Abandoned:
            log.error(
                "%s (call %s, run %s) ignored cancellation for %.1f s; the registration refuses "
                "new calls until it exits",
                call.name,
                call.call_id,
                call.run_id,
                self.cleanup_grace_s,
            )
            result = self._cancelled(call, scope)
        finally:
            scope.close()
        if not self._post_any or isinstance(result, ToolSkipped):
            return result
        if isinstance(result, ToolError) and result.code in _HOOK_CODES:
            return result
        return await self._post_hooks(registration, call, parsed, signal, result)

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

    async def _execute(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
    ) -> ToolResult[Any]:
        spec = registration.spec
        if self._pre_any:
            scope.bind()
            verdict = await self._pre_hooks(call, arguments, scope.signal)
            if not isinstance(verdict, HookVerdict):
                return verdict
            if verdict.input is not None:
                arguments = verdict.input

        if not registration.input_validator.is_valid(arguments):
            problems = describe(registration.input_validator.violations(arguments))
            return _error(
                call, ErrorCode.INVALID_INPUT, f"Invalid arguments for {call.name}: {problems}."
            )
        try:
            context = None
            if registration.context is not None:
                context = registration.context(call)
                if inspect.isawaitable(context):
                    scope.bind()
                    context = await context
            if self.permission is not None:
                scope.bind()
                denied = await self.permission(
                    PermissionRequest(call.name, spec.id, call, arguments)
                )
                if denied is not None:
                    return _error(call, ErrorCode.PERMISSION_DENIED, denied)
        except Exception as error:
            return self._tool_error(call, error)
        if scope.reason is not None:
            return self._cancelled(call, scope)

        data = _CallData(registration.data) if registration.data else None
        ctx = ToolContext(spec.input_type, arguments, context, call, scope.signal, data)
        try:
            output = await scope.run(registration.implementation(ctx), registration.timeout_s)
        except ToolFailed as failure:
            return _error(call, ErrorCode.TOOL_FAILED, failure.message)
        except Suspended as suspended:
            log.error(
                "%s: suspended at %r without a pending-action store", call.name, suspended.point
            )
            return _error(call, ErrorCode.TOOL_ERROR, GENERIC_ERROR)
        except Exception as error:
            return self._tool_error(call, error)
        finally:
            scope.stop()
        return self._output(registration, call, output, ctx._display)

    def _output(
        self, registration: Registration[Any], call: CallInfo, output: Any, display: JsonValue
    ) -> ToolResult[Any]:
        try:
            content = registration.output_adapter.serializer.to_python(
                output, mode="json", by_alias=True, exclude_unset=True, warnings=False
            )
        except Exception as error:
            log.error(
                "%s (call %s): the output cannot be serialized: %s", call.name, call.call_id, error
            )
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
            json.dumps(content)
        except (TypeError, ValueError) as error:
            log.error("fallback for %s returned a value that is not JSON: %s", call.name, error)
            return _error(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        return ToolSuccess(call, content, content)

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


_INITIAL = InitialEntry()
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")  # the spec format's rule for names
_HOOK_CODES = frozenset({ErrorCode.HOOK_ABORTED, ErrorCode.HOOK_FAILED, ErrorCode.HOOK_TIMEOUT})


def _ignore(task: asyncio.Task[None]) -> None:
    """A fallback call has no registration to refuse calls for; its detached task just ends."""


def _error(call: CallInfo, code: ErrorCode, message: str) -> ToolError:
    return ToolError(call, code, message, error_content(code, message))


def _parse_arguments(arguments: JsonObject | str | bytes) -> JsonObject | str:
    """The arguments as a JSON object, or a sentence saying why they are not one."""
    if isinstance(arguments, str | bytes):
        try:
            arguments = json.loads(arguments)
        except ValueError as error:
            return f"The arguments are not valid JSON: {error}."
    if not isinstance(arguments, Mapping):
        return "The arguments must be a JSON object."
    return arguments


_VALIDATORS: dict[str, SchemaValidator] = {}


def _compiled(schema: JsonObject) -> SchemaValidator:
    """One compiled validator per distinct schema, shared by every registration that uses it."""
    key = json.dumps(schema, sort_keys=True)
    validator = _VALIDATORS.get(key)
    if validator is None:
        validator = _VALIDATORS[key] = SchemaValidator(schema)
    return validator


def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


def _now() -> str:
    return datetime.now(UTC).isoformat()
