"""One call: resolve the handler -> ``pre_tool_use`` hooks -> validate the input (JSON Schema) ->
server context and permission -> record the start (durable stores: committed before the
implementation runs, under this runtime's lease) -> the implementation under its deadline -> the
output serialized to lossless JSON and validated -> ``post_tool_use`` or
``post_tool_use_failure`` hooks -> the result is recorded (what the hooks let the model read) and
announced. Every expected outcome is a result; only a bug in the runtime itself raises.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, cast

from pydantic import JsonValue

from blade_runtime.core.caller import CallContext
from blade_runtime.core.cancel_scope import GRACE_S, Abandoned, CancelScope
from blade_runtime.core.capabilities import with_capabilities
from blade_runtime.core.content import projected
from blade_runtime.core.context import (
    CallInfo,
    CancellationSignal,
    InitialEntry,
    ResumeEntry,
    Suspended,
    SuspensionEpisode,
    ToolFailed,
)
from blade_runtime.core.events import PendingAction
from blade_runtime.core.execution import (
    INITIAL,
    CallData,
    ChildHookFailed,
    ChildToolError,
    ChildTools,
    ToolContext,
)
from blade_runtime.core.guard import Overran
from blade_runtime.core.hooks import (
    Hook,
    HookEvent,
    HookInput,
    HookRaised,
    HookTimedOut,
    HookVerdict,
    dispatch,
)
from blade_runtime.core.jsonvalue import NotJson, checked, model_of
from blade_runtime.core.observers import Lifecycle, ObserverFailed
from blade_runtime.core.observers import Method as ObserverMethod
from blade_runtime.core.permissions import (
    ADMISSION,
    DECISIONS,
    STEP,
    STEP_POINT,
    Allow,
    Ask,
    Deny,
    PermissionPrompt,
    PermissionRequest,
    Policy,
    PolicyAnswer,
    answer_schema,
    decision_of,
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
    skipped_content,
)
from blade_runtime.core.shared import (
    DEFAULT_TIMEOUT_MS,
    GENERIC_ERROR,
    GENERIC_INVALID_OUTPUT,
    Attempt,
    FallbackCall,
    RuntimeCore,
    error_result,
    log,
    parse_arguments,
    result_json,
)
from blade_runtime.core.spec import JsonObject, ToolSpec
from blade_runtime.core.store import DuplicateCall, LeaseLost, StoreError, storable_id
from blade_runtime.core.validation import describe

_HOOK_CODES = frozenset({ErrorCode.HOOK_ABORTED, ErrorCode.HOOK_FAILED, ErrorCode.HOOK_TIMEOUT})
_FATAL_IN_CHILDREN = frozenset(
    {ErrorCode.HOOK_FAILED, ErrorCode.HOOK_TIMEOUT, ErrorCode.OBSERVER_FAILED}
)
_RESULTS = (ToolSuccess, ToolSkipped, ToolError, ToolPending)


class CallPipeline(RuntimeCore):
    """``call``: one model-issued call from its arguments to its result."""

    async def call(
        self,
        name: str,
        arguments: JsonObject | str | bytes,
        *,
        call_id: str | None = None,
        run_id: str = "default",
        context: CallContext | None = None,
        parent: str | None = None,
    ) -> ToolResult[Any]:
        """Call the tool registered as ``name`` with the model's arguments (a JSON object or
        its text). ``context``: who the call is for (stored with the call and its actions).
        ``parent``: the call id of the call whose ``ctx.tools`` makes this one (set by it).
        Never raises for an expected outcome: the result says what happened."""
        registration = self._registrations.get(name)
        spec_id = "" if registration is None else registration.spec.id
        call = CallInfo(
            next(self._ids) if call_id is None else call_id, run_id, name, spec_id, context, parent
        )
        if registration is None or self._restricted or registration.checked:
            refused = self._refuse(registration, call)
            if refused is not None:
                return refused
        parsed = arguments if type(arguments) is dict else parse_arguments(arguments)
        if isinstance(parsed, str):
            return error_result(call, ErrorCode.INVALID_INPUT, parsed)
        if not (storable_id(run_id) and (call_id is None or storable_id(call_id))):
            return error_result(call, ErrorCode.INVALID_INPUT, _ID_RULE)
        if call.call_id in self._running:
            raise ValueError(f"call id {call.call_id!r} is already running")

        scope = CancelScope(call, self._running, registration)
        if self.cleanup_grace_s != GRACE_S:
            scope.grace_s = self.cleanup_grace_s
        admitted = parsed
        try:
            if registration is None:
                result = await self._fallback(call, parsed, scope)
            else:
                verdict = await self._admit(call, parsed, scope) if self._pre_any else parsed
                if isinstance(verdict, _RESULTS):
                    result = verdict
                elif (valid := _valid(registration, verdict)) is True:
                    admitted = verdict
                    result = await self._enter(registration, call, admitted, scope)
                elif valid is False:
                    admitted = verdict
                    result = self._invalid(registration, call, admitted)
                else:
                    result = error_result(call, ErrorCode.INVALID_INPUT, valid)
        except (asyncio.CancelledError, Abandoned) as stopped:
            result = self._stopped(call, scope, stopped)
        finally:
            scope.close()
        if self._post_any or scope.observed:
            return await self._conclude(registration, call, admitted, scope, result)
        return self._recorded(call, scope, result)  # no coroutine where nothing awaits

    async def _conclude(
        self,
        registration: Registration[Any] | None,
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        result: ToolResult[Any],
    ) -> ToolResult[Any]:
        """Post-hooks, then record and announce what they let the model read."""
        if self._post_any:
            result = await self._finish(registration, call, arguments, scope.signal, result)
        if (
            scope.observed
            and registration is not None
            and self._observers.settled
            and not isinstance(result, ToolPending)
        ):
            try:
                await self._observing(
                    "settled",
                    self._observers.settled,
                    registration,
                    call,
                    arguments,
                    outcome=result,
                )
            except Exception as error:
                result = self._observer_failed("settled", call, error)
        return self._recorded(call, scope, result)

    def _recorded(
        self, call: CallInfo, scope: CancelScope, result: ToolResult[Any]
    ) -> ToolResult[Any]:
        """The result, recorded where the store keeps the call and announced where anyone
        listens (a pending result was recorded when its action was)."""
        attempt: Attempt | None = scope.stored
        if isinstance(result, ToolPending) or (attempt is None and not self._events.active):
            return result
        return self._settled(call, result, attempt)

    async def _call_child(self, tool: ToolSpec[Any, Any, Any], input: Any, call: CallInfo) -> Any:
        """One ``ctx.tools.call``: a full call of the child's registration, its output or a
        ChildToolError. A child's hook or observer failure is fatal to the parent."""
        registration = self._by_spec.get(tool.id)
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
        )
        if isinstance(result, ToolSuccess):
            return result.output
        if isinstance(result, ToolError):
            if result.code in _FATAL_IN_CHILDREN:
                assert call.parent is not None
                self._fatal[call.parent] = result
                raise ChildHookFailed(tool.id, result.code.value, result.message)
            raise ChildToolError(tool.id, result.code.value, result.message)
        if isinstance(result, ToolSkipped):
            raise ChildToolError(tool.id, "SKIPPED", result.reason)
        raise ChildToolError(tool.id, "PENDING", "a child tool cannot wait on a pending action")

    def _disabled_children(self, registration: Registration[Any], call: CallInfo) -> frozenset[str]:
        """The children not there for this parent call: decided once, when it starts."""
        disabled = set()
        for spec_id in registration.children:
            child = self._by_spec.get(spec_id)
            if child is not None and child.enabled is not None and not child.enabled(call):
                disabled.add(spec_id)
        return frozenset(disabled)

    def _refuse(self, registration: Registration[Any] | None, call: CallInfo) -> ToolError | None:
        """Why the call cannot even start: no handler, not allowed, or unavailable."""
        name = call.name
        if self._closing:
            return error_result(
                call, ErrorCode.TOOL_UNAVAILABLE, "The tool runtime is shutting down; try again."
            )
        if registration is None:
            if self.fallback is None:
                return error_result(
                    call, ErrorCode.TOOL_HANDLER_NOT_FOUND, f"There is no tool named {name!r}."
                )
            return None
        if self._restricted and not self.is_allowed(name):
            return error_result(
                call, ErrorCode.TOOL_NOT_ALLOWED, f"The tool {name!r} is not enabled."
            )
        enabled = registration.enabled
        if enabled is not None and call.parent is None and not enabled(call):
            return error_result(
                call, ErrorCode.TOOL_NOT_ALLOWED, f"The tool {name!r} is not enabled."
            )
        if registration.detached:
            return error_result(
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
        try:
            problems = describe(registration.input_validator.violations(arguments))
        except (ValueError, RecursionError) as error:  # see _valid
            problems = _unreadable(error)
        return error_result(
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
        *,
        claimed: bool = False,
    ) -> ToolResult[Any]:
        """Run one entry of the implementation (or open a client tool's pending action). The
        result is not recorded here: ``_conclude`` does it, after the post-hooks. ``claimed``:
        the store records the call as running under this runtime already (a resume, a replay)."""
        admitting = not claimed and entry is INITIAL  # a new invocation, not a re-entry
        if self._observers.any:
            scope.observed = True  # an entry that observers see start is seen settling too
            if admitting and self._observers.scheduled:
                try:
                    await self._observing(
                        "scheduled", self._observers.scheduled, registration, call, arguments
                    )
                except Exception as error:
                    return self._observer_failed("scheduled", call, error)
        context = None
        policy = (registration.permission or self.permission) if admitting else None
        if registration.context is not None:
            context, refused = await self._server_context(registration, call, scope)
            if refused is not None:
                return refused
        if policy is not None:
            permitted = self._permit(policy, registration, call, arguments, scope)
            if permitted is not None:
                refused = permitted if isinstance(permitted, _RESULTS) else await permitted
                if refused is not None:
                    return refused
        if registration.implementation is None:
            return self._await_client(registration, call, arguments)
        attempt = None
        if self._durable or registration.data or claimed:
            try:
                attempt = scope.stored = self._start(registration, call, arguments, claimed, scope)
            except DuplicateCall as duplicate:
                return error_result(call, ErrorCode.DUPLICATE_CALL, f"{duplicate}; nothing ran.")
            except StoreError as error:
                log.error(
                    "%s (call %s): the store refused its start: %s", call.name, call.call_id, error
                )
                return error_result(
                    call, ErrorCode.STORE_UNAVAILABLE, "The tool could not start; try again."
                )
        elif self._events.active:
            self._events.publish(self._event(call, "started", None))
        if self._observers.execution_started:
            try:
                await self._observing(
                    "execution_started",
                    self._observers.execution_started,
                    registration,
                    call,
                    arguments,
                )
            except Exception as error:
                return self._observer_failed("execution_started", call, error)
        ctx = ToolContext(registration.build_input, arguments, call, scope, registration.points)
        if context is not None:
            ctx.context = context
        if attempt is not None:
            ctx.data = attempt.data
        if entry is not INITIAL:
            ctx.entry = entry
        if history is not None:
            ctx._history = history
        if registration.children:
            ctx.tools = ChildTools(
                self._call_child,
                call,
                registration.children,
                self._disabled_children(registration, call) if self._dynamic else frozenset(),
            )
        running: Awaitable[Any]
        if registration.services is not None:  # every binding shared: nothing to acquire
            ctx.capabilities = registration.services
            running = registration.implementation(ctx)
        elif registration.bindings:  # acquired under the deadline, released however it ends
            running = with_capabilities(
                registration.bindings, call, scope.signal, ctx, registration.implementation
            )
        else:
            running = registration.implementation(ctx)
        try:
            output = await scope.run(running, registration.timeout_s)
        except ToolFailed as failure:
            return self._fatal.pop(call.call_id, None) or error_result(
                call, ErrorCode.TOOL_FAILED, failure.message
            )
        except Suspended as suspended:
            return self._suspend(registration, call, arguments, suspended, attempt)
        except ChildHookFailed:
            return self._fatal.pop(call.call_id)
        except Exception as error:
            return self._fatal.pop(call.call_id, None) or self._tool_error(call, error)
        finally:
            scope.stop()
        if registration.children and call.call_id in self._fatal:  # it caught the failure
            return self._fatal.pop(call.call_id)
        if scope.reason is not None:  # it swallowed its cancellation: the call still ended
            return self._cancelled(call, scope)
        return self._output(registration, call, output, ctx._display)

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
            return None, self._tool_error(call, error)
        if scope.reason is not None:
            return None, self._cancelled(call, scope)
        return context, None

    def _permit(
        self,
        policy: Policy,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
    ) -> ToolResult[Any] | Awaitable[ToolResult[Any] | None] | None:
        """Ask the policy about the final input: None when it allows at once and no hook
        watches (the common case, without a coroutine), the error when it raised, else the rest
        of the decision to await (``_decide``)."""
        request = PermissionRequest(call.name, registration.spec, call, arguments, scope)
        try:
            answer = policy(request)
        except Exception as error:  # the policy raised: a bug of the application's
            return self._tool_error(call, error)
        if (answer is None or type(answer) is Allow) and not self._permission_hooked:
            return None
        return self._decide(answer, request, registration, call, arguments, scope)

    async def _decide(
        self,
        answer: PolicyAnswer | Awaitable[PolicyAnswer],
        request: PermissionRequest,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
    ) -> ToolResult[Any] | None:
        """The policy's decision: None (allowed), a denial, or a durable permission request (the
        call waits on it). An async policy is cancellation-bounded, and one that outlives its
        call's cancellation blocks later permission checks."""
        try:
            if answer is not None and type(answer) not in DECISIONS and inspect.isawaitable(answer):
                scope.bind()
                answer = await self._guard.run("permission", answer, None, scope.signal)
            decision = decision_of(cast(PolicyAnswer, answer))  # awaited above if awaitable
        except Overran as overran:
            log.error("%s (call %s): permission: %s", call.name, call.call_id, overran)
            return error_result(
                call, ErrorCode.HOOK_TIMEOUT, "The permission check did not finish."
            )
        except Exception as error:  # the policy raised: a bug of the application's
            return self._tool_error(call, error)
        if scope.reason is not None:
            return self._cancelled(call, scope)
        asking = type(decision) is Ask
        # An allow needs no request, so it crosses no permission boundary (observers see a
        # request made, and a denial); permission_request hooks see every decision.
        boundary = "permission_requested" if asking else "permission_resolved"
        methods = getattr(self._observers, boundary) if type(decision) is not Allow else []
        if self._permission_hooked or methods:
            label, reason = describe_decision(decision)
            refused = await self._permission_hooks(call, arguments, scope, label, reason)
            if refused is None and methods:
                try:
                    await self._observing(
                        boundary, methods, registration, call, arguments, label, reason
                    )
                except Exception as error:
                    refused = self._observer_failed(boundary, call, error)
            if refused is not None:
                return refused
        if asking:
            assert isinstance(decision, Ask)
            if call.parent is not None:  # it could never be answered: no orphan request
                return error_result(
                    call,
                    ErrorCode.PERMISSION_DENIED,
                    "A child tool call cannot wait for a permission request.",
                )
            return self._ask(registration, call, arguments, request, decision)
        if isinstance(decision, Deny):
            return error_result(call, ErrorCode.PERMISSION_DENIED, decision.message)
        return None

    def _ask(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        request: PermissionRequest,
        decision: Ask,
    ) -> ToolResult[Any]:
        """Store a permission request (a pending action of its own kind) and its waiting call."""
        schema = self._answer_schemas.get(registration.spec.id)
        if schema is None:
            schema = answer_schema(registration.spec.input_schema)
            self._answer_schemas[registration.spec.id] = schema
        payload = request_payload(request, decision.prompt)
        action = self._action(call, ADMISSION, payload, schema)
        record = self._record(registration, call, arguments, "suspended")
        event = self._event(call, "suspended", {"action_id": action.action_id, "point": ADMISSION})
        try:
            self._emit(self.store.suspend, record, action, event)
        except Exception as error:
            return self._tool_error(call, error)
        view = PendingAction.of(action, PermissionPrompt.model_validate(payload))
        return ToolPending(call, view, pending_content(view))

    @staticmethod
    def _observing(
        boundary: str,
        methods: list[ObserverMethod],
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        decision: str | None = None,
        reason: str | None = None,
        action_id: str | None = None,
        outcome: ToolResult[Any] | None = None,
    ) -> Awaitable[object]:
        """The observers' ``methods`` of ``boundary`` run in order on one event, as one
        awaitable; the caller turns a raise into ``_observer_failed``. (One observer's own
        coroutine is returned as it is: no wrapper on the path of every observed call.)"""
        event = Lifecycle(
            boundary, call, registration.spec, arguments, decision, reason, action_id, outcome
        )
        if len(methods) == 1:
            return methods[0](event)
        return _in_order(methods, event)

    @staticmethod
    def _observer_failed(boundary: str, call: CallInfo, error: Exception) -> ToolError:
        """An observer raised: the call stops, OBSERVER_FAILED (the details go to the log)."""
        failed = ObserverFailed(boundary, error)
        log.error("%s (call %s): %s", call.name, call.call_id, failed, exc_info=error)
        return error_result(call, ErrorCode.OBSERVER_FAILED, GENERIC_ERROR)

    async def _permission_hooks(
        self,
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope | None,
        decision: str,
        reason: str | None,
    ) -> ToolError | None:
        """``permission_request`` hooks observe a decision; one that fails stops the call."""
        hooks = self._hooks_for(HookEvent.PERMISSION_REQUEST, call.name)
        if not hooks:
            return None
        signal = CancellationSignal() if scope is None else scope.signal
        event = HookInput(
            HookEvent.PERMISSION_REQUEST,
            call.name,
            call.spec_id or None,
            call,
            arguments,
            signal,
            decision=decision,
            reason=reason,
        )
        try:
            await dispatch(hooks, event, self.hook_timeout_s, self._guard)
        except HookRaised as raised:
            log.error("permission_request %s for %s (call %s)", raised, call.name, call.call_id)
            return error_result(call, ErrorCode.HOOK_FAILED, GENERIC_ERROR)
        except HookTimedOut as timed_out:
            log.error("%s for %s (call %s)", timed_out, call.name, call.call_id)
            return error_result(call, ErrorCode.HOOK_TIMEOUT, "The permission check timed out.")
        return None

    def _start(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        claimed: bool,
        scope: CancelScope,
    ) -> Attempt:
        """Record the start of an entry where the store keeps it (committed before the tool
        runs, under this runtime's lease), announce it, and open its ToolData writer."""
        attempt = Attempt(self._durable or claimed)
        if attempt.recorded and not claimed:  # a claimed entry's start was recorded by its claim
            record = self._record(registration, call, arguments, "running")
            self._emit(self.store.begin, record, self._event(call, "started", None))
        elif not claimed and self._events.active:
            self._events.publish(self._event(call, "started", None))
        if attempt.recorded:
            self._leases.hold(scope)
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
            return error_result(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        validator = registration.output_validator
        if validator is not None and not validator.is_valid(content):
            log.error(
                "%s (call %s): the output violates the output schema of %s: %s",
                call.name,
                call.call_id,
                registration.spec.id,
                describe(validator.violations(content)),
            )
            return error_result(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        if registration.project is None:
            return ToolSuccess(call, output, content, display)
        try:
            model_reads, _ = projected(registration.project(output))
            model_reads = checked(model_reads)
        except Exception as error:
            log.error(
                "%s (call %s): the projection failed", call.name, call.call_id, exc_info=error
            )
            return error_result(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        return ToolSuccess(call, output, model_reads, display, output_json=content)

    def _settled(
        self, call: CallInfo, result: ToolResult[Any], attempt: Attempt | None
    ) -> ToolResult[Any]:
        """Record the end of a stored call (with its event), or just announce it."""
        stored = result_json(result)
        if attempt is not None and attempt.stored:
            self._leases.release(call.call_id)
            event = self._event(call, "result", stored)
            try:
                self._emit(self.store.settle, call.call_id, event.payload, event, owner=self.owner)
            except LeaseLost as lost:
                # Another worker claimed the call (this one's lease lapsed): its outcome is the
                # one recorded; this late result is reported, not written.
                log.error(
                    "%s (call %s): %s; the result is not recorded", call.name, call.call_id, lost
                )
        elif self._events.active:
            self._events.publish(self._event(call, "result", stored))
        return result

    def _stopped(
        self, call: CallInfo, scope: CancelScope, stopped: BaseException
    ) -> ToolResult[Any]:
        """The result of a call a cancellation or a deadline ended (or the exception to raise)."""
        if isinstance(stopped, Abandoned):
            log.error(
                "%s (call %s, run %s) ignored cancellation for %.1f s; the registration refuses "
                "new calls until it exits",
                call.name,
                call.call_id,
                call.run_id,
                self.cleanup_grace_s,
            )
            return self._cancelled(call, scope)
        if scope.release() > 0:
            attempt: Attempt | None = scope.stored
            if attempt is not None and attempt.stored:  # the caller's task was cancelled
                self._settled(call, self._cancelled(call, scope), attempt)
            raise stopped  # from outside: not ours to absorb
        if scope.reason is None:
            return self._tool_error(call, asyncio.CancelledError("raised by the tool"))
        return self._cancelled(call, scope)

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
            return error_result(call, ErrorCode.TOOL_FAILED, failure.message)
        except Exception as error:
            return self._tool_error(call, error)
        finally:
            scope.stop()
        try:
            content = checked(content)
        except NotJson as error:
            log.error("fallback for %s returned a value that is not JSON: %s", call.name, error)
            return error_result(call, ErrorCode.INVALID_OUTPUT, GENERIC_INVALID_OUTPUT)
        return ToolSuccess(call, content, content)

    # -- calls that end waiting ------------------------------------------------------------

    def _suspend(
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
        action = self._action(
            call, suspended.point, suspended.payload, point.resume.schema, point.expires_after_s
        )
        record = self._record(registration, call, arguments, "suspended")
        payload: JsonValue = {"action_id": action.action_id, "point": action.point}
        self._leases.release(call.call_id)
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
        """A client tool's call: a pending action that its output (``submit``) settles, or
        that expires as TIMEOUT after the tool's timeout."""
        assert registration.output is not None  # client specs always have an output schema
        if call.parent is not None:
            return error_result(
                call, ErrorCode.TOOL_ERROR, "A client tool cannot be called as a child tool."
            )
        action = self._action(
            call, None, dict(arguments), registration.output.schema, registration.timeout_s
        )
        record = self._record(registration, call, arguments, "pending")
        payload: JsonValue = {"action_id": action.action_id}
        try:
            self._emit(self.store.suspend, record, action, self._event(call, "pending", payload))
        except Exception as error:
            return self._tool_error(call, error)
        view = PendingAction.of(action, model_of(registration.build_input, arguments))
        return ToolPending(call, view, pending_content(view))

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
            verdict = await dispatch(hooks, event, self.hook_timeout_s, self._guard)
        except HookRaised as raised:
            log.error("pre_tool_use %s for %s (call %s)", raised, call.name, call.call_id)
            return error_result(call, ErrorCode.HOOK_FAILED, GENERIC_ERROR)
        except HookTimedOut as timed_out:
            log.error("%s for %s (call %s)", timed_out, call.name, call.call_id)
            return error_result(
                call, ErrorCode.HOOK_TIMEOUT, "The tool call timed out before it ran."
            )
        if verdict.action == "skip":
            reason = verdict.reason or "skipped by a hook"
            return ToolSkipped(call, reason, skipped_content(reason))
        if verdict.action == "abort":
            reason = verdict.reason or "The tool call was blocked."
            return error_result(call, ErrorCode.HOOK_ABORTED, reason)
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
            verdict = await dispatch(hooks, hook_input, self.hook_timeout_s, self._guard)
        except (HookRaised, HookTimedOut) as problem:
            log.error("%s %s for %s (call %s)", event, problem, call.name, call.call_id)
            if not success:
                return result  # a failing failure hook never hides the original error
            code = (
                ErrorCode.HOOK_TIMEOUT
                if isinstance(problem, HookTimedOut)
                else ErrorCode.HOOK_FAILED
            )
            return error_result(call, code, GENERIC_ERROR)
        if success and verdict.action == "abort":
            return error_result(
                call, ErrorCode.HOOK_ABORTED, verdict.reason or "The tool result was withheld."
            )
        if verdict.output is None:
            return result
        if isinstance(result, ToolSuccess):
            # Typed views elsewhere are built from what the model may read (``rewritten``).
            return ToolSuccess(
                result.call, result.output, verdict.output, result.display, rewritten=True
            )
        assert isinstance(result, ToolError)
        return ToolError(result.call, result.code, result.message, verdict.output, result.display)


async def _in_order(methods: list[ObserverMethod], event: Lifecycle) -> None:
    for method in methods:
        await method(event)


_ID_RULE = (
    "A call id and a run id are 1 to 200 printable characters (no NUL, no line break, no "
    "lone surrogate): every store must hold and index them alike."
)


def _valid(registration: Registration[Any], arguments: JsonObject) -> bool | str:
    """Whether the arguments meet the input schema, or why they cannot be read at all: a
    dict from Python may hold what no JSON text can (a lone surrogate, which the validator
    cannot take) or nest deeper than the validator goes."""
    try:
        return registration.input_validator.is_valid(arguments)
    except (ValueError, RecursionError) as error:  # UnicodeEncodeError is a ValueError
        return f"Invalid arguments for {registration.name}: {_unreadable(error)}."


def _unreadable(error: BaseException) -> str:
    if isinstance(error, UnicodeError):
        return "the text is not valid Unicode (a lone surrogate)"
    if isinstance(error, RecursionError) or "ecursion" in str(error):
        return "nested too deeply to validate"
    return f"they cannot be validated ({error})"
