"""Stage 2, validate: every rule of spec format 1, over the whole set, all problems at once."""

from __future__ import annotations

import json
import keyword as python_keyword
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

import jsonschema_rs

from blade_codegen.dependencies import Dependency, Unavailable, holder, installed
from blade_codegen.explain import schema_errors, spec_error
from blade_codegen.load import SourceFile, SpecTree
from blade_codegen.patterns import ecma_problem
from blade_codegen.problems import Problem, pointer
from blade_codegen.refs import RefError, RefTarget, dependency_of, parse_ref
from blade_codegen.schemas import Segments, resolve_pointer, subschemas

DIALECT = "https://json-schema.org/draft/2020-12/schema"
UNSUPPORTED_KEYWORDS = {
    "$dynamicRef": "write the reference as $ref to a $defs entry",
    "$dynamicAnchor": "remove it and use $ref to a $defs entry",
    "$recursiveRef": "write the reference as $ref to a $defs entry",
    "$id": "remove it: references in a spec resolve relative to the spec file",
}

_VERSION = re.compile(r"v[0-9]+")


@cache
def meta_schema() -> dict[str, Any]:
    """The spec meta-schema, shipped in the package (``blade-codegen schema`` prints it)."""
    text = resources.files("blade_codegen").joinpath("spec.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@cache
def _meta_validator() -> Any:
    return jsonschema_rs.validator_for(meta_schema())


def schema_slots(spec: dict[str, Any]) -> Iterator[tuple[Segments, Any]]:
    """Every JSON Schema slot of a spec with its path: input, output, context, data, suspend,
    effects."""
    for key in ("inputSchema", "outputSchema", "contextSchema"):
        if key in spec:
            yield (key,), spec[key]
    data = spec.get("dataSchemas")
    if isinstance(data, dict):
        for channel, schema in data.items():
            yield ("dataSchemas", channel), schema
    suspend = spec.get("suspend")
    if isinstance(suspend, dict):
        for point, entry in suspend.items():
            if isinstance(entry, dict):
                for key in ("suspendSchema", "resumeSchema"):
                    if key in entry:
                        yield ("suspend", point, key), entry[key]
    effects = spec.get("effects")
    if isinstance(effects, dict):
        for kind in ("context", "message"):
            if kind in effects:
                yield ("effects", kind), effects[kind]


def _aliases_taken(tree: SpecTree, names: dict[str, SourceFile]) -> list[Problem]:
    """An alias is a name the tool is called by: none may be a tool's name or another alias."""
    problems = []
    seen: dict[str, SourceFile] = {}
    for source in tree.specs:
        aliases = source.data.get("aliases") if isinstance(source.data, dict) else None
        for index, alias in enumerate(aliases if isinstance(aliases, list) else ()):
            if not isinstance(alias, str):
                continue
            holder = names.get(alias) or seen.get(alias)
            if holder is not None:
                whose = "its own name" if holder is source else f"a name of {holder.rel}"
                problems.append(
                    source.problem(
                        ("aliases", index),
                        f"alias {alias!r} is {whose} already",
                        "remove the alias or rename one of the tools",
                    )
                )
            seen.setdefault(alias, source)
    return problems


def validate(tree: SpecTree, checked: frozenset[str] = frozenset()) -> list[Problem]:
    """All problems of the tree: per file (not for the spec files in ``checked``: unchanged
    since a build checked them), then across the set (ids and names unique)."""
    problems = list(tree.problems)
    for shared in tree.shared:
        problems.extend(_check_schema(tree, shared, (), shared.data))
    ids: dict[str, list[SourceFile]] = defaultdict(list)
    names: dict[str, list[SourceFile]] = defaultdict(list)
    for source in tree.specs:
        if source.rel not in checked:
            problems.extend(_check_spec(tree, source))
        if isinstance(source.data, dict):
            if isinstance(source.data.get("id"), str):
                ids[source.data["id"]].append(source)
            if isinstance(source.data.get("name"), str):
                names[source.data["name"]].append(source)
    for key, table in (("id", ids), ("name", names)):
        for value, sources in table.items():
            for source in sources[1:]:
                problems.append(
                    source.problem(
                        (key,),
                        f"{key} {value!r} is already used by {sources[0].rel}",
                        f"give one of them another {key}",
                    )
                )
    problems.extend(_aliases_taken(tree, {k: v[0] for k, v in names.items()}))
    own = {k: v[0] for k, v in ids.items()}
    problems.extend(_check_children(tree, own))
    problems.extend(_check_granted(tree, own))
    for dependency in installed(tree):
        for spec_id in sorted(ids.keys() & dependency.tools.keys()):
            problems.append(
                ids[spec_id][0].problem(
                    ("id",),
                    f"id {spec_id!r} is also a tool of {dependency.label}, which this "
                    "tree references",
                    "ids are unique across a project and its spec packages; use another id",
                )
            )
    problems.extend(_check_file_cycles(tree))
    return problems


def _check_spec(tree: SpecTree, source: SourceFile) -> list[Problem]:
    spec = source.data
    problems = [
        source.problem(at, message, hint)
        for error in _meta_validator().iter_errors(spec)
        for at, message, hint in spec_error(error, spec, meta_schema())
    ]
    if not isinstance(spec, dict):
        return problems
    problems.extend(_check_id(source, spec.get("id")))
    timeout = spec.get("timeoutMs")
    if isinstance(timeout, float):
        problems.append(
            source.problem(
                ("timeoutMs",), "timeoutMs must be a whole number", "write it without .0"
            )
        )
    root = spec.get("inputSchema")
    if isinstance(root, dict) and root.get("type") != "object":
        problems.append(
            source.problem(
                ("inputSchema",),
                "the input schema's root must be an object",
                'add "type": "object" and describe the arguments as properties',
            )
        )
    effects = spec.get("effects")
    patch = effects.get("context") if isinstance(effects, dict) else None
    if isinstance(patch, dict) and patch.get("type") != "object":
        problems.append(
            source.problem(
                ("effects", "context"),
                "a context patch's schema must have root type object (a JSON merge patch)",
                'add "type": "object" and describe the context keys the tool sets as properties',
            )
        )
    if spec.get("execution") == "client":
        if "outputSchema" not in spec:
            problems.append(
                source.problem(
                    (),
                    "a client tool needs an outputSchema: it is the payload the client submits",
                    "add outputSchema",
                )
            )
        for key in (
            "suspend",
            "contextSchema",
            "capabilities",
            "caller",
            "lease",
            "concurrency",
            "locks",
            "permissions",
            "environment",
            "effects",
        ):
            if key in spec:
                problems.append(
                    source.problem(
                        (key,),
                        f"a client tool cannot have {key}: only backend implementations use it",
                        f'remove {key} or set "execution": "backend"',
                    )
                )
    capabilities = spec.get("capabilities")
    for name in capabilities if isinstance(capabilities, dict) else ():
        if python_keyword.iskeyword(name):  # it becomes an attribute of ctx.capabilities
            problems.append(
                source.problem(
                    ("capabilities", name),
                    f"{name!r} is a Python keyword, so ctx.capabilities cannot name it",
                    f"rename it, for example to {name}_service",
                )
            )
    problems.extend(_check_locks(source, spec))
    for at, schema in schema_slots(spec):
        problems.extend(_check_schema(tree, source, at, schema))
    return problems


def _check_locks(source: SourceFile, spec: Mapping[str, Any]) -> list[Problem]:
    """Each lock's pointer starts at a property the input declares (a misspelt one would find
    nothing in any call, and lock nothing)."""
    locks = spec.get("locks")
    properties = (
        spec.get("inputSchema", {}).get("properties")
        if isinstance(spec.get("inputSchema"), dict)
        else None
    )
    if not isinstance(locks, list) or not isinstance(properties, dict):
        return []
    problems = []
    for index, lock in enumerate(locks):
        if not isinstance(lock, str) or "/" not in lock:
            continue  # the meta-schema names it
        first = lock[lock.index("/") + 1 :].split("/")[0].replace("~1", "/").replace("~0", "~")
        if first not in properties:
            problems.append(
                source.problem(
                    ("locks", index),
                    f"the lock {lock!r} points at {first!r}, which the inputSchema does not "
                    "declare: it would lock nothing",
                    f"point it at one of: {', '.join(sorted(properties)) or 'no property'}",
                )
            )
    return problems


def _check_children(tree: SpecTree, own: Mapping[str, SourceFile]) -> list[Problem]:
    """Each child names a tool of the tree or of an installed spec package, and is an ordinary
    backend tool (seed 002: no client execution, suspension, ToolData or nesting)."""
    problems = []
    for source in tree.specs:
        spec = source.data
        children = spec.get("children") if isinstance(spec, dict) else None
        if not isinstance(children, list):
            continue
        if spec.get("execution") == "client":
            problems.append(
                source.problem(
                    ("children",),
                    "a client tool cannot have children: only backend implementations call them",
                    'remove children or set "execution": "backend"',
                )
            )
        for index, child in enumerate(children):
            found = _child_problem(tree, own, spec, child) if isinstance(child, str) else None
            if found is not None:
                problems.append(source.problem(("children", index), *found))
    return problems


def _check_granted(tree: SpecTree, own: Mapping[str, SourceFile]) -> list[Problem]:
    """Each tool ``effects.permissions`` lists is a tool of the tree or of an installed spec
    package: a typo is refused here, not by the first grant."""
    problems = []
    for source in tree.specs:
        effects = source.data.get("effects") if isinstance(source.data, dict) else None
        granted = effects.get("permissions") if isinstance(effects, dict) else None
        tools = granted.get("tools") if isinstance(granted, dict) else None
        for index, tool in enumerate(tools if isinstance(tools, list) else ()):
            if not isinstance(tool, str) or tool in own or holder(tree, tool) is not None:
                continue
            searched = ", ".join(d.label for d in installed(tree)) or "no installed spec package"
            problems.append(
                source.problem(
                    ("effects", "permissions", "tools", index),
                    f"{tool!r} is not a tool of this spec tree or of an installed spec package "
                    f"({searched})",
                    "check the id, or install the spec package that has it",
                )
            )
    return problems


def _child_problem(
    tree: SpecTree, own: Mapping[str, SourceFile], spec: Mapping[str, Any], child: str
) -> tuple[str, str] | None:
    """Why ``child`` cannot be a child of ``spec`` (message and hint), or None."""
    if child == spec.get("id"):
        return "a tool cannot be its own child", ""
    package = None if child in own else holder(tree, child)
    facts = own[child].data if child in own else package.tools[child] if package else None
    if not isinstance(facts, Mapping):
        searched = ", ".join(d.label for d in installed(tree)) or "no installed spec package"
        return (
            f"child {child!r} is not a tool of this spec tree or of an installed spec package "
            f"({searched})",
            "check the id, or install the spec package that has it",
        )
    kinds = (("suspend", "suspend points"), ("dataSchemas", "data channels"), ("children",) * 2)
    refused = [what for key, what in kinds if facts.get(key)]
    if facts.get("execution", "backend") != "backend":
        refused.insert(0, "client execution")
    if not refused:
        return None
    where = package.label if package else "this spec tree"
    return (
        f"child {child!r} (in {where}) has {', '.join(refused)}",
        "children are ordinary backend tools; call this one from the agent",
    )


def versioned(spec_id: str) -> bool:
    """Whether the id ends in its version, ``.v1``, ``.v2``...: what ``check`` counts on to
    publish an incompatible change under the next id."""
    parts = spec_id.split(".")
    return len(parts) > 2 and _VERSION.fullmatch(parts[-1]) is not None


def unversioned(spec_id: str) -> str:
    return (
        f"id {spec_id!r} has no version: end it with .v1 ({spec_id}.v1), so that an "
        "incompatible change can be published as .v2 beside it"
    )


def _check_id(source: SourceFile, spec_id: Any) -> list[Problem]:
    if not isinstance(spec_id, str) or not spec_id:
        return []
    problems = []
    if spec_id != spec_id.strip():
        problems.append(
            source.problem(("id",), "id has surrounding whitespace", "remove the spaces")
        )
    for bad, what in (("/", "a slash"), ("\\", "a backslash"), ("..", "'..'")):
        if bad in spec_id:
            problems.append(
                source.problem(
                    ("id",), f"id contains {what}", "use dots between parts: namespace.tool.v1"
                )
            )
    if any(ord(c) < 32 or ord(c) == 127 for c in spec_id):
        problems.append(source.problem(("id",), "id contains control characters", "remove them"))
    if not problems and not versioned(spec_id):
        message, _, fix = unversioned(spec_id).partition(": ")
        problems.append(source.problem(("id",), message, fix))
    expected = source.rel.removesuffix(".json").replace("/", ".")
    if not problems and spec_id != expected:
        namespace, _, rest = spec_id.partition(".")
        suggestion = f"{namespace}/{rest}.json" if rest else f"{spec_id}.json"
        problems.append(
            source.problem(
                ("id",),
                f"id {spec_id!r} does not match the file path (which reads as {expected!r})",
                f"move the file to {suggestion} or change the id",
            )
        )
    return problems


def _check_schema(tree: SpecTree, source: SourceFile, at: Segments, schema: Any) -> list[Problem]:
    """A schema slot (or a shared file) is valid 2020-12 and every $ref in it resolves."""
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        return [source.problem(at, "a schema must be an object or a boolean", "")]
    wrong = _dialect_problem(source, at, schema.get("$schema"), nested=False)
    if wrong is not None:
        return [wrong]
    problems = [
        source.problem((*at, *where), message, hint)
        for where, message, hint in schema_errors(schema)
    ]
    walked = list(subschemas(schema, at))  # one walk for every check below
    for path, sub in walked:
        if "$schema" in sub and path != at:
            wrong = _dialect_problem(source, path, sub["$schema"], nested=True)
            if wrong is not None:
                problems.append(wrong)
        for keyword, hint in UNSUPPORTED_KEYWORDS.items():
            if keyword in sub and not (keyword == "$id" and path == () and source.is_shared):
                problems.append(
                    source.problem((*path, keyword), f"{keyword} is not supported in specs", hint)
                )
        ref = sub.get("$ref")
        if isinstance(ref, str):
            problems.extend(_check_ref(tree, source, (*path, "$ref"), ref, at))
        if "pattern" in sub or "patternProperties" in sub:  # rare: most nodes skip the call
            problems.extend(_check_patterns(source, path, sub))
    problems.extend(_check_ref_cycles(source, at, schema, walked))
    return problems


def _dialect_problem(
    source: SourceFile, at: Segments, dialect: Any, nested: bool
) -> Problem | None:
    """Why the ``$schema`` at ``at`` cannot stand, or None: 2020-12 only, at a slot's root or
    (the same dialect said again) below it. Another dialect below a 2020-12 root would be read
    in its own way by some validators and as 2020-12 by others, so it is refused at its own
    place, as the root's is."""
    if dialect is None or (isinstance(dialect, str) and dialect.rstrip("#") == DIALECT):
        return None
    if nested and not isinstance(dialect, str):
        return None  # the meta-schema's check says it must be a string
    where = (*at, "$schema")
    if not isinstance(dialect, str):
        return source.problem(
            where, "$schema must be a URI string", f"write {DIALECT}, or remove $schema"
        )
    fix = (
        "remove it and write this subschema as JSON Schema 2020-12, the dialect of its slot"
        if nested
        else f"write JSON Schema 2020-12 ({DIALECT})"
    )
    return source.problem(
        where,
        f"schema dialect {dialect!r} is not supported",
        f"{fix}; blade-codegen import converts drafts 04 to 2019-09 in MCP, OpenAI and "
        "Anthropic tool lists",
    )


def _check_ref_cycles(
    source: SourceFile, at: Segments, schema: Any, walked: list[tuple[Segments, Any]]
) -> list[Problem]:
    """No chain of local ``$ref`` keywords leads back to where it started.

    A ``$ref`` applies its target to the same value, whatever keywords sit beside it, so such a
    chain never reaches a schema: validators disagree on what it means (undefined in 2020-12) and
    the models recurse forever. Recursion through ``properties`` or ``items`` moves into the
    value and is fine. A cycle across shared files is refused as a file cycle, so one document
    (a slot, or a shared file) holds every cycle; each is reported once, at its first member.
    ``walked``: ``subschemas(schema, at)``, as the caller walked it.
    """
    starts = [(path, sub) for path, sub in walked if isinstance(sub.get("$ref"), str)]
    if not starts:  # most schemas: nothing to follow
        return []
    nodes = {id(sub): path for path, sub in walked}
    reported: set[int] = set()
    problems = []
    for path, sub in starts:
        chain = [id(sub)]
        node: Any = sub
        while id(sub) not in reported:
            ref = node.get("$ref")
            target = parse_ref(ref, source.rel) if isinstance(ref, str) else None
            if not isinstance(target, RefTarget) or target.file:
                break
            found, node = resolve_pointer(schema, target.fragment)
            # Only schema positions count: "#/properties" is a map, its "$ref" a property name.
            if not found or id(node) not in nodes:
                break
            if id(node) == id(sub):
                reported.update(chain)
                names = ["#" + pointer(*nodes[n][len(at) :]) for n in [*chain, id(sub)]]
                problems.append(
                    source.problem(
                        (*path, "$ref"),
                        "references form a cycle that never reaches a schema: "
                        + " -> ".join(names),
                        "give one of them the schema it stands for; recursion must go through "
                        "properties or items",
                    )
                )
            if id(node) in chain:
                break  # it leads into a cycle it is not part of, reported at a member
            chain.append(id(node))
    return problems


def _check_patterns(source: SourceFile, path: Segments, schema: dict[str, Any]) -> list[Problem]:
    """Every ``pattern`` and ``patternProperties`` name compiles as the runtime reads it."""
    found: list[tuple[Segments, str]] = []
    if isinstance(schema.get("pattern"), str):
        found.append(((*path, "pattern"), schema["pattern"]))
    if isinstance(schema.get("patternProperties"), dict):
        found.extend(((*path, "patternProperties", k), k) for k in schema["patternProperties"])
    problems = []
    for at, pattern in found:
        why = ecma_problem(pattern)
        if why is not None:
            problems.append(
                source.problem(
                    at,
                    f"{json.dumps(pattern)} is not a valid ECMA-262 regular expression: {why}",
                    "JSON Schema patterns are ECMA-262 (JavaScript) regular expressions",
                )
            )
    return problems


def _check_ref(
    tree: SpecTree, source: SourceFile, at: Segments, ref: str, slot: Segments
) -> list[Problem]:
    target = parse_ref(ref, source.rel)
    if isinstance(target, RefError):
        return [source.problem(at, target.message, target.hint)]
    document: Any
    dependency: Dependency | Unavailable | None = None
    if target.file:
        shared = tree.file(target.file)
        owner = dependency_of(target.file)
        dependency = tree.dependencies.get(owner) if owner else None
        if isinstance(dependency, Unavailable):
            return [source.problem(at, f"reference {ref!r}: {dependency.message}", dependency.hint)]
        if shared is None and isinstance(dependency, Dependency):
            inner = target.file.partition("/")[2]
            return [
                source.problem(
                    at,
                    f"reference {ref!r}: {dependency.label} ships no {inner}",
                    f"install a version of {dependency.name} that has it, or change the reference",
                )
            ]
        if shared is None:
            return [
                source.problem(at, f"reference {ref!r}: no file {target.file}", "check the path")
            ]
        document = shared.data
    else:
        found, document = resolve_pointer(source.data, "".join("/" + str(s) for s in slot))
    found, _ = resolve_pointer(document, target.fragment)
    if not found:
        where = target.file or "this schema"
        if isinstance(dependency, Dependency):
            where = f"{target.file.partition('/')[2]} of {dependency.label}"
        return [
            source.problem(
                at,
                f"reference {ref!r}: {target.fragment or '/'} does not exist in {where}",
                "point it at an existing definition, e.g. #/$defs/Name",
            )
        ]
    return []


def _file_refs(source: SourceFile) -> set[str]:
    files = set()
    for _, sub in subschemas(source.data):
        ref = sub.get("$ref")
        if isinstance(ref, str):
            target = parse_ref(ref, source.rel)
            if isinstance(target, RefTarget) and target.file:
                files.add(target.file)
    return files


def _check_file_cycles(tree: SpecTree) -> list[Problem]:
    """Shared files may not reference each other in a cycle (recursion lives inside one file)."""
    graph = {s.rel: _file_refs(s) for s in tree.shared}
    problems = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = [*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt]
                source = tree.file(node)
                if source is not None:
                    problems.append(
                        source.problem(
                            (),
                            "shared schema files reference each other in a cycle: "
                            + " -> ".join(cycle),
                            "move the recursive definitions into one file's $defs",
                        )
                    )
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return problems
