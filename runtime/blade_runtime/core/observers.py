"""Durable lifecycle observers: blocking callbacks at the boundaries of a call (seed 000).

An observer implements any of these coroutine methods; each completes before the step it
guards, so an observer that persists what it sees (an audit log, an outbox) has it stored before
the step happens:

    scheduled              the call is an executable invocation (its input is valid); before its
                           permission is decided and before it starts
    permission_requested   a policy asked a human; before the request becomes visible
    permission_resolved    a request answered (approved or denied by a person), or a policy's
                           denial; before the runtime acts on it (a policy's allow asks nobody,
                           so it crosses no permission boundary)
    execution_started      the start, the final input and the side-effect contract are stored;
                           before the implementation runs (a failure here blocks the side effect)
    settled                the call has its result; before it is recorded and announced
    refused                the call never became an invocation (no such tool, not enabled,
                           arguments that are not a JSON object or fail the input schema, a
                           ``pre_tool_use`` hook's skip or abort): it sees a ``Refusal``

An observer that raises stops that call, as OBSERVER_FAILED, and no other (``refused`` comes
after the fact: a raise there is logged).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import JsonValue

from blade_runtime.core.context import CallInfo
from blade_runtime.core.outcomes import result_json
from blade_runtime.core.spec import JsonObject, ToolSpec

BOUNDARIES = (
    "scheduled",
    "permission_requested",
    "permission_resolved",
    "execution_started",
    "suspended",
    "settled",
    "refused",
)


@dataclass(slots=True)
class Lifecycle:
    """What an observer sees at a boundary. ``boundary`` names it; the rest depends on it:
    ``spec`` (the tool's, with ``spec_id``), ``input`` (the final input), ``side_effect`` and
    ``kind`` (the contract), ``decision`` and
    ``reason`` (permissions), ``action_id`` (a permission request), ``outcome`` and ``result``
    (settled: the ToolResult, and its JSON as stored). (Not frozen: frozen dataclasses cost
    three times as much to build, and one is built per boundary of every observed call.)"""

    boundary: str
    call: CallInfo
    spec: ToolSpec[Any, Any, Any]
    input: JsonObject
    decision: str | None = None
    reason: str | None = None
    action_id: str | None = None
    outcome: Any = None
    _result: JsonValue = field(default=None, repr=False)
    _model_input: JsonObject | None = field(default=None, repr=False)

    @property
    def model_input(self) -> JsonObject:
        """scheduled: the model's own arguments, before a ``pre_tool_use`` hook changed them
        (``input`` is the final input); the same as ``input`` when no hook did."""
        return self.input if self._model_input is None else self._model_input

    @model_input.setter
    def model_input(self, value: JsonObject) -> None:
        self._model_input = value

    source: str = "spec"  # the registration's source: spec, dynamic, mcp:<server>
    trust: str = "workspace"  # and trust level: trusted, workspace, remote

    @property
    def spec_id(self) -> str:
        spec_id: str = self.spec.id  # the spec's generic id type, a str
        return spec_id

    @property
    def side_effect(self) -> str:
        """The call's, as its registration's ``behavior`` narrowed it (else the spec's)."""
        behavior = self.call.behavior
        if behavior is None or behavior.side_effect is None:
            return self.spec.side_effect
        return behavior.side_effect

    @property
    def kind(self) -> str | None:
        """The call's, as narrowed (else the spec's)."""
        behavior = self.call.behavior
        return self.spec.kind if behavior is None else behavior.kind

    @property
    def result(self) -> JsonValue:
        """settled: the result's JSON as it is stored (made when first read: most observers
        of a call never read it)."""
        if self._result is None and self.outcome is not None:
            self._result = result_json(self.outcome)
        return self._result


@dataclass(slots=True)
class Refusal:
    """What a ``refused`` observer sees: the call, its tool's spec (None where no tool has the
    name) and the result that ended it (a ToolError, or a hook's ToolSkipped)."""

    call: CallInfo
    spec: ToolSpec[Any, Any, Any] | None
    outcome: Any


class LifecycleObserver(Protocol):
    """Implement any of ``scheduled``, ``permission_requested``, ``permission_resolved``,
    ``execution_started``, ``suspended`` (an entry ended waiting on a pending action: its
    ``outcome`` is the ToolPending; the call settles in a later entry) and ``settled`` as
    ``async def name(self, event: Lifecycle)``, and ``refused`` as
    ``async def refused(self, refusal: Refusal)``."""


class ObserverFailed(Exception):
    def __init__(self, boundary: str, error: BaseException) -> None:
        super().__init__(f"the {boundary} observer raised {type(error).__name__}: {error}")
        self.boundary = boundary


Method = Callable[[Lifecycle], Awaitable[Any]]


class Observers:
    """The registered observers' methods, by boundary (only the ones they define), one
    attribute per boundary: the pipeline reads them on every observed call."""

    def __init__(self) -> None:
        self.scheduled: list[Method] = []
        self.permission_requested: list[Method] = []
        self.permission_resolved: list[Method] = []
        self.execution_started: list[Method] = []
        self.suspended: list[Method] = []  # an entry ended waiting on a pending action
        self.settled: list[Method] = []
        self.refused: list[Callable[[Refusal], Awaitable[Any]]] = []
        self.any = False

    def add(self, observer: object) -> None:
        found = False
        for boundary in BOUNDARIES:
            method = getattr(observer, boundary, None)
            if method is not None:
                getattr(self, boundary).append(method)
                found = True
        if not found:
            raise TypeError(
                f"{type(observer).__name__} implements no lifecycle boundary "
                f"({', '.join(BOUNDARIES)})"
            )
        self.any = True
