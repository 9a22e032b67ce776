"""The ``ctx`` an implementation receives, and its ToolData writer.

``ToolContext`` satisfies every generated Execution protocol structurally: the typed input (built
on first access), server context, call identity, cancellation signal, entry (initial or resume),
suspension history, ToolData channels, ``fail``, ``suspend`` and ``display``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NoReturn, Protocol

from pydantic import BaseModel, JsonValue, ValidationError

from blade_runtime.core.caller import CallContext
from blade_runtime.core.cancel_scope import CancelScope
from blade_runtime.core.context import (
    CallInfo,
    CancellationSignal,
    DataItem,
    InitialEntry,
    ResumeEntry,
    Suspended,
    SuspensionEpisode,
    ToolFailed,
    child_id,
    event_of,
)
from blade_runtime.core.effects import CallEffects, Effects
from blade_runtime.core.fencing import Lease, LeaseNotHeld
from blade_runtime.core.files import FileAccess, ScopedFiles
from blade_runtime.core.jsonvalue import NotJson, checked, encodable_tree, lossless, model_of
from blade_runtime.core.permissions import (
    POINTS,
    STEP,
    STEP_POINT,
    PermissionAnswer,
    step_payload,
)
from blade_runtime.core.registry import Point, Typed
from blade_runtime.core.spec import JsonObject, ToolSpec
from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import Claim, DataRecord, Event, LeaseLost, now
from blade_runtime.core.triggers import Triggers

log = logging.getLogger("blade_runtime")

INITIAL = InitialEntry()


class CallServices:
    """What a runtime lends every ``ctx``: its files, its triggers and its effects."""

    __slots__ = ("effects", "files", "triggers")

    def __init__(self, files: FileAccess, triggers: Triggers, effects: Effects) -> None:
        self.files = files
        self.triggers = triggers
        self.effects = effects


class DataRejected(ValueError):
    """A ToolData record that is not lossless JSON or that its channel schema rejects."""


class SuspendRejected(ValueError):
    """A suspend payload that is not lossless JSON or that its point's schema rejects."""


class InputModelMismatch(Exception):
    """The generated input model rejected input its JSON Schema accepted: a toolchain bug."""


class UnreadableInput(Exception):
    """Arguments no JSON text could carry (a lone surrogate in a string from Python): JSON
    Schema accepts them, no typed model can hold them. The call is INVALID_INPUT."""


class CallData:
    """``ctx.data``: the call's ToolData, validated per channel, written through the store.

    Durable items are stored with the call (one transaction with their event); transient ones
    only reach live subscribers. The same id updates an item in place, keeping its position.
    """

    __slots__ = ("_call", "_channels", "_claim", "_counter", "_io", "_publish")

    def __init__(
        self,
        call: CallInfo,
        channels: Mapping[str, Typed],
        io: StoreAccess,
        publish: Callable[[Event], None],
        claim: Claim | None = None,
    ) -> None:
        self._call = call
        self._channels = channels
        self._io = io
        self._publish = publish
        self._claim = claim  # the entry's: a write is refused once another worker holds it
        self._counter = itertools.count(1)

    async def write(
        self, channel: str, value: Any, *, id: str | None = None, transient: bool = False
    ) -> None:
        typed = self._channel(channel)
        try:
            record = lossless(typed.adapter, value)
        except NotJson as error:
            raise DataRejected(f"ToolData channel {channel!r}: {error}") from None
        if not typed.validator.is_valid(record):
            problems = typed.validator.explain(record)
            raise DataRejected(f"ToolData channel {channel!r} rejected a record: {problems}")
        item_id = id if id is not None else f"{channel}-{self._call.call_id}-{next(self._counter)}"
        at = now()
        payload: JsonValue = {
            "channel": channel,
            "id": item_id,
            "value": record,
            "transient": transient,
        }
        event = event_of(self._call, "data", payload, at)
        if not transient:
            data = DataRecord(self._call.call_id, channel, item_id, record, at)
            try:
                written = await self._io(self._io.store.write_data, data, event, claim=self._claim)
            except LeaseLost as lost:  # another worker holds the call: this entry ends
                fence = -1 if self._claim is None else self._claim.fence
                raise LeaseNotHeld(lost.call_id, fence) from None
            event = written or event
        self._publish(event)

    async def list(self, channel: str) -> Sequence[DataItem[Any]]:
        typed = self._channel(channel)
        stored = await self._io(self._io.store.data, self._call.call_id, channel)
        return [
            DataItem(
                item.item_id, model_of(typed.adapter.validate_python, item.value), item.updated_at
            )
            for item in stored
        ]

    def _channel(self, channel: str) -> Typed:
        try:
            return self._channels[channel]
        except KeyError:
            known = ", ".join(sorted(self._channels)) or "none"
            raise DataRejected(f"no ToolData channel {channel!r} (channels: {known})") from None


