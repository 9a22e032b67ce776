"""What the application puts around every call, behind one dispatch: hooks (``pre_tool_use``,
``post_tool_use``, ``post_tool_use_failure``, ``permission_request``), lifecycle observers, the
permission policy, and the guard that bounds the callbacks' time.

Each returns what the call runner needs to go on (a verdict, a decision) or the result that ends
the call; none of them reads or writes the store.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, cast

from blade_runtime.core.cancel_scope import CancelScope
from blade_runtime.core.context import CallInfo, CancellationSignal
from blade_runtime.core.guard import Guard, Overran
from blade_runtime.core.hooks import (
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
from blade_runtime.core.observers import Lifecycle, ObserverFailed, Observers, Refusal
from blade_runtime.core.observers import Method as ObserverMethod
from blade_runtime.core.outcomes import (
    GENERIC_ERROR,
    ErrorMapper,
    cancelled,
    error_result,
    log,
)
from blade_runtime.core.permissions import (
    DECISIONS,
    Allow,
    Ask,
    Deny,
    PermissionRequest,
    Policy,
    PolicyAnswer,
    decision_of,
    describe_decision,
)
from blade_runtime.core.registry import Registration
from blade_runtime.core.results import (
    ErrorCode,
    ToolError,
    ToolPending,
    ToolResult,
    ToolSkipped,
    ToolSuccess,
    skipped_content,
)
from blade_runtime.core.spec import JsonObject

_HOOK_CODES = frozenset({ErrorCode.HOOK_ABORTED, ErrorCode.HOOK_FAILED, ErrorCode.HOOK_TIMEOUT})


@dataclass(frozen=True, slots=True)
class Asking:
    """The policy asks a person: the request to store, and the prompt it decided on."""

    request: PermissionRequest
    decision: Ask


class Interceptors:
    """The application's hooks, observers and permission policy, and their time budget."""

    def __init__(
        self, *, hook_timeout_s: float, permission: Policy | None, error_mapper: ErrorMapper | None
    ) -> None:
        self.hook_timeout_s = hook_timeout_s
        self.permission = permission
        self.error_mapper = error_mapper
        self.hooks: dict[HookEvent, list[Hook]] = {event: [] for event in HookEvent}
        self.pre_any = self.post_any = self.permission_hooked = False
        self.observers = Observers()
        self.guard = Guard()
        self.bare = permission is None
        """No permission policy and no observer: what a call may skip (``CallRunner.call``)."""

    def on(
        self,
        event: HookEvent | HookEventName,
        callback: HookCallback,
        *,
        tools: Collection[str] | None = None,
    ) -> None:
        """Add a hook for ``event`` (optionally only for some names); hooks run in this order."""
        self.hooks[HookEvent(event)].append(
            Hook(HookEvent(event), callback, None if tools is None else frozenset(tools))
        )
        self.pre_any = bool(self.hooks[HookEvent.PRE_TOOL_USE])
        self.post_any = bool(
            self.hooks[HookEvent.POST_TOOL_USE] or self.hooks[HookEvent.POST_TOOL_USE_FAILURE]
        )
        self.permission_hooked = bool(self.hooks[HookEvent.PERMISSION_REQUEST])

    def observe(self, observer: object) -> None:
        """Add a durable lifecycle observer (see ``blade_runtime.core.observers``): its methods run,
        in order of registration, at each boundary of every call and complete before it."""
        self.observers.add(observer)
        self.bare = False

    def hooks_for(self, event: HookEvent, name: str) -> list[Hook]:
        hooks = self.hooks[event]
        return [hook for hook in hooks if hook.applies_to(name)] if hooks else hooks

    async def pre_hooks(
        self, call: CallInfo, arguments: JsonObject, signal: CancellationSignal
    ) -> HookVerdict | ToolResult[Any]:
        hooks = self.hooks_for(HookEvent.PRE_TOOL_USE, call.name)
        if not hooks:
            return HookVerdict()
        event = HookInput(
            HookEvent.PRE_TOOL_USE, call.name, call.spec_id or None, call, arguments, signal
        )
        try:
            verdict = await dispatch(hooks, event, self.hook_timeout_s, self.guard)
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

    async def post_hooks(
        self,
        registration: Registration[Any] | None,
        call: CallInfo,
        arguments: JsonObject,
        signal: CancellationSignal,
        result: ToolResult[Any],
    ) -> ToolResult[Any]:
        success = isinstance(result, ToolSuccess)
        event = HookEvent.POST_TOOL_USE if success else HookEvent.POST_TOOL_USE_FAILURE
        hooks = self.hooks_for(event, call.name)
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
            verdict = await dispatch(hooks, hook_input, self.hook_timeout_s, self.guard)
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
                result.call,
                result.output,
                verdict.output,
                result.display,
                rewritten=True,
                metadata=result.metadata,
            )
        assert isinstance(result, ToolError)
        return ToolError(
            result.call,
            result.code,
            result.message,
            verdict.output,
            result.display,
            metadata=result.metadata,
        )

    async def finish(
        self,
        registration: Registration[Any] | None,
        call: CallInfo,
        arguments: JsonObject,
        signal: CancellationSignal,
        result: ToolResult[Any],
    ) -> ToolResult[Any]:
        """Post-hooks, for results the tool itself produced."""
        if not self.post_any or isinstance(result, ToolSkipped | ToolPending):
            return result
        if isinstance(result, ToolError) and result.code in _HOOK_CODES:
            return result
        return await self.post_hooks(registration, call, arguments, signal, result)

    async def permission_hooks(
        self,
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope | None,
        decision: str,
        reason: str | None,
    ) -> ToolError | None:
        """``permission_request`` hooks observe a decision; one that fails stops the call."""
        hooks = self.hooks_for(HookEvent.PERMISSION_REQUEST, call.name)
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
            await dispatch(hooks, event, self.hook_timeout_s, self.guard)
        except HookRaised as raised:
            log.error("permission_request %s for %s (call %s)", raised, call.name, call.call_id)
            return error_result(call, ErrorCode.HOOK_FAILED, GENERIC_ERROR)
        except HookTimedOut as timed_out:
            log.error("%s for %s (call %s)", timed_out, call.name, call.call_id)
            return error_result(call, ErrorCode.HOOK_TIMEOUT, "The permission check timed out.")
        return None

    def permit(
        self,
        policy: Policy,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        granted: Callable[[CallInfo], Awaitable[bool]] | None = None,
    ) -> ToolResult[Any] | Awaitable[ToolResult[Any] | Asking | None] | None:
        """Ask the policy about the final input: None when it allows at once and no hook
        watches (the common case, without a coroutine), the error when it raised, else the rest
        of the decision to await (``decide``). ``granted``: whether a standing grant stands in
        for the person an ``Ask`` would wait for."""
        request = PermissionRequest(
            call.name,
            registration.spec,
            call,
            arguments,
            scope,
            source=registration.source,
            trust=registration.trust,
        )
        try:
            answer = policy(request)
        except Exception as error:  # the policy raised: a bug of the application's
            return policy_failed(call, "the permission policy", error)
        if (answer is None or type(answer) is Allow) and not self.permission_hooked:
            return None
        return self.decide(answer, request, registration, call, arguments, scope, granted)

    async def decide(
        self,
        answer: PolicyAnswer | Awaitable[PolicyAnswer],
        request: PermissionRequest,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        granted: Callable[[CallInfo], Awaitable[bool]] | None = None,
    ) -> ToolResult[Any] | Asking | None:
        """The policy's decision: None (allowed), a denial, or a permission request to store (the
        call waits on it). An async policy is cancellation-bounded, and one that outlives its
        call's cancellation blocks later permission checks."""
        try:
            if answer is not None and type(answer) not in DECISIONS and inspect.isawaitable(answer):
                scope.bind()
                answer = await self.guard.run("permission", answer, None, scope.signal)
            decision = decision_of(cast(PolicyAnswer, answer))  # awaited above if awaitable
        except Overran as overran:
            log.error("%s (call %s): permission: %s", call.name, call.call_id, overran)
            return error_result(
                call, ErrorCode.HOOK_TIMEOUT, "The permission check did not finish."
            )
        except Exception as error:  # it raised, or answered what is not a decision
            return policy_failed(call, "the permission policy", error)
        if scope.reason is not None:
            return cancelled(call, scope, registration.timeout_ms)
        if type(decision) is Ask and granted is not None and await granted(call):
            decision = Allow()  # a grant stands in for the person: nobody is asked
        asking = type(decision) is Ask
        # An allow needs no request, so it crosses no permission boundary (observers see a
        # request made, and a denial); permission_request hooks see every decision.
        boundary = "permission_requested" if asking else "permission_resolved"
        methods = getattr(self.observers, boundary) if type(decision) is not Allow else []
        if self.permission_hooked or methods:
            label, reason = describe_decision(decision)
            refused = await self.permission_hooks(call, arguments, scope, label, reason)
            if refused is None and methods:
                try:
                    await self.observing(
                        boundary, methods, registration, call, arguments, label, reason
                    )
                except Exception as error:
                    refused = self.observer_failed(boundary, call, error)
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
            return Asking(request, decision)  # the runner stores it; the call waits on it
        if isinstance(decision, Deny):
            return error_result(call, ErrorCode.PERMISSION_DENIED, decision.message)
        return None

    @staticmethod
    def observing(
        boundary: str,
        methods: list[ObserverMethod],
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        decision: str | None = None,
        reason: str | None = None,
        action_id: str | None = None,
        outcome: ToolResult[Any] | None = None,
        model_input: JsonObject | None = None,
    ) -> Awaitable[object]:
        """The observers' ``methods`` of ``boundary`` run in order on one event, as one
        awaitable; the caller turns a raise into ``_observer_failed``. (One observer's own
        coroutine is returned as it is: no wrapper on the path of every observed call.)"""
        event = Lifecycle(
            boundary, call, registration.spec, arguments, decision, reason, action_id, outcome,
            source=registration.source, trust=registration.trust,
        )  # fmt: skip
        if model_input is not None:
            event.model_input = model_input
        if len(methods) == 1:
            return methods[0](event)
        return _in_order(methods, event)

    async def settled(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        result: ToolResult[Any],
        *,
        committed: bool = False,
    ) -> ToolResult[Any]:
        """The ``settled`` observers see ``result`` (a pending one is not settled: the
        ``suspended`` observers see it): the result, or OBSERVER_FAILED when one of them
        raised. ``committed``: the store holds ``result`` already, so that is what the caller
        is told; a failing observer is only logged."""
        boundary = "suspended" if isinstance(result, ToolPending) else "settled"
        methods = getattr(self.observers, boundary)
        if not methods:
            return result
        try:
            await self.observing(boundary, methods, registration, call, arguments, outcome=result)
        except Exception as error:
            failed = self.observer_failed(boundary, call, error)
            # A pending action is stored already: the caller is told of it all the same.
            return result if committed or isinstance(result, ToolPending) else failed
        return result

    async def refused(
        self, registration: Registration[Any] | None, call: CallInfo, result: ToolResult[Any]
    ) -> ToolResult[Any]:
        """A call that never became an invocation ends with ``result``: the ``refused``
        observers see it, after the fact (one that raises is logged). Returns ``result``."""
        refusal = Refusal(call, None if registration is None else registration.spec, result)
        for method in self.observers.refused:
            try:
                await method(refusal)
            except Exception as error:
                log.error(
                    "%s (call %s): %s", call.name, call.call_id, ObserverFailed("refused", error)
                )
        return result

    @staticmethod
    def observer_failed(boundary: str, call: CallInfo, error: Exception) -> ToolError:
        """An observer raised: the call stops, OBSERVER_FAILED (the details go to the log)."""
        failed = ObserverFailed(boundary, error)
        log.error("%s (call %s): %s", call.name, call.call_id, failed, exc_info=error)
        return error_result(call, ErrorCode.OBSERVER_FAILED, GENERIC_ERROR)


def policy_failed(call: CallInfo, what: str, error: BaseException) -> ToolError:
    """POLICY_FAILED: a callback deciding whether the call may run raised (details: the log)."""
    log.error("%s (call %s): %s raised", call.name, call.call_id, what, exc_info=error)
    return error_result(call, ErrorCode.POLICY_FAILED, POLICY_SENTENCE)


POLICY_SENTENCE = (
    "The tool call was refused because the check of whether it may run failed; it did not run."
)


async def _in_order(methods: list[ObserverMethod], event: Lifecycle) -> None:
    for method in methods:
        await method(event)
