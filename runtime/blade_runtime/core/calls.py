"""The call runner: one model-issued call, admit -> run -> settle.

admit: resolve the registration, refuse what cannot start, run the ``pre_tool_use`` hooks and
validate the input (JSON Schema). run: the server context and the permission policy, the start
recorded (durable stores: committed before the implementation runs, under this runtime's lease),
the implementation under its deadline, its output serialized to lossless JSON and validated.
settle: the ``post_tool_use`` hooks and the observers, then the result recorded (what the hooks
let the model read) and announced. Every expected outcome is a result; only a bug in the runtime
itself raises. The store is reached through ``StoreAccess``, never on the event loop's time.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import JsonValue

from blade_runtime.core import grants
from blade_runtime.core.artifacts import offload
from blade_runtime.core.caller import CallContext
from blade_runtime.core.cancel_scope import COROUTINE, GRACE_S, Abandoned, CancelScope
from blade_runtime.core.capabilities import with_capabilities
from blade_runtime.core.content import project
from blade_runtime.core.context import (
    CallInfo,
    InitialEntry,
    ResumeEntry,
    Suspended,
    SuspensionEpisode,
    ToolFailed,
    event_of,
)
from blade_runtime.core.effects import Effect
from blade_runtime.core.events import EventHub, PendingAction
from blade_runtime.core.execution import (
    INITIAL,
    CallData,
    CallServices,
    ChildHookFailed,
    ChildToolError,
    ChildTools,
    InputModelMismatch,
    ToolContext,
    UnreadableInput,
)
from blade_runtime.core.fencing import Lease, LeaseNotHeld
from blade_runtime.core.hooks import HookVerdict
from blade_runtime.core.interceptors import Asking, Interceptors, policy_failed
from blade_runtime.core.jsonvalue import NotJson, checked, model_of
from blade_runtime.core.leases import Leases
from blade_runtime.core.outcomes import (
    DEFAULT_TIMEOUT_MS,
    GENERIC_ERROR,
    GENERIC_INVALID_OUTPUT,
    FallbackCall,
    FallbackHandler,
    action_id,
    cancelled,
    client_action_id,
    error_result,
    log,
    parse_arguments,
    result_json,
    stored_effects,
    stored_metadata,
    tool_error,
)
from blade_runtime.core.permissions import (
    ADMISSION,
    ALLOW,
    APPROVED,
    ASK,
    STEP,
    STEP_POINT,
    Allow,
    Ask,
    Decision,
    Deny,
    PermissionAnswer,
    PermissionPrompt,
    PermissionRequest,
    StepRefused,
    answer_schema,
    decide,
    describe_decision,
    request_payload,
)
from blade_runtime.core.registry import Registration
from blade_runtime.core.results import (
    ErrorCode,
    ToolError,
    ToolPending,
    ToolResult,
    ToolSkipped,
    ToolSuccess,
    pending_content,
)
from blade_runtime.core.slots import Key, Slots
from blade_runtime.core.spec import JsonObject, ToolSpec
from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import (
    ActionRecord,
    CallRecord,
    CallState,
    Claim,
    DuplicateCall,
    Event,
    LeaseLost,
    SlotRecord,
    StoreError,
    StoreUnavailable,
    clock,
    now,
    storable_id,
)
from blade_runtime.core.tools import ChildEnabledFailed, Tools
from blade_runtime.core.validation import unreadable

_FATAL_IN_CHILDREN = frozenset(
    {ErrorCode.HOOK_FAILED, ErrorCode.HOOK_TIMEOUT, ErrorCode.OBSERVER_FAILED}
)
_RESULTS = (ToolSuccess, ToolSkipped, ToolError, ToolPending)
# What an implementation may raise that ends its call with a result (``_failed``); a
# suspension is handled apart, and cancellation is not caught at all.
_FAILURES = (ToolFailed, ChildHookFailed, StepRefused, LeaseNotHeld, Exception)


@dataclass(slots=True)
class Attempt:
    """One entry of a call: the claim the store holds it under (so that its end is recorded
    there, and every write it makes is fenced by it), or None where no store records it."""

    claim: Claim | None = None
    data: CallData | None = None

    @property
    def recorded(self) -> bool:
        return self.claim is not None


def _untyped(ctx: ToolContext) -> Exception | None:
    """Why the typed input cannot be made, or None (made now, once). Typed before anything is
    recorded or entered: what JSON Schema accepts and the typed model cannot hold (a lone
    surrogate in a constrained string) is refused here, not inside the implementation, which
    would have run and then been reported as given invalid input."""
    try:
        _ = ctx.input
    except (UnreadableInput, InputModelMismatch) as error:
        return error
    return None


class _Entered(NamedTuple):
    """What an entry runs with once ``_enter`` let it: its recorded attempt (None where nothing
    records it), the registration's server context, and the children left out of it."""

    attempt: Attempt | None
    context: Any
    disabled: frozenset[str]


