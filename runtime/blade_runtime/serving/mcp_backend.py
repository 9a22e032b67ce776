"""What the MCP server needs of the place its tools run: an ``McpBackend``.

``McpTools`` (``blade_runtime.serving.mcp``) holds every MCP rule (the listing, the answer to a
call, the input-required flow, cancellation, tenant scoping) once, over this small protocol:
the registrations (what is listed, with its schemas and guidance), a call, its cancellation,
the actions a principal may answer, the state of an action's call, a submission and a
cancellation of an action, a file, and (where there is one) the run's event stream for
progress. ``RuntimeBackend`` is a ``Runtime`` and its store; ``TemporalBackend``
(``blade_runtime.serving.mcp_temporal``) is ``TemporalTools``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import JsonValue

from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.effects import Effect
from blade_runtime.core.events import Subscription
from blade_runtime.core.files import FileBody
from blade_runtime.core.outcomes import stored_effects, stored_metadata
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolResult, ToolSuccess
from blade_runtime.core.store import ActionRecord
from blade_runtime.runtime import Runtime

__all__ = ["CallView", "McpBackend", "Outcome", "RuntimeBackend"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """A call's result as MCP answers it: ``content`` is what the model reads (the projection
    where the registration projects its output: ``projected``); an error's ``code`` and
    ``message``; a pending call's ``action_id`` (and its ``action`` where the backend has the
    record at hand, sparing a lookup)."""

    status: Literal["success", "error", "pending"]
    content: JsonValue = None
    projected: bool = False
    code: ErrorCode = ErrorCode.TOOL_ERROR
    message: str = ""
    metadata: dict[str, JsonValue] | None = None
    action_id: str = ""
    action: ActionRecord | None = None
    effects: tuple[Effect, ...] = ()  # what the call emitted (ctx.effects), in order

    @staticmethod
    def of(result: ToolResult[Any]) -> Outcome:
        """A runtime's result."""
        if isinstance(result, ToolPending):
            return Outcome("pending", result.content, action_id=result.action.action_id)
        if isinstance(result, ToolError):
            code, message, metadata = result.code, result.message, result.metadata
            return Outcome(
                "error",
                result.content,
                code=code,
                message=message,
                metadata=metadata,
                effects=result.effects,
            )
        if isinstance(result, ToolSuccess):
            projected = result.output_json is not None
            return Outcome(
                "success",
                result.content,
                projected,
                metadata=result.metadata,
                effects=result.effects,
            )
        return Outcome("success", result.content)  # skipped

    @staticmethod
    def stored(result: Mapping[str, Any]) -> Outcome:
        """A result as the runtime stores it (``result_json``; a pending one as Temporal's call
        workflows return it: its ``action_id`` and ``action`` record)."""
        status = result.get("status")
        metadata = stored_metadata(dict(result))
        effects = stored_effects(dict(result))
        if status == "error":
            code, message = ErrorCode(str(result.get("code"))), str(result.get("message", ""))
            content: JsonValue = {"error": code.value, "message": message}
            return Outcome(
                "error", content, code=code, message=message, metadata=metadata, effects=effects
            )
        if status == "pending":
            raw = result.get("action")
            action = None
            if isinstance(raw, dict):
                action = ActionRecord(**{k: v for k, v in raw.items() if k in _ACTION_FIELDS})
            action_id = str(result.get("action_id") or (action.action_id if action else ""))
            return Outcome("pending", result.get("content"), action_id=action_id, action=action)
        # "output": the whole output, whose projection the content is
        projected = result.get("output") is not None
        return Outcome(
            "success", result.get("content"), projected, metadata=metadata, effects=effects
        )


