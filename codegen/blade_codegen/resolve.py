"""Stage 3, resolve: bundle each schema slot into a self-contained document and fingerprint specs.

The resolved set is the one immutable form the later stages read. A bundled slot keeps its own
``#/...`` references; what it takes from shared files is copied into its ``$defs`` under a
``<file>#<pointer>``-derived key, with every reference inside rewritten to a local one, so each
schema stands alone (for the runtime's validators, the manifest and model providers).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blade_codegen.dependencies import with_dependencies
from blade_codegen.load import SHARED_SUFFIX, SourceFile, SpecTree, load
from blade_codegen.problems import Problem, SpecError
from blade_codegen.refs import RefTarget, parse_ref
from blade_codegen.schemas import resolve_pointer, transform, without_annotations
from blade_codegen.validate import schema_slots, validate

DEFAULT_TIMEOUT_MS = 600_000


@dataclass(frozen=True)
class Slot:
    """One schema slot: as written (refs relative to ``file``), and bundled (self-contained)."""

    role: str  # input, output, context, data, suspend, resume
    key: str  # channel or suspend point name; "" for input/output/context
    schema: Any
    bundled: Any


@dataclass(frozen=True)
class ResolvedSpec:
    """A valid spec with every schema bundled; what plan, render and the manifest read."""

    source: SourceFile
    id: str
    name: str
    description: str
    kind: str | None
    side_effect: str
    execution: str
    timeout_ms: int
    input: Slot
    output: Slot | None
    context: Slot | None
    data: tuple[Slot, ...]
    suspend: tuple[tuple[Slot, Slot], ...]
    shared_files: frozenset[str]  # every shared file it depends on, transitively
    fingerprint: str
    wire: dict[str, Any]  # what the fingerprint hashes: the contract compatibility compares
    deprecated: bool = False
    children: tuple[str, ...] = ()  # ids of the tools it may call through ctx.tools
    deadlines: Mapping[str, int] = field(default_factory=dict)  # suspend point: expiresAfterMs
    # Server-side services the implementation needs (name: description, configSchema); not part
    # of the wire contract (callers never see them), so not of the fingerprint either.
    capabilities: Mapping[str, Any] = field(default_factory=dict)
    # Also server-side only, outside the fingerprint: lease fencing (ctx.lease), and what the
    # README documents: the permission subjects it asks for and the environment it reads.
    lease: bool = False
    concurrency: int | None = None  # at most this many calls at once (core.slots)
    locks: tuple[str, ...] = ()  # JSON pointers into the input: what a call locks
    caller: bool = False  # its implementation reads who the call is for (ctx.call.context)
    permissions: Mapping[str, Any] = field(default_factory=dict)
    environment: Mapping[str, Any] = field(default_factory=dict)
    # How it is shown and found (seed 000): outside the wire contract, as name and description.
    title: str | None = None
    aliases: tuple[str, ...] = ()
    group: str | None = None
    exposure: str = "model"
    # What ctx.effects may emit (role "effect", key "context" or "message"), and the ids of the
    # tools whose permission it may change. The schemas are part of the wire contract (what
    # subscribers read); the permission list, server-side, is not.
    effects: tuple[Slot, ...] = ()
    effect_permissions: tuple[str, ...] = ()

    @property
    def slots(self) -> tuple[Slot, ...]:
        found = [self.input, *(s for s in (self.output, self.context) if s), *self.data]
        for pair in self.suspend:
            found.extend(pair)
        found.extend(self.effects)
        return tuple(found)


@dataclass(frozen=True)
class ResolvedSet:
    tree: SpecTree
    specs: tuple[ResolvedSpec, ...]  # ordered by id


def shared_key(target: RefTarget) -> str:
    """The ``$defs`` key a shared definition is bundled under: readable and free of slashes."""
    stem = target.file.removesuffix(SHARED_SUFFIX).replace("/", ".")
    return stem + target.fragment.replace("/", ".").replace("~1", "_").replace("~0", "_")


@dataclass(frozen=True)
class Bundle:
    schema: Any  # self-contained: every $ref local
    files: frozenset[str]  # shared files it took definitions from
    clashes: tuple[str, ...]  # local $defs keys a shared definition would have overwritten


class Bundler:
    """Copies shared definitions into a slot's ``$defs`` and rewrites references to them."""

    def __init__(self, tree: SpecTree) -> None:
        self.tree = tree

    def target_schema(self, target: RefTarget) -> Any:
        source = self.tree.file(target.file)
        assert source is not None, "validate guarantees references resolve"
        found, node = resolve_pointer(source.data, target.fragment)
        assert found, "validate guarantees references resolve"
        return node

    def bundle(self, schema: Any, from_file: str) -> Bundle:
        imported: dict[str, Any] = {}
        files: set[str] = set()

        def rewrite(node: dict[str, Any], in_file: str, local: bool) -> dict[str, Any]:
            ref = node.get("$ref")
            if not isinstance(ref, str):
                return node
            target = parse_ref(ref, in_file)
            assert isinstance(target, RefTarget), "validate guarantees references parse"
            if local and not target.file:
                return node  # stays relative to the slot root
            target = RefTarget(target.file or in_file, target.fragment)
            key = shared_key(target)
            if key not in imported:
                imported[key] = True  # placeholder: guards recursion
                files.add(target.file)
                content = self.target_schema(target)
                copied = transform(content, lambda n: rewrite(n, target.file, False))
                if isinstance(copied, dict):
                    copied = {
                        k: v for k, v in copied.items() if k not in ("$defs", "$schema", "$id")
                    }
                imported[key] = copied
            return {**node, "$ref": "#/$defs/" + key.replace("~", "~0").replace("/", "~1")}

        bundled = transform(schema, lambda n: rewrite(n, from_file, True))
        clashes: tuple[str, ...] = ()
        if imported and isinstance(bundled, dict):
            defs = dict(bundled.get("$defs", {}))
            clashes = tuple(sorted(key for key in imported if key in defs))
            defs.update(sorted(imported.items()))
            bundled = {**bundled, "$defs": defs}
        return Bundle(bundled, frozenset(files), clashes)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(wire: dict[str, Any]) -> str:
    """Hash of the wire contract: id, execution and bundled schemas, annotations excluded."""
    return "sha256:" + hashlib.sha256(canonical_json(wire).encode()).hexdigest()


