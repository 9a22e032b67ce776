"""Stage 4, plan: name every module and class, and refuse collisions instead of numbering them."""

from __future__ import annotations

import hashlib
import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel

from blade_codegen import __version__
from blade_codegen.dependencies import Dependency
from blade_codegen.load import SHARED_SUFFIX, SourceFile
from blade_codegen.problems import Problem, SpecError
from blade_codegen.refs import dependency_of
from blade_codegen.resolve import Bundler, ResolvedSet, ResolvedSpec, Slot, canonical_json

SHARED_PACKAGE = "shared"
CLIENT_MODULE = "client"
_WORDS = re.compile(r"[A-Za-z0-9]+", re.ASCII)
_VERSION_SUFFIX = re.compile(r"\.v[0-9]+$")
# Names generated modules use for their own purposes; a spec-derived class may not take them.
# A definition of one of these names would replace the import (render checks none slipped by).
RESERVED = frozenset(
    {"ID", "SPEC", "RESULT", "DATA", "Final", "Literal", "Protocol", "TypeAlias", "NoReturn"}
    | {"Sequence", "Mapping", "AsyncIterator", "Any", "Annotated", "overload", "TypeVar"}
    | {"Union", "Optional"}
    | {"BaseModel", "Field", "ConfigDict", "RootModel", "StringConstraints", "JsonValue"}
    | {"MISSING", "Enum", "AnyUrl", "AwareDatetime", "EmailStr", "UUID", "Decimal"}
    # blade_runtime's names that generated modules and the client import
    | {"BackendToolSpec", "ClientToolSpec", "ToolSpec", "Execution", "InitialEntry"}
    | {"ResumeEntry", "SuspendPoint", "DataChannel", "DataItem", "Parser", "PendingActionBase"}
    | {"CallSuccess", "CallSkipped", "CallError", "CallPending", "ToolClient", "CapabilitySpec"}
    | {"PermissionRequestAction", "Lease", "Effect", "EffectsSpec"}
)
# Each tool module's own interfaces: <base><suffix>.
INTERFACE_SUFFIXES = (
    *("Id", "Execution", "Implementation", "DataWriter", "Entry", "Result", "Action", "Data"),
    *("Tools", "Capabilities", "Effects"),
)
# Methods every generated Client has; a tool's method may not take them.
# The names a tool's method may not take on the package's client: those the template writes
# and those of the runtime's ToolClient it subclasses (a test holds this to both).
CLIENT_METHODS = frozenset(
    {"pending", "pages", "action"}  # templates/package_client.py.jinja
    | {
        "runtime",
        "events",
        "permission_requests",
        "read_file",
        "suspensions",
        "run_context",
    }  # ToolClient
)


def pascal(text: str) -> str:
    """``lookup-customer`` -> ``LookupCustomer``; inner capitals are kept (``aB`` -> ``AB``)."""
    words = _WORDS.findall(text)
    name = "".join(w[0].upper() + w[1:] for w in words)
    return "T" + name if name[:1].isdigit() else name


def module_name(text: str) -> str:
    """A module name for a path segment: ``lookup-customer.v1`` -> ``lookup_customer_v1``."""
    name = "_".join(_WORDS.findall(text)).lower()
    if not name or name[0].isdigit():
        name = "m_" + name
    return name + "_" if keyword.iskeyword(name) or name.startswith("__") else name


def slot_class(base: str, slot: Slot) -> str:
    role = {"input": "Input", "output": "Output", "context": "Context"}.get(slot.role)
    if role is not None:
        return base + role
    if slot.role == "effect":  # LookupContextPatch, LookupMessage
        return base + {"context": "ContextPatch", "message": "Message"}[slot.key]
    suffix = {"data": "Data", "suspend": "Suspend", "resume": "Resume"}[slot.role]
    return base + pascal(slot.key) + suffix


@dataclass(frozen=True)
class ToolPlan:
    spec: ResolvedSpec
    module: str  # dotted, inside the package: crm.lookup_customer_v1
    base: str  # class-name stem: LookupCustomer
    slot_classes: Mapping[tuple[str, str], str]  # (role, key) -> class or alias name
    local_defs: Mapping[tuple[str, str, str], str]  # (role, key, $defs key) -> class name
    cache_key: str
    method: str  # the typed client's method: lookup_customer
    data_fields: Mapping[str, str]  # data channel -> field of the client's data view

    @property
    def actions(self) -> tuple[tuple[str, str, str | None], ...]:
        """(class, kind, point) of every pending action this tool can create."""
        spec = self.spec
        if spec.execution == "client":
            return ((self.base + "Action", spec.id, None),)
        return tuple(
            (self.base + pascal(p.key) + "Action", f"{spec.id}#{p.key}", p.key)
            for p, _ in spec.suspend
        )

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"

    @property
    def names(self) -> set[str]:
        """Every class name the plan gave this tool's module, and the reserved ones."""
        interfaces = {self.base + suffix for suffix in INTERFACE_SUFFIXES}
        actions = {cls for cls, _, _ in self.actions}
        return {*RESERVED, *self.slot_classes.values(), *self.local_defs.values()} | (
            interfaces | actions
        )

    def cls(self, slot: Slot) -> str:
        return self.slot_classes[(slot.role, slot.key)]


