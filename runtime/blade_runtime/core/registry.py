"""Registrations: a name bound to a spec, with everything a call needs compiled once.

Each schema is compiled into one validator shared by every registration that uses the same
schema; each generated type gets one pydantic ``TypeAdapter`` for serialization and parsing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar

from pydantic import TypeAdapter

from blade_runtime.core.behavior import Behavior, narrowed
from blade_runtime.core.caller import CallContext
from blade_runtime.core.context import CallInfo
from blade_runtime.core.export import ExportedTool
from blade_runtime.core.jsonvalue import model_of
from blade_runtime.core.slots import Limits
from blade_runtime.core.spec import Exposure, JsonObject, ToolSpec
from blade_runtime.core.validation import SchemaValidator

log = logging.getLogger("blade_runtime")

OutputT = TypeVar("OutputT")
ContextT = TypeVar("ContextT")

ContextProvider: TypeAlias = Callable[[CallInfo], ContextT | Awaitable[ContextT]]
"""Builds a tool's server context for one call (sync or async)."""

OutputObserver: TypeAlias = Callable[[Any, CallInfo], Awaitable[None] | None]
"""Sees a child's output as its parent receives it (the typed output, the child's CallInfo)."""


class DescribeWithChildren(Protocol):
    """A ``describe`` callback that also reads its enabled children's metadata."""

    def __call__(
        self, context: CallContext | None, /, *, children: Mapping[str, ExportedTool]
    ) -> str: ...


Trust: TypeAlias = Literal["trusted", "workspace", "remote"]
TRUST_LEVELS: tuple[Trust, ...] = ("trusted", "workspace", "remote")

Describe: TypeAlias = Callable[[CallContext | None], str] | DescribeWithChildren
"""The description the model reads for a caller's context (and the parent's children)."""


@dataclass(frozen=True, slots=True)
class Child:
    """A parent's own registration of one of the children its spec declares.

    It owns its policy apart from any direct registration of the same spec: its implementation,
    server ``context`` provider, ``enabled`` callback (decided once when the parent starts),
    ``permission`` policy, ``on_output`` observer, timeout and capabilities' configuration.
    A declared child without one runs the runtime's own registration of that spec."""

    spec: Any  # the child's BackendToolSpec
    implementation: Callable[[Any], Awaitable[Any]] | Callable[[Any], Any]
    context: ContextProvider[Any] | None = None
    enabled: Callable[[CallInfo], bool] | None = None
    permission: Any = None
    on_output: OutputObserver | None = None
    timeout_ms: int | None = None
    capability_config: Mapping[str, Any] | None = None


NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")  # the spec format's rule for names


class RegistrationError(ValueError):
    """A registration the runtime refuses; the message says why and what to do."""


def asynchronous(implementation: Callable[[Any], Any], where: str) -> Callable[[Any], Any]:
    """The implementation as the call path runs it: an ``async def`` (or a callable whose
    ``__call__`` is one) as it is; a plain function in a worker thread, so that it blocks no
    other call (see ``in_thread``). A generator of either kind is refused: a tool returns its
    output once, and reports along the way with ``ctx.progress`` and ``ctx.message``."""
    call = getattr(implementation, "__call__", None)  # noqa: B004 (the method, not callable())
    if inspect.isasyncgenfunction(implementation) or inspect.isgeneratorfunction(implementation):
        kind = "an async generator" if inspect.isasyncgenfunction(implementation) else "a generator"
        raise RegistrationError(
            f"{where}: the implementation is {kind}; a tool returns its output once (use "
            "ctx.progress or ctx.message for what it reports along the way)"
        )
    if inspect.iscoroutinefunction(implementation) or inspect.iscoroutinefunction(call):
        return implementation
    return in_thread(implementation)


