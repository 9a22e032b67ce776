"""What a call settles to: a value, never an exception, for every expected outcome.

A result carries the model-facing ``content`` (the JSON written back into the model's context),
optional ``display`` content for a UI, and either the typed output or a stable error code with a
sentence the model can act on, and ``metadata`` (a JSON object for the application, set with
``ctx.metadata``: stored with the call, returned on every surface, never shown to the model).
Details meant for operators (failing output paths, tracebacks) go to
the ``blade_runtime`` logger, never into ``content``.

Results and ``CallInfo`` are values; they are plain (not frozen) slotted dataclasses only because
a frozen dataclass costs three times as much to build, on the path of every call.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeAlias, TypeVar

from pydantic import JsonValue

from blade_runtime.core.context import CallInfo
from blade_runtime.core.events import PendingAction

if TYPE_CHECKING:
    from blade_runtime.core.effects import Effect

OutputT = TypeVar("OutputT", covariant=True)


class ErrorCode(StrEnum):
    """Stable error codes. Their string values are part of the wire format."""

    INVALID_INPUT = "INVALID_INPUT"
    """The arguments (or a hook's modified input) violate the input schema; nothing ran."""
    INVALID_OUTPUT = "INVALID_OUTPUT"
    """The implementation returned a value its output schema rejects."""
    TOOL_FAILED = "TOOL_FAILED"
    """The implementation called ``ctx.fail(sentence)``; the sentence is the message."""
    TOOL_ERROR = "TOOL_ERROR"
    """The implementation raised; the model sees a generic sentence unless the app maps it."""
    TIMEOUT = "TIMEOUT"
    """The call ran past its deadline and was cancelled."""
    CANCELLED = "CANCELLED"
    """The call or its run was cancelled through the runtime."""
    TOOL_HANDLER_NOT_FOUND = "TOOL_HANDLER_NOT_FOUND"
    """No registration and no fallback handler for the name."""
    TOOL_NOT_ALLOWED = "TOOL_NOT_ALLOWED"
    """The name is registered but excluded by the allowed/disallowed lists."""
    TOOL_UNAVAILABLE = "TOOL_UNAVAILABLE"
    """An earlier call of this registration ignored cancellation and has not exited yet."""
    PERMISSION_DENIED = "PERMISSION_DENIED"
    """The app's permission callback denied the call."""
    HOOK_ABORTED = "HOOK_ABORTED"
    """A hook returned ``abort``; its reason is the message."""
    HOOK_FAILED = "HOOK_FAILED"
    """A hook raised."""
    HOOK_TIMEOUT = "HOOK_TIMEOUT"
    """An event's hooks did not finish within their shared budget."""
    INVALID_SUBMISSION = "INVALID_SUBMISSION"
    """A submit payload its action's schema rejects; the action stays pending."""
    UNKNOWN_ACTION = "UNKNOWN_ACTION"
    """No pending action has that id."""
    ACTION_ALREADY_RESOLVED = "ACTION_ALREADY_RESOLVED"
    """Another submit, cancel or fail resolved the action first; the message says how."""
    INTERRUPTED = "INTERRUPTED"
    """The process stopped during a non-idempotent call: its effects need reconciliation."""
    DUPLICATE_CALL = "DUPLICATE_CALL"
    """A call with this call id is already recorded; nothing ran (read the recorded one)."""
    OBSERVER_FAILED = "OBSERVER_FAILED"
    """A lifecycle observer raised at one of the call's boundaries; the call stopped there."""
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    """The store could not record the call's start (the implementation did not run), or its
    result (this worker records it when the store is back; recovery settles the call if the
    worker stops first)."""
    LEASE_LOST = "LEASE_LOST"
    """``ctx.lease.assert_held()`` found that another worker holds the call now (this worker
    stalled past its lease): nothing this entry reports is recorded."""
    POLICY_FAILED = "POLICY_FAILED"
    """The application's permission policy, ``enabled`` or ``behavior`` callback raised, or
    answered with something that is not a decision (a behaviour wider than the spec's): the
    call was refused before the implementation ran (a bug of the application's, in its log;
    not TOOL_ERROR, which says the implementation raised)."""


@dataclass(slots=True)
class ToolSuccess(Generic[OutputT]):
    """The implementation returned ``output``, valid against the output schema.

    ``content`` is what the model reads: the output as JSON, its registration's projection, or
    what a ``post_tool_use`` hook replaced it with.
    """

    call: CallInfo
    output: OutputT
    content: JsonValue
    display: JsonValue = None
    status: Literal["success"] = "success"
    output_json: JsonValue = None
    """The whole output as JSON when ``content`` is a projection of it (else None: ``content``
    is the output itself, or what a post hook let the model read)."""
    rewritten: bool = False
    """A post hook replaced ``content``: typed views elsewhere (the typed client, the HTTP API)
    are built from it, so that what a hook withheld (a secret) reaches nobody."""
    artifact: str | None = None
    """The file id of the model-facing content, when it was over the registration's
    ``large_result_bytes`` and saved as a file (``content`` is then its head and a link)."""
    metadata: dict[str, JsonValue] | None = None
    """What the implementation set with ``ctx.metadata``: for the application, not the model."""
    effects: tuple[Effect, ...] = ()
    """What the call changed beyond its result (``ctx.effects``), in the order it emitted them."""


@dataclass(slots=True)
class ToolSkipped:
    """A ``pre_tool_use`` hook skipped execution; the model reads the reason as a success."""

    call: CallInfo
    reason: str
    content: JsonValue
    display: JsonValue = None
    status: Literal["success"] = "success"


@dataclass(slots=True)
class ToolError:
    """The call did not produce an output. ``message`` is a sentence meant for the model."""

    call: CallInfo
    code: ErrorCode
    message: str
    content: JsonValue
    display: JsonValue = None
    status: Literal["error"] = "error"
    metadata: dict[str, JsonValue] | None = None
    """What the implementation set with ``ctx.metadata`` before it failed (seed 000: an error
    result carries metadata too)."""
    effects: tuple[Effect, ...] = ()
    """The effects the call emitted before it failed (recorded, and applied: not undone)."""


@dataclass(slots=True)
class ToolPending:
    """The call waits on a pending action (a suspension, or a client tool's output).

    ``action`` is the typed view; ``submit``, ``cancel`` or ``fail`` with its id settles it.
    """

    call: CallInfo
    action: PendingAction[Any]
    content: JsonValue
    display: JsonValue = None
    status: Literal["pending"] = "pending"


ToolResult: TypeAlias = ToolSuccess[OutputT] | ToolSkipped | ToolError | ToolPending


def error_content(code: ErrorCode, message: str) -> JsonValue:
    """The JSON the model reads for a failed call."""
    return {"error": code.value, "message": message}


def pending_content(action: PendingAction[Any]) -> JsonValue:
    """The JSON the model reads while the call waits."""
    return {"pending": action.name, "action_id": action.action_id}


def skipped_content(reason: str) -> JsonValue:
    """The JSON the model reads for a call a hook skipped."""
    return {"skipped": True, "reason": reason}