@dataclass(frozen=True)
class SharedPlan:
    source: SourceFile
    module: str  # dotted, inside the package: shared.common.money
    root_class: str | None  # None when the file only holds $defs
    def_classes: Mapping[str, str]  # $defs key -> class name
    cache_key: str
    dependency: Dependency | None = None  # the spec package whose module this is; None: ours

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"


@dataclass(frozen=True)
class BuildPlan:
    package: str
    resolved: ResolvedSet
    tools: tuple[ToolPlan, ...]
    shared: tuple[SharedPlan, ...]  # dependencies before dependents

    @property
    def guidance(self) -> str | None:
        """The package's guidance for the model (``guidance.md``), None without one."""
        return self.resolved.tree.guidance

    @property
    def packages(self) -> tuple[str, ...]:
        """Every folder (dotted, "" for the root) that needs an ``__init__.py``."""
        found = {""}
        ours = (s.module for s in self.shared if s.dependency is None)
        for module in (*(t.module for t in self.tools), *ours):
            parts = module.split(".")[:-1]
            for i in range(1, len(parts) + 1):
                found.add(".".join(parts[:i]))
        return tuple(sorted(found))

    def shared_plan(self, rel: str) -> SharedPlan:
        return next(s for s in self.shared if s.source.rel == rel)


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join((__version__, *parts)).encode()).hexdigest()


def _defs_is_only(data: object) -> bool:
    """A shared file that is only a container of definitions gets no root class."""
    annotations = {"$schema", "$id", "$defs", "definitions", "title", "description", "$comment"}
    return isinstance(data, dict) and set(data) <= annotations


def plan(resolved: ResolvedSet, package: str, options: str) -> BuildPlan:
    """Names for the whole set; every collision is reported, with both sides named."""
    problems: list[Problem] = []
    modules: dict[str, str] = {CLIENT_MODULE: "the package's typed client"}

    def claim_module(module: str, source: SourceFile) -> None:
        other = modules.setdefault(module, source.rel)
        if other != source.rel:
            problems.append(
                source.problem(
                    (),
                    f"its module {package}.{module} is also the module of {other}",
                    "names that differ only in punctuation or case collide; rename one",
                )
            )

    shared_digests = {s.rel: s.digest for s in resolved.tree.shared}
    closures = {s.rel: _shared_closure(resolved, s.rel) for s in resolved.tree.shared}
    shared_plans = []
    for source in _dependency_order(resolved, closures):
        stem = source.rel.removesuffix(SHARED_SUFFIX)
        owner = dependency_of(source.rel)
        dependency = resolved.tree.dependencies.get(owner) if owner else None
        if owner:
            stem = stem.partition("/")[2]  # the path inside the spec package that ships it
        module = ".".join([SHARED_PACKAGE, *(module_name(p) for p in stem.split("/"))])
        if not isinstance(dependency, Dependency):
            claim_module(module, source)
            dependency = None
        names: dict[str, str] = {}
        root = None if _defs_is_only(source.data) else pascal(stem.split("/")[-1]) or "Schema"
        if root:
            names[root] = "the file's root schema"
        def_classes = {}
        for key in source.data.get("$defs", {}) if isinstance(source.data, dict) else {}:
            name = pascal(key) or "Definition"
            if name in RESERVED:
                name += "Model"
            if name in names:
                problems.append(
                    source.problem(
                        ("$defs", key),
                        f"definition {key!r} would be class {name}, as {names[name]} is",
                        "rename one of them",
                    )
                )
            names[name] = f"definition {key!r}"
            def_classes[key] = name
        deps = sorted(closures[source.rel])
        cache_key = _key(options, package, source.rel, *(shared_digests[d] for d in deps))
        shared_plans.append(SharedPlan(source, module, root, def_classes, cache_key, dependency))

    tools = []
    for spec in resolved.specs:
        stem = spec.source.rel.removesuffix(".json")
        module = ".".join(module_name(p) for p in stem.split("/"))
        claim_module(module, spec.source)
        base = pascal(_VERSION_SUFFIX.sub("", stem.split("/")[-1])) or "Tool"
        # a tool module imports the package's GUIDANCE only when it has one
        tool_options = options + ("\0guidance" if resolved.tree.guidance is not None else "")
        tools.append(
            _plan_tool(spec, module, base, package, tool_options, shared_digests, problems)
        )
    _check_client_methods(tools, problems)
    if problems:
        raise SpecError(problems)
    return BuildPlan(package, resolved, tuple(tools), tuple(shared_plans))


