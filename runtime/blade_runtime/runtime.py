"""The public ``Runtime``: a small facade over the services that do the work.

Each service owns its state and is handed its collaborators here, once:

    Tools          the registrations, and which names may be called          (core.tools)
    Interceptors   hooks, observers, the permission policy, the guard        (core.interceptors)
    CallRunner     one call: admit -> run -> settle                          (core.calls)
    PendingActions submit, cancel, fail and expire pending actions           (core.pending)
    Recovery       claims, the recovery sweep and its loop                   (core.recovery)
    Records        calls, actions, ToolData and events as a principal sees them (core.records)
    EventHub       subscriptions to a run's events                           (core.events)
    FileAccess     the files tools save, in the store or a folder            (core.files)
    Triggers       tools' requests to continue a thread, and their delivery  (core.triggers)
    Leases         the heartbeat of this runtime's claims                    (core.leases)
    StoreAccess    the store, reached off the event loop                     (core.storage)

This module is the composition root: it alone picks the default store (``MemoryStore``).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, JsonValue

from blade_runtime.core import grants
from blade_runtime.core.behavior import Behavior
from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.calls import CallRunner
from blade_runtime.core.cancel_scope import GRACE_S
from blade_runtime.core.capabilities import Binding, services_of
from blade_runtime.core.content import Projected, ProjectionWithContext, project, takes_context
from blade_runtime.core.context import CallInfo
from blade_runtime.core.effects import Effect, Effects
from blade_runtime.core.events import WINDOW, EventHub, PendingAction, Subscription
from blade_runtime.core.execution import CallServices
from blade_runtime.core.export import ExportFormat, ToolExport
from blade_runtime.core.files import DEFAULT_MAX_FILE_BYTES, FileAccess, FileBackend
from blade_runtime.core.hooks import HookCallback, HookEvent, HookEventName
from blade_runtime.core.interceptors import Interceptors
from blade_runtime.core.jsonvalue import model_of
from blade_runtime.core.leases import Leases
from blade_runtime.core.observers import BOUNDARIES
from blade_runtime.core.outcomes import (
    DEFAULT_TIMEOUT_MS,
    HOST,
    ErrorMapper,
    FallbackCall,
    FallbackHandler,
    log,
)
from blade_runtime.core.pending import PendingActions
from blade_runtime.core.permissions import ADMISSION, STEP, PermissionRequest, Policy
from blade_runtime.core.records import Records
from blade_runtime.core.recovery import Recovery
from blade_runtime.core.registry import (
    TRUST_LEVELS,
    Child,
    ContextProvider,
    Describe,
    Registration,
    RegistrationError,
    Trust,
    asynchronous,
)
from blade_runtime.core.results import ErrorCode, ToolError, ToolResult
from blade_runtime.core.retention import Retention, prune_all, sweep
from blade_runtime.core.slots import Limits, LimitsError
from blade_runtime.core.sources import SourcePolicy
from blade_runtime.core.spec import BackendToolSpec, ClientToolSpec, Exposure, JsonObject
from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import (
    DEFAULT_LEASE_S,
    ActionRecord,
    GrantRecord,
    Pruned,
    Store,
)
from blade_runtime.core.tools import Tools, takes_children
from blade_runtime.core.triggers import TriggerHandler, Triggers

IdT = TypeVar("IdT", bound=str)
InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT")
ContextT = TypeVar("ContextT")
ExecutionT = TypeVar("ExecutionT")

__all__ = [
    "CloseReport",
    "FallbackCall",
    "PermissionRequest",
    "ProjectionUnavailable",
    "Registration",
    "RegistrationError",
    "Runtime",
]


class Runtime:
    """Registered tools, their calls and pending actions.

    ``store``: where calls, pending actions, ToolData and events live; the default MemoryStore
    keeps what waits, in this process (``blade_runtime.open_store(url)`` opens the others).
    Use a runtime from one event loop; like asyncio itself, it is not thread-safe (threads,
    processes and machines share a durable store instead: see ``recover``).
    """

    def __init__(
        self,
        *,
        store: Store | None = None,
        allowed: Collection[str] | None = None,
        disallowed: Collection[str] = (),
        timeout_ms: int | None = None,
        hook_timeout_ms: int = DEFAULT_TIMEOUT_MS,
        permission: Policy | None = None,
        error_mapper: ErrorMapper | None = None,
        fallback: FallbackHandler | None = None,
        cleanup_grace_s: float = GRACE_S,
        lease_s: float = DEFAULT_LEASE_S,
        host: str | None = None,
        capabilities: Mapping[str, Binding] | None = None,
        files: FileBackend | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        on_trigger: TriggerHandler | None = None,
        retention: Retention | None = None,
        large_result_bytes: int | None = None,
        sources: SourcePolicy | None = None,
        guidance: str | None = None,
    ) -> None:
        """``allowed``: when given, only these names may be called (empty: none);
        ``disallowed`` always wins. ``timeout_ms`` overrides every spec's own timeout.
        ``lease_s``: how long this runtime's claim on a running call holds without a heartbeat
        (another worker may take the call over after it; renewed every third of it).
        ``host``: this machine's name in the runtime's owner id (default: the host name).
        ``capabilities``: the bindings of the services tools declare (see
        ``blade_runtime.core.capabilities``); a tool whose capability is unbound is refused.
        ``permission``: the policy deciding each new call on its final input (allow, deny or
        ask: see ``blade_runtime.core.permissions``; ``permissions.by_kind()`` asks for every
        ``write`` and ``execute`` tool). ``files``: where ``ctx.files`` keeps files (default:
        the store; ``FolderFiles(path)`` for a folder), each at most ``max_file_bytes``.
        ``on_trigger``: called with each ``ctx.trigger`` of any worker sharing the store, once
        across them (see ``blade_runtime.core.triggers``; ``run_triggers`` polls for other
        processes' triggers). ``retention``: how long settled history is kept (see
        ``blade_runtime.core.retention``): ``run_recovery`` deletes the rest as it sweeps, and
        ``prune()`` on demand; without one, nothing is ever deleted. ``large_result_bytes``: above
        this many bytes, what the model reads of a success is saved as a file of the call and the
        model reads its head and a link (``blade_runtime.core.artifacts``); a registration may
        set its own; None: never. ``sources``: the sources and trust levels of the tools let in
        (``SourcePolicy``; the rest are left out of every tool list and their calls refused,
        TOOL_NOT_ALLOWED). ``guidance``: the application's own guidance for the model, sent
        before the guidance its tools' spec packages carry (see ``guidance``)."""
        checked_size(large_result_bytes, "Runtime(large_result_bytes=...)")
        if store is None:  # imported here: a generated package imports no database driver
            from blade_runtime.stores.memory import MemoryStore

            store = MemoryStore()
        self.store: Store = store
        self.owner = f"{host or HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_s = lease_s
        self.io = StoreAccess(self.store)
        self.tools = Tools(
            capabilities=capabilities or {},
            timeout_ms=timeout_ms,
            allowed=allowed,
            disallowed=disallowed,
            large_result_bytes=large_result_bytes,
            guidance=guidance,
        )
        self.tools.sources = sources
        self.interceptors = Interceptors(
            hook_timeout_s=hook_timeout_ms / 1000, permission=permission, error_mapper=error_mapper
        )
        self.events = EventHub(self.store, self.io)
        self.files = FileAccess(
            self.store if files is None else files,
            self.io if files is None else None,
            max_file_bytes,
            held=None if files is None else self.store.held,
        )
        self.records = Records(self.store, self.io, files=self.files)
        self.triggers = Triggers(
            io=self.io, publish=self.events.publish, owner=self.owner, handler=on_trigger
        )
        self.effects = Effects(self.io, self.events.publish, lambda: self.tools.by_name)
        self.leases = Leases(self.store, self.owner, lease_s)
        self.calls = CallRunner(
            io=self.io,
            tools=self.tools,
            interceptors=self.interceptors,
            events=self.events,
            leases=self.leases,
            owner=self.owner,
            lease_s=lease_s,
            fallback=fallback,
            cleanup_grace_s=cleanup_grace_s,
            services=CallServices(self.files, self.triggers, self.effects),
        )
        self.actions = PendingActions(
            io=self.io,
            runner=self.calls,
            tools=self.tools,
            interceptors=self.interceptors,
            records=self.records,
            events=self.events,
            owner=self.owner,
            lease_s=lease_s,
        )
        self.retention = retention
        self.recovery = Recovery(
            io=self.io,
            runner=self.calls,
            pending=self.actions,
            tools=self.tools,
            interceptors=self.interceptors,
            events=self.events,
            owner=self.owner,
            lease_s=lease_s,
        )
        self.recovery.retention = retention
        # The method below, as the runner's own bound method: what the class documents, without
        # a second Python call on the path of every call.
        self.call = self.calls.call  # type: ignore[method-assign]
        self._closed = False
        self._let_go: asyncio.Task[None] | None = None
        self.store.attach(self.owner)

    # -- calls -------------------------------------------------------------------------------

    def call(
        self,
        name: str,
        arguments: JsonObject | str | bytes,
        *,
        call_id: str | None = None,
        run_id: str = "default",
        context: CallContext | None = None,
    ) -> Coroutine[Any, Any, ToolResult[Any]]:
        """Call the tool registered as ``name`` with the model's arguments (a JSON object or
        its text); await it for the result. ``call_id``: the model's id for the call (else one
        is made); ``run_id``: the run it belongs to; ``context``: who the call is for (stored
        with the call and its actions). Never raises for an expected outcome: the result says
        what happened. (Each instance binds this name to the runner's own method.)"""
        return self.calls.call(name, arguments, call_id=call_id, run_id=run_id, context=context)

    # -- pending actions ---------------------------------------------------------------------

    async def submit(
        self,
        action_id: str,
        payload: JsonValue | BaseModel | str | bytes,
        *,
        principal: Principal | None = None,
    ) -> ToolResult[Any]:
        """Answer a pending action (validated against its resume schema) and resume its call
        here; ``principal``: only an action it may see."""
        return await self.actions.submit(action_id, payload, principal=principal)

    async def cancel(
        self, action_id: str, reason: str = "cancelled", *, principal: Principal | None = None
    ) -> ToolResult[Any]:
        """Cancel a pending action: its call settles CANCELLED with ``reason``."""
        return await self.actions.cancel(action_id, reason, principal=principal)

    async def fail(
        self, action_id: str, error: str | BaseException, *, principal: Principal | None = None
    ) -> ToolResult[Any]:
        """Fail a pending action (a client tool that failed): its call settles with ``error``."""
        return await self.actions.fail(action_id, error, principal=principal)

    async def expire(self, action: ActionRecord) -> str:
        """Expire ``action`` (past its deadline) as its spec says; what became of it."""
        return await self.actions.expire(action)

    def pending(
        self,
        *,
        run_id: str | None = None,
        name: str | None = None,
        principal: Principal | None = None,
    ) -> list[PendingAction[Any]]:
        """The pending actions (of a run, of a registration name), typed where this runtime
        knows the tool; ``principal``: only those it may see. It reads the store on the
        calling thread and blocks it: from a coroutine, ``await runtime.apending()``."""
        return self.actions.pending(run_id=run_id, name=name, principal=principal)

    async def apending(
        self,
        *,
        run_id: str | None = None,
        name: str | None = None,
        principal: Principal | None = None,
    ) -> list[PendingAction[Any]]:
        """``pending()`` for a coroutine: the store is read off the event loop."""
        return await self.actions.apending(run_id=run_id, name=name, principal=principal)

    async def grants(
        self, *, principal: Principal | None = None, tool: str | None = None
    ) -> list[GrantRecord]:
        """The standing grants ``principal`` may see (of a tool)."""
        return await self.records.grants(principal=principal, tool=tool)

    async def revoke_grant(
        self, grant_id: str, *, principal: Principal | None = None
    ) -> GrantRecord | None:
        """Revoke a standing grant; the revoked grant, or None if there is none it may see."""
        return await self.records.revoke_grant(grant_id, principal=principal)

    # -- recovery and triggers -----------------------------------------------------------------

    async def recover(self, *, replay: bool = True, limit: int = 100) -> list[ToolResult[Any]]:
        """One recovery sweep: claim what needs a runtime (answered actions, calls of dead
        workers, expired actions) and take it up here by its contract; the results.
        ``replay=False``: running pure and idempotent calls are not run again either."""
        return await self.recovery.recover(replay=replay, limit=limit)

    async def run_recovery(self, interval_s: float = 1.0) -> None:
        """Recover every ``interval_s`` until cancelled (and prune by ``retention``)."""
        await self.recovery.run_recovery(interval_s)

    async def deliver_triggers(self, limit: int = 100) -> int:
        """Deliver the triggers due now to ``on_trigger``; how many were delivered."""
        return await self.triggers.deliver(limit)

    async def run_triggers(self, interval_s: float = 0.5) -> None:
        """Deliver triggers every ``interval_s`` until cancelled."""
        await self.triggers.run(interval_s)

    # -- the registry, hooks and observers --------------------------------------------------

    def unregister(self, name: str) -> Registration[Any]:
        """Remove the registration ``name``; it is returned."""
        return self.tools.unregister(name)

    def registrations(self) -> Iterator[Registration[Any]]:
        """Every registration, in the order made."""
        return self.tools.registrations()

    def registration_of(self, spec_id: str) -> Registration[Any] | None:
        """The registration of ``spec_id`` (the first, if it has several names)."""
        return self.tools.registration_of(spec_id)

    @property
    def guidance(self) -> str | None:
        """The guidance for the model that goes with this runtime's tools (the seed's skills
        ``{guidance, tools}``): the application's own, then each spec package's that an allowed
        registration comes from, once each, in registration order; None when there is none.
        ``blade-runtime mcp`` sends it as the server's ``instructions``."""
        return self.tools.guidance_of(
            r for r in self.tools.registrations() if self.is_allowed(r.name)
        )

    def is_allowed(self, name: str) -> bool:
        """Whether ``allowed`` and ``disallowed`` let the name ``name`` be called."""
        return self.tools.is_allowed(name)

    def export(
        self,
        format: ExportFormat = "blade",
        *,
        context: CallContext | None = None,
        run_id: str = "default",
    ) -> ToolExport:
        """The tools a model may call now, for ``context`` and ``run_id``, in ``format``."""
        return self.tools.export(format, context=context, run_id=run_id)

    def on(
        self,
        event: HookEvent | HookEventName,
        callback: HookCallback,
        *,
        tools: Collection[str] | None = None,
    ) -> None:
        """Run ``callback`` on ``event`` (of the names in ``tools``, else of every tool)."""
        self.interceptors.on(event, callback, tools=tools)

    def observe(self, observer: object) -> None:
        """Add a lifecycle observer (its scheduled / execution_started / settled methods...;
        see ``blade_runtime.core.observers``), and a ``store_operation(name, seconds)`` method
        is told how long each of this runtime's store operations took."""
        timer = getattr(observer, "store_operation", None)
        if timer is not None:
            self.io.timers.append(timer)
            if not any(hasattr(observer, b) for b in BOUNDARIES):
                return  # a store timer alone
        self.interceptors.observe(observer)

    # -- registry --------------------------------------------------------------------------

    def register(
        self,
        spec: BackendToolSpec[IdT, InputT, OutputT, ContextT, ExecutionT],
        implementation: (
            Callable[[ExecutionT], Awaitable[OutputT]] | Callable[[ExecutionT], OutputT]
        ),
        *,
        name: str | None = None,
        context: ContextProvider[ContextT] | None = None,
        timeout_ms: int | None = None,
        project: (
            Callable[[OutputT], Projected | Awaitable[Projected]]
            | ProjectionWithContext[OutputT]
            | None
        ) = None,
        enabled: Callable[[CallInfo], bool] | None = None,
        describe: Describe | None = None,
        permission: Policy | None = None,
        capability_config: Mapping[str, JsonValue] | None = None,
        children: Collection[Child] = (),
        behavior: Callable[[InputT], Behavior] | None = None,
        large_result_bytes: int | None = None,
        source: str = "spec",
        trust: Trust = "workspace",
        concurrency: int | None = None,
        locks: Collection[str] | None = None,
        worker_concurrency: int | None = None,
        title: str | None = None,
        aliases: Collection[str] | None = None,
        group: str | None = None,
        exposure: Exposure | None = None,
    ) -> Registration[OutputT]:
        """Bind ``implementation`` to ``spec`` under ``name`` (default: the spec's name).

        ``project``: what the model reads of the typed output (a sentence, JSON or content
        blocks; the stored and typed output stay whole); it may be async, and may take the
        keywords ``input`` (the typed input) and ``call`` (the CallInfo). It runs again, alike,
        when a stored call is projected anew (``reproject``); errors and cancellations bypass
        it. ``enabled``: whether the tool is there
        for a call (``call.context``, ``call.run_id``), decided when the call starts, and for a
        parent's children once for the parent's length. ``describe``: the description the
        model reads for a caller's context (the manifest keeps the spec's). ``permission``: this
        registration's own policy, instead of the runtime's. ``capability_config``: per declared
        capability, the configuration its binding gets (validated against its configSchema).
        ``children``: the parent's own registrations of children its spec declares (``Child``:
        spec, implementation, context, enabled, permission, on_output), apart from any direct
        registration of the same spec; a declared child without one runs the runtime's. A
        ``describe`` that takes ``children=`` reads its enabled children's metadata.
        ``behavior``: the kind and side effect of one call, from its typed input, never wider
        than the spec's (see ``blade_runtime.core.behavior``): the policy sees them, the call's
        start stores them and recovery follows them. ``large_result_bytes``: above this many
        bytes, what the model reads of a success is saved as a file of the call and the model
        reads its head and a link (see ``blade_runtime.core.artifacts``; default: the
        runtime's). ``source`` and ``trust``: where the tool comes from (``spec``, ``dynamic``,
        ``mcp:<server>``) and how far it is trusted (``trusted``, ``workspace``, ``remote``):
        the source policy, the permission policy and observers read them. ``concurrency``: at
        most this many calls of this name run at once, in every worker of the store; ``locks``:
        JSON pointers into the final input (``"/path"``, or ``"file:/path"`` to name the
        resource) whose calls with equal values never run at once (see
        ``blade_runtime.core.slots``); each, when given, instead of the spec's.
        ``worker_concurrency``: at most this many at once in this runtime. ``title``,
        ``aliases``, ``group``, ``exposure``: the display name, more names the tool is called
        by (a call by one is a call of this registration; the store records the name called),
        its group, and where it is listed (``model``: everywhere; ``operator``: never offered
        to a model); each defaults to the spec's.

        One spec may be registered under several names. Refused here rather than at the first
        call: a taken or malformed name, a spec that needs server context without a ``context``
        provider, and a child tool that could suspend (nobody could answer it).
        """
        registered = spec.name if name is None else name
        where = f"registering {spec.id} as {registered!r}"
        if not isinstance(spec, BackendToolSpec):
            raise RegistrationError(
                f"{where}: a client executes {spec.id}; use register_client(spec)"
            )
        if spec.context_schema is not None and context is None:
            raise RegistrationError(
                f"{where}: the spec declares a contextSchema, so pass context= (a function of "
                "the CallInfo returning the context model)"
            )
        if not callable(implementation):
            raise RegistrationError(f"{where}: the implementation is not callable")
        if trust not in TRUST_LEVELS:
            raise RegistrationError(
                f"{where}: trust={trust!r} is no trust level; use {', '.join(TRUST_LEVELS)}"
            )
        runnable = asynchronous(implementation, where)
        checked_size(large_result_bytes, f"{where}: large_result_bytes")
        try:
            limits = Limits.of(
                spec.concurrency if concurrency is None else concurrency,
                spec.locks if locks is None else locks,
                worker_concurrency,
            )
        except LimitsError as error:
            raise RegistrationError(f"{where}: {error}") from None
        if behavior is not None and not callable(behavior):
            raise RegistrationError(
                f"{where}: behavior= is not callable (pass a function of the typed input "
                "returning a Behavior)"
            )
        self.tools.check_children(spec, where)
        bindings = self.tools.bindings(spec, where, capability_config or {})
        own = self.tools.own_children(spec, where, children)
        added = self.tools.add(
            spec,
            registered,
            runnable,
            context,
            timeout_ms,
            own_children=own,
            bindings=bindings,
            services=services_of(bindings) if bindings else None,
            project=project,
            project_context=project is not None and takes_context(project),
            enabled=enabled,
            describe=describe,
            describe_children=describe is not None and takes_children(describe),
            permission=permission,
            behavior=behavior,
            large_result_bytes=large_result_bytes,
            source=source,
            trust=trust,
            limits=limits,
            title=title,
            aliases=aliases,
            group=group,
            exposure=exposure,
        )
        self.tools.dynamic = (
            self.tools.dynamic
            or enabled is not None
            or any(child.enabled is not None for child in own.values())
        )
        return added

    def register_client(
        self,
        spec: ClientToolSpec[IdT, InputT, OutputT],
        *,
        name: str | None = None,
        timeout_ms: int | None = None,
        enabled: Callable[[CallInfo], bool] | None = None,
        describe: Describe | None = None,
        title: str | None = None,
        aliases: Collection[str] | None = None,
        group: str | None = None,
        exposure: Exposure | None = None,
    ) -> Registration[OutputT]:
        """Offer a client-executed tool: a call becomes a pending action whose submission
        (validated against the output schema) completes it. ``title``, ``aliases``, ``group``
        and ``exposure`` as for ``register``."""
        registered = spec.name if name is None else name
        if not isinstance(spec, ClientToolSpec):
            raise RegistrationError(
                f"registering {spec.id} as {registered!r}: the backend executes it; use register"
            )
        self.tools.check_children(spec, f"registering {spec.id} as {registered!r}")
        added = self.tools.add(
            spec,
            registered,
            None,
            None,
            timeout_ms,
            enabled=enabled,
            describe=describe,
            describe_children=describe is not None and takes_children(describe),
            title=title,
            aliases=aliases,
            group=group,
            exposure=exposure,
        )
        self.tools.dynamic = self.tools.dynamic or enabled is not None
        return added

    def replace(
        self,
        spec: BackendToolSpec[IdT, InputT, OutputT, ContextT, ExecutionT],
        implementation: (
            Callable[[ExecutionT], Awaitable[OutputT]] | Callable[[ExecutionT], OutputT]
        ),
        **options: Any,
    ) -> Registration[OutputT]:
        """Register ``spec`` in place of what its name is registered as now (atomically: a
        refused registration leaves the old one)."""
        name = options.get("name") or spec.name
        saved = self.tools.saved()
        if name in self.tools.by_name:
            self.unregister(name)
        try:
            return self.register(spec, implementation, **options)
        except BaseException:  # refused, or not even a registration (a misspelt option)
            self.tools.restore(saved)
            raise

    @property
    def capabilities(self) -> dict[str, Binding]:
        return self.tools.capabilities

    @property
    def sources(self) -> SourcePolicy | None:
        """The sources and trust levels of the tools let in (None: all; it may change)."""
        return self.tools.sources

    @sources.setter
    def sources(self, policy: SourcePolicy | None) -> None:
        self.tools.sources = policy

    @property
    def allowed(self) -> frozenset[str] | None:
        """When not None, only these names may be called (it may change at any time)."""
        return self.tools.allowed

    @allowed.setter
    def allowed(self, names: Collection[str] | None) -> None:
        self.tools.allowed = names

    @property
    def disallowed(self) -> frozenset[str]:
        """Names that may never be called; it wins over ``allowed`` (it may change too)."""
        return self.tools.disallowed

    @disallowed.setter
    def disallowed(self, names: Collection[str]) -> None:
        self.tools.disallowed = names

    async def grant(
        self, principal: Principal, tool: str, subject: str = "", *, step: bool | None = None
    ) -> GrantRecord:
        """A standing grant: ``principal`` always allows ``tool`` (a registration name, for the
        spec registered under it now) when the policy would ask a person: before a call runs
        (``subject`` "") or, with ``step`` (the default when a subject is given), a step it asks
        about with ``ctx.request_permission(..., subject=subject)``. The one already there is
        kept. ``RegistrationError`` when nothing is registered as ``tool``."""
        registration = self.tools.by_name.get(tool)
        if registration is None:
            raise RegistrationError(f"granting {tool!r}: no tool is registered under it")
        point = STEP if (bool(subject) if step is None else step) else ADMISSION
        made: GrantRecord = await self.io(
            self.store.add_grant,
            grants.new_grant(principal, tool, registration.spec.id, point, subject),
        )
        return made

    async def reproject(self, call_id: str) -> JsonValue:
        """What the model would read of the stored call ``call_id`` with its registration's
        projection as it is now (the stored output is whole). KeyError if not stored;
        ``ProjectionUnavailable`` when the call was projected and no registration of its spec
        projects it now (unregistered, or replaced by another spec or one without a projection)
        or the projection fails: what the projection hid is never handed out instead."""
        record = await self.records.call(call_id)
        if record is None or not isinstance(record.result, dict):
            raise KeyError(f"no settled call {call_id!r} in the store")
        result = record.result
        if result.get("status") != "success":
            return result  # errors bypass projections
        registration = self.tools.by_name.get(record.name)
        if registration is not None and registration.spec.id != record.spec_id:
            registration = None
        if "output" not in result:  # not projected when it settled: the content is the output
            if registration is None or registration.project is None:
                return result.get("content")
            result = {**result, "output": result.get("content")}  # projected as it is now
        if registration is None:
            raise ProjectionUnavailable(
                f"call {call_id}: no registration of {record.spec_id} as {record.name!r} now, "
                "so nothing can project its stored output"
            )
        if registration.project is None:
            raise ProjectionUnavailable(
                f"call {call_id}: {record.name!r} has no projection now; its stored output "
                "was projected when the call settled"
            )
        try:
            typed = model_of(registration.output_adapter.validate_python, result["output"])
            call = CallInfo(
                record.call_id,
                record.run_id,
                record.name,
                record.spec_id,
                CallContext.from_json(record.context),
            )
            stored_input = record.input
            return await project(
                registration,
                typed,
                lambda: model_of(registration.build_input, stored_input),
                call,
            )
        except Exception as error:
            raise ProjectionUnavailable(
                f"call {call_id}: the projection of {record.name!r} failed: "
                f"{type(error).__name__}"
            ) from error

    async def prune(self, retention: Retention | None = None, *, dry_run: bool = False) -> Pruned:
        """Delete the settled history ``retention`` (default: the runtime's) lets go, with
        everything of each call (actions, ToolData, events, files, triggers), in batches off the
        event loop; never a running, resumable or waiting call. ``dry_run``: count only."""
        policy = retention or self.retention
        if policy is None:
            raise ValueError("prune() needs a Retention: pass one, or Runtime(retention=...)")
        if dry_run:  # the operators' count, off the loop
            counted: Pruned = await self.io.thread(
                prune_all, self.store, policy.older_than_s, policy.keep, dry_run=True
            )
            return counted
        return await sweep(self.io, policy)

    def subscribe(
        self,
        run_id: str,
        *,
        after: int | None = None,
        principal: Principal | None = None,
        window: int = WINDOW,
    ) -> Subscription:
        """The run's tool events from now on (or after the sequence number ``after``, on a
        durable store): started, data, suspended, pending, resumed, claimed, result; those
        other processes commit too, on a durable store. ``principal``: only those of calls it
        may see. At most ``window`` events wait for a reader that does not keep up (see
        ``Subscription``). Without ``after``, a durable store's last event is read here, on the
        caller's thread: from a coroutine, pass ``after=await runtime.records.head(run_id)``."""
        return self.events.subscribe(run_id, after, principal=principal, window=window)

    async def run_context(
        self, run_id: str, *, principal: Principal | None = None
    ) -> dict[str, JsonValue]:
        """The context of ``run_id`` for the calls made for ``principal`` (None: for nobody):
        the context patches its tools emitted (``ctx.effects.patch_context``), merged in the
        order they were recorded; what the run's later calls read with ``ctx.run_context()``."""
        tenant, owner = ("", "") if principal is None else (principal.tenant, principal.id)
        return await self.effects.run_context(run_id, tenant, owner)

    async def run_effects(
        self, run_id: str, *, principal: Principal | None = None
    ) -> tuple[Effect, ...]:
        """Every effect the calls of ``run_id`` made for ``principal`` emitted, in order."""
        tenant, owner = ("", "") if principal is None else (principal.tenant, principal.id)
        return await self.effects.listed(run_id, tenant, owner)

    # -- cancellation ----------------------------------------------------------------------

    def cancel_call(self, call_id: str, reason: str = "the call was cancelled") -> bool:
        """Cancel one running call; it settles as CANCELLED. False if it is not running."""
        scope = self.calls.running.get(call_id)
        return scope is not None and scope.cancel("cancelled", reason)

    async def cancel_run(self, run_id: str, reason: str = "the run was cancelled") -> int:
        """Cancel every running call of ``run_id`` and every pending action it waits on;
        returns how many were cancelled."""
        running = self.calls.running
        calls = [call for call, scope in running.items() if scope.call.run_id == run_id]
        cancelled = sum(self.cancel_call(call, reason) for call in calls)
        waiting: list[ActionRecord] = await self.io(self.store.actions, run_id=run_id)
        for action in waiting:
            settled = await self.actions.settle_action(action, cancelled=True, reason=reason)
            cancelled += isinstance(settled, ToolError) and settled.code == ErrorCode.CANCELLED
        return cancelled

    async def close(self, timeout_s: float = 5.0) -> CloseReport:
        """Refuse new calls, cancel the running ones and wait up to ``timeout_s`` for them to
        end; then stop recovery, triggers and the heartbeat, and tell the store this runtime is
        gone. The store stays open (its owner closes it).

        It fails closed: an implementation still running at the timeout (it ignores its
        cancellation) keeps its call's lease, renewed, until it ends (then the call settles
        CANCELLED here), or until this process exits and the lease expires: no other worker
        takes up a call while its implementation may still act. The report names every call
        still running and every hook or permission callback still running past its budget;
        ``wait_closed()`` waits for the rest (before the store is closed)."""
        if self._closed:
            return CloseReport((), 0)
        self.tools.closing = self.tools.restricted = True
        running = self.calls.running
        for scope in list(running.values()):
            scope.cancel("cancelled", "the runtime is closing")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (running or self._abandoned()) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        held = tuple(sorted(running))
        abandoned = tuple(sorted({*held, *self._abandoned()}))
        stuck = tuple(sorted(self.interceptors.guard.stuck_events()))
        self._closed = True
        await self.recovery.end(release=not held)
        await self.triggers.close()
        self._let_go = loop.create_task(self._release_when_ended(held))
        if not held:
            await self._let_go
        report = CloseReport(abandoned, len(self.interceptors.guard.stuck()), stuck, held)
        if not report.clean:
            log.error(
                "closing: %d call(s) still running (%s)%s, callbacks past their budget: %s",
                len(abandoned),
                ", ".join(abandoned),
                "; their leases are kept until they end" if held else "",
                ", ".join(stuck) or "none",
            )
        return report

    async def wait_closed(self) -> None:
        """After ``close()``: return when every call it left running has ended and its lease is
        let go (at once if none was left)."""
        if self._let_go is not None:
            await asyncio.shield(self._let_go)

    def _abandoned(self) -> set[str]:
        """Calls whose implementation ignored cancellation past its grace and still runs
        detached (their calls are settled: no lease is held for them)."""
        return {
            task.get_name()
            for registration in self.tools.registrations()
            for task in registration.detached
            if not task.done()
        }

    async def _release_when_ended(self, held: tuple[str, ...]) -> None:
        # Each one's end is recorded as it comes (its lease let go once that is written).
        while self.calls.running or self.leases.holds(held):
            await asyncio.sleep(0.05)
        self.calls.stop_recording()
        self.leases.close()
        self.calls.slots.close()
        await self.io(self.store.renew, self.owner, 0.0)
        await self.io(self.store.detach, self.owner)
        self.io.close()


class ProjectionUnavailable(LookupError):
    """``reproject`` cannot say what the model reads of a stored output now."""


@dataclass(frozen=True, slots=True)
class CloseReport:
    """What ``Runtime.close`` could not wait for."""

    abandoned: tuple[str, ...]
    """Ids of calls whose implementation still runs (it ignored cancellation)."""
    stuck_callbacks: int
    """Hook and permission callbacks still running past their budget."""
    stuck_events: tuple[str, ...] = ()
    """The events (``pre_tool_use``, ``permission``...) of those callbacks."""
    leases_kept: tuple[str, ...] = ()
    """Of ``abandoned``, the calls whose lease this runtime keeps renewing until their
    implementation ends (``wait_closed``), so that no other worker runs them meanwhile."""

    @property
    def clean(self) -> bool:
        """Whether everything ended within the timeout."""
        return not self.abandoned and not self.stuck_callbacks


def checked_size(value: int | None, where: str) -> None:
    """A size in bytes given to the runtime: a positive integer, or None."""
    if value is not None and (type(value) is not int or value <= 0):
        raise ValueError(f"{where} is a number of bytes above 0, not {value!r}")