class ChildToolError(Exception):
    """A child tool's call ended without an output: its stable ``code`` and ``message``.

    Raised by ``ctx.tools.call``; a tool that does not catch it fails as TOOL_ERROR (or as its
    runtime's ``error_mapper`` says)."""

    def __init__(self, spec_id: str, code: str, message: str) -> None:
        super().__init__(f"{spec_id}: {code}: {message}")
        self.spec_id = spec_id
        self.code = code
        self.message = message


ChildCaller = Callable[[ToolSpec[Any, Any, Any], Any, CallInfo], Awaitable[Any]]


class ChildTools:
    """``ctx.tools``: calls of the child tools the spec declares, and of no other tool.

    Each child call is a full call of its registration (hooks, validation, timeout), in the same
    run, with a call id under the parent's; cancelling the parent cancels it."""

    __slots__ = (
        "_allowed",
        "_call",
        "_caller",
        "_count",
        "_disabled",
        "_ended",
        "_entry",
        "_refused",
        "_tasks",
    )

    def __init__(
        self,
        caller: ChildCaller,
        call: CallInfo,
        entry: str,
        allowed: tuple[str, ...],
        disabled: frozenset[str] = frozenset(),
        refused: frozenset[str] = frozenset(),
    ) -> None:
        self._caller = caller
        self._call = call
        self._allowed = allowed
        self._disabled = disabled  # decided when the parent started, for its whole length
        self._refused = refused  # registered nowhere, or refused by name
        self._count = itertools.count(1)
        # Child ids are the parent's entry's: the initial entry's, or the resume of an action's
        # (a counter per entry, so that a resumed parent calling a child again gets a new id).
        self._entry = entry
        self._tasks: set[asyncio.Task[Any]] = set()  # tasks running one of its children
        self._ended = False

    def end(self) -> None:
        """The parent's entry ended: a child started in a task it did not await is cancelled
        (it settles CANCELLED), and none starts from now on."""
        self._ended = True
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current and not task.done():
                task.cancel("its parent call ended")
        self._tasks.clear()

    def enabled(self, tool: ToolSpec[Any, Any, Any], /) -> bool:
        """Whether ``tool`` may be called here: a declared child, registered, and enabled for
        this parent call (decided when it started, so the answer holds for its whole length)."""
        return (
            tool.id in self._allowed
            and tool.id not in self._disabled
            and tool.id not in self._refused
        )

    async def call(self, tool: ToolSpec[Any, Any, Any], input: Any, /) -> Any:
        """The child's validated output, or a ChildToolError. To cut one child short without
        its siblings, cancel its task (``asyncio.timeout``, ``task.cancel()``): the child
        settles CANCELLED and the parent goes on."""
        if tool.id not in self._allowed:
            declared = ", ".join(self._allowed) or "none"
            raise ChildToolError(
                tool.id,
                "TOOL_NOT_ALLOWED",
                f"not a declared child of {self._call.spec_id} " f"(children: {declared})",
            )
        if tool.id in self._disabled:
            raise ChildToolError(tool.id, "TOOL_NOT_ALLOWED", "not enabled for this call")
        if self._ended:
            raise ChildToolError(tool.id, "CANCELLED", "its parent call has ended")
        child = CallInfo(
            child_id(self._call.call_id, self._entry, tool.name, next(self._count)),
            self._call.run_id,
            tool.name,
            tool.id,
            self._call.context,
            self._call.call_id,
        )
        task = asyncio.current_task()
        if task is None:
            return await self._caller(tool, input, child)
        self._tasks.add(task)
        try:
            return await self._caller(tool, input, child)
        finally:
            self._tasks.discard(task)


class ChildHookFailed(BaseException):
    """A child call's hook or observer failed: fatal to the parent, even if it catches it (a
    BaseException, so that ``except Exception`` does not; the runtime fails the parent anyway)."""

    def __init__(self, spec_id: str, code: str, message: str) -> None:
        super().__init__(f"{spec_id}: {code}: {message}")
        self.code = code