def _plan_tool(
    spec: ResolvedSpec,
    module: str,
    base: str,
    package: str,
    options: str,
    shared_digests: Mapping[str, str],
    problems: list[Problem],
) -> ToolPlan:
    taken: dict[str, str] = {}
    for suffix in INTERFACE_SUFFIXES:
        taken[base + suffix] = "a generated interface"
    slot_classes: dict[tuple[str, str], str] = {}
    for slot in spec.slots:
        name = slot_class(base, slot)
        what = f"the {slot.role} schema" + (f" {slot.key!r}" if slot.key else "")
        if name in taken:
            problems.append(
                spec.source.problem(
                    _slot_at(slot),
                    f"{what} would be class {name}, as {taken[name]} is",
                    "names that differ only in punctuation or case collide; rename one",
                )
            )
        taken[name] = what
        slot_classes[(slot.role, slot.key)] = name
        if slot.role == "suspend":
            taken.setdefault(base + pascal(slot.key) + "Action", f"the {slot.key!r} pending action")
    # Local $defs keep their own names where they are unambiguous across the tool's slots.
    local_defs: dict[tuple[str, str, str], str] = {}
    by_name: dict[str, list[tuple[Slot, str]]] = {}
    for slot in spec.slots:
        defs = slot.schema.get("$defs", {}) if isinstance(slot.schema, dict) else {}
        for key in defs:
            by_name.setdefault(pascal(key) or "Definition", []).append((slot, key))
    for name, owners in sorted(by_name.items()):
        same = len({canonical_json(o[0].schema["$defs"][o[1]]) for o in owners}) == 1
        for slot, key in owners:
            final = name if same or len(owners) == 1 else slot_classes[(slot.role, slot.key)] + name
            if final in RESERVED:
                final += "Model"
            if final in taken and taken[final] != f"definition {key!r}":
                problems.append(
                    spec.source.problem(
                        (*_slot_at(slot), "$defs", key),
                        f"definition {key!r} would be class {final}, as {taken[final]} is",
                        "rename the definition",
                    )
                )
            taken[final] = f"definition {key!r}"
            local_defs[(slot.role, slot.key, key)] = final
    deps = sorted(spec.shared_files)
    cache_key = _key(
        options, package, spec.source.rel, spec.source.digest, *(shared_digests[d] for d in deps)
    )
    data_fields: dict[str, str] = {}
    for channel in spec.data:
        name = module_name(channel.key)
        if hasattr(BaseModel, name) or name.startswith("model_"):
            name = "channel_" + name
        if name in data_fields.values():
            problems.append(
                spec.source.problem(
                    ("dataSchemas", channel.key),
                    f"data channel {channel.key!r} would be field {name} of {base}Data, "
                    "as another channel is",
                    "names that differ only in punctuation or case collide; rename one",
                )
            )
        data_fields[channel.key] = name
    return ToolPlan(
        spec, module, base, slot_classes, local_defs, cache_key, module_name(spec.name), data_fields
    )


def _check_client_methods(tools: list[ToolPlan], problems: list[Problem]) -> None:
    """Every tool gets its own method (and ``<method>_data``) on the package's typed client."""
    methods = {name: "a method of every client" for name in CLIENT_METHODS}
    for tool in tools:
        names = [tool.method] + ([tool.method + "_data"] if tool.spec.data else [])
        for name in names:
            other = methods.setdefault(name, tool.spec.id)
            if other != tool.spec.id:
                problems.append(
                    tool.spec.source.problem(
                        ("name",),
                        f"the typed client's method {name} would also be that of {other}",
                        "names that differ only in punctuation or case collide; rename one",
                    )
                )


def _slot_at(slot: Slot) -> tuple[str, ...]:
    if slot.role in ("input", "output", "context"):
        return (slot.role + "Schema",)
    if slot.role == "data":
        return ("dataSchemas", slot.key)
    if slot.role == "effect":
        return ("effects", slot.key)
    return ("suspend", slot.key, slot.role + "Schema")


def _shared_closure(resolved: ResolvedSet, rel: str) -> set[str]:
    source = resolved.tree.file(rel)
    assert source is not None
    return {rel, *Bundler(resolved.tree).bundle(source.data, rel).files}


def _dependency_order(resolved: ResolvedSet, closures: Mapping[str, set[str]]) -> list[SourceFile]:
    """Shared files, each after the files it references (validate refused cycles)."""
    done: list[SourceFile] = []
    seen: set[str] = set()

    def visit(source: SourceFile) -> None:
        if source.rel in seen:
            return
        seen.add(source.rel)
        for dep in sorted(closures[source.rel] - {source.rel}):
            dep_source = resolved.tree.file(dep)
            if dep_source is not None:
                visit(dep_source)
        done.append(source)

    for source in resolved.tree.shared:
        visit(source)
    return done