def _wire(
    spec_id: str, execution: str, slots: list[Slot], deadlines: Mapping[str, int]
) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "id": spec_id,
        "execution": execution,
        "schemas": {
            f"{s.role}:{s.key}" if s.key else s.role: without_annotations(s.bundled)
            for s in slots
            if s.role != "context"
        },
    }
    if deadlines:  # only when there are any: specs without deadlines keep their fingerprints
        wire["deadlines"] = dict(sorted(deadlines.items()))
    return wire


def resolve(tree: SpecTree) -> ResolvedSet:
    """Bundle and fingerprint every spec of a validated tree."""
    bundler = Bundler(tree)
    resolved = []
    problems: list[Problem] = []
    for source in tree.specs:
        spec = source.data
        slots: dict[tuple[str, ...], Slot] = {}
        files: set[str] = set()
        for at, schema in schema_slots(spec):
            bundle = bundler.bundle(schema, source.rel)
            bundled = bundle.schema
            for key in bundle.clashes:
                problems.append(
                    source.problem(
                        (*at, "$defs", key),
                        f"local definition {key!r} has the name a shared definition is "
                        "bundled under",
                        "rename the local definition",
                    )
                )
            files |= bundle.files
            role = {
                "inputSchema": "input",
                "outputSchema": "output",
                "contextSchema": "context",
                "dataSchemas": "data",
                "suspendSchema": "suspend",
                "resumeSchema": "resume",
                "effects": "effect",
            }[str(at[-1] if at[0] == "suspend" else at[0])]
            key = str(at[1]) if len(at) > 1 else ""
            slots[tuple(str(a) for a in at)] = Slot(role, key, schema, bundled)
        data = tuple(s for at, s in slots.items() if at[0] == "dataSchemas")
        effects = tuple(s for at, s in slots.items() if at[0] == "effects")
        suspend = tuple(
            (slots[("suspend", point, "suspendSchema")], slots[("suspend", point, "resumeSchema")])
            for point in spec.get("suspend", {})
        )
        deadlines = {
            point: int(body["expiresAfterMs"])
            for point, body in spec.get("suspend", {}).items()
            if "expiresAfterMs" in body
        }
        wire = _wire(spec["id"], spec.get("execution", "backend"), list(slots.values()), deadlines)
        resolved.append(
            ResolvedSpec(
                source=source,
                id=spec["id"],
                name=spec["name"],
                description=spec["description"],
                kind=spec.get("kind"),
                side_effect=spec.get("sideEffect", "non_idempotent"),
                execution=spec.get("execution", "backend"),
                timeout_ms=int(spec.get("timeoutMs", DEFAULT_TIMEOUT_MS)),
                input=slots[("inputSchema",)],
                output=slots.get(("outputSchema",)),
                context=slots.get(("contextSchema",)),
                data=data,
                suspend=suspend,
                shared_files=frozenset(files),
                fingerprint=fingerprint(wire),
                wire=wire,
                deprecated=bool(spec.get("deprecated", False)),
                children=tuple(spec.get("children", ())),
                deadlines=deadlines,
                capabilities=dict(spec.get("capabilities", {})),
                lease=bool(spec.get("lease", False)),
                concurrency=spec.get("concurrency"),
                locks=tuple(spec.get("locks", ())),
                caller=bool(spec.get("caller", False)),
                permissions=dict(spec.get("permissions", {})),
                environment=dict(spec.get("environment", {})),
                title=spec.get("title"),
                aliases=tuple(spec.get("aliases", ())),
                group=spec.get("group"),
                exposure=spec.get("exposure", "model"),
                effects=effects,
                effect_permissions=tuple(
                    spec.get("effects", {}).get("permissions", {}).get("tools", ())
                ),
            )
        )
    if problems:
        raise SpecError(problems)
    return ResolvedSet(tree, tuple(sorted(resolved, key=lambda r: r.id)))


def resolve_specs(specs: Path) -> ResolvedSet:
    """Load, validate and resolve the spec tree at ``specs``; SpecError lists every problem."""
    tree = with_dependencies(load(specs))
    problems = validate(tree)
    if problems:
        raise SpecError(problems)
    return resolve(tree)