def in_thread(function: Callable[[Any], Any]) -> Callable[[Any], Awaitable[Any]]:
    """Run a synchronous implementation in a worker thread (the loop's default executor) with
    the caller's context variables. ``ctx.signal`` tells it the call was cancelled or timed out;
    Python cannot stop a thread, so a cancelled call waits for it as for a coroutine that
    ignores its cancellation (the runtime's cleanup grace, then it is reported as abandoned and
    its registration refuses calls until it returns). Events it announces (``ctx.progress``,
    ``ctx.message``) reach the loop safely. A function that returns an awaitable (a lambda around
    an ``async def``) has it awaited on the loop."""

    @functools.wraps(function)
    async def implementation(ctx: Any) -> Any:
        loop = asyncio.get_running_loop()
        publish = getattr(ctx, "_publish", None)
        if publish is not None:
            ctx._publish = lambda event: loop.call_soon_threadsafe(publish, event)
        running = loop.run_in_executor(
            None, functools.partial(contextvars.copy_context().run, function, ctx)
        )
        try:
            answer = await asyncio.shield(running)
        except asyncio.CancelledError:
            while not running.done():  # the thread runs on: so does this call, until it ends
                try:
                    await asyncio.wait({running})
                except asyncio.CancelledError:
                    continue
            raise
        finally:
            if publish is not None:
                ctx._publish = publish
        if inspect.isawaitable(answer):
            answer = await answer
        return answer

    return implementation


@dataclass(frozen=True, slots=True)
class Typed:
    """One schema slot: its compiled validator and its generated type's adapter."""

    schema: JsonObject
    validator: SchemaValidator
    adapter: TypeAdapter[Any]


@dataclass(frozen=True, slots=True)
class Point:
    """A suspend point: what the tool shows while waiting, and what resumes it."""

    name: str
    suspend: Typed
    resume: Typed
    expires_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class EffectSlots:
    """What a registration's spec lets its tool emit (``core.effects``): typed slots, and the
    spec ids whose permissions it may change."""

    context: Typed | None = None
    message: Typed | None = None
    permissions: frozenset[str] = frozenset()


