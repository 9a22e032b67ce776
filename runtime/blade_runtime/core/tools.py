"""The tools a runtime offers: its registrations, by name and by spec id, and which may be called.

Registering checks what can be checked before the first call (a taken or malformed name, a spec
that needs server context without a provider, a child tool that could suspend, unbound
capabilities), so that a call never finds a registration it cannot run.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, JsonValue

from blade_runtime.core.caller import CallContext
from blade_runtime.core.capabilities import Binding, services_of
from blade_runtime.core.context import CallInfo
from blade_runtime.core.export import (
    ExportedTool,
    ExportFormat,
    ToolExport,
    export_tools,
    joined_guidance,
)
from blade_runtime.core.outcomes import DEFAULT_TIMEOUT_MS, log
from blade_runtime.core.registry import (
    NAME,
    Child,
    ContextProvider,
    Registration,
    RegistrationError,
    asynchronous,
    compiled,
    registration,
)
from blade_runtime.core.sources import SourcePolicy
from blade_runtime.core.spec import EXPOSURES, BackendToolSpec, CapabilitySpec, JsonObject

IdT = TypeVar("IdT", bound=str)
InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT")
ContextT = TypeVar("ContextT")
ExecutionT = TypeVar("ExecutionT")


def enabled_for(registration: Registration[Any], call: CallInfo, *, strict: bool = False) -> bool:
    """Whether the registration's ``enabled`` callback puts it there for ``call``; one that
    raises leaves it out (fails closed), in the log, or with ``strict`` is
    ``ChildEnabledFailed``."""
    assert registration.enabled is not None
    try:
        return bool(registration.enabled(call))
    except Exception as error:
        if strict:
            raise ChildEnabledFailed(registration.name, error) from error
        log.exception("%s: its enabled callback raised; the tool is left out", registration.name)
        return False


class ChildEnabledFailed(Exception):
    """A child's ``enabled`` callback raised when its parent started: the parent does not run
    (PAI: a resolution failure prevents the parent from starting)."""

    def __init__(self, child: str, error: BaseException) -> None:
        super().__init__(f"the enabled callback of the child tool {child!r} raised: {error!r}")
        self.child = child
        self.error = error


def takes_children(describe: Callable[..., str]) -> bool:
    """Whether a ``describe`` callback takes the ``children=`` keyword."""
    try:
        parameters = inspect.signature(describe).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return "children" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


class Tools:
    """The registrations, the allowed and disallowed names, and what is derived from them."""

    def __init__(
        self,
        *,
        capabilities: Mapping[str, Binding],
        timeout_ms: int | None,
        allowed: Collection[str] | None,
        disallowed: Collection[str],
        large_result_bytes: int | None = None,
        guidance: str | None = None,
    ) -> None:
        self.capabilities: dict[str, Binding] = dict(capabilities)
        self.guidance = guidance  # the application's own, before its packages' guidance
        self.timeout_ms = timeout_ms
        self.large_result_bytes = large_result_bytes
        self.offloading = False  # some registration may save what the model reads as a file
        self.by_name: dict[str, Registration[Any]] = {}
        self.by_spec: dict[str, Registration[Any]] = {}  # the first registration of each id
        self.answer_schemas: dict[str, JsonObject] = {}  # permission answers, per spec id
        self.dynamic = False  # some registration has an ``enabled`` callback
        self.generation = 0
        """Moves on with every registration added or removed: what a surface derives from the
        registrations (a tool listing, an OpenAPI document) is current while it stays."""
        self.closing = False  # the runtime refuses new calls
        self._allowed: frozenset[str] | None = None
        self._disallowed: frozenset[str] = frozenset()
        self.restricted = False  # any name may be refused: check ``is_allowed``
        self._sources: SourcePolicy | None = None
        self.allowed = allowed
        self.disallowed = disallowed

    def saved(self) -> tuple[dict[str, Any], ...]:
        """The registrations as they are, for ``restore``."""
        return dict(self.by_name), dict(self.by_spec), dict(self.answer_schemas)

    def restore(self, saved: tuple[dict[str, Any], ...]) -> None:
        """The registrations as ``saved`` had them (a refused replacement leaves the old one)."""
        self.by_name, self.by_spec, self.answer_schemas = saved
        self.generation += 1

    def caller_dependent(self) -> bool:
        """Whether what a listing shows depends on who asks (an ``enabled`` or ``describe``
        callback): such a listing is made for each caller and never kept."""
        return any(r.enabled is not None or r.describe is not None for r in self.by_name.values())

    def unregister(self, name: str) -> Registration[Any]:
        """Remove the registration ``name``: new calls find no tool; calls of it that wait
        stay in the store, readable, and any runtime that has the tool can resolve them."""
        found = self.by_name.get(name)
        if found is not None and found.name != name:
            raise RegistrationError(
                f"unregistering {name!r}: it is an alias of {found.name!r}; unregister that"
            )
        removed = self.by_name.pop(name, None)
        if removed is None:
            raise RegistrationError(f"unregistering {name!r}: no tool is registered under it")
        for alias in removed.aliases:
            self.by_name.pop(alias, None)
        self.generation += 1
        if self.by_spec.get(removed.spec.id) is removed:
            del self.by_spec[removed.spec.id]
            for other in self.by_name.values():  # the next one of that id, if any
                self.by_spec.setdefault(other.spec.id, other)
        self.answer_schemas.pop(removed.spec.id, None)
        return removed

    def bindings(
        self, spec: Any, where: str, config: Mapping[str, JsonValue]
    ) -> dict[str, tuple[Binding, JsonValue]]:
        """The binding and configuration of every capability ``spec`` declares, or why not."""
        declared: Mapping[str, CapabilitySpec] = getattr(spec, "capabilities", {})
        missing = sorted({c.key for c in declared.values()} - set(self.capabilities))
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
                problems = validator.explain(value)
                raise RegistrationError(
                    f"{where}: capability_config[{name!r}] does not match the capability's "
                    f"configSchema: {problems}"
                )
            chosen[name] = (self.capabilities[capability.key], value)
        return chosen

    def check_children(self, spec: Any, where: str) -> None:
        """A child tool must never leave a pending action: refuse a parent whose child could
        suspend (or runs on a client), and such a tool when a registered parent lists it."""
        for child_id in getattr(spec, "children", ()):
            child = self.by_spec.get(child_id)
            if child is not None and (child.points or child.implementation is None):
                raise RegistrationError(
                    f"{where}: its child {child_id} could suspend (or runs on a client), so "
                    "its pending action could never be answered; make the child a tool that "
                    "does not wait"
                )
        if getattr(spec, "suspend", None) or not isinstance(spec, BackendToolSpec):
            for parent in self.by_name.values():
                if spec.id in parent.children:
                    raise RegistrationError(
                        f"{where}: {parent.spec.id} calls it as a child tool, and a child "
                        "cannot wait on a pending action"
                    )

    def own_children(
        self, spec: Any, where: str, children: Collection[Child]
    ) -> dict[str, Registration[Any]]:
        """A parent's own registrations of its declared children, compiled, or why not."""
        own: dict[str, Registration[Any]] = {}
        declared = getattr(spec, "children", ())
        for index, child in enumerate(children):
            if not isinstance(child, Child):
                raise RegistrationError(
                    f"{where}: children[{index}]: pass a Child(spec, implementation, ...)"
                )
            child_spec = child.spec
            at = f"{where}: the child {getattr(child_spec, 'id', child_spec)!r}"
            if not isinstance(child_spec, BackendToolSpec):
                raise RegistrationError(f"{at}: a child tool must be a backend tool spec")
            if child_spec.id not in declared:
                raise RegistrationError(
                    f"{at}: the spec does not declare it as a child (children: "
                    f"{', '.join(declared) or 'none'}); add it to the spec's children"
                )
            if child_spec.suspend:
                raise RegistrationError(
                    f"{at}: it could suspend, and a child cannot wait on a pending action"
                )
            if child_spec.context_schema is not None and child.context is None:
                raise RegistrationError(
                    f"{at}: the child declares a contextSchema, so pass Child(context=...)"
                )
            if not callable(child.implementation):
                raise RegistrationError(f"{at}: the implementation is not callable")
            if child_spec.id in own:
                raise RegistrationError(f"{at}: registered twice; pass one Child per spec")
            limit = child.timeout_ms or self.timeout_ms or child_spec.timeout_ms
            bindings = self.bindings(child_spec, at, child.capability_config or {})
            compiled_child = registration(
                child_spec,
                child_spec.name,
                asynchronous(child.implementation, at),
                child.context,
                limit or DEFAULT_TIMEOUT_MS,
                bindings=bindings,
                services=services_of(bindings) if bindings else None,
                enabled=child.enabled,
                permission=child.permission,
                on_output=child.on_output,
            )
            own[child_spec.id] = compiled_child
        return own

    def add(
        self,
        spec: Any,
        name: str,
        implementation: Callable[[Any], Awaitable[Any]] | None,
        context: ContextProvider[Any] | None,
        timeout_ms: int | None,
        **options: Any,
    ) -> Registration[Any]:
        """Register ``spec`` as ``name``, whole (``options``: the registration's other fields)."""
        where = f"registering {spec.id} as {name!r}"
        if name in self.by_name:
            other = self.by_name[name].spec.id
            raise RegistrationError(
                f"{where}: the name is already registered for {other}; pass name= to register "
                "it under another name"
            )
        if not NAME.fullmatch(name):
            raise RegistrationError(f"{where}: a name must match {NAME.pattern}")
        limit = timeout_ms or self.timeout_ms or spec.timeout_ms or DEFAULT_TIMEOUT_MS
        large = options.get("large_result_bytes") or self.large_result_bytes
        options["large_result_bytes"] = large
        options.update(self._presentation(spec, name, where, options))
        added = registration(spec, name, implementation, context, limit, **options)
        self.offloading = self.offloading or large is not None
        self.by_name[name] = added
        for alias in added.aliases:  # the same registration, found by more names
            self.by_name[alias] = added
        self.by_spec.setdefault(spec.id, added)
        self.generation += 1
        return added

    def _presentation(
        self, spec: Any, name: str, where: str, options: dict[str, Any]
    ) -> dict[str, Any]:
        """The title, aliases, group and exposure of a registration: its own where given, else
        the spec's; a bad value or a taken alias is refused with what to do."""
        given = {key: options.pop(key, None) for key in ("title", "aliases", "group", "exposure")}
        title = spec.title if given["title"] is None else given["title"]
        aliases = spec.aliases if given["aliases"] is None else given["aliases"]
        group = spec.group if given["group"] is None else given["group"]
        exposure = spec.exposure if given["exposure"] is None else given["exposure"]
        if title is not None and (not isinstance(title, str) or not title.strip()):
            raise RegistrationError(f"{where}: title= is a display name: a non-empty string")
        if group is not None and (not isinstance(group, str) or not group.strip()):
            raise RegistrationError(f"{where}: group= is a group's name: a non-empty string")
        if exposure not in EXPOSURES:
            raise RegistrationError(
                f"{where}: exposure={exposure!r} is none of {', '.join(EXPOSURES)}"
            )
        if isinstance(aliases, str) or not all(isinstance(a, str) for a in aliases):
            raise RegistrationError(f"{where}: aliases= is a list of names, not {aliases!r}")
        aliases = tuple(dict.fromkeys(aliases))
        for alias in aliases:
            if not NAME.fullmatch(alias):
                raise RegistrationError(f"{where}: the alias {alias!r} must match {NAME.pattern}")
            if alias == name or alias in self.by_name:
                holder = spec.id if alias == name else self.by_name[alias].spec.id
                raise RegistrationError(
                    f"{where}: the alias {alias!r} is already a name of {holder}; drop it or "
                    "register under another name"
                )
        return {"title": title, "aliases": aliases, "group": group, "exposure": exposure}

    def registrations(self) -> Iterator[Registration[Any]]:
        """Each registration once, under its name (its aliases are names of the same one)."""
        return (entry for name, entry in self.by_name.items() if entry.name == name)

    def registration_of(self, spec_id: str) -> Registration[Any] | None:
        """The first registration of the spec ``spec_id`` (typed clients and child calls find
        tools by id, whatever name they were registered under)."""
        return self.by_spec.get(spec_id)

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
        exported_from = []
        for entry in self.registrations():
            if not entry.offered_to_models or not self.is_allowed(entry.name):
                continue  # an operator tool is never offered to a model
            # given a CallInfo of its own: it may keep it
            there = CallInfo("", run_id, entry.name, entry.spec.id, context)
            if entry.enabled is not None and not enabled_for(entry, there):
                continue
            children = self.described_children(entry, there) if entry.describe_children else None
            chosen.append(entry.exported(context, children))
            exported_from.append(entry)
        return export_tools(chosen, format, self.guidance_of(exported_from))

    def guidance_of(self, entries: Iterable[Registration[Any]]) -> str | None:
        """The guidance for the model that goes with ``entries``: the application's own, then
        each spec package's they come from, once each (``joined_guidance``)."""
        return joined_guidance([self.guidance, *(entry.spec.guidance for entry in entries)])

    def child(self, parent: Registration[Any], spec_id: str) -> Registration[Any] | None:
        """What a call of ``spec_id`` through ``parent``'s ``ctx.tools`` runs: the parent's own
        registration of that child, else the runtime's registration of the spec."""
        return parent.own_children.get(spec_id) or self.by_spec.get(spec_id)

    def disabled_children(
        self, parent: Registration[Any], call: CallInfo, *, strict: bool = False
    ) -> frozenset[str]:
        """The declared children whose ``enabled`` leaves them out of this parent call: decided
        once, when the parent starts. ``strict`` (the parent's start): a callback that raises
        is ``ChildEnabledFailed``, which stops the parent; otherwise (a listing) it leaves the
        child out."""
        disabled = set()
        for spec_id in parent.children:
            child = self.child(parent, spec_id)
            if (
                child is not None
                and child.enabled is not None
                and not enabled_for(child, call, strict=strict)
            ):
                disabled.add(spec_id)
        return frozenset(disabled)

    def refused_children(self, parent: Registration[Any]) -> frozenset[str]:
        """The declared children that cannot be called now: registered nowhere, or a name the
        runtime's allowed and disallowed lists refuse."""
        refused = set()
        for spec_id in parent.children:
            child = self.child(parent, spec_id)
            if child is None or (self.restricted and not self.is_allowed(child.name)):
                refused.add(spec_id)
        return frozenset(refused)

    def described_children(
        self, parent: Registration[Any], call: CallInfo
    ) -> dict[str, ExportedTool]:
        """The metadata of the parent's enabled children, by spec id, for its ``describe``."""
        disabled = self.disabled_children(parent, call) | self.refused_children(parent)
        described = {}
        for spec_id in parent.children:
            child = self.child(parent, spec_id)
            if child is not None and spec_id not in disabled:
                described[spec_id] = child.exported(call.context)
        return described

    def of(self, name: str, spec_id: str) -> Registration[Any] | None:
        """The registration ``name`` if it is still of the spec ``spec_id``: a stored call or
        action is taken up only by the spec it was made with, never by another spec registered
        under its old name."""
        found = self.by_name.get(name)
        return found if found is not None and found.spec.id == spec_id else None

    def is_allowed(self, name: str) -> bool:
        if name in self._disallowed:
            return False
        entry = self.by_name.get(name)
        if entry is not None and entry.name != name and not self.is_allowed(entry.name):
            return False  # an alias is refused wherever its tool's name is
        if self._sources is not None:
            entry = self.by_name.get(name)
            if entry is not None and not self._sources.admits(entry):
                return False
        return self._allowed is None or name in self._allowed

    @property
    def sources(self) -> SourcePolicy | None:
        """Which sources and trust levels are let in (None: all)."""
        return self._sources

    @sources.setter
    def sources(self, policy: SourcePolicy | None) -> None:
        self._sources = policy
        self._restrict()

    @property
    def allowed(self) -> frozenset[str] | None:
        """When not None, only these names may be called (it may change at any time)."""
        return self._allowed

    @allowed.setter
    def allowed(self, names: Collection[str] | None) -> None:
        self._allowed = None if names is None else frozenset(names)
        self._restrict()

    @property
    def disallowed(self) -> frozenset[str]:
        """Names that may never be called; it wins over ``allowed`` (it may change too)."""
        return self._disallowed

    @disallowed.setter
    def disallowed(self, names: Collection[str]) -> None:
        self._disallowed = frozenset(names)
        self._restrict()

    def _restrict(self) -> None:
        self.restricted = (
            self.closing
            or self._allowed is not None
            or bool(self._disallowed)
            or self._sources is not None
        )
