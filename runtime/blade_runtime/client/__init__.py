"""Typed client DTOs, and the typed client over a ``Runtime`` in process or over HTTP.

A generated spec package builds on these: per tool a result type
(``CallSuccess[Output] | CallSkipped | CallError | CallPending[Action]``), per suspend point and
per client tool a pending-action class (``input`` is the typed payload, ``submit`` takes only the
typed resume payload), per tool with data channels a data view, one discriminated union of the
package's pending actions, and a ``Client`` with one typed method per tool.

DTOs are pydantic models with a literal tag (``status`` for results, ``kind`` for actions), so a
UI in another process parses the very JSON the client produces (``model_dump(mode="json")``).

A client talks to its runtime through a ``Transport``: ``Client(runtime)`` in process, or
``Client(HttpTransport(base_url, token=...))`` (``blade_runtime.client.http``) against a served one,
with the same typed calls, results, pending actions and submit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, TypeAlias, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
)

from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.effects import effects_json
from blade_runtime.core.events import PendingAction
from blade_runtime.core.files import FileBody, UnknownFile
from blade_runtime.core.permissions import POINTS as PERMISSION_POINTS
from blade_runtime.core.permissions import PermissionAnswer, PermissionPrompt
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolResult, ToolSuccess

if TYPE_CHECKING:
    from blade_runtime.runtime import Runtime

T = TypeVar("T")
OutputT = TypeVar("OutputT")
ActionT = TypeVar("ActionT")
InputT = TypeVar("InputT")


class Parser(Generic[T]):
    """Parses JSON-shaped data into ``T`` (a class or a union alias), building its pydantic
    adapter on first use so that importing a tool module stays cheap."""

    def __init__(self, form: Any) -> None:
        self._form = form
        self._adapter: TypeAdapter[T] | None = None

    def parse(self, data: Any) -> T:
        if self._adapter is None:
            self._adapter = TypeAdapter(self._form)
        return self._adapter.validate_python(data)


_DTO = ConfigDict(frozen=True)
# Serializes a typed payload (a model, or a list or alias of models) as the runtime's JSON values:
# unset fields stay out, numbers stay exact (python mode), aliases are the JSON names.
_JSON: TypeAdapter[Any] = TypeAdapter(Any)


class CallEffect(BaseModel):
    """One effect a call emitted (``ctx.effects``): ``type`` ``context_patch`` (``value``: the
    patch of its run's context), ``message`` (the message) or ``permission`` (``{"change",
    "tool", "spec_id", "point", "subject"}``)."""

    model_config = _DTO
    effect_id: str
    type: Literal["context_patch", "message", "permission"]
    value: JsonValue = None
    at: str


class _Call(BaseModel):
    """What every result DTO holds; each subclass adds its literal ``status`` tag."""

    model_config = _DTO
    call_id: str
    run_id: str
    metadata: dict[str, JsonValue] | None = None
    """What the tool attached with ``ctx.metadata`` (a success or an error; None: nothing)."""
    effects: tuple[CallEffect, ...] = ()
    """What the call changed beyond its result (``ctx.effects``), in order (a success or an
    error)."""


class CallSuccess(_Call, Generic[OutputT]):
    """The tool returned ``output``, valid against its output schema."""

    status: Literal["success"] = "success"
    output: OutputT
    content: JsonValue = None
    """What the model read: the output as JSON, its projection, or a post hook's rewrite."""


class CallSkipped(_Call):
    """A ``pre_tool_use`` hook skipped the call; ``reason`` says why."""

    status: Literal["skipped"] = "skipped"
    reason: str


class CallError(_Call):
    """The call produced no output: a stable ``code`` and a sentence for the model."""

    status: Literal["error"] = "error"
    code: ErrorCode
    message: str


class CallPending(_Call, Generic[ActionT]):
    """The call waits on ``action`` (a suspension, or a client tool's output)."""

    status: Literal["pending"] = "pending"
    action: ActionT