class StepDecider(Protocol):
    """Who decides ``ctx.request_permission`` before a person is asked (the call runner)."""

    async def decide_step(
        self,
        registration: Any,
        call: CallInfo,
        arguments: JsonObject,
        scope: CancelScope,
        prompt: str,
        subject: str | None,
    ) -> PermissionAnswer | None:
        """An answer that allows the step now, None to ask a person, or ``StepRefused``."""
        ...


class ToolContext:
    """The ``ctx`` an implementation receives.

    ``input`` is built from the validated arguments on first access: the typed model costs about
    as much as the rest of a call, and a tool that never reads it should not pay for it.
    """

    # Class-level defaults rather than slots: most calls set five attributes, not eleven.
    _view: CallInfo | None = None  # ``call`` as the implementation sees it, made when first read
    context: Any = None
    capabilities: Any = None
    data: CallData | None = None
    tools: ChildTools | None = None
    lease: Lease | None = None  # set for a tool whose spec asks for lease fencing
    entry: InitialEntry | ResumeEntry[Any, Any] = INITIAL
    _input: BaseModel | None = None
    _publish: Callable[[Event], None] | None = None  # set while anyone subscribes
    _display: JsonValue = None
    _metadata: dict[str, JsonValue] | None = None  # set by ctx.metadata
    _history: Sequence[SuspensionEpisode] | Callable[[], Sequence[SuspensionEpisode]] = ()
    _services: CallServices | None = None
    _files: ScopedFiles | None = None
    _steps: StepDecider | None = None  # decides request_permission before a person is asked
    _registration: Any = None
    _claim: Claim | None = None  # what its writes are fenced by (see core.fencing)
    _asked: dict[tuple[str, str | None], int] | None = None  # request_permission calls so far
    _triggered = 0  # ctx.trigger calls so far
    _effects: CallEffects | None = None  # made by the first ctx.effects

    def __init__(
        self,
        registration: Any,
        arguments: JsonObject,
        call: CallInfo,
        scope: CancelScope,
        steps: StepDecider | None = None,
        publish: Callable[[Event], None] | None = None,
        services: CallServices | None = None,
        entry: InitialEntry | ResumeEntry[Any, Any] = INITIAL,
        history: Callable[[], Sequence[SuspensionEpisode]] | None = None,
    ) -> None:
        """Everything a call's context needs, given when it is made (what depends on the
        entry's admission, its server context, ToolData, claim, lease and children, is given by
        the runner once it is known)."""
        self._registration = registration
        self._build_input = registration.build_input
        self._points: Mapping[str, Point] = registration.points
        self._arguments = arguments
        self._call = call
        self._scope = scope
        self._steps = steps
        self._publish = publish
        self._services = services
        if entry is not INITIAL:
            self.entry = entry
        if history is not None:
            self._history = history

    @property
    def signal(self) -> CancellationSignal:
        return self._scope.signal

    @property
    def suspend_history(self) -> Sequence[SuspensionEpisode]:
        """The call's suspension episodes, read from the store on first access."""
        if callable(self._history):
            self._history = self._history()
        return self._history

    @property
    def call(self) -> CallInfo:
        """The call: its ids, tool name and thread. Who it is for (the principal, its tenant,
        the client's untrusted data) only when the spec declares ``"caller": true``: a tool
        gets the context it declares (seed 002), and its server context from the provider."""
        view = self._view
        if view is None:
            view = self._view = caller_view(self._call, self._registration.spec)
        return view

    @property
    def agent_id(self) -> str | None:
        """The agent executing the call (seed 002's ``ctx.agentId``): the id the adapter or
        the caller named it by, whatever the spec declares; None when nobody named one."""
        return self._call.agent_id

    @property
    def input(self) -> Any:
        if self._input is None:
            try:
                try:  # model_of's retry only where validation failed: one frame less per call
                    self._input = self._build_input(self._arguments)
                except ValidationError:
                    self._input = model_of(self._build_input, self._arguments)
            except ValidationError as error:
                if not encodable_tree(self._arguments):
                    raise UnreadableInput(
                        "the text is not valid Unicode (a lone surrogate)"
                    ) from None
                raise InputModelMismatch(
                    f"{self._call.spec_id}: the generated input model rejected input its JSON "
                    f"Schema accepts (rebuild with the current blade-codegen): {error}"
                ) from None
        return self._input

    def fail(self, message: str) -> NoReturn:
        raise ToolFailed(message)

    def display(self, content: JsonValue) -> None:
        self._display = content

    def metadata(self, fields: Mapping[str, JsonValue]) -> None:
        """Attach ``fields`` to the call's result as metadata (seed 000's ``metadata``): JSON for
        the application (an upload id, a count, a cost), stored with the call and returned by
        ``Runtime.call``, HTTP, MCP (the result's ``_meta``) and the typed client, never shown
        to the model. A success and a failure (``ctx.fail``, an exception) both carry it; later
        calls add to it key by key. A value that is not JSON is a ``NotJson`` (ValueError)."""
        added = checked(dict(fields))
        assert isinstance(added, dict)
        if self._metadata is None:
            self._metadata = added
        else:
            self._metadata.update(added)

    def progress(
        self,
        message: str = "",
        *,
        completed: float | None = None,
        total: float | None = None,
        data: JsonValue = None,
        resume_token: str | None = None,
    ) -> None:
        """Tell whoever watches the call how far it is: a transient ``progress`` event, in
        order with the call's other events, never stored; it never fails the tool (nobody
        watching, or a watcher gone, is not an error). ``data`` (JSON; a value that is not is
        its text) and ``resume_token`` ride in the event when given (seed 000)."""
        payload: dict[str, JsonValue] = {
            "message": str(message),
            "completed": _amount(completed),
            "total": _amount(total),
        }
        if data is not None:
            try:
                payload["data"] = checked(data)
            except NotJson:
                payload["data"] = str(data)
        if resume_token is not None:
            payload["resume_token"] = str(resume_token)
        self._announce("progress", payload)

    def message(self, display: JsonValue) -> None:
        """Show whoever watches the call a message while it runs: a transient ``message``
        event (JSON; a value that is not JSON is shown as its text)."""
        try:
            shown = checked(display)
        except NotJson:
            shown = str(display)
        self._announce("message", shown)

    @property
    def files(self) -> ScopedFiles:
        """Durable files bound to this call's tenant, creator and thread (see ``core.files``)."""
        if self._files is None:
            self._files = ScopedFiles(
                self._runtime().files, self._call, self._scope.signal, self._claim
            )
        return self._files

    async def trigger(self, input: JsonValue) -> str:
        """Ask the application to continue generation on this call's thread: a durable trigger
        and a ``trigger`` event of the run, delivered to ``Runtime(on_trigger=...)`` once across
        workers. Returns the trigger's id. ``TriggerRejected`` when ``input`` is not JSON."""
        services = self._runtime()
        self._triggered += 1  # the n-th of this execution: the same one when it runs again
        key = f"{self._call.call_id}\x00{self._execution()}\x00{self._triggered}"
        return await services.triggers.request(self._call, input, claim=self._claim, key=key)

    @property
    def effects(self) -> CallEffects:
        """What this entry changes beyond its result, as its spec's ``effects`` declares:
        ``patch_context``, ``post_message``, ``grant`` and ``revoke`` (see ``core.effects``)."""
        if self._effects is None:
            self._effects = CallEffects(
                self._runtime().effects,
                self._call,
                self._registration.effects,
                self._claim,
                self._execution(),
            )
        return self._effects

    def _execution(self) -> str:
        """Which execution of the call this entry runs: "initial", or the action whose resume
        began it. A permission's answer (a step's, or the policy's before the call ran) enters
        the tool again from the top: the same execution, replayed, so what it triggers or emits
        before the step is the same trigger or effect, not a new one."""
        entry = self.entry
        if not isinstance(entry, ResumeEntry):
            return "initial"
        if entry.point not in POINTS:
            return entry.action.action_id
        began = "initial"
        for episode in self.suspend_history:  # oldest first
            if episode.action_id == entry.action.action_id:
                break
            if episode.point not in POINTS:
                began = episode.action_id
        return began

    async def run_context(self) -> dict[str, JsonValue]:
        """The context of this call's run: the context patches its calls emitted so far (its
        own included), merged in order; that of the run's calls made for the same caller."""
        call = self._call
        return await self._runtime().effects.run_context(
            call.run_id, call.tenant, call.principal_id
        )

    def _runtime(self) -> CallServices:
        if self._services is None:
            raise RuntimeError("this context was not made by a Runtime (no files, no triggers)")
        return self._services

    def _announce(self, kind: str, payload: JsonValue) -> None:
        publish = self._publish
        if publish is None:
            return
        try:
            publish(event_of(self._call, kind, payload))
        except Exception:  # a watcher's failure is never the tool's
            log.exception(
                "%s (call %s): a %s event was not delivered",
                self._call.name,
                self._call.call_id,
                kind,
            )

    async def request_permission(
        self, prompt: str, details: JsonValue = None, *, subject: str | None = None
    ) -> PermissionAnswer:
        """Ask before one sensitive step. The policy decides first: an allow (or a standing
        grant of the caller's for this tool and ``subject``) returns at once, a denial ends the
        call as PERMISSION_DENIED. Otherwise this execution ends and waits on a durable
        permission request, and the tool is entered again: there this call returns the
        person's answer (approved or not) instead of asking again."""
        if not isinstance(prompt, str) or not (subject is None or isinstance(subject, str)):
            raise SuspendRejected(
                "request_permission: the prompt and the subject are text "
                f"(got {type(prompt).__name__} and {type(subject).__name__})"
            )
        answered = self._answer_of(prompt, subject)
        if answered is not None:
            return answered
        try:
            shown = checked(details)
        except NotJson as error:
            raise SuspendRejected(
                f"request_permission: the details are not JSON: {error}"
            ) from None
        if self._steps is not None:
            allowed = await self._steps.decide_step(
                self._registration, self._call, self._arguments, self._scope, prompt, subject
            )
            if allowed is not None:
                return allowed
        raise Suspended(STEP, step_payload(self._call, prompt, shown, subject))

    def _answer_of(self, prompt: str, subject: str | None) -> PermissionAnswer | None:
        """The person's answer to this request when an earlier entry of the call asked it: the
        n-th request of a prompt and subject in this entry is the n-th one asked of them (a
        tool may ask several steps, each answered once)."""
        if not isinstance(self.entry, ResumeEntry):
            return None
        if self._asked is None:
            self._asked = {}
        key = (prompt, subject)
        seen = self._asked[key] = self._asked.get(key, 0) + 1
        matching = [
            episode
            for episode in self.suspend_history
            if episode.point == STEP
            and isinstance(episode.payload, dict)
            and episode.payload.get("prompt") == prompt
            and episode.payload.get("subject") == subject
            and episode.resume is not None
        ]
        if len(matching) < seen:
            return None
        answer: PermissionAnswer = model_of(
            STEP_POINT.resume.adapter.validate_python, matching[seen - 1].resume
        )
        return answer

    @property
    def permission(self) -> PermissionAnswer | None:
        """The answer to ``request_permission`` when this entry resumes from one, else None."""
        entry = self.entry
        if isinstance(entry, ResumeEntry) and entry.point == STEP:
            answer: PermissionAnswer = entry.payload
            return answer
        return None

    def suspend(self, point: str, payload: Any) -> NoReturn:
        """End this execution and wait at ``point``; the payload is validated first."""
        found = self._points.get(point)
        if found is None:
            known = ", ".join(sorted(self._points)) or "none"
            raise SuspendRejected(f"no suspend point {point!r} (points: {known})")
        try:
            record = lossless(found.suspend.adapter, payload)
        except NotJson as error:
            raise SuspendRejected(f"suspend point {point!r}: {error}") from None
        if not found.suspend.validator.is_valid(record):
            problems = found.suspend.validator.explain(record)
            raise SuspendRejected(f"suspend point {point!r} rejected the payload: {problems}")
        raise Suspended(point, record)


def _amount(value: Any) -> float | None:
    """A progress amount as JSON can carry it: a finite number, else None."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, int | float):
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
    return value if math.isfinite(value) else None


def caller_view(call: CallInfo, spec: Any) -> CallInfo:
    """``call`` as an implementation whose spec does not declare ``caller`` sees it: its
    context keeps the thread and the executing agent (where the call is, not who asked) and
    nothing of who called (the runtime keeps the whole call)."""
    context = call.context
    if context is None or getattr(spec, "caller", False):
        return call
    if context.principal is None and context.client_data is None and not context.extra:
        return call
    return replace(
        call, context=CallContext(thread_id=context.thread_id, agent_id=context.agent_id)
    )