_ACTION_FIELDS = frozenset(ActionRecord.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class CallView:
    """What an action's call has come to: its stored ``result`` once settled, or the action it
    waits on now (``waiting``, maybe a newer one); neither while it runs."""

    result: Mapping[str, Any] | None = None
    waiting: ActionRecord | None = None


class McpBackend(Protocol):
    """Where the MCP server's tools run (see the module's doc). Every method taking a
    ``principal`` answers only what that principal may see: another tenant's call or action
    does not exist for it."""

    @property
    def runtime(self) -> Runtime:
        """The registrations served: the listing, the schemas and the tools' guidance."""

    @property
    def reports(self) -> bool:
        """Whether calls report progress and messages (``subscribe`` serves them)."""

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str | None,
        run_id: str,
        context: CallContext,
    ) -> Outcome:
        """Run the tool ``name`` (its registration's name) until it settles or waits."""

    def cancel_call(self, call_id: str, reason: str) -> None:
        """Cancel the running call ``call_id`` (from a sync callback: it may finish later)."""

    async def action(self, action_id: str, principal: Principal | None) -> ActionRecord | None:
        """The action ``action_id``, in whatever state, if ``principal`` may answer it: its
        tenant and the principal of its call (an operator may answer any); else None."""

    async def call_view(self, call_id: str, principal: Principal | None) -> CallView | None:
        """What the call ``call_id`` has come to, for ``principal`` (None: not theirs)."""

    async def submit(self, action_id: str, payload: Any, principal: Principal | None) -> Outcome:
        """Resolve the action with ``payload`` (refused as INVALID_SUBMISSION when its schema
        refuses it, nothing recorded) and return what its call did next."""

    async def cancel(self, action_id: str, reason: str, principal: Principal | None) -> Outcome:
        """Settle the action's call as cancelled."""

    async def file(self, file_id: str, principal: Principal | None) -> FileBody | None:
        """A file of a call of ``principal``'s tenant (None: none, or not served here)."""

    async def subscribe(self, run_id: str) -> Subscription:
        """The run's events from now on (only where ``reports``; closed with ``aclose``)."""


class RuntimeBackend:
    """A ``Runtime`` and its store as the MCP server's backend."""

    __slots__ = ("_runtime",)
    reports = True

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def runtime(self) -> Runtime:
        return self._runtime

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str | None,
        run_id: str,
        context: CallContext,
    ) -> Outcome:
        result = await self._runtime.call(
            name, arguments, call_id=call_id, run_id=run_id, context=context
        )
        return Outcome.of(result)

    def cancel_call(self, call_id: str, reason: str) -> None:
        self._runtime.cancel_call(call_id, reason)

    async def action(self, action_id: str, principal: Principal | None) -> ActionRecord | None:
        records = self._runtime.records
        action = await records.action(action_id, principal=principal)
        if action is None or await records.sees_call(action.call_id, principal=principal) is False:
            return None
        return action

    async def call_view(self, call_id: str, principal: Principal | None) -> CallView | None:
        records = self._runtime.records
        call = await records.call(call_id, principal=principal)
        if call is None:
            return None
        if call.state == "settled" and isinstance(call.result, dict):
            return CallView(result=call.result)
        if call.state == "suspended":
            newer = await records.actions(call_id=call_id, principal=principal)
            return CallView(waiting=newer[-1] if newer else None)
        return CallView()

    async def submit(self, action_id: str, payload: Any, principal: Principal | None) -> Outcome:
        return Outcome.of(await self._runtime.submit(action_id, payload, principal=principal))

    async def cancel(self, action_id: str, reason: str, principal: Principal | None) -> Outcome:
        return Outcome.of(await self._runtime.cancel(action_id, reason, principal=principal))

    async def file(self, file_id: str, principal: Principal | None) -> FileBody | None:
        return await self._runtime.records.file(file_id, principal=principal)

    async def subscribe(self, run_id: str) -> Subscription:
        head = await self._runtime.records.head(run_id)
        return self._runtime.subscribe(run_id, after=head)


def backend_of(source: Runtime | McpBackend) -> McpBackend:
    """``source`` as a backend: a Runtime through ``RuntimeBackend``, a backend as it is."""
    return RuntimeBackend(source) if isinstance(source, Runtime) else source