@dataclass(eq=False, frozen=True, slots=True)
class Registration(Generic[OutputT]):
    """One name bound to one spec: a backend implementation, or a client-executed tool. Made
    whole when registered and frozen, with what a call of it needs decided then (``plain``):
    nothing about it changes at a call."""

    name: str
    spec: ToolSpec[Any, Any, OutputT]
    implementation: Callable[[Any], Awaitable[OutputT]] | None
    context: ContextProvider[Any] | None
    timeout_ms: int
    input: Typed
    output: Typed | None
    output_adapter: TypeAdapter[Any]
    data: Mapping[str, Typed]
    points: Mapping[str, Point]
    timeout_s: float = field(init=False)
    # Flattened from input and output: read on every call.
    input_validator: SchemaValidator = field(init=False)
    build_input: Callable[[Any], Any] = field(init=False)
    """The typed input from valid arguments (``ctx.input``): the core validator itself, without
    ``model_validate``'s Python wrapper."""
    output_validator: SchemaValidator | None = field(init=False)
    children: tuple[str, ...] = field(init=False)  # ids ctx.tools may call (backend specs)
    detached: set[asyncio.Task[None]] = field(default_factory=set)
    """Implementations abandoned after ignoring cancellation and still running."""
    project: Callable[..., Any] | None = None
    project_context: bool = False  # the projection takes input= and call=
    """What the model reads of the typed output (``blade_runtime.core.content``)."""
    enabled: Callable[[CallInfo], bool] | None = None
    """Whether the tool is there for a call (its run, the caller's context); None: always."""
    describe: Describe | None = None
    """The description the model reads for a caller's context; None: the spec's."""
    describe_children: bool = False  # the callback takes children=
    permission: Any = None
    """This registration's own permission policy (else the runtime's)."""
    bindings: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    """The capabilities its implementation gets: name -> (binding, its configuration)."""
    services: Any = None
    """``ctx.capabilities`` made once, when every binding is shared (else made per call)."""
    fenced: bool = False  # the spec asks for lease fencing: ctx.lease, and a stored start
    behavior: Any = None  # the input's narrowed kind and side effect (core.behavior)
    own_children: Mapping[str, Registration[Any]] = field(default_factory=dict)
    """The parent's own registrations of its children, by spec id (else the runtime's)."""
    on_output: OutputObserver | None = None
    """A parent's own child registration: sees each output it delivers to the parent."""
    limits: Limits | None = None
    """Its concurrency limit and resource locks (``core.slots``); None: neither."""
    large_result_bytes: int | None = None
    """Above this many bytes, what the model reads is saved as a file of the call and the model
    reads its head and a link (``core.artifacts``); None: the runtime's setting."""
    source: str = "spec"
    """Where the tool comes from: ``spec`` (a spec registered by the application),
    ``dynamic`` (a spec made at run time) or ``mcp:<server>`` (a remote MCP server's tool)."""
    trust: Trust = "workspace"
    """How far it is trusted: ``trusted`` (built in), ``workspace`` (the application's own),
    ``remote`` (another party's server); a source policy and the permission policy read it."""
    title: str | None = None
    """Its display name for people (MCP ``title``, the inbox); None: its name."""
    aliases: tuple[str, ...] = ()
    """More names it is called by: a call by one is a call of this registration (the store
    records the name called); listed once, under ``name``, with these beside it."""
    group: str | None = None
    """The group it belongs to (``filesystem``, ``web``...), for listings and policies."""
    effects: EffectSlots | None = None
    """What ``ctx.effects`` may emit, as the spec declares it; None: nothing."""
    exposure: Exposure = "model"
    """``model``: listed on every model-facing surface; ``operator``: never offered to a model
    (not exported, not in MCP ``tools/list`` nor the adapters), called by the application."""

    @property
    def offered_to_models(self) -> bool:
        """Whether model-facing surfaces list it and let a model call it (``exposure``)."""
        return self.exposure == "model"

    plain: bool = field(init=False)
    """Whether a call of it needs nothing but its implementation: a backend implementation
    without server context, behavior, own permission policy, ToolData, lease fencing, children
    or capabilities acquired per call, whose calls skip what those need."""

    @property
    def checked(self) -> bool:
        """Whether a call must look at the registration before it starts (not the fast path)."""
        return bool(self.detached) or self.enabled is not None

    def __post_init__(self) -> None:
        # Frozen: the fields derived from the others are set once, here.
        derived = {
            "timeout_s": self.timeout_ms / 1000,
            "input_validator": self.input.validator,
            "build_input": self.input.adapter.validator.validate_python,
            "output_validator": None if self.output is None else self.output.validator,
            "children": getattr(self.spec, "children", ()),
        }
        derived["plain"] = (
            self.implementation is not None
            and self.context is None
            and self.behavior is None
            and self.permission is None
            and not self.data
            and not self.fenced
            and self.effects is None
            and not derived["children"]
            and (not self.bindings or self.services is not None)
        )
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def narrowed(self, arguments: JsonObject) -> Behavior:
        """The ``behavior`` callback's answer for ``arguments`` (set), checked against the spec
        and completed with its values; ``BehaviorRejected`` or the callback's own error."""
        return narrowed(self.spec, self.name, self.behavior(model_of(self.build_input, arguments)))

    def track(self, task: asyncio.Task[None]) -> None:
        """Refuse calls until the abandoned implementation running in ``task`` exits."""
        self.detached.add(task)
        task.add_done_callback(self._exited)

    def _exited(self, task: asyncio.Task[None]) -> None:
        self.detached.discard(task)
        error = None if task.cancelled() else task.exception()
        log.warning(
            "%s: an abandoned implementation exited%s; the registration accepts calls again",
            self.name,
            f" raising {type(error).__name__}: {error}" if error else "",
        )

    def exported(
        self,
        context: CallContext | None = None,
        children: Mapping[str, ExportedTool] | None = None,
    ) -> ExportedTool:
        """The tool as the model sees it; ``children``: its enabled children's metadata, for a
        ``describe`` that reads them."""
        spec = self.spec
        description = spec.description
        if self.describe is not None:
            try:
                if self.describe_children:
                    description = self.describe(  # type: ignore[call-arg]
                        context, children=children or {}
                    )
                else:
                    description = self.describe(context)  # type: ignore[call-arg]
            except Exception:  # the spec's own description stands; the bug is in the log
                log.exception("%s: its describe callback raised", self.name)
        return ExportedTool(
            name=self.name,
            id=spec.id,
            description=description,
            input_schema=spec.input_schema,
            output_schema=spec.output_schema,
            kind=spec.kind,
            side_effect=spec.side_effect,
            execution=spec.execution,
            timeout_ms=self.timeout_ms,
            title=self.title,
            aliases=self.aliases,
            group=self.group,
        )


