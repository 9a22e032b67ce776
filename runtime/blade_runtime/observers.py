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

An observer that raises stops that call, as OBSERVER_FAILED, and no other. Arguments that are
not even JSON never enter the lifecycle: they never form an invocation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import JsonValue

from blade_runtime.context import CallInfo
from blade_runtime.spec import JsonObject

BOUNDARIES = (
    "scheduled",
    "permission_requested",
    "permission_resolved",
    "execution_started",
    "settled",
)


@dataclass(slots=True)
class Lifecycle:
    """What an observer sees at a boundary. ``boundary`` names it; the rest depends on it:
    ``input`` (the final input), ``side_effect`` and ``kind`` (the contract), ``decision`` and
    ``reason`` (permissions), ``action_id`` (a permission request), ``result`` (settled: the
    stored JSON of the result). (Not frozen: frozen dataclasses cost three times as much to
    build, and one is built per boundary of every observed call.)"""

    boundary: str
    call: CallInfo
    spec_id: str
    input: JsonObject
    side_effect: str
    kind: str | None = None
    decision: str | None = None
    reason: str | None = None
    action_id: str | None = None
    result: JsonValue = None


class LifecycleObserver(Protocol):
    """Implement any of ``scheduled``, ``permission_requested``, ``permission_resolved``,
    ``execution_started`` and ``settled`` as ``async def name(self, event: Lifecycle)``."""


class ObserverFailed(Exception):
    def __init__(self, boundary: str, error: BaseException) -> None:
        super().__init__(f"the {boundary} observer raised {type(error).__name__}: {error}")
        self.boundary = boundary


class Observers:
    """The registered observers' methods, by boundary (only the ones they define)."""

    def __init__(self) -> None:
        self.by_boundary: dict[str, list[Callable[[Lifecycle], Awaitable[Any]]]] = {
            boundary: [] for boundary in BOUNDARIES
        }
        self.any = False

    def add(self, observer: object) -> None:
        found = False
        for boundary in BOUNDARIES:
            method = getattr(observer, boundary, None)
            if method is not None:
                self.by_boundary[boundary].append(method)
                found = True
        if not found:
            raise TypeError(
                f"{type(observer).__name__} implements no lifecycle boundary "
                f"({', '.join(BOUNDARIES)})"
            )
        self.any = True

    async def notify(self, event: Lifecycle) -> None:
        """Run the boundary's observers in order; the first that raises stops the call."""
        for method in self.by_boundary[event.boundary]:
            try:
                await method(event)
            except Exception as error:
                raise ObserverFailed(event.boundary, error) from error
