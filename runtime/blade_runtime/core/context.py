"""The execution context an implementation receives, as typing building blocks.

Generated modules declare, per tool, a Protocol that extends :class:`Execution` with typed
``data`` writes, ``suspend`` points and resume entries. The runtime's concrete context satisfies
those protocols structurally.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, NoReturn, Protocol, TypeVar

from pydantic import JsonValue

from blade_runtime.core.caller import CallContext
from blade_runtime.core.store import Event, now

if TYPE_CHECKING:
    from blade_runtime.core.behavior import Behavior
    from blade_runtime.core.files import ScopedFiles
    from blade_runtime.core.permissions import PermissionAnswer

InputT = TypeVar("InputT", covariant=True)
ContextT = TypeVar("ContextT", covariant=True)
PointT = TypeVar("PointT", bound=str, covariant=True)
PayloadT = TypeVar("PayloadT", covariant=True)
ValueT = TypeVar("ValueT", covariant=True)


class ToolFailed(BaseException):
    """Raised by ``ctx.fail(sentence)``: a deliberate, model-visible failure.

    A BaseException, not an Exception, so an implementation's ``except Exception`` does not swallow
    it by accident.
    """

    def __init__(self, message: str, code: str = "TOOL_FAILED") -> None:
        super().__init__(message)
        self.message = message
        self.code = code  # an ErrorCode's value: a bridge to a remote tool names its own


class Suspended(BaseException):
    """Raised by ``ctx.suspend(point, payload)``: this execution ends and waits for a resume.

    ``resume_schema``: what this one suspension's answer must meet, in place of the point's
    (a bridged MCP server's form: its schema is the server's, known only when it asks)."""

    def __init__(
        self, point: str, payload: JsonValue, resume_schema: Mapping[str, JsonValue] | None = None
    ) -> None:
        super().__init__(point)
        self.point = point
        self.payload = payload
        self.resume_schema = resume_schema


# A child's call id is its parent's, then (a resumed entry's action id,) the child's tool name and
# a count: ``ChildTools`` makes them; a grandchild's continues its parent's.
_CHILD_STEP = r"(?:act_[0-9a-f]+/)?[A-Za-z][A-Za-z0-9_.-]*/[1-9][0-9]*"
_CHILD_PATH = re.compile(rf"{_CHILD_STEP}(?:/{_CHILD_STEP})*")


def child_id(parent: str, entry: str, name: str, count: int) -> str:
    """The call id of a parent's ``count``-th child call of ``name`` in the entry ``entry``
    (an action id for a resume, else "")."""
    return f"{parent}/{entry}/{name}/{count}" if entry else f"{parent}/{name}/{count}"


def parent_ids(call_id: str) -> list[str]:
    """The call ids ``call_id`` has the form of a descendant of (a child's, a grandchild's),
    the outermost first: each part before a "/" after which comes what ``child_id`` adds."""
    found = []
    at = call_id.find("/")
    while at > 0:
        if _CHILD_PATH.fullmatch(call_id, at + 1):
            found.append(call_id[:at])
        at = call_id.find("/", at + 1)
    return found


@dataclass(slots=True)
class CallInfo:
    """Identity of one tool call inside one agent run, and who it is for."""

    call_id: str
    run_id: str
    name: str
    spec_id: str
    context: CallContext | None = None
    parent: str | None = None  # the call id of the parent, for a child tool's call
    behavior: Behavior | None = None  # narrowed by its registration's ``behavior`` callback

    @property
    def tenant(self) -> str:
        """The tenant the call is made for (its caller context's), "" when anonymous."""
        return "" if self.context is None else self.context.tenant

    @property
    def principal_id(self) -> str:
        """The id of the principal the call is made for, "" when anonymous."""
        context = self.context
        principal = None if context is None else context.principal
        return "" if principal is None else principal.id

    @property
    def thread_id(self) -> str | None:
        """The thread the call belongs to (its caller context's), None when unnamed."""
        return None if self.context is None else self.context.thread_id

    @property
    def agent_id(self) -> str | None:
        """The agent executing the call (its caller context's), None when unnamed."""
        return None if self.context is None else self.context.agent_id


def event_of(call: CallInfo, kind: str, payload: JsonValue, at: str | None = None) -> Event:
    """An event of ``call``, with whose it is (its caller's tenant and principal): a listing of
    a run's events is narrowed to them in the store's query."""
    return Event(
        call.run_id,
        call.call_id,
        kind,
        payload,
        now() if at is None else at,
        tenant=call.tenant,
        principal=call.principal_id,
    )


class CancellationSignal:
    """Set when the call is cancelled or times out; implementations check it or await it."""

    __slots__ = ("_cancelled", "_children", "_event", "_reason")

    def __init__(self) -> None:
        self._cancelled = False
        self._reason: str | None = None
        self._event: asyncio.Event | None = None  # made on the first wait: most calls never wait
        self._children: list[CancellationSignal] | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def reason(self) -> str | None:
        return self._reason

    def cancel(self, reason: str) -> None:
        if not self._cancelled:
            self._cancelled = True
            self._reason = reason
            if self._event is not None:
                self._event.set()
            for child in self._children or ():
                child.cancel(reason)

    def child(self) -> CancellationSignal:
        """A signal cancelled with this one, and also on its own (a hook's, at its deadline)."""
        made = CancellationSignal()
        if self._cancelled:
            made.cancel(self._reason or "cancelled")
        elif self._children is None:
            self._children = [made]
        else:
            self._children.append(made)
        return made

    async def wait(self) -> None:
        if self._cancelled:
            return
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()


@dataclass(frozen=True, slots=True)
class ActionRef:
    """Reference to the pending action whose submission re-entered the tool."""

    action_id: str
    call_id: str
    run_id: str
    point: str


@dataclass(frozen=True, slots=True)
class InitialEntry:
    """The first execution of a call."""


@dataclass(frozen=True)
class ResumeEntry(Generic[PointT, PayloadT]):
    """Re-entry after the pending action at ``point`` was submitted with ``payload``."""

    point: PointT
    payload: PayloadT
    action: ActionRef


@dataclass(frozen=True, slots=True)
class SuspensionEpisode:
    """One durable suspension of the current call; the payloads are the stored JSON."""

    action_id: str
    point: str
    payload: JsonValue
    suspended_at: str
    state: str
    resume: JsonValue = None
    resolved_at: str | None = None


@dataclass(frozen=True)
class DataItem(Generic[ValueT]):
    """One ToolData record as stored: same ``id`` means the same item, updated in place."""

    id: str
    value: ValueT
    updated_at: str


class Execution(Protocol[InputT, ContextT]):
    """What every implementation's ``ctx`` offers. Generated protocols add the typed parts."""

    @property
    def input(self) -> InputT: ...

    @property
    def context(self) -> ContextT: ...

    @property
    def call(self) -> CallInfo: ...

    @property
    def agent_id(self) -> str | None:
        """The agent executing the call: its registry id or its own name (None: unnamed)."""
        ...

    @property
    def signal(self) -> CancellationSignal: ...

    @property
    def suspend_history(self) -> Sequence[SuspensionEpisode]: ...

    def fail(self, message: str) -> NoReturn: ...

    async def request_permission(
        self, prompt: str, details: JsonValue = None, *, subject: str | None = None
    ) -> PermissionAnswer:
        """Ask before a sensitive step: the policy, a standing grant, or a person (waiting on a
        durable permission request; the same call returns the answer when the tool is entered
        again)."""
        ...

    @property
    def permission(self) -> PermissionAnswer | None:
        """The answer to ``request_permission`` when this entry resumes from one."""

    def progress(
        self,
        message: str = "",
        *,
        completed: float | None = None,
        total: float | None = None,
        data: JsonValue = None,
        resume_token: str | None = None,
    ) -> None:
        """Tell whoever watches the call how far it is (a transient, ordered event); ``data``:
        JSON for a client that reads it; ``resume_token``: a token the tool hands out with this
        point of its work (a client keeps the last one it saw)."""
        ...

    def message(self, display: JsonValue) -> None:
        """Show whoever watches the call a message while it runs (a transient event)."""
        ...

    def display(self, content: JsonValue) -> None:
        """Set UI-facing content for the result; the model never reads it."""

    def metadata(self, fields: Mapping[str, JsonValue]) -> None:
        """Attach JSON metadata to the result (success or failure): stored with the call and
        returned on every surface (``result.metadata``, HTTP, MCP ``_meta``, the typed client),
        never shown to the model."""

    @property
    def files(self) -> ScopedFiles:
        """Durable files of the call's tenant: ``save(name, content, media_type)``, ``read(id)``."""
        ...

    async def trigger(self, input: JsonValue) -> str:
        """Ask the application to continue generation on the call's thread (returns its id)."""
        ...

    async def run_context(self) -> dict[str, JsonValue]:
        """The context of the call's run: what the run's tools patched with
        ``ctx.effects.patch_context`` (the spec's ``effects.context``), merged in order."""
        ...