def registration(
    spec: ToolSpec[Any, Any, Any],
    name: str,
    implementation: Callable[[Any], Awaitable[Any]] | None,
    context: ContextProvider[Any] | None,
    timeout_ms: int,
    **options: Any,
) -> Registration[Any]:
    """Compile what a call of ``spec`` needs (validators and adapters), once; ``options``: the
    registration's other fields (its projection, callbacks, policy, capabilities...)."""
    points: dict[str, Point] = {}
    for point in getattr(spec, "suspend", {}).values():
        points[point.name] = Point(
            point.name,
            typed(point.suspend_schema, point.suspend_type),
            typed(point.resume_schema, point.resume_type),
            None if point.expires_after_ms is None else point.expires_after_ms / 1000,
        )
    output = None if spec.output_schema is None else typed(spec.output_schema, spec.output_type)
    declared = getattr(spec, "effects", None)
    effects = (
        None
        if declared is None
        else EffectSlots(
            (
                None
                if declared.context_schema is None
                else typed(declared.context_schema, declared.context_type)
            ),
            (
                None
                if declared.message_schema is None
                else typed(declared.message_schema, declared.message_type)
            ),
            frozenset(declared.permissions),
        )
    )
    return Registration(
        name=name,
        spec=spec,
        implementation=implementation,
        context=context,
        timeout_ms=timeout_ms,
        input=typed(spec.input_schema, spec.input_type),
        output=output,
        output_adapter=adapter(Any if spec.output_type is None else spec.output_type),
        data={c.name: typed(c.schema, c.type) for c in spec.data.values()},
        points=points,
        fenced=bool(getattr(spec, "lease", False)),
        effects=effects,
        **options,
    )


def typed(schema: JsonObject, annotation: Any) -> Typed:
    return Typed(schema, compiled(schema), adapter(annotation))


_VALIDATORS: dict[str, SchemaValidator] = {}
_BY_OBJECT: dict[int, tuple[Any, SchemaValidator]] = {}
_ADAPTERS: dict[int, tuple[Any, TypeAdapter[Any]]] = {}


def compiled(schema: JsonObject) -> SchemaValidator:
    """One compiled validator per distinct schema, shared by every registration that uses it.

    The same schema object (a spec's, or a store's cached one) is found without serializing it.
    """
    seen = _BY_OBJECT.get(id(schema))
    if seen is not None and seen[0] is schema:
        return seen[1]
    key = json.dumps(schema, sort_keys=True)
    validator = _VALIDATORS.get(key)
    if validator is None:
        validator = _VALIDATORS[key] = SchemaValidator(schema)
    _BY_OBJECT[id(schema)] = (schema, validator)  # the schema is kept: its id stays its own
    return validator


def adapter(annotation: Any) -> TypeAdapter[Any]:
    """One TypeAdapter per generated type (building one costs milliseconds)."""
    found = _ADAPTERS.get(id(annotation))
    if found is None or found[0] is not annotation:  # the annotation is kept: its id stays its
        found = _ADAPTERS[id(annotation)] = (annotation, TypeAdapter(annotation))
    return found[1]