class PendingActionBase(BaseModel, Generic[InputT]):
    """What every pending-action DTO holds. Generated subclasses fix ``kind`` to a literal
    (``<spec id>#<point>``, or the spec id of a client tool), type ``input`` and add a ``submit``
    that accepts only the typed resume payload (or the client tool's typed output).

    An action from a client is bound to it; one parsed elsewhere is bound with
    ``client.action(data)`` before it can be submitted."""

    model_config = _DTO
    kind: str
    action_id: str
    name: str  # <registration name>.<point>, or the registration name of a client tool
    spec_id: str
    point: str | None
    call_id: str
    run_id: str
    suspended_at: str
    input: InputT
    thread_id: str | None = None  # the thread of the call that asks
    agent_id: str | None = None  # the agent that ran it
    _client: ToolClient | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # The same action, whichever client (if any) it is bound to.
        if not isinstance(other, PendingActionBase):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # its input is a mutable model

    def _bound(self) -> ToolClient:
        if self._client is None:
            raise RuntimeError(
                f"pending action {self.action_id!r} is not bound to a client; "
                "get it from client.pending() or client.action(data)"
            )
        return self._client

    async def cancel(self, reason: str = "cancelled") -> CallError:
        """Settle the call as CANCELLED (or say who resolved the action first)."""
        client = self._bound()
        return client._settled(await client.transport.cancel(self.action_id, reason, self._ids()))

    async def fail(self, error: str) -> CallError:
        """Settle the call as TOOL_FAILED with ``error`` as the model's sentence."""
        client = self._bound()
        return client._settled(await client.transport.fail(self.action_id, error, self._ids()))

    async def _submit(self, payload: Any, result: Parser[T]) -> T:
        client = self._bound()
        # Whatever the payload holds is sent as it is: the resume schema decides, not a warning.
        value = _JSON.dump_python(payload, by_alias=True, exclude_unset=True, warnings=False)
        submitted = await client.transport.submit(self.action_id, value, self._ids())
        return client._converted(submitted, result)

    def _ids(self) -> dict[str, str]:
        return {"call_id": self.call_id, "run_id": self.run_id}


AnyResult: TypeAlias = CallSuccess[Any] | CallSkipped | CallError | CallPending[Any]


class PermissionRequestAction(PendingActionBase[PermissionPrompt]):
    """A permission request of any backend tool (``kind``: ``<spec id>#@permission``, before the
    call runs, or ``#@permission-step``, from ``ctx.request_permission``): ``input`` shows the
    tool, its contract and the input that would run; answer with ``approve`` or ``deny``."""

    kind: Annotated[str, Field(pattern=r"#@permission(-step)?$")]

    async def approve(self, input: BaseModel | Mapping[str, Any] | None = None) -> AnyResult:
        """Let the call run (with ``input`` instead, validated against the tool's input schema,
        when given; only before the call runs)."""
        answer: dict[str, Any] = {"decision": "approve"}
        if input is not None:
            answer["input"] = input
        return await self._submit(answer, _ANY_RESULT)

    async def deny(self, message: str) -> AnyResult:
        """Refuse: the call settles as PERMISSION_DENIED with ``message`` for the model (or, for
        a request from inside the tool, the tool resumes with the denial)."""
        return await self._submit({"decision": "deny", "message": message}, _ANY_RESULT)

    async def submit(self, answer: PermissionAnswer) -> AnyResult:
        return await self._submit(answer, _ANY_RESULT)


def action_kind(spec_id: str, point: str | None) -> str:
    """The ``kind`` tag of a pending action: stable across registrations and processes."""
    return spec_id if point is None else f"{spec_id}#{point}"


Data: TypeAlias = dict[str, Any]
"""A result or action DTO's fields, before the typed parse."""


class RunEvent(BaseModel):
    """One event of a run, as a client watches it: ``started``, ``data``, ``suspended``,
    ``pending``, ``resumed``, ``claimed``, ``trigger``, ``result``, and the transient ``progress``
    and ``message`` (never stored: ``seq`` 0), in the order they happened."""

    model_config = _DTO
    run_id: str
    call_id: str
    kind: str
    payload: JsonValue = None
    at: str
    seq: int = 0