class CallRunner:
    """Runs calls: the runtime's ``call``, and the claimed entries that pending actions and
    recovery resume (``run_claimed``)."""

    def __init__(
        self,
        *,
        io: StoreAccess,
        tools: Tools,
        interceptors: Interceptors,
        events: EventHub,
        leases: Leases,
        owner: str,
        lease_s: float,
        fallback: FallbackHandler | None,
        cleanup_grace_s: float,
        services: CallServices | None = None,
    ) -> None:
        self.io = io
        self.store = io.store
        self.durable = io.store.durable
        self.tools = tools
        self.interceptors = interceptors
        self.events = events
        self.leases = leases
        self.owner = owner
        self.lease_s = lease_s
        self.fallback = fallback
        self.cleanup_grace_s = cleanup_grace_s
        self.services = services  # ctx.files and ctx.trigger
        self.running: dict[str, CancelScope] = {}  # by call id; a call enters when it suspends
        self.fatal: dict[str, ToolError] = {}  # parent call id: the child failure that ends it
        self.held: dict[str, Claim] = {}  # a running parent's claim, by call id, for its children
        self.unrecorded: set[asyncio.Task[None]] = set()  # results written again until stored
        self.slots = Slots(io, owner, lease_s)  # concurrency limits and resource locks
        self.cleaning: dict[str, int] = {}
        """Runs with a cancelled implementation still running detached, and how many: their new
        tool calls are refused until it exits (seed 000)."""
        prefix = self._made = f"call_{uuid.uuid4().hex[:12]}_"
        self._ids = map(f"{prefix}{{}}".format, itertools.count(1))  # C-level: no Python frame

    async def call(
        self,
        name: str,
        arguments: JsonObject | str | bytes,
        *,
        call_id: str | None = None,
        run_id: str = "default",
        context: CallContext | None = None,
        parent: str | None = None,
        child: Registration[Any] | None = None,
    ) -> ToolResult[Any]:
        """Call the tool registered as ``name`` with the model's arguments (a JSON object or
        its text). ``context``: who the call is for (stored with the call and its actions).
        ``parent``: the call id of the call whose ``ctx.tools`` makes this one (set by it), and
        ``child`` the registration it runs (a parent's own, or the runtime's).
        Never raises for an expected outcome: the result says what happened."""
        registration = self.tools.by_name.get(name) if child is None else child
        spec_id = "" if registration is None else registration.spec.id
        call = CallInfo(
            next(self._ids) if call_id is None else call_id, run_id, name, spec_id, context, parent
        )
        if (
            registration is None
            or self.tools.restricted
            or registration.enabled is not None
            or registration.detached  # Registration.checked, without a property's call
            or self.cleaning
        ):
            refused = self._refuse(registration, call)
            if refused is not None:
                return await self._refused(registration, call, refused)
        if type(arguments) is dict:
            parsed: JsonObject = arguments
        else:
            read = parse_arguments(arguments)
            if isinstance(read, str):
                return await self._refused(
                    registration, call, error_result(call, ErrorCode.INVALID_INPUT, read)
                )
            parsed = read
        if not (
            (run_id == "default" or storable_id(run_id))
            and (call_id is None or storable_id(call_id))
        ):
            invalid = error_result(call, ErrorCode.INVALID_INPUT, _ID_RULE)
            return await self._refused(registration, call, invalid)
        if call.call_id in self.running:
            raise ValueError(f"call id {call.call_id!r} is already running")

        scope = CancelScope(call, self.running, registration)
        if self.cleanup_grace_s != GRACE_S:
            scope.grace_s = self.cleanup_grace_s
        admitted = parsed
        try:
            if registration is None:
                result = await self._fallback(call, parsed, scope)
            else:
                verdict = (
                    await self._admit(call, parsed, scope) if self.interceptors.pre_any else parsed
                )
                if verdict is not parsed and isinstance(verdict, _RESULTS):
                    result = await self._refused(registration, call, verdict)
                elif (valid := _valid(registration, verdict)) is True:
                    admitted = verdict
                    if verdict is not parsed:  # a hook changed them: observers see both
                        scope.model_input = parsed
                    result = await self._run(registration, call, admitted, scope)
                elif valid is False:
                    admitted = verdict
                    invalid = self._invalid(registration, call, admitted)
                    result = await self._refused(registration, call, invalid)
                else:
                    invalid = error_result(call, ErrorCode.INVALID_INPUT, valid)
                    result = await self._refused(registration, call, invalid)
        except (asyncio.CancelledError, Abandoned) as stopped:
            result = await self._stopped(call, scope, stopped)
        finally:
            scope.close()
        if self.interceptors.post_any or scope.observed or self.tools.offloading:
            return await self.settle(registration, call, admitted, scope, result)
        attempt: Attempt | None = scope.stored
        if (attempt is None and not self.events.active) or isinstance(result, ToolPending):
            return result  # nothing to record or announce (a pending result was recorded)
        return await self.record_end(call, result, attempt)

    async def run_claimed(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        entry: InitialEntry | ResumeEntry[Any, Any] = INITIAL,
        history: Callable[[], tuple[SuspensionEpisode, ...]] | None = None,
        *,
        fence: int = 0,
    ) -> ToolResult[Any]:
        """One entry of an admitted call this runtime has claimed (a resume, or a replay),
        under its own cancel scope: the store records it as running here already, under the
        claim of fencing token ``fence``."""
        scope = CancelScope(call, self.running, registration)
        try:
            result = await self._run(
                registration, call, arguments, scope, entry, history, claimed=True, fence=fence
            )
        except (asyncio.CancelledError, Abandoned) as stopped:
            result = await self._stopped(call, scope, stopped)
        finally:
            scope.close()
        return await self.settle(registration, call, arguments, scope, result)

    async def settle(
        self,
        registration: Registration[Any] | None,
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        result: ToolResult[Any],
    ) -> ToolResult[Any]:
        """The post-hooks and the ``settled`` observers, then the result recorded where the store
        keeps the call and announced where anyone listens (a pending result was recorded when its
        action was)."""
        if self.interceptors.post_any:
            result = await self.interceptors.finish(
                registration, call, arguments, scope.signal, result
            )
        if (
            isinstance(result, ToolSuccess)
            and registration is not None
            and registration.large_result_bytes is not None
            and call.parent is None  # a child's output goes to its parent's code, not a model
        ):
            result = await self._offload(registration.large_result_bytes, call, scope, result)
        if scope.observed and registration is not None:
            result = await self.interceptors.settled(registration, call, arguments, result)
        attempt: Attempt | None = scope.stored
        if isinstance(result, ToolPending) or (attempt is None and not self.events.active):
            return result
        return await self.record_end(call, result, attempt)

    async def _call_child(
        self,
        parent: Registration[Any],
        tool: ToolSpec[Any, Any, Any],
        input: Any,
        call: CallInfo,
    ) -> Any:
        """One ``ctx.tools.call``: a full call of the child's registration, its output or a
        ChildToolError. A child's hook or observer failure is fatal to the parent."""
        registration = self.tools.child(parent, tool.id)
        if registration is None:
            raise ChildToolError(
                tool.id, "TOOL_HANDLER_NOT_FOUND", "this runtime has no registration of it"
            )
        arguments = input.model_dump(by_alias=True, exclude_unset=True)
        result = await self.call(
            registration.name,
            arguments,
            call_id=call.call_id,
            run_id=call.run_id,
            context=call.context,
            parent=call.parent,
            child=registration,
        )
        if isinstance(result, ToolSuccess):
            if registration.on_output is not None:
                await self._child_output(registration, call, result.output)
            return result.output
        if isinstance(result, ToolError):
            if result.code in _FATAL_IN_CHILDREN:
                assert call.parent is not None
                self.fatal[call.parent] = result
                raise ChildHookFailed(tool.id, result.code.value, result.message)
            raise ChildToolError(tool.id, result.code.value, result.message)
        if isinstance(result, ToolSkipped):
            raise ChildToolError(tool.id, "SKIPPED", result.reason)
        raise ChildToolError(tool.id, "PENDING", "a child tool cannot wait on a pending action")

    async def _child_output(
        self, registration: Registration[Any], call: CallInfo, output: Any
    ) -> None:
        """A child registration's ``on_output`` sees what its parent receives; one that fails
        ends the parent (as any observer's failure does), even if the parent catches it."""
        assert registration.on_output is not None and call.parent is not None
        try:
            seen = registration.on_output(output, call)
            if inspect.isawaitable(seen):
                await seen
        except Exception as error:
            log.error("%s (call %s): its on_output raised: %r", call.name, call.call_id, error)
            self.fatal[call.parent] = error_result(
                call, ErrorCode.OBSERVER_FAILED, "The child tool's output observer failed."
            )
            raise ChildHookFailed(
                registration.spec.id, ErrorCode.OBSERVER_FAILED.value, str(error)
            ) from None

    async def _refused(
        self, registration: Registration[Any] | None, call: CallInfo, result: ToolResult[Any]
    ) -> ToolResult[Any]:
        """A call that never became an invocation: the ``refused`` observers see its result."""
        if self.interceptors.observers.refused:
            await self.interceptors.refused(registration, call, result)
        return result

    def _refuse(self, registration: Registration[Any] | None, call: CallInfo) -> ToolError | None:
        """Why the call cannot even start: no handler, not allowed, or unavailable."""
        name = call.name
        if self.tools.closing:
            return error_result(
                call, ErrorCode.TOOL_UNAVAILABLE, "The tool runtime is shutting down; try again."
            )
        if registration is None:
            if self.fallback is None:
                return error_result(
                    call, ErrorCode.TOOL_HANDLER_NOT_FOUND, f"There is no tool named {name!r}."
                )
            return None
        if self.tools.restricted and not self.tools.is_allowed(name):
            return error_result(
                call, ErrorCode.TOOL_NOT_ALLOWED, f"The tool {name!r} is not enabled."
            )
        enabled = registration.enabled
        if enabled is not None and call.parent is None:
            try:
                there = enabled(call)
            except Exception as error:
                return policy_failed(call, "its enabled callback", error)
            if not there:
                return error_result(
                    call, ErrorCode.TOOL_NOT_ALLOWED, f"The tool {name!r} is not enabled."
                )
        if registration.detached:
            return error_result(
                call,
                ErrorCode.TOOL_UNAVAILABLE,
                f"The tool {name!r} is temporarily unavailable; try again later.",
            )
        if self.cleaning and call.run_id in self.cleaning:
            return error_result(
                call,
                ErrorCode.TOOL_UNAVAILABLE,
                "A cancelled tool call of this run is still cleaning up; this run takes no new "
                "tool call until it ends. Try again later.",
            )
        return None

    async def _admit(
        self, call: CallInfo, arguments: JsonObject, scope: CancelScope
    ) -> JsonObject | ToolResult[Any]:
        """Pre-hooks: the arguments to validate (possibly modified), or the hooks' result."""
        scope.bind()
        verdict = await self.interceptors.pre_hooks(call, arguments, scope.signal)
        if not isinstance(verdict, HookVerdict):
            return verdict
        return arguments if verdict.input is None else verdict.input

    @staticmethod
    def _invalid(
        registration: Registration[Any], call: CallInfo, arguments: JsonObject
    ) -> ToolError:
        """INVALID_INPUT naming every failing path and what was expected there."""
        try:
            problems = registration.input_validator.explain(arguments)
        except (ValueError, RecursionError) as error:  # see _valid
            problems = unreadable(error)
        return error_result(
            call, ErrorCode.INVALID_INPUT, f"Invalid arguments for {call.name}: {problems}."
        )

    async def _run(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        entry: InitialEntry | ResumeEntry[Any, Any] = INITIAL,
        history: Callable[[], tuple[SuspensionEpisode, ...]] | None = None,
        *,
        claimed: bool = False,
        fence: int = 0,
    ) -> ToolResult[Any]:
        """Run one entry of the implementation (or open a client tool's pending action): enter
        it (``_enter``: what the registration and the runtime ask for before it runs; a plain
        registration on a runtime without policy, observers or a durable store needs none of
        it), then run it under its deadline and make its result. The result is not recorded
        here: ``settle`` does it, after the post-hooks. ``claimed``: the store records the call
        as running under this runtime already (a resume, a replay)."""
        ctx = ToolContext(
            registration, arguments, call, scope, self, self.events.publish, self.services, entry,
            history,
        )  # fmt: skip
        if registration.plain and self.interceptors.bare and not (self.durable or claimed):
            attempt = context = None
            disabled: frozenset[str] = frozenset()
            refused = _untyped(ctx)
            if refused is not None:
                return self._failed(call, refused)
            if self.events.active:
                self.events.publish(self._event(call, "started", None))
        else:
            entered = await self._enter(
                registration, call, arguments, scope, entry, claimed, fence, ctx
            )
            if not isinstance(entered, _Entered):
                return entered
            attempt, context, disabled = entered
        claim = None
        if not registration.plain or attempt is not None:
            claim = self._prepare(registration, call, ctx, attempt, context, disabled)
        limited = registration.limits is not None
        if limited:  # waits here, before its deadline starts
            keys = self._keys(registration, call, arguments)
            if keys:
                unslotted = await self._take_slots(call, keys, scope, claim)
                if unslotted is not None:
                    self.slots.forget(call.call_id)
                    return unslotted
        implementation = registration.implementation
        assert implementation is not None  # a client tool's call ends in _enter
        running: Awaitable[Any]
        if registration.services is not None:  # every binding shared: nothing to acquire
            ctx.capabilities = registration.services
            running = implementation(ctx)
        elif registration.bindings:  # acquired under the deadline, released however it ends
            running = with_capabilities(
                registration.bindings, call, scope.signal, ctx, implementation
            )
        else:
            running = implementation(ctx)
        children = registration.children
        if claim is not None and children:
            self.held[call.call_id] = claim  # its children write under this entry's claim
        try:
            if type(running) is COROUTINE:  # its first step here: most calls end in it
                scope.arm(registration.timeout_s)
                try:
                    yielded = running.send(None)
                except StopIteration as finished:
                    output = finished.value
                else:
                    output = await scope.resume(running, yielded)
            else:
                output = await scope.run(running, registration.timeout_s)
        except Suspended as suspended:
            return await self._suspend(registration, call, arguments, suspended, attempt)
        except _FAILURES as error:
            failed = self._failed(call, error)
            if ctx._metadata is not None:
                failed.metadata = ctx._metadata
            if registration.effects is not None or registration.children:
                failed.effects = await self._effects_of(registration, call, ctx)
            return failed
        finally:
            scope.stop()  # no timer reaches what follows (the projection)
            if limited:  # every exit: a result, an error, a timeout, a cancellation, a suspension
                if scope.detached is not None:  # it ignored its cancellation: held until it exits
                    self.slots.release_later(call.call_id, scope.detached)
                else:
                    await self.slots.release(call.call_id)
            if children:
                if claim is not None:
                    self.held.pop(call.call_id, None)
                if isinstance(ctx.tools, ChildTools):
                    ctx.tools.end()  # children it started and did not await are cancelled
        if children and call.call_id in self.fatal:  # it caught the failure
            return self.fatal.pop(call.call_id)
        if scope.reason is not None:  # it swallowed its cancellation: the call still ended
            return self._cancelled(call, scope)
        done = self._output(registration, call, output, ctx._display)
        if ctx._metadata is not None:
            done.metadata = ctx._metadata  # type: ignore[union-attr]  # a success or an error
        if registration.effects is not None or registration.children:
            done.effects = await self._effects_of(registration, call, ctx)  # type: ignore[union-attr]
        if registration.project is None or call.parent is not None:
            return done  # a child's output goes to its parent, not to a model: never projected
        if not isinstance(done, ToolSuccess):
            return done
        return await self._project(registration, ctx, done)

    async def _enter(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        entry: InitialEntry | ResumeEntry[Any, Any],
        claimed: bool,
        fence: int,
        ctx: ToolContext,
    ) -> _Entered | ToolResult[Any]:
        """Everything before the implementation runs, each step only where the registration or
        the runtime asks for it: the ``scheduled`` observers, the narrowed behaviour, the
        children's ``enabled`` callbacks, the server context, the permission policy, a client
        tool's pending action, the recorded start, the ``execution_started`` observers. A
        result ends the call here; else what the entry runs with."""
        admitting = not claimed and entry is INITIAL  # a new invocation, not a re-entry
        observers = self.interceptors.observers
        if observers.any:
            scope.observed = True  # an entry that observers see start is seen settling too
            if admitting and observers.scheduled:
                try:
                    await self.interceptors.observing(
                        "scheduled",
                        observers.scheduled,
                        registration,
                        call,
                        arguments,
                        model_input=scope.model_input,
                    )
                except Exception as error:
                    return self.interceptors.observer_failed("scheduled", call, error)
        if admitting and registration.behavior is not None:
            try:
                call.behavior = registration.narrowed(arguments)
            except Exception as error:
                return policy_failed(call, "its behavior callback", error)
        disabled: frozenset[str] = frozenset()
        if registration.children and self.tools.dynamic:
            try:  # decided once, before anything of the parent runs or is recorded
                disabled = self.tools.disabled_children(registration, call, strict=True)
            except ChildEnabledFailed as failed:
                return policy_failed(call, str(failed), failed.error)
        context = None
        policy = (registration.permission or self.interceptors.permission) if admitting else None
        if registration.context is not None:
            context, refused = await self._server_context(registration, call, scope)
            if refused is not None:
                return refused
        if policy is not None:
            permitted = self.interceptors.permit(
                policy, registration, call, arguments, scope, self._granted
            )
            if permitted is not None:
                decided = permitted if isinstance(permitted, _RESULTS) else await permitted
                if isinstance(decided, Asking):
                    return await self._ask(registration, call, arguments, decided)
                if decided is not None:
                    return decided
        if registration.implementation is None:
            return await self._await_client(registration, call, arguments)
        untyped = _untyped(ctx)
        if untyped is not None:
            return self._failed(call, untyped)
        attempt = None
        if self.durable or registration.data or registration.fenced or claimed:
            try:
                attempt = scope.stored = await self._start(
                    registration, call, arguments, claimed, scope, fence
                )
            except DuplicateCall as duplicate:
                return error_result(call, ErrorCode.DUPLICATE_CALL, f"{duplicate}; nothing ran.")
            except StoreError as error:
                log.error(
                    "%s (call %s): the store refused its start: %s", call.name, call.call_id, error
                )
                return error_result(
                    call, ErrorCode.STORE_UNAVAILABLE, "The tool could not start; try again."
                )
        elif self.events.active:
            self.events.publish(self._event(call, "started", None))
        if observers.execution_started:
            try:
                await self.interceptors.observing(
                    "execution_started", observers.execution_started, registration, call, arguments
                )
            except Exception as error:
                return self.interceptors.observer_failed("execution_started", call, error)
        return _Entered(attempt, context, disabled)

    def _keys(
        self, registration: Registration[Any], call: CallInfo, arguments: JsonObject
    ) -> tuple[Key, ...]:
        """The slot keys of this entry: its tool's, and its locks' values in the final input
        (a child's, less those its parent holds)."""
        assert registration.limits is not None
        keys = registration.limits.keys(registration.name, call.tenant, arguments, self.owner)
        return self.slots.keys_of(call.call_id, keys, call.parent)

    async def _take_slots(
        self, call: CallInfo, keys: tuple[Key, ...], scope: CancelScope, claim: Claim | None
    ) -> ToolResult[Any] | None:
        """Wait for the entry's slots and locks (FIFO, cancellable; ``core.slots``): None once
        they are held, or the result that ends the call. A call that waits is announced as
        ``waiting`` (the keys), then ``acquired``: stored with the call where the store keeps
        it (``claim``: its own, not a parent's), so every worker's subscribers see them."""
        own = claim if call.parent is None else None
        entry = SlotRecord(
            "", call.call_id, self.owner, 0.0, 0, False, 0.0, call.tenant, call.run_id, call.name
        )
        waited = False

        async def waiting() -> None:
            nonlocal waited
            waited = True
            payload: JsonValue = {"keys": [key for key, _ in keys]}
            await self._announce(call, "waiting", payload, own)

        try:
            await self.slots.acquire(entry, keys, scope, waiting)
        except StoreError as error:
            log.error("%s (call %s): the store refused its slots: %s", *_named(call), error)
            return error_result(call, ErrorCode.STORE_UNAVAILABLE, NO_SLOT)
        if waited:
            await self._announce(call, "acquired", None, own)
        return None

    async def _announce(
        self, call: CallInfo, kind: str, payload: JsonValue, claim: Claim | None
    ) -> None:
        event = self._event(call, kind, payload)
        if claim is None:
            self.events.publish(event)
            return
        try:
            await self._emit(self.store.announce, event, claim=claim)
        except StoreError as error:  # only news: the wait goes on, the heartbeat judges the lease
            log.warning("%s (call %s): its %s event was not stored: %s", *_named(call), kind, error)
            self.events.publish(event)

    def _prepare(
        self,
        registration: Registration[Any],
        call: CallInfo,
        ctx: ToolContext,
        attempt: Attempt | None,
        context: Any,
        disabled: frozenset[str],
    ) -> Claim | None:
        """What ``ctx`` gets beyond a plain call's: the server context, ToolData, the claim its
        writes carry, the lease, the children; the claim."""
        if context is not None:
            ctx.context = context
        claim = self._claim(call, attempt)
        if attempt is not None:
            ctx.data = attempt.data
        ctx._claim = claim
        if registration.fenced and claim is not None:
            ctx.lease = Lease(self.io, claim)
        if registration.children:
            entry = ctx.entry
            ctx.tools = ChildTools(
                functools.partial(self._call_child, registration),
                call,
                entry.action.action_id if isinstance(entry, ResumeEntry) else "",
                registration.children,
                disabled,
                self.tools.refused_children(registration),
            )
        return claim

    def _failed(self, call: CallInfo, error: BaseException) -> ToolError:
        """The result of an implementation that raised ``error`` (one of ``_FAILURES``)."""
        if isinstance(error, ToolFailed):
            return self.fatal.pop(call.call_id, None) or error_result(
                call, ErrorCode(error.code), error.message
            )
        if isinstance(error, ChildHookFailed):
            return self.fatal.pop(call.call_id)
        if isinstance(error, StepRefused):
            return error_result(call, ErrorCode(error.code), error.message)
        if isinstance(error, LeaseNotHeld):
            log.error("%s (call %s): %s", call.name, call.call_id, error)
            return error_result(call, ErrorCode.LEASE_LOST, LOST_LEASE)
        if isinstance(error, UnreadableInput):
            message = f"Invalid arguments for {call.name}: {error}."
            return error_result(call, ErrorCode.INVALID_INPUT, message)
        return self.fatal.pop(call.call_id, None) or tool_error(
            call, error, self.interceptors.error_mapper
        )

    def _claim(self, call: CallInfo, attempt: Attempt | None) -> Claim | None:
        """The claim an entry's writes carry: its own where the store records it, else (a
        child tool's call) its parent entry's, if that one holds a claim."""
        if attempt is not None and attempt.claim is not None:
            return attempt.claim
        return None if call.parent is None else self.held.get(call.parent)

    async def decide_step(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        prompt: str,
        subject: str | None,
    ) -> PermissionAnswer | None:
        """``ctx.request_permission``: the policy first (allow: go on; deny: the call ends),
        then, where it asks, a standing grant; None: ask a person."""
        policy = registration.permission or self.interceptors.permission
        decision: Decision = ASK
        if policy is not None:
            request = PermissionRequest(
                call.name, registration.spec, call, arguments, scope, True, prompt, subject,
                registration.source, registration.trust,
            )  # fmt: skip
            try:
                decision = await decide(policy, request)
            except Exception as error:
                failed = policy_failed(call, "the permission policy", error)
                raise StepRefused(failed.code, failed.message) from None
        if isinstance(decision, Ask):
            granted = await self.io(grants.lookup, self.store, call, STEP, subject or "")
            if granted is not None:
                decision = ALLOW
        if self.interceptors.permission_hooked:  # they see every decision, a step's too
            label, reason = describe_decision(decision)
            refused = await self.interceptors.permission_hooks(
                call, arguments, scope, label, reason
            )
            if refused is not None:
                raise StepRefused(refused.code, refused.message)
        if isinstance(decision, Deny):
            raise StepRefused(ErrorCode.PERMISSION_DENIED, decision.message)
        return APPROVED if isinstance(decision, Allow) else None

    async def _server_context(
        self, registration: Registration[Any], call: CallInfo, scope: CancelScope
    ) -> tuple[Any, ToolResult[Any] | None]:
        """The registration's server context for the call: (context, None), or (None, the
        result that ends the call)."""
        assert registration.context is not None
        try:
            context = registration.context(call)
            if inspect.isawaitable(context):
                scope.bind()
                context = await context
        except Exception as error:
            return None, tool_error(call, error, self.interceptors.error_mapper)
        if scope.reason is not None:
            return None, self._cancelled(call, scope)
        return context, None

    async def _ask(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        asking: Asking,
    ) -> ToolResult[Any]:
        """Store a permission request (a pending action of its own kind) and its waiting call."""
        schema = self.tools.answer_schemas.get(registration.spec.id)
        if schema is None:
            schema = answer_schema(registration.spec.input_schema)
            self.tools.answer_schemas[registration.spec.id] = schema
        payload = request_payload(asking.request, asking.decision.prompt)
        action = self._action(call, ADMISSION, payload, schema)
        record = self._record(registration, call, arguments, "suspended")
        event = self._event(call, "suspended", {"action_id": action.action_id, "point": ADMISSION})
        try:
            await self._emit(self.store.suspend, record, action, event)
        except DuplicateCall as duplicate:
            return error_result(call, ErrorCode.DUPLICATE_CALL, f"{duplicate}; nothing ran.")
        except StoreError as error:
            log.error(
                "%s (call %s): the store refused its permission request: %s", *_named(call), error
            )
            return error_result(call, ErrorCode.STORE_UNAVAILABLE, NOT_ASKED)
        except Exception as error:
            return tool_error(call, error, self.interceptors.error_mapper)
        view = PendingAction.of(action, PermissionPrompt.model_validate(payload))
        return ToolPending(call, view, pending_content(view))

    async def _start(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        claimed: bool,
        scope: CancelScope,
        fence: int = 0,
    ) -> Attempt:
        """Record the start of an entry where the store keeps it (committed before the tool
        runs, under this runtime's lease), announce it, and open its ToolData writer."""
        # The store records a call that must outlive this entry or be fenced: every call on a
        # durable store, and on any store one that writes ToolData or effects (its own, or a
        # child's: kept with their root, and gone with it) or whose spec asks for a lease.
        # Only the outer call is a durable part: a child's start and end are not stored as
        # a call of their own (it writes under its parent's claim), so a replayed parent never
        # meets its children's ids again and recovery never claims a child alone.
        attempt = Attempt()
        if claimed:  # its claim recorded it
            attempt.claim = Claim(call.call_id, self.owner, fence)
        elif call.parent is None and (
            self.durable or registration.fenced or registration.data or self._may_emit(registration)
        ):
            record = self._record(registration, call, arguments, "running")
            begun = await self.io(
                self.store.begin, record, self._event(call, "started", None), lease_s=self.lease_s
            )
            self.events.publish(begun.event)
            attempt.claim = record.claim
        elif self.events.active:
            self.events.publish(self._event(call, "started", None))
        if attempt.recorded:
            self.leases.hold(scope)
        if registration.data:
            attempt.data = CallData(
                call,
                registration.data,
                self.io,
                self.events.publish,
                self._claim(call, attempt),
            )
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
            return error_result(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        validator = registration.output_validator
        if validator is not None and not validator.is_valid(content):
            log.error(
                "%s (call %s): the output violates the output schema of %s: %s",
                call.name,
                call.call_id,
                registration.spec.id,
                validator.explain(content),
            )
            return error_result(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        return ToolSuccess(call, output, content, display)

    async def _project(
        self, registration: Registration[Any], ctx: ToolContext, done: ToolSuccess[Any]
    ) -> ToolResult[Any]:
        """What the model reads of a valid output: the registration's projection of it."""
        call = done.call
        try:
            model_reads = checked(await project(registration, done.output, lambda: ctx.input, call))
        except Exception as error:
            log.error(
                "%s (call %s): the projection failed", call.name, call.call_id, exc_info=error
            )
            return error_result(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        return ToolSuccess(
            call,
            done.output,
            model_reads,
            done.display,
            output_json=done.content,
            metadata=done.metadata,
        )

    async def record_end(
        self, call: CallInfo, result: ToolResult[Any], attempt: Attempt | None
    ) -> ToolResult[Any]:
        """Record the end of a stored call (with its event), or just announce it. What the caller
        is told is what the store holds: when another worker took the call over, its record."""
        stored = result_json(result)
        claim = None if attempt is None or call.parent is not None else attempt.claim
        if claim is None:
            if self.events.active:
                self.events.publish(self._event(call, "result", stored))
            return result
        event = self._event(call, "result", stored)
        try:
            await self._emit(self.store.settle, claim, event.payload, event)
        except LeaseLost as lost:
            log.error("%s (call %s): %s; the result is not recorded", call.name, call.call_id, lost)
            if isinstance(result, ToolError) and result.code is ErrorCode.LEASE_LOST:
                return result  # the tool found out itself, before its write
            return await self._as_recorded(call)
        except StoreError as error:
            log.error(
                "%s (call %s): the store refused its result: %s", call.name, call.call_id, error
            )
            if isinstance(error, StoreUnavailable):
                self._record_later(call, claim, event)
            return error_result(call, ErrorCode.STORE_UNAVAILABLE, UNRECORDED)
        finally:  # held until its end is written: a closing runtime waits for that
            self.leases.release(call.call_id)
        return result

    async def _offload(
        self, limit: int, call: CallInfo, scope: CancelScope, done: ToolSuccess[Any]
    ) -> ToolResult[Any]:
        """What the model reads of a success over ``limit`` bytes: its head and a link to the
        file of the call that holds it all (``core.artifacts``)."""
        assert self.services is not None
        attempt: Attempt | None = scope.stored
        try:
            return await offload(
                self.services.files,
                call,
                scope.signal,
                None if attempt is None else attempt.claim,
                done,
                limit,
            )
        except LeaseNotHeld:
            return error_result(call, ErrorCode.LEASE_LOST, LOST_LEASE)
        except Exception as error:  # FileRejected (over max_file_bytes), a store error
            log.error(
                "%s (call %s): its large result could not be saved as a file: %s",
                call.name,
                call.call_id,
                error,
            )
            return error_result(call, ErrorCode.STORE_UNAVAILABLE, UNKEPT)

    def _record_later(self, call: CallInfo, claim: Claim, event: Event) -> None:
        """Write the result again until the store takes it. The store keeps this runtime's lease
        on the call while it lives, so no recovery would take the call before it closes; a
        result that lands is what a later reader gets (it ran; nothing runs it again)."""

        async def again() -> None:
            wait = 0.1
            while True:
                await asyncio.sleep(wait)
                wait = min(wait * 2, self.lease_s)
                try:
                    await self._emit(self.store.settle, claim, event.payload, event)
                except StoreUnavailable:
                    continue
                except StoreError as error:  # taken over, or settled: its record stands
                    log.error("%s (call %s): %s", call.name, call.call_id, error)
                    return
                log.warning("%s (call %s): its result is recorded now", call.name, call.call_id)
                return

        task = asyncio.get_running_loop().create_task(again())
        self.unrecorded.add(task)
        task.add_done_callback(self.unrecorded.discard)

    def stop_recording(self) -> None:
        """The runtime closes: what is still unrecorded is left to recovery."""
        for task in list(self.unrecorded):
            task.cancel()

    async def _effects_of(
        self, registration: Registration[Any], call: CallInfo, ctx: ToolContext
    ) -> tuple[Effect, ...]:
        """The effects a call's result lists. An outer call that may have emitted any (its spec
        declares effects, or a child's does): every one recorded for it, its earlier entries'
        and its children's included, as stored (a replayed entry's are the first run's). A
        child's result (its parent's part): what it emitted."""
        emitted = () if ctx._effects is None else tuple(ctx._effects.emitted)
        if call.parent is not None or self.services is None or not self._may_emit(registration):
            return emitted
        try:
            return await self.services.effects.listed(
                call.run_id, call.tenant, call.principal_id, call_id=call.call_id
            )
        except StoreError as error:
            log.warning("%s (call %s): its effects were not read: %s", *_named(call), error)
            return emitted

    def _may_emit(self, registration: Registration[Any]) -> bool:
        """Whether a call of ``registration`` or of one of its children may emit effects."""
        if registration.effects is not None:
            return True
        for spec_id in registration.children:
            child = self.tools.child(registration, spec_id)
            if child is not None and child.effects is not None:
                return True
        return False

    async def _as_recorded(self, call: CallInfo) -> ToolResult[Any]:
        """The outcome the store holds for a call another worker took over."""
        try:
            record = await self.io(self.store.call, call.call_id)
        except StoreError:
            record = None
        stored = None if record is None or record.state != "settled" else record.result
        if isinstance(stored, dict) and stored.get("status") == "error":
            try:
                code = ErrorCode(str(stored.get("code")))
            except ValueError:
                code = ErrorCode.INTERRUPTED
            failed = error_result(call, code, str(stored.get("message", "")))
            failed.metadata = stored_metadata(stored)
            failed.effects = stored_effects(stored)
            return failed
        if isinstance(stored, dict) and stored.get("status") == "success":
            content = stored.get("content")
            return ToolSuccess(
                call,
                stored.get("output", content),
                content,
                metadata=stored_metadata(stored),
                effects=stored_effects(stored),
            )
        return error_result(call, ErrorCode.INTERRUPTED, TAKEN_OVER)

    async def _stopped(
        self, call: CallInfo, scope: CancelScope, stopped: BaseException
    ) -> ToolResult[Any]:
        """The result of a call a cancellation or a deadline ended (or the exception to raise)."""
        if isinstance(stopped, Abandoned):
            log.error(
                "%s (call %s, run %s) ignored cancellation for %.1f s; the registration and the "
                "run refuse new calls until it exits",
                call.name,
                call.call_id,
                call.run_id,
                self.cleanup_grace_s,
            )
            if scope.detached is not None:
                self._hold_run(call.run_id, scope.detached)
            return self._cancelled(call, scope)
        if scope.release() > 0:
            attempt: Attempt | None = scope.stored
            if attempt is not None and attempt.recorded:  # the caller's task was cancelled
                await self.record_end(call, self._cancelled(call, scope), attempt)
            raise stopped  # from outside: not ours to absorb
        if scope.reason is None:
            return tool_error(
                call, asyncio.CancelledError("raised by the tool"), self.interceptors.error_mapper
            )
        return self._cancelled(call, scope)

    def _hold_run(self, run_id: str, detached: asyncio.Task[Any]) -> None:
        """Refuse ``run_id``'s new tool calls until ``detached`` (an implementation that
        ignored its cancellation) exits."""
        self.cleaning[run_id] = self.cleaning.get(run_id, 0) + 1

        def exited(_: asyncio.Task[Any]) -> None:
            left = self.cleaning.get(run_id, 1) - 1
            if left > 0:
                self.cleaning[run_id] = left
                return
            self.cleaning.pop(run_id, None)
            log.warning("run %s: its cancelled call exited; it accepts tool calls again", run_id)

        detached.add_done_callback(exited)

    async def _fallback(
        self, call: CallInfo, arguments: JsonObject, scope: CancelScope
    ) -> ToolResult[Any]:
        assert self.fallback is not None
        scope.bind()
        if self.interceptors.pre_any:
            verdict = await self.interceptors.pre_hooks(call, arguments, scope.signal)
            if not isinstance(verdict, HookVerdict):
                return verdict
            if verdict.input is not None:
                arguments = verdict.input
        request = FallbackCall(call.name, arguments, call, scope.signal)
        limit = (self.tools.timeout_ms or DEFAULT_TIMEOUT_MS) / 1000
        try:
            content = await scope.run(self.fallback(request), limit)
        except ToolFailed as failure:
            return error_result(call, ErrorCode.TOOL_FAILED, failure.message)
        except Exception as error:
            return tool_error(call, error, self.interceptors.error_mapper)
        finally:
            scope.stop()
        try:
            content = checked(content)
        except NotJson as error:
            log.error("fallback for %s returned a value that is not JSON: %s", call.name, error)
            return error_result(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        return ToolSuccess(call, content, content)

    async def _suspend(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        suspended: Suspended,
        attempt: Attempt | None,
    ) -> ToolResult[Any]:
        """The implementation suspended: store its pending action (and the call, suspended)."""
        if call.parent is not None:  # nobody could answer it: a child never leaves an action
            log.error("%s (call %s): a child tool call cannot suspend", call.name, call.call_id)
            return error_result(call, ErrorCode.TOOL_ERROR, GENERIC_ERROR)
        # ctx.suspend checked the name; ctx.request_permission uses the runtime's own point
        point = STEP_POINT if suspended.point == STEP else registration.points[suspended.point]
        resume = point.resume.schema if suspended.resume_schema is None else suspended.resume_schema
        action = self._action(
            call, suspended.point, suspended.payload, resume, point.expires_after_s
        )
        record = self._record(registration, call, arguments, "suspended")
        payload: JsonValue = {"action_id": action.action_id, "point": action.point}
        self.leases.release(call.call_id)
        try:
            event = self._event(call, "suspended", payload)
            claim = None if attempt is None else attempt.claim
            self.events.publish(
                await self.io(self.store.suspend, record, action, event, claim=claim)
            )
        except StoreError as error:  # settled as such where the store takes it, else recovered
            log.error("%s (call %s): the store refused its suspension: %s", *_named(call), error)
            return error_result(call, ErrorCode.STORE_UNAVAILABLE, UNSUSPENDED)
        except Exception as error:
            failed = tool_error(call, error, self.interceptors.error_mapper)
            return await self.record_end(call, failed, attempt)
        typed = model_of(point.suspend.adapter.validate_python, suspended.payload)
        view = PendingAction.of(action, typed)
        return ToolPending(call, view, pending_content(view))

    async def _await_client(
        self, registration: Registration[Any], call: CallInfo, arguments: JsonObject
    ) -> ToolResult[Any]:
        """A client tool's call: a pending action that its output (``submit``) settles, or
        that expires as TIMEOUT after the tool's timeout."""
        assert registration.output is not None  # client specs always have an output schema
        if call.parent is not None:
            return error_result(
                call, ErrorCode.TOOL_ERROR, "A client tool cannot be called as a child tool."
            )
        action = self._action(
            call,
            None,
            dict(arguments),
            registration.output.schema,
            registration.timeout_s,
            client_action_id(call.call_id, self._made),
        )
        record = self._record(registration, call, arguments, "pending")
        payload: JsonValue = {"action_id": action.action_id}
        try:
            await self._emit(
                self.store.suspend, record, action, self._event(call, "pending", payload)
            )
        except DuplicateCall as duplicate:  # its id is a call's already (this caller's or not)
            return error_result(call, ErrorCode.DUPLICATE_CALL, f"{duplicate}; nothing ran.")
        except StoreError as error:
            log.error(
                "%s (call %s): the store refused its pending action: %s", *_named(call), error
            )
            return error_result(call, ErrorCode.STORE_UNAVAILABLE, NOT_OFFERED)
        except Exception as error:
            return tool_error(call, error, self.interceptors.error_mapper)
        view = PendingAction.of(action, model_of(registration.build_input, arguments))
        return ToolPending(call, view, pending_content(view))

    def _record(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        state: CallState,
    ) -> CallRecord:
        spec = registration.spec
        context = call.context
        behavior = call.behavior
        return CallRecord(
            call.call_id,
            call.run_id,
            call.name,
            spec.id,
            (
                spec.side_effect
                if behavior is None or not behavior.side_effect
                else behavior.side_effect
            ),
            spec.execution,
            arguments,
            state,
            now(),
            self.owner,
            lease_until=clock() + self.lease_s if state == "running" else 0.0,
            tenant=call.tenant,
            context=None if context is None else context.to_json(),
            kind=spec.kind if behavior is None else behavior.kind,
            fence=1 if state == "running" else 0,
            principal=call.principal_id,
        )

    def _action(
        self,
        call: CallInfo,
        point: str | None,
        payload: JsonValue,
        schema: JsonObject,
        expires_after_s: float | None = None,
        given_id: str | None = None,
    ) -> ActionRecord:
        return ActionRecord(
            action_id() if given_id is None else given_id,
            call.call_id,
            call.run_id,
            call.name,
            call.spec_id,
            point,
            payload,
            schema,
            now(),
            tenant=call.tenant,
            expires_at=None if expires_after_s is None else clock() + expires_after_s,
            principal=call.principal_id,
            thread_id=None if call.context is None else call.context.thread_id,
            agent_id=None if call.context is None else call.context.agent_id,
        )

    def _event(self, call: CallInfo, kind: str, payload: JsonValue) -> Event:
        return event_of(call, kind, payload)

    async def _granted(self, call: CallInfo) -> bool:
        """Whether a standing grant of the caller allows ``call`` as a whole before it runs."""
        return await self.io(grants.lookup, self.store, call, ADMISSION) is not None

    async def _emit(self, write: Callable[..., Event], *args: Any, **kwargs: Any) -> None:
        """Commit ``write``, then tell this process's subscribers of the event it committed."""
        self.events.publish(await self.io(write, *args, **kwargs))

    def _cancelled(self, call: CallInfo, scope: CancelScope) -> ToolError:
        # The registration that ran: a parent's own child is not the one its name finds.
        registration = scope.owner
        if not isinstance(registration, Registration):
            registration = self.tools.by_name.get(call.name)
        limit = registration.timeout_ms if registration else self.tools.timeout_ms
        return cancelled(call, scope, limit)


UNSUSPENDED = (
    "The tool suspended, but its pending action could not be recorded (the store is "
    "unavailable), so nobody can answer it. Try the call again later."
)
NOT_ASKED = (
    "The permission request could not be recorded (the store is unavailable); the tool did not "
    "run. Try again."
)
NOT_OFFERED = (
    "The client tool's pending action could not be recorded (the store is unavailable); "
    "nothing was asked of the client. Try again."
)
NO_SLOT = (
    "The tool could not take its concurrency slot or resource lock (the store is "
    "unavailable); it did not run. Try again."
)
UNKEPT = (
    "The tool ran, but its result is larger than the model may read and could not be kept as "
    "a file to read instead; try again later."
)
UNRECORDED = (
    "The tool ran, but its result could not be recorded (the store is unavailable); this "
    "worker records it when the store is back, or recovery settles the call if it stops first."
)
LOST_LEASE = (
    "Another worker took this call over after this one's lease lapsed; this entry stopped "
    "before its write, and the call's outcome is the one the store records."
)
TAKEN_OVER = (
    "Another worker took this call over after this one's lease lapsed; its outcome is the one "
    "the store records."
)
_ID_RULE = (
    "A call id and a run id are 1 to 200 printable characters (no NUL, no line break, no "
    "lone surrogate): every store must hold and index them alike."
)


def _named(call: CallInfo) -> tuple[str, str]:
    return call.name, call.call_id


def _valid(registration: Registration[Any], arguments: JsonObject) -> bool | str:
    """Whether the arguments meet the input schema, or why they cannot be read at all: a
    dict from Python may hold what no JSON text can (a lone surrogate, which the validator
    cannot take) or nest deeper than the validator goes."""
    try:
        return registration.input_validator.is_valid(arguments)
    except (ValueError, RecursionError) as error:  # UnicodeEncodeError is a ValueError
        return f"Invalid arguments for {registration.name}: {unreadable(error)}."
