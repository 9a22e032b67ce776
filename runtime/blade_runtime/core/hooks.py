"""Tool hooks: callbacks that observe, block or transform calls.

Semantics: the callbacks of one event run one after another in registration order, within one
shared time budget, and every one of them receives the original input (a later callback never sees
an earlier one's modification). Their outputs are then merged in order until the first ``skip`` or
``abort``. On ``pre_tool_use`` a modified input is merged key by key into the input and validated
against the input schema before anything runs; on ``post_tool_use`` a modified output replaces what
the model reads, never the typed output.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal, TypeAlias

from pydantic import JsonValue

from blade_runtime.core.context import CallInfo, CancellationSignal
from blade_runtime.core.guard import Guard, Overran
from blade_runtime.core.jsonvalue import NotJson, checked
from blade_runtime.core.results import ToolError
from blade_runtime.core.spec import JsonObject

HookAction: TypeAlias = Literal["continue", "skip", "abort"]
HookEventName: TypeAlias = Literal[
    "pre_tool_use", "post_tool_use", "post_tool_use_failure", "permission_request"
]


class HookEvent(StrEnum):
    PRE_TOOL_USE = "pre_tool_use"
    """Before input validation and execution: block, skip or rewrite the input."""
    POST_TOOL_USE = "post_tool_use"
    """After a successful, validated output: observe, rewrite what the model reads, or abort."""
    POST_TOOL_USE_FAILURE = "post_tool_use_failure"
    """After an error result: observe, or rewrite what the model reads."""
    PERMISSION_REQUEST = "permission_request"
    """Every permission decision (allow, deny, ask; and a human's answer): observe only."""


@dataclass(frozen=True, slots=True)
class HookInput:
    """What a callback receives. ``input`` is the call's original arguments."""

    event: HookEvent
    name: str
    spec_id: str | None
    call: CallInfo
    input: JsonObject
    signal: CancellationSignal
    output: JsonValue = None
    """``post_tool_use``: the model-facing content of the result."""
    error: ToolError | None = None
    """``post_tool_use_failure``: the error result."""
    decision: str | None = None
    """``permission_request``: allow, deny or ask (a policy's), approve or deny (a human's)."""
    reason: str | None = None
    """``permission_request``: the denial's sentence, or the request's prompt."""


@dataclass(frozen=True, slots=True)
class HookOutput:
    """A callback's answer. ``None`` fields change nothing (a hook cannot make the content null)."""

    action: HookAction = "continue"
    modified_input: JsonObject | None = None
    modified_output: JsonValue = None
    reason: str | None = None


HookCallback: TypeAlias = Callable[[HookInput], Awaitable[HookOutput | None]]


@dataclass(frozen=True, slots=True)
class Hook:
    """A callback registered for one event, optionally only for some registration names."""

    event: HookEvent
    callback: HookCallback
    tools: frozenset[str] | None = None

    def applies_to(self, name: str) -> bool:
        return self.tools is None or name in self.tools


@dataclass(slots=True)
class HookVerdict:
    """The merged outcome of one event's callbacks."""

    action: HookAction = "continue"
    reason: str | None = None
    input: JsonObject | None = None
    output: JsonValue = None


class HookRaised(Exception):
    """A callback raised; ``position`` is its index among the event's callbacks."""

    def __init__(self, position: int, error: BaseException) -> None:
        super().__init__(f"hook #{position} raised {type(error).__name__}: {error}")
        self.position = position
        self.error = error


class HookTimedOut(Exception):
    """The event's callbacks did not finish within their shared budget."""


async def dispatch(
    hooks: Sequence[Hook], hook_input: HookInput, timeout_s: float | None, guard: Guard
) -> HookVerdict:
    """Run the callbacks in order, then merge their outputs (see the module docstring).

    The callbacks run in a task of their own under ``guard``: past the budget they are
    cancelled, and one that swallows the cancellation blocks the event until it ends."""

    async def run_all() -> list[HookOutput | None]:
        outputs: list[HookOutput | None] = []
        for position, hook in enumerate(hooks):
            try:
                outputs.append(await hook.callback(hook_input))
            except Exception as error:
                raise HookRaised(position, error) from error
        return outputs

    # The callbacks' signal: the call's, and also cancelled at the callbacks' deadline.
    own = hook_input.signal.child()
    hook_input = replace(hook_input, signal=own)
    try:
        outputs = await guard.run(str(hook_input.event), run_all(), timeout_s, stops=own)
    except Overran as overran:
        raise HookTimedOut(f"{hook_input.event} hooks exceeded {timeout_s} s ({overran})") from None
    return merge(outputs, hook_input.input)


def merge(outputs: Sequence[HookOutput | None], original: JsonObject) -> HookVerdict:
    """Merge outputs in order; stop at the first ``skip`` or ``abort`` (its reason wins). A
    modified input or output that is not JSON (NaN, a date, a set: what no store holds and no
    client reads back) is its hook's failure, ``HookRaised``, as if it had raised."""
    verdict = HookVerdict()
    merged: dict[str, JsonValue] | None = None
    for position, output in enumerate(outputs):
        if output is None:
            continue
        if output.action != "continue":
            verdict.action = output.action
            verdict.reason = output.reason
            break
        if output.modified_input is not None:
            modified = _json_of(position, output.modified_input)
            if not isinstance(modified, dict):
                raise HookRaised(position, TypeError("modified_input is not a JSON object"))
            merged = {**(original if merged is None else merged), **modified}
        if output.modified_output is not None:
            verdict.output = _json_of(position, output.modified_output)
    verdict.input = merged
    return verdict


def _json_of(position: int, value: object) -> JsonValue:
    try:
        return checked(value)
    except (NotJson, RecursionError) as error:  # nested deeper than any reader goes, too
        raise HookRaised(position, error) from None