class Suspension(BaseModel):
    """One suspension episode of a call (seed 002's suspension view): ``name`` is its suspend
    point and ``input`` what it showed; ``state`` is ``pending``, ``submitted`` (with
    ``resume``, the answer), ``cancelled``, ``failed`` or ``expired``, and a resolved one has
    ``resolved_at``."""

    model_config = _DTO
    action_id: str
    name: str
    input: JsonValue = None
    suspended_at: str
    state: str
    resolved_at: str | None = None
    resume: JsonValue = None


class Transport:
    """Where a typed client's requests go. Results come back as DTO fields (``status`` and
    the ids, then ``output``, ``code`` and ``message``, ``action`` or ``reason``)."""

    async def call(self, spec_id: str, arguments: Any, *, call_id: str | None, run_id: str) -> Data:
        raise NotImplementedError

    async def submit(self, action_id: str, payload: Any, ids: dict[str, str]) -> Data:
        raise NotImplementedError

    async def cancel(self, action_id: str, reason: str, ids: dict[str, str]) -> Data:
        raise NotImplementedError

    async def fail(self, action_id: str, error: str, ids: dict[str, str]) -> Data:
        raise NotImplementedError

    def pending(self, run_id: str | None) -> list[Data]:
        """Every pending action, every page of them (it blocks; a page at a time, from a
        coroutine: ``pending_page``)."""
        raise NotImplementedError

    async def pending_page(
        self, run_id: str | None, limit: int | None, cursor: str | None
    ) -> tuple[list[Data], str | None]:
        """One page of the pending actions, and the next page's cursor (None: the last)."""
        raise NotImplementedError

    def data(self, call_id: str) -> dict[str, list[dict[str, JsonValue]]]:
        raise NotImplementedError

    async def suspensions(self, call_id: str) -> list[Data]:
        """The call's suspension episodes, oldest first (empty: not the client's call)."""
        raise NotImplementedError(f"{type(self).__name__} does not read suspension episodes")

    async def read_file(self, file_id: str) -> FileBody:
        raise NotImplementedError

    async def run_context(self, run_id: str) -> dict[str, JsonValue]:
        """The run's context for the client's calls (``ctx.effects.patch_context``)."""
        raise NotImplementedError(f"{type(self).__name__} does not read a run's context")

    def events(self, run_id: str, after: int | None) -> AsyncIterator[RunEvent]:
        raise NotImplementedError


