"""The runtime: the public ``Runtime``, a registry of implementations over the layers below.

See ``blade_runtime.core.shared`` for the layers: the call pipeline (``pipeline``), pending actions
(``pending``) and recovery (``recovery``, with leases in ``leases``); this module adds the
registry, hooks, exports, subscriptions, cancellation and ``close``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, JsonValue

from blade_runtime.core.caller import CallContext
from blade_runtime.core.cancel_scope import GRACE_S
from blade_runtime.core.capabilities import Binding, services_of
from blade_runtime.core.content import Projected, projected
from blade_runtime.core.context import CallInfo
from blade_runtime.core.events import Subscription
from blade_runtime.core.export import ExportFormat, ToolExport, export_tools
from blade_runtime.core.hooks import Hook, HookCallback, HookEvent, HookEventName
from blade_runtime.core.jsonvalue import model_of
from blade_runtime.core.permissions import PermissionRequest, Policy
from blade_runtime.core.recovery import Recovery
from blade_runtime.core.registry import (
    NAME,
    ContextProvider,
    Registration,
    RegistrationError,
    compiled,
    registration,
)
from blade_runtime.core.results import ErrorCode, ToolError
from blade_runtime.core.shared import (
    DEFAULT_TIMEOUT_MS,
    ErrorMapper,
    FallbackCall,
    FallbackHandler,
    log,
)
from blade_runtime.core.spec import BackendToolSpec, CapabilitySpec, ClientToolSpec
from blade_runtime.core.store import DEFAULT_LEASE_S, Store
from blade_runtime.core.validation import describe
from blade_runtime.stores.memory import MemoryStore

IdT = TypeVar("IdT", bound=str)
InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT")
ContextT = TypeVar("ContextT")
ExecutionT = TypeVar("ExecutionT")

__all__ = [
    "CloseReport",
    "FallbackCall",
    "PermissionRequest",
    "Registration",
    "RegistrationError",
    "Runtime",
]


class Runtime(Recovery):
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
        ``write`` and ``execute`` tool)."""
        self._init_core(MemoryStore() if store is None else store, lease_s, host)
        self._allowed: frozenset[str] | None = None
        self._disallowed: frozenset[str] = frozenset()
        self.allowed = allowed
        self.disallowed = disallowed
        self.timeout_ms = timeout_ms
        self.hook_timeout_s = hook_timeout_ms / 1000
        self.permission = permission
        self.error_mapper = error_mapper
        self.fallback = fallback
        self.cleanup_grace_s = cleanup_grace_s
        self._closed = False
        self.capabilities: dict[str, Binding] = dict(capabilities or {})
        self.store.attach(self.owner)
        self._live()

    # -- registry --------------------------------------------------------------------------

    def register(
        self,
        spec: BackendToolSpec[IdT, InputT, OutputT, ContextT, ExecutionT],
        implementation: Callable[[ExecutionT], Awaitable[OutputT]],
        *,
        name: str | None = None,
        context: ContextProvider[ContextT] | None = None,
        timeout_ms: int | None = None,
        project: Callable[[OutputT], Projected] | None = None,
        enabled: Callable[[CallInfo], bool] | None = None,
        describe: Callable[[CallContext | None], str] | None = None,
        permission: Policy | None = None,
        capability_config: Mapping[str, JsonValue] | None = None,
    ) -> Registration[OutputT]:
        """Bind ``implementation`` to ``spec`` under ``name`` (default: the spec's name).

        ``project``: what the model reads of the typed output (a sentence, JSON or content
        blocks; the stored and typed output stay whole). ``enabled``: whether the tool is there
        for a call (``call.context``, ``call.run_id``), decided when the call starts, and for a
        parent's children once for the parent's length. ``describe``: the description the
        model reads for a caller's context (the manifest keeps the spec's). ``permission``: this
        registration's own policy, instead of the runtime's. ``capability_config``: per declared
        capability, the configuration its binding gets (validated against its configSchema).

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
        self._check_children(spec, where)
        bindings = self._bindings(spec, where, capability_config or {})
        added = self._add(spec, registered, implementation, context, timeout_ms)
        added.bindings = bindings
        added.services = services_of(bindings) if bindings else None
        added.project = project
        added.enabled = enabled
        added.describe = describe
        added.permission = permission
        self._dynamic = self._dynamic or enabled is not None
        return added

    def register_client(
        self,
        spec: ClientToolSpec[IdT, InputT, OutputT],
        *,
        name: str | None = None,
        timeout_ms: int | None = None,
        enabled: Callable[[CallInfo], bool] | None = None,
        describe: Callable[[CallContext | None], str] | None = None,
    ) -> Registration[OutputT]:
        """Offer a client-executed tool: a call becomes a pending action whose submission
        (validated against the output schema) completes it."""
        registered = spec.name if name is None else name
        if not isinstance(spec, ClientToolSpec):
            raise RegistrationError(
                f"registering {spec.id} as {registered!r}: the backend executes it; use register"
            )
        self._check_children(spec, f"registering {spec.id} as {registered!r}")
        added = self._add(spec, registered, None, None, timeout_ms)
        added.enabled = enabled
        added.describe = describe
        self._dynamic = self._dynamic or enabled is not None
        return added

    def unregister(self, name: str) -> Registration[Any]:
        """Remove the registration ``name``: new calls find no tool; calls of it that wait
        stay in the store, readable, and any runtime that has the tool can resolve them."""
        removed = self._registrations.pop(name, None)
        if removed is None:
            raise RegistrationError(f"unregistering {name!r}: no tool is registered under it")
        if self._by_spec.get(removed.spec.id) is removed:
            del self._by_spec[removed.spec.id]
            for other in self._registrations.values():  # the next one of that id, if any
                self._by_spec.setdefault(other.spec.id, other)
        self._answer_schemas.pop(removed.spec.id, None)
        return removed

    def replace(
        self,
        spec: BackendToolSpec[IdT, InputT, OutputT, ContextT, ExecutionT],
        implementation: Callable[[ExecutionT], Awaitable[OutputT]],
        **options: Any,
    ) -> Registration[OutputT]:
        """Register ``spec`` in place of what its name is registered as now (atomically: a
        refused registration leaves the old one)."""
        name = options.get("name") or spec.name
        old = self._registrations.get(name)
        if old is not None:
            self.unregister(name)
        try:
            return self.register(spec, implementation, **options)
        except RegistrationError:
            if old is not None:
                self._registrations[name] = old
                self._by_spec.setdefault(old.spec.id, old)
            raise

    def _bindings(
        self, spec: Any, where: str, config: Mapping[str, JsonValue]
    ) -> dict[str, tuple[Binding, JsonValue]]:
        """The binding and configuration of every capability ``spec`` declares, or why not."""
        declared: Mapping[str, CapabilitySpec] = getattr(spec, "capabilities", {})
        missing = sorted(set(declared) - set(self.capabilities))
        if missing:
            raise RegistrationError(
                f"{where}: this runtime has no binding of its capabilities {', '.join(missing)}; "
                "pass Runtime(capabilities={name: binding})"
            )
        unknown = sorted(set(config) - set(declared))
        if unknown:
            raise RegistrationError(
                f"{where}: capability_config names {', '.join(unknown)}, which the spec does not "
                f"declare (it declares: {', '.join(sorted(declared)) or 'none'})"
            )
        chosen = {}
        for name, capability in declared.items():
            value = config.get(name)
            validator = compiled(capability.config_schema)  # type: ignore[arg-type]
            if not validator.is_valid(value):
                problems = describe(validator.violations(value))
                raise RegistrationError(
                    f"{where}: capability_config[{name!r}] does not match the capability's "
                    f"configSchema: {problems}"
                )
            chosen[name] = (self.capabilities[name], value)
        return chosen

    def _check_children(self, spec: Any, where: str) -> None:
        """A child tool must never leave a pending action: refuse a parent whose child could
        suspend (or runs on a client), and such a tool when a registered parent lists it."""
        for child_id in getattr(spec, "children", ()):
            child = self._by_spec.get(child_id)
            if child is not None and (child.points or child.implementation is None):
                raise RegistrationError(
                    f"{where}: its child {child_id} could suspend (or runs on a client), so "
                    "its pending action could never be answered; make the child a tool that "
                    "does not wait"
                )
        if getattr(spec, "suspend", None) or not isinstance(spec, BackendToolSpec):
            for parent in self._registrations.values():
                if spec.id in parent.children:
                    raise RegistrationError(
                        f"{where}: {parent.spec.id} calls it as a child tool, and a child "
                        "cannot wait on a pending action"
                    )

    def _add(
        self,
        spec: Any,
        name: str,
        implementation: Callable[[Any], Awaitable[Any]] | None,
        context: ContextProvider[Any] | None,
        timeout_ms: int | None,
    ) -> Registration[Any]:
        where = f"registering {spec.id} as {name!r}"
        if name in self._registrations:
            other = self._registrations[name].spec.id
            raise RegistrationError(
                f"{where}: the name is already registered for {other}; pass name= to register "
                "it under another name"
            )
        if not NAME.fullmatch(name):
            raise RegistrationError(f"{where}: a name must match {NAME.pattern}")
        limit = timeout_ms or self.timeout_ms or spec.timeout_ms or DEFAULT_TIMEOUT_MS
        added = registration(spec, name, implementation, context, limit)
        self._registrations[name] = added
        self._by_spec.setdefault(spec.id, added)
        return added

    def registrations(self) -> Iterator[Registration[Any]]:
        return iter(self._registrations.values())

    def registration_of(self, spec_id: str) -> Registration[Any] | None:
        """The first registration of the spec ``spec_id`` (typed clients and child calls find
        tools by id, whatever name they were registered under)."""
        return self._by_spec.get(spec_id)

    def on(
        self,
        event: HookEvent | HookEventName,
        callback: HookCallback,
        *,
        tools: Collection[str] | None = None,
    ) -> None:
        """Add a hook for ``event`` (optionally only for some names); hooks run in this order."""
        self._hooks[HookEvent(event)].append(
            Hook(HookEvent(event), callback, None if tools is None else frozenset(tools))
        )
        self._pre_any = bool(self._hooks[HookEvent.PRE_TOOL_USE])
        self._post_any = bool(
            self._hooks[HookEvent.POST_TOOL_USE] or self._hooks[HookEvent.POST_TOOL_USE_FAILURE]
        )
        self._permission_hooked = bool(self._hooks[HookEvent.PERMISSION_REQUEST])

    def export(
        self,
        format: ExportFormat = "blade",
        *,
        context: CallContext | None = None,
        run_id: str = "default",
    ) -> ToolExport:
        """The callable tools (registered, allowed and enabled) as a model-facing tool list.

        ``context``: the tool list for that caller's run step: ``enabled`` callbacks decide
        which tools are there, and ``describe`` callbacks what their descriptions say."""
        chosen = []
        for entry in self._registrations.values():
            if not self.is_allowed(entry.name):
                continue
            enabled = entry.enabled  # given a CallInfo of its own: it may keep it
            if enabled is not None and not enabled(
                CallInfo("", run_id, entry.name, entry.spec.id, context)
            ):
                continue
            chosen.append(entry.exported(context))
        return export_tools(chosen, format)

    @property
    def allowed(self) -> frozenset[str] | None:
        """When not None, only these names may be called (it may change at any time)."""
        return self._allowed

    @allowed.setter
    def allowed(self, names: Collection[str] | None) -> None:
        self._allowed = None if names is None else frozenset(names)
        self._restricted = self._closing or self._allowed is not None or bool(self._disallowed)

    @property
    def disallowed(self) -> frozenset[str]:
        """Names that may never be called; it wins over ``allowed`` (it may change too)."""
        return self._disallowed

    @disallowed.setter
    def disallowed(self, names: Collection[str]) -> None:
        self._disallowed = frozenset(names)
        self._restricted = self._closing or self._allowed is not None or bool(self._disallowed)

    def reproject(self, call_id: str) -> JsonValue:
        """What the model would read of the stored call ``call_id`` with its registration's
        projection as it is now (the stored output is whole); KeyError if not stored."""
        record = self.store.call(call_id)
        if record is None or not isinstance(record.result, dict):
            raise KeyError(f"no settled call {call_id!r} in the store")
        result = record.result
        if result.get("status") != "success":
            return result  # errors bypass projections
        output = result.get("output", result.get("content"))
        registration = self._registrations.get(record.name)
        if registration is None or registration.project is None:
            return output
        typed = model_of(registration.output_adapter.validate_python, output)
        return projected(registration.project(typed))[0]

    def subscribe(self, run_id: str, *, after: int | None = None) -> Subscription:
        """The run's tool events from now on (or after the sequence number ``after``, on a
        durable store): started, data, suspended, pending, resumed, claimed, result; those
        other processes commit too, on a durable store."""
        return self._events.subscribe(run_id, after)

    # -- cancellation ----------------------------------------------------------------------

    def cancel_call(self, call_id: str, reason: str = "the call was cancelled") -> bool:
        """Cancel one running call; it settles as CANCELLED. False if it is not running."""
        scope = self._running.get(call_id)
        return scope is not None and scope.cancel("cancelled", reason)

    def cancel_run(self, run_id: str, reason: str = "the run was cancelled") -> int:
        """Cancel every running call of ``run_id`` and every pending action it waits on;
        returns how many were cancelled."""
        calls = [call for call, scope in self._running.items() if scope.call.run_id == run_id]
        cancelled = sum(self.cancel_call(call, reason) for call in calls)
        for action in self.store.actions(run_id=run_id):
            settled = self._settle_action(action, cancelled=True, reason=reason)
            cancelled += isinstance(settled, ToolError) and settled.code == ErrorCode.CANCELLED
        return cancelled

    def observe(self, observer: object) -> None:
        """Add a durable lifecycle observer (see ``blade_runtime.core.observers``): its methods run,
        in order of registration, at each boundary of every call and complete before it."""
        self._observers.add(observer)

    async def close(self, timeout_s: float = 5.0) -> CloseReport:
        """Refuse new calls, cancel the running ones and wait up to ``timeout_s`` for their
        cleanup; then stop the heartbeat and tell the store this runtime is gone (its calls
        become claimable at once). Returns what it abandoned: calls still running, and hook or
        permission callbacks still running past their budget. The store stays open (its owner
        closes it)."""
        if self._closed:
            return CloseReport((), 0)
        self._closing = self._restricted = True
        for scope in list(self._running.values()):
            scope.cancel("cancelled", "the runtime is closing")
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._running and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        abandoned = tuple(sorted(self._running))
        stuck = len(self._guard.stuck())
        self._closed = True
        self._leases.close()
        self._gone()
        self.store.detach(self.owner)
        if abandoned or stuck:
            log.error(
                "closing: %d call(s) still running (%s), %d callback(s) past their budget",
                len(abandoned),
                ", ".join(abandoned),
                stuck,
            )
        return CloseReport(abandoned, stuck)


@dataclass(frozen=True, slots=True)
class CloseReport:
    """What ``Runtime.close`` could not wait for."""

    abandoned: tuple[str, ...]
    """Ids of calls still running (they ignored cancellation past the timeout)."""
    stuck_callbacks: int
    """Hook and permission callbacks still running past their budget."""