class RuntimeTransport(Transport):
    """A ``Runtime`` in this process: typed outputs are handed over as they are. ``principal``:
    who the client's calls are for and who reads and answers its actions (None: the application
    itself, every tenant); every read goes through ``runtime.records`` with it. ``thread_id``
    and ``agent_id``: the thread its calls belong to and the agent that makes them."""

    def __init__(
        self,
        runtime: Runtime,
        principal: Principal | None = None,
        *,
        thread_id: str | None = None,
        agent_id: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.principal = principal
        self._context = (
            None
            if principal is None and thread_id is None and agent_id is None
            else CallContext(principal=principal, thread_id=thread_id, agent_id=agent_id)
        )

    async def call(self, spec_id: str, arguments: Any, *, call_id: str | None, run_id: str) -> Data:
        registration = self.runtime.registration_of(spec_id)
        if registration is None:
            return {
                "status": "error",
                "call_id": call_id or "",
                "run_id": run_id,
                "code": ErrorCode.TOOL_HANDLER_NOT_FOUND,
                "message": f"This runtime has no registration of {spec_id}.",
            }
        called = await self.runtime.call(
            registration.name, arguments, call_id=call_id, run_id=run_id, context=self._context
        )
        return result_data(called)

    async def submit(self, action_id: str, payload: Any, ids: dict[str, str]) -> Data:
        return result_data(await self.runtime.submit(action_id, payload, principal=self.principal))

    async def cancel(self, action_id: str, reason: str, ids: dict[str, str]) -> Data:
        return result_data(await self.runtime.cancel(action_id, reason, principal=self.principal))

    async def fail(self, action_id: str, error: str, ids: dict[str, str]) -> Data:
        return result_data(await self.runtime.fail(action_id, error, principal=self.principal))

    def pending(self, run_id: str | None) -> list[Data]:
        records = self.runtime.records.actions_blocking(run_id=run_id, principal=self.principal)
        return [_action_data(PendingAction.of(record, record.payload)) for record in records]

    async def pending_page(
        self, run_id: str | None, limit: int | None, cursor: str | None
    ) -> tuple[list[Data], str | None]:
        page = await self.runtime.records.actions_page(
            run_id=run_id, principal=self.principal, limit=limit, cursor=cursor
        )
        return [_action_data(PendingAction.of(r, r.payload)) for r in page.items], page.next

    def data(self, call_id: str) -> dict[str, list[dict[str, JsonValue]]]:
        channels: dict[str, list[dict[str, JsonValue]]] = {}
        for record in self.runtime.records.data_blocking(call_id, principal=self.principal):
            item = {"id": record.item_id, "value": record.value, "updated_at": record.updated_at}
            channels.setdefault(record.channel, []).append(item)
        return channels

    async def suspensions(self, call_id: str) -> list[Data]:
        return await self.runtime.records.suspensions(call_id, principal=self.principal)

    async def read_file(self, file_id: str) -> FileBody:
        found = await self.runtime.records.file(file_id, principal=self.principal)
        if found is None:
            raise UnknownFile(file_id)
        return found

    async def run_context(self, run_id: str) -> dict[str, JsonValue]:
        return await self.runtime.run_context(run_id, principal=self.principal)

    async def events(self, run_id: str, after: int | None) -> AsyncIterator[RunEvent]:
        """The run's events as the principal may see them (those of its own calls and of their
        child calls), until the iterator is closed."""
        subscription = self.runtime.subscribe(run_id, after=after)
        records = self.runtime.records
        seen: dict[str, bool] = {}
        try:
            async for event in subscription:
                if self.principal is not None and not self.principal.operator:
                    shown = seen.get(event.call_id)
                    if shown is None:
                        shown = await records.sees_events(
                            event.call_id, event.run_id, principal=self.principal
                        )
                        if shown is not None:
                            seen[event.call_id] = shown
                    if not shown:
                        continue
                yield RunEvent(
                    run_id=event.run_id,
                    call_id=event.call_id,
                    kind=event.kind,
                    payload=event.payload,
                    at=event.at,
                    seq=event.seq,
                )
        finally:
            subscription.close()


def result_data(called: ToolResult[Any]) -> Data:
    """A runtime result as the fields of its result DTO."""
    ids = {"call_id": called.call.call_id, "run_id": called.call.run_id}
    if isinstance(called, ToolSuccess):
        # A post hook's rewrite is all a typed view may hold: what it withheld reaches nobody.
        output = called.content if called.rewritten else called.output
        success = {"status": "success", **ids, "output": output, "content": called.content}
        return {**success, "metadata": called.metadata, "effects": effects_json(called.effects)}
    if isinstance(called, ToolError):
        error = {"status": "error", **ids, "code": called.code, "message": called.message}
        return {**error, "metadata": called.metadata, "effects": effects_json(called.effects)}
    if isinstance(called, ToolPending):
        return {"status": "pending", **ids, "action": _action_data(called.action)}
    return {"status": "skipped", **ids, "reason": called.reason}


class ToolClient:
    """The base of a generated ``Client``: typed calls over a ``Runtime`` in this process, or
    over any ``Transport`` (``blade_runtime.serving.http.HttpTransport`` for a served runtime).

    Tools are found by spec id among the runtime's registrations, so the client works whatever
    name a tool was registered under."""

    def __init__(self, runtime: Runtime | Transport) -> None:
        self.transport = runtime if isinstance(runtime, Transport) else RuntimeTransport(runtime)

    @property
    def runtime(self) -> Runtime:
        """The in-process runtime (a client over HTTP has none)."""
        if not isinstance(self.transport, RuntimeTransport):
            raise AttributeError("this client talks to its runtime through a transport")
        return self.transport.runtime

    async def _call(
        self,
        spec_id: str,
        input: BaseModel,
        result: Parser[T],
        *,
        call_id: str | None,
        run_id: str,
    ) -> T:
        arguments = input.model_dump(by_alias=True, exclude_unset=True)
        called = await self.transport.call(spec_id, arguments, call_id=call_id, run_id=run_id)
        return self._converted(called, result)

    def _converted(self, data: Data, result: Parser[T]) -> T:
        """A result's fields as the tool's typed result DTO, its pending action bound here."""
        try:
            parsed = result.parse(data)
        except ValidationError:
            if data.get("status") != "success":
                raise
            # A post hook rewrote the output into a shape its type cannot hold.
            message = "The tool's output was rewritten into a shape its typed result cannot hold."
            refused = {**data, "status": "error", "code": ErrorCode.INVALID_OUTPUT}
            parsed = result.parse({**refused, "message": message})
        if isinstance(parsed, CallPending) and isinstance(parsed.action, PendingActionBase):
            parsed.action._client = self
        return parsed

    def _settled(self, settled: Data) -> CallError:
        assert settled["status"] == "error", "cancel and fail settle as errors"
        return CallError.model_validate(settled)

    async def _pending_pages(
        self, actions: Parser[T], kinds: Iterable[str], run_id: str | None, limit: int | None
    ) -> AsyncIterator[list[T]]:
        """Pages of the pending actions of ``kinds``, typed, as the transport hands them."""
        known = frozenset(kinds)
        cursor: str | None = None
        while True:
            found, cursor = await self.transport.pending_page(run_id, limit, cursor)
            yield [self._action(actions, data) for data in found if data["kind"] in known]
            if cursor is None:
                return

    def _pending(self, actions: Parser[T], kinds: Iterable[str], run_id: str | None) -> list[T]:
        known = frozenset(kinds)
        return [
            self._action(actions, data)
            for data in self.transport.pending(run_id)
            if data["kind"] in known
        ]

    def permission_requests(self, *, run_id: str | None = None) -> list[PermissionRequestAction]:
        """The pending permission requests (of one run, or all), typed and bound to this
        client."""
        return [
            self._action(_PERMISSION_ACTIONS, data)
            for data in self.transport.pending(run_id)
            if data["point"] in PERMISSION_POINTS
        ]

    def _action(self, actions: Parser[T], data: Any) -> T:
        action = actions.parse(data)
        if isinstance(action, PendingActionBase):
            action._client = self
        return action

    def _data(self, call_id: str, view: Parser[T]) -> T:
        return view.parse(self.transport.data(call_id))

    async def read_file(self, file_id: str) -> FileBody:
        """A file a tool saved (``ctx.files``), of this client's tenant; ``UnknownFile`` when
        there is none (another tenant's is none)."""
        return await self.transport.read_file(file_id)

    async def suspensions(self, call_id: str) -> list[Suspension]:
        """Every suspension episode of the call ``call_id``, oldest first: the points it waited
        at, answered or not (the pending one, if any, is the last); empty when the call is not
        this client's."""
        found = await self.transport.suspensions(call_id)
        return [Suspension.model_validate(episode) for episode in found]

    async def run_context(self, run_id: str) -> dict[str, JsonValue]:
        """The context of the run ``run_id`` for this client's calls: what its tools patched
        with ``ctx.effects.patch_context``, merged in order (empty: nothing yet)."""
        return await self.transport.run_context(run_id)

    def events(self, run_id: str, *, after: int | None = None) -> AsyncIterator[RunEvent]:
        """The run's events from now on (or after the sequence number ``after``): stored ones
        and the transient ``progress`` and ``message``, in order, until closed
        (``aclose()``, or leaving an ``async for`` early)."""
        return self.transport.events(run_id, after)


def _action_data(view: PendingAction[Any]) -> dict[str, Any]:
    origin = view.origin
    return {
        "kind": action_kind(origin.spec_id, origin.point),
        "action_id": view.action_id,
        "name": view.name,
        "spec_id": origin.spec_id,
        "point": origin.point,
        "call_id": origin.call_id,
        "run_id": origin.run_id,
        "suspended_at": origin.suspended_at,
        "thread_id": origin.thread_id,
        "agent_id": origin.agent_id,
        "input": view.payload,
    }


_ANY_RESULT: Parser[AnyResult] = Parser(
    CallSuccess[Any] | CallSkipped | CallError | CallPending[Any]
)
_PERMISSION_ACTIONS = Parser[PermissionRequestAction](PermissionRequestAction)
