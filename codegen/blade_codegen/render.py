"""Stage 5, render: models with datamodel-code-generator, everything else with jinja2 templates.

Rendering is pure: a plan (and the previous output, to reuse modules whose inputs did not change)
in, a mapping of package-relative paths to text out. Nothing here touches the output folder.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import textwrap
import tokenize
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from blade_codegen import __version__
from blade_codegen.dependencies import holder
from blade_codegen.models import (
    ModelFailure,
    generate_models,
    hoist_pattern_values,
    is_object_slot,
    looser_than_schema,
    model_default,
    model_shapes,
    models_with_fallbacks,
    name_branches,
    with_discriminators,
    with_model_patterns,
)
from blade_codegen.plan import CLIENT_MODULE, RESERVED, BuildPlan, SharedPlan, ToolPlan, pascal
from blade_codegen.refs import RefTarget, parse_ref
from blade_codegen.resolve import Slot, shared_key
from blade_codegen.schemas import resolve_pointer, transform
from blade_codegen.syntax import code_lines, offset, parsed, source_of, spliced, tokens_of

# Keywords the models do not carry. ``format`` is an annotation in 2020-12 (the runtime's JSON
# Schema validation is the single truth); as pydantic types (EmailStr, AwareDatetime) it would
# reject strings the schema accepts and change values on the way through.
MODEL_DROPPED = ("format", "$schema", "$id", "$comment", "deprecated")
BOX_PREFIX = "BladeBox"


@dataclass(frozen=True)
class Rendered:
    """Package-relative path -> file text, and the cache key each generated module was made for."""

    files: Mapping[str, str]
    keys: Mapping[str, str]
    looser: Mapping[str, list[str]] = field(default_factory=dict)
    """Per spec id generated in this run: where its models accept more than its schema."""


# -- templates ---------------------------------------------------------------------------------


def _templates_dir() -> Path:
    packaged = resources.files("blade_codegen").joinpath("templates")
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "templates"  # a checkout, or editable


def text_block(text: str, indent: str = "    ", width: int = 72) -> str:
    """A long string as black writes it: one literal if it fits, else adjacent literals in
    parentheses, one per line of the text (long lines wrapped between words); they join back
    to the text exactly."""
    pieces = [
        piece
        for line in text.splitlines(keepends=True)
        for piece in textwrap.wrap(
            line,
            width,
            expand_tabs=False,
            replace_whitespace=False,
            drop_whitespace=False,
            break_on_hyphens=False,
        )
    ]
    if len(pieces) <= 1 and len(pyrepr(text)) <= width:
        return pyrepr(text)
    body = "".join(f"\n{indent}{pyrepr(piece)}" for piece in pieces)
    return f"({body}\n)"


def pyrepr(value: object) -> str:
    """A Python literal for a str, int, bool or None: spec text only ever reaches code like this.

    Strings are written double-quoted, as black writes them, so templates need no reformatting.
    """
    if isinstance(value, str):
        escaped = (
            c if c.isprintable() and c not in '"\\' else repr(c)[1:-1] if c != '"' else '\\"'
            for c in value
        )
        return '"' + "".join(escaped) + '"'
    if value is None or isinstance(value, bool | int):
        return repr(value)
    raise TypeError(f"cannot write {type(value).__name__} as a literal")


def docstring_text(value: str) -> str:
    """Text safe inside a triple-quoted docstring: escapes, quotes and control characters
    neutralised."""
    text = value.replace("\\", "\\\\").replace('"', '\\"')
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def json_text(value: str) -> str:
    """A JSON string literal: safe on one comment line whatever it holds."""
    return json.dumps(value)


def table_cell(value: object) -> str:
    """Text for one cell of a Markdown table: one line, its pipes escaped."""
    return " ".join(str(value).split()).replace("|", "\\|")


@cache
def environment(user_templates: Path | None = None) -> jinja2.Environment:
    loaders: list[jinja2.BaseLoader] = [jinja2.FileSystemLoader(_templates_dir())]
    if user_templates is not None:
        loaders.insert(0, jinja2.FileSystemLoader(user_templates))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(
        pyrepr=pyrepr,
        text_block=text_block,
        docstring_text=docstring_text,
        json_text=json_text,
        cell=table_cell,
    )
    return env


def header(source: str, spec_id: str | None = None, fingerprint: str | None = None) -> str:
    values: dict[str, Any] = {"version": __version__, "source": source}
    if spec_id is not None:
        values.update(spec_id=spec_id, fingerprint=fingerprint)
    return environment().get_template("header.jinja").render(**values).rstrip("\n")


# -- model documents -------------------------------------------------------------------------------


class ModelDocument:
    """Builds the one JSON Schema document datamodel-code-generator turns into a module's models.

    References are rewritten so each definition lands under the class name the plan chose; a
    definition of a shared file that became a class is imported (``customTypePath``), never copied.
    """

    def __init__(self, plan: BuildPlan, shared_classes: Mapping[tuple[str, str], str]) -> None:
        self.plan = plan
        self.shared_classes = shared_classes  # (file, fragment) -> dotted import path
        self.defs: dict[str, Any] = {}

    def imported(self, target: RefTarget, siblings: dict[str, Any]) -> dict[str, Any]:
        dotted = self.shared_classes.get((target.file, target.fragment))
        if dotted is not None:
            return {**siblings, "customTypePath": dotted}
        name = "Shared" + pascal(shared_key(target))
        if name not in self.defs:
            self.defs[name] = True  # placeholder: guards recursion
            source = self.plan.resolved.tree.file(target.file)
            assert source is not None
            _, content = resolve_pointer(source.data, target.fragment)
            # Inside copied content, a local reference is a reference into that shared file.
            self.defs[name] = self.clean(self.rewrite(content, target.file, _no_local))
        return {**siblings, "$ref": f"#/$defs/{name}"}

    def rewrite(
        self, schema: Any, file: str, local: Callable[[str], Callable[[str], str | None]]
    ) -> Any:
        """Rewrite every $ref of ``schema`` (written in ``file``); ``local`` maps same-document
        fragments to new references (None: treat as a shared-file reference)."""

        def edit(node: dict[str, Any]) -> dict[str, Any]:
            node = with_model_patterns(node)
            if "default" in node and not model_default(node):
                node = {k: v for k, v in node.items() if k != "default"}
            ref = node.get("$ref")
            if not isinstance(ref, str):
                if not any(k in node for k in MODEL_DROPPED):
                    return node
                return {k: v for k, v in node.items() if k not in MODEL_DROPPED}
            target = parse_ref(ref, file)
            assert isinstance(target, RefTarget)
            siblings = {k: v for k, v in node.items() if k != "$ref" and k not in MODEL_DROPPED}
            if not target.file:
                mapped = local(file)(target.fragment)
                if mapped is not None:
                    return {**siblings, "$ref": mapped}
                target = RefTarget(file, target.fragment)
            return self.imported(target, siblings)

        return transform(schema, edit)

    @staticmethod
    def clean(schema: Any) -> Any:
        if isinstance(schema, dict):
            return {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
        return schema


def _no_local(file: str) -> Callable[[str], str | None]:
    return lambda fragment: None


def _defs_pointer(fragment: str, names: Mapping[str, str], root: str) -> str | None:
    """Map a fragment of a document whose ``$defs`` were renamed and whose root sits at ``root``."""
    parts = fragment.split("/")
    if len(parts) >= 3 and parts[1] in ("$defs", "definitions"):
        key = parts[2].replace("~1", "/").replace("~0", "~")
        if key in names:
            return "#/$defs/" + "/".join([names[key], *parts[3:]])
    return root + fragment


def tool_document(
    tool: ToolPlan, plan: BuildPlan, shared_classes: Mapping[tuple[str, str], str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The model document of one tool, and the box class of each slot that is not an object."""
    doc = ModelDocument(plan, shared_classes)
    spec = tool.spec
    boxes: dict[str, str] = {}
    # Classes of the shared files this tool uses may be imported: never take their names.
    taken = tool.names | {
        dotted.rpartition(".")[2]
        for (file, _), dotted in shared_classes.items()
        if file in spec.shared_files
    }
    for slot in spec.slots:
        cls = tool.cls(slot)
        names = {
            key: tool.local_defs[(slot.role, slot.key, key)]
            for key in (slot.schema.get("$defs", {}) if isinstance(slot.schema, dict) else {})
        }
        where = f"#/$defs/{cls}"

        def local(file: str, names: Mapping[str, str] = names, where: str = where) -> Any:
            return lambda fragment: _defs_pointer(fragment, names, where)

        shaped = with_discriminators(model_shapes(slot.schema, slot.role != "input"))
        rewritten = doc.rewrite(shaped, spec.source.rel, local)
        rewritten = hoist_pattern_values(rewritten, cls, doc.defs)
        if isinstance(rewritten, dict):
            for key, name in names.items():
                definition = doc.clean(rewritten.get("$defs", {}).get(key, {}))
                doc.defs[name] = name_branches(definition, name, doc.defs, taken)
        doc.defs[cls] = name_branches(doc.clean(rewritten), cls, doc.defs, taken)
        if not is_object_slot(slot):
            box = BOX_PREFIX + cls
            boxes[cls] = box
            doc.defs[box] = {
                "type": "object",
                "properties": {"value": {"$ref": f"#/$defs/{cls}"}},
                "required": ["value"],
            }
    # Every slot is a definition: with skip_root_model the document root itself yields no model.
    return {"$defs": dict(sorted(doc.defs.items()))}, boxes


def shared_document(
    shared: SharedPlan, plan: BuildPlan, shared_classes: Mapping[tuple[str, str], str]
) -> dict[str, Any]:
    doc = ModelDocument(plan, shared_classes)
    names = dict(shared.def_classes)
    file = shared.source.rel

    def local(in_file: str) -> Callable[[str], str | None]:
        if in_file != file:
            return lambda fragment: None
        if shared.root_class is None:
            return lambda fragment: _defs_pointer(fragment, names, "") if fragment else None
        root = f"#/$defs/{shared.root_class}"
        return lambda fragment: _defs_pointer(fragment, names, root)

    shaped = with_discriminators(model_shapes(shared.source.data))
    rewritten = doc.rewrite(shaped, file, local)
    taken = {*RESERVED, *names.values(), *([shared.root_class] if shared.root_class else [])}
    for key, name in names.items():
        definition = doc.clean(rewritten.get("$defs", {}).get(key, {}))
        doc.defs[name] = name_branches(definition, name, doc.defs, taken)
    if shared.root_class:
        root = doc.clean(rewritten)
        doc.defs[shared.root_class] = name_branches(root, shared.root_class, doc.defs, taken)
    return {"$defs": dict(sorted(doc.defs.items()))}


# -- module text -----------------------------------------------------------------------------


def _local_names(tool: ToolPlan, slot: Slot) -> list[str]:
    local = slot.schema.get("$defs", {}) if isinstance(slot.schema, dict) else {}
    return [tool.local_defs[(slot.role, slot.key, key)] for key in local]


def escape_controls(code: str) -> str:
    """Write control characters inside (non-raw) string literals as escapes: the values stay the
    same, and linters do not flag invisible characters that spec text carried into docstrings."""
    if code.replace("\n", "").replace("\t", "").isprintable():
        return code  # nothing to escape anywhere (most modules): no need to tokenize
    escaped = []
    for token in tokens_of(code):
        text = token.string
        if token.type != tokenize.STRING or "r" in text[: text.index(text[-1])].lower():
            continue
        if all(c in "\n\t" or c.isprintable() for c in text):
            continue
        text = "".join(c if c in "\n\t" or c.isprintable() else f"\\u{ord(c):04x}" for c in text)
        escaped.append((offset(code, *token.start), offset(code, *token.end), text))
    return spliced(code, escaped)


# Where the generator imports a name from a deprecated place: MISSING left pydantic.experimental
# in pydantic 2.14 (the old path warns on import).
_MOVED_MODULES = {"pydantic.experimental.missing_sentinel": "pydantic"}


@dataclass(frozen=True)
class SplitModule:
    imports: dict[str, set[str]]  # module -> names ("" for plain `import x`)
    body: str
    names: frozenset[str]  # top-level classes and assignments


def split_module(code: str, boxes: Mapping[str, str] | None = None) -> SplitModule:
    """Separate imports from definitions; replace each box class by an alias of its value's type."""
    code = escape_controls(code)
    tree = parsed(code)
    lines = [line.rstrip("\r\n") for line in code_lines(code)]
    imports: dict[str, set[str]] = {}
    keep: list[str] = []
    aliases: list[str] = []
    box_to_alias = {box: cls for cls, box in (boxes or {}).items()}
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            module = _MOVED_MODULES.get(node.module or "", node.module or "")
            entry = imports.setdefault(module, set())
            entry.update(
                a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names
            )
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        segment = "\n".join(lines[start - 1 : node.end_lineno])
        if isinstance(node, ast.ClassDef) and node.name in box_to_alias:
            value = next(
                s for s in node.body if isinstance(s, ast.AnnAssign) and _target(s) == "value"
            )
            annotation = source_of(code, value.annotation)
            if annotation != box_to_alias[node.name]:  # else the slot's class is the type
                aliases.append(f"{box_to_alias[node.name]}: TypeAlias = {annotation}")
            names.add(box_to_alias[node.name])
            continue
        if any(box in segment for box in box_to_alias) and isinstance(node, ast.Expr):
            continue  # BladeBoxX.model_rebuild()
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            names.update(_assigned(node))
        keep.append(segment)
    if aliases:
        imports.setdefault("typing", set()).add("TypeAlias")
    body = "\n\n\n".join(keep + aliases)
    used = {n.id for n in ast.walk(parsed(body)) if isinstance(n, ast.Name)}
    imports = {
        module: kept
        for module, listed in imports.items()
        if (kept := {name for name in listed if name.split(" as ")[-1] in used})
    }
    return SplitModule(imports, body, frozenset(names))


def _target(node: ast.AnnAssign) -> str | None:
    return node.target.id if isinstance(node.target, ast.Name) else None


def _assigned(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _name_order(name: str) -> tuple[int, str]:
    """isort's order-by-type: CONSTANTS, then Classes, then functions and variables."""
    base = name.split(" as ")[0]
    kind = 0 if base.isupper() and len(base) > 1 else 1 if base[:1].isupper() else 2
    return kind, base.lower()


def import_block(package: str, module: str, *groups: Mapping[str, set[str]]) -> str:
    """One isort-ordered import block: standard library, third party, then this package's own
    modules as relative imports (so the order holds whatever the user's first-party setting)."""
    merged: dict[str, set[str]] = {}
    for group in groups:
        for name, names in group.items():
            if name == package or name.startswith(package + "."):
                depth = len(module.split("."))
                name = "." * depth + name[len(package) + 1 :]
            merged.setdefault(name, set()).update(names)
    sections: list[list[str]] = [[], [], []]
    for name in sorted(merged, key=lambda m: (-(len(m) - len(m.lstrip("."))), m.lstrip("."))):
        top = name.split(".")[0]
        section = 2 if name.startswith(".") else 0 if top in sys.stdlib_module_names else 1
        # isort's default: aliased names each get their own statement, ordered by first name.
        plain = sorted((n for n in merged[name] if " as " not in n), key=_name_order)
        statements = [plain] if plain else []
        statements += [[n] for n in merged[name] if " as " in n]
        for listed in sorted(statements, key=lambda g: _name_order(g[0])):
            sections[section].append(f"from {name} import {', '.join(listed)}")
    return "\n\n".join("\n".join(lines) for lines in sections if lines)


# -- modules -----------------------------------------------------------------------------------


def render_shared(
    shared: SharedPlan, plan: BuildPlan, shared_classes: Mapping[tuple[str, str], str]
) -> tuple[str, SplitModule]:
    document = shared_document(shared, plan, shared_classes)
    split = split_module(generate_models(document))
    _refuse_shadowing(shared.source.rel, split)
    text = (
        environment()
        .get_template("shared_module.py.jinja")
        .render(
            header=header(shared.source.rel),
            imports=import_block(plan.package, shared.module, split.imports),
            models=split.body,
        )
    )
    return text, split


def render_tool(
    tool: ToolPlan, plan: BuildPlan, shared_classes: Mapping[tuple[str, str], str]
) -> tuple[str, list[str]]:
    """The module of one tool, and where its models are looser than its JSON Schema."""
    spec = tool.spec
    document, boxes = tool_document(tool, plan, shared_classes)
    slots = [(tool.cls(slot), _local_names(tool, slot), slot) for slot in spec.slots]
    try:
        code, loosened = models_with_fallbacks(document, slots)
    except ModelFailure as failure:
        raise ModelFailure(f"{spec.source.rel}: {spec.id}: {failure}") from failure
    split = split_module(code, boxes)
    notes = [f"{label}: the generator failed; typed as any JSON object/value" for label in loosened]
    notes += [f"{at}: {why}" for at, why in looser_than_schema(spec.slots)]
    data = list(spec.data)
    suspend = list(spec.suspend)
    backend = spec.execution == "backend"
    output_type = tool.cls(spec.output) if spec.output else "JsonValue"
    context_type = tool.cls(spec.context) if spec.context else "None"
    own: dict[str, set[str]] = {"typing": {"Final", "Literal", "TypeAlias"}}
    runtime = own.setdefault("blade_runtime", {"load_schemas"})
    if spec.output is None:
        own.setdefault("pydantic", set()).add("JsonValue")
    if data:
        runtime.add("DataChannel")
    if backend:
        runtime.update({"BackendToolSpec", "Execution"})
        own["typing"].add("Protocol")
        if data:
            runtime.add("DataItem")
            own.setdefault("collections.abc", set()).add("Sequence")
        if suspend:
            runtime.update({"InitialEntry", "ResumeEntry", "SuspendPoint"})
            own["typing"].add("NoReturn")
        if len(data) > 1 or len(suspend) > 1:
            own["typing"].update({"overload", "Any"})
        if spec.capabilities:
            runtime.add("CapabilitySpec")
            own["typing"].add("Any")
        if spec.lease:
            runtime.add("Lease")
        if spec.effects or spec.effect_permissions:
            runtime.update({"Effect", "EffectsSpec"})
        if spec.effect_permissions:
            runtime.add("ToolSpec")
            own["typing"].add("Any")
        if spec.children:
            runtime.add("ToolSpec")
            if len(spec.children) > 1:
                own["typing"].update({"overload", "Any"})
            else:
                own["typing"].add("Any")
        params = [
            f"{tool.base}Id",
            tool.cls(spec.input),
            output_type,
            context_type,
            f"{tool.base}Execution",
        ]
        spec_class = "BackendToolSpec"
    else:
        runtime.add("ClientToolSpec")
        params = [f"{tool.base}Id", tool.cls(spec.input), output_type]
        spec_class = "ClientToolSpec"
    client = own.setdefault("blade_runtime.client", {"CallError", "CallSkipped", "CallSuccess"})
    client.add("Parser")
    if backend:  # any backend call may wait on a permission request
        client.update({"CallPending", "PermissionRequestAction"})
    if tool.actions:
        client.update({"CallPending", "PendingActionBase"})
        if len(tool.actions) > 1:
            own["typing"].add("Annotated")
            own.setdefault("pydantic", set()).add("Field")
    if data:
        runtime.add("DataItem")
        own.setdefault("pydantic", set()).update({"BaseModel", "ConfigDict"})
        if any(tool.data_fields[ch.key] != ch.key for ch in data):
            own["pydantic"].add("Field")
    if backend:
        action_inputs = [tool.cls(point) for point, _ in suspend]
        action_payloads = [tool.cls(resume) for _, resume in suspend]
    else:
        assert spec.output is not None, "validate requires an output schema of client tools"
        action_inputs, action_payloads = [tool.cls(spec.input)], [tool.cls(spec.output)]
    children = child_tools(tool, plan)
    for child in children:
        parent, _, leaf = child.module.rpartition(".")
        own.setdefault(parent, set()).add(f"{leaf} as {child.alias}")
        if child.output == "JsonValue":
            own.setdefault("pydantic", set()).add("JsonValue")
    if plan.guidance is not None:
        own.setdefault(plan.package, set()).add("GUIDANCE")
    _refuse_shadowing(spec.source.rel, split, own)
    schemas = {f"{s.role}:{s.key}" if s.key else s.role: s.bundled for s in spec.slots}
    for name, capability in spec.capabilities.items():
        schemas[f"capability:{name}"] = capability.get("configSchema", True)
    text = (
        environment()
        .get_template("tool_module.py.jinja")
        .render(
            header=header(spec.source.rel, spec.id, spec.fingerprint),
            fallbacks=notes,
            imports=import_block(plan.package, tool.module, split.imports, own),
            models=split.body,
            spec=spec,
            plan=tool,
            base=tool.base,
            data=data,
            suspend=suspend,
            output_type=output_type,
            context_type=context_type,
            spec_class=spec_class,
            spec_params=", ".join(params),
            # the spec's own key order (deterministic: the file's), not sorted: forms, tool
            # lists and OpenAPI documents show properties as the spec lists them
            schemas_json=json.dumps(schemas, separators=(",", ":"), ensure_ascii=False),
            action_inputs=action_inputs,
            children=children,
            action_payloads=action_payloads,
            guidance=plan.guidance is not None,
            # every key present (the template is strict): a spec may declare either, or neither
            effects={"context": None, "message": None} | {s.key: s for s in spec.effects},
        )
    )
    return text, notes


def _refuse_shadowing(source: str, split: SplitModule, *imports: Mapping[str, set[str]]) -> None:
    """A class named like an import would replace it: the module would fail at import. plan
    keeps spec-derived names off the reserved ones; this catches what it could not foresee."""
    imported = {
        name.split(" as ")[-1]
        for group in (split.imports, *imports)
        for names in group.values()
        for name in names
    }
    clash = sorted(split.names & imported)
    if clash:
        raise ModelFailure(f"{source}: class {clash[0]} would shadow the import of that name")


@dataclass(frozen=True)
class ChildTool:
    spec_id: str
    module: str  # absolute: this package's module, or a spec package's
    alias: str  # the name the parent module imports it as
    input: str
    output: str  # a class or alias of the module, or JsonValue


def child_tools(tool: ToolPlan, plan: BuildPlan) -> list[ChildTool]:
    """Where the typed input and output of each child of ``tool`` are (validate found them all)."""
    ours = {t.spec.id: t for t in plan.tools}
    found: list[ChildTool] = []
    for spec_id in tool.spec.children:
        child = ours.get(spec_id)
        if child is not None:
            module = f"{plan.package}.{child.module}"
            input_cls = child.cls(child.spec.input)
            output = child.cls(child.spec.output) if child.spec.output else None
        else:
            package = holder(plan.resolved.tree, spec_id)
            assert package is not None, "validate found every child"
            python = package.tools[spec_id]["python"]
            module, input_cls, output = python["module"], python["input"], python["output"]
        alias = "child_" + module.rpartition(".")[2]
        while alias in (c.alias for c in found):
            alias += "_"
        found.append(ChildTool(spec_id, module, alias, input_cls, output or "JsonValue"))
    return found


def render(
    plan: BuildPlan,
    previous: Mapping[str, tuple[str, str]],
    on_module: Callable[[str], None] = lambda path: None,
) -> Rendered:
    """Every file of the package. ``previous`` maps a path to (cache key, text) of the last build:
    a module whose key is unchanged is reused as it is, without running the generator."""
    files: dict[str, str] = {}
    keys: dict[str, str] = {}
    looser: dict[str, list[str]] = {}
    prefix = plan.package
    shared_classes: dict[tuple[str, str], str] = {}
    for shared in plan.shared:
        old = previous.get(shared.path)
        if shared.dependency is not None:
            # A spec package's class is imported from the installed package, never copied.
            installed = shared.dependency.folder / shared.path
            names = split_module(installed.read_text("utf-8")).names if installed.is_file() else ()
            _register_classes(shared_classes, shared, names, shared.dependency.package)
            continue
        if old is not None and old[0] == shared.cache_key:
            text = old[1]
            names = split_module(text).names
        else:
            on_module(shared.path)
            text, split = render_shared(shared, plan, shared_classes)
            names = split.names
        files[shared.path] = text
        keys[shared.path] = shared.cache_key
        _register_classes(shared_classes, shared, names, prefix)
    for tool in plan.tools:
        old = previous.get(tool.path)
        if old is not None and old[0] == tool.cache_key:
            files[tool.path] = old[1]
        else:
            on_module(tool.path)
            files[tool.path], notes = render_tool(tool, plan, shared_classes)
            if notes:
                looser[tool.spec.id] = notes
        keys[tool.path] = tool.cache_key
    env = environment()
    for package in plan.packages:
        path = (package.replace(".", "/") + "/" if package else "") + "__init__.py"
        if package:
            files[path] = header("(package folder)") + "\n"
    files["__init__.py"] = env.get_template("package_init.py.jinja").render(
        header=header("(all specs)"),
        tools=plan.tools,
        specs=plan.tools,
        package=prefix,
        guidance=plan.guidance,
    )
    path = CLIENT_MODULE + ".py"
    files[path], keys[path] = _client_module(plan, previous, on_module)
    files["py.typed"] = ""
    files["manifest.json"] = manifest(plan)
    return Rendered(files, keys, looser)


def _register_classes(
    shared_classes: dict[tuple[str, str], str],
    shared: SharedPlan,
    names: Iterable[str],
    package: str,
) -> None:
    """Record the dotted path of every class a shared module holds, by (file, fragment)."""
    dotted = f"{package}.{shared.module}"
    present = set(names)
    if shared.root_class in present:
        shared_classes[(shared.source.rel, "")] = f"{dotted}.{shared.root_class}"
    for key, cls in shared.def_classes.items():
        if cls in present:
            fragment = "/$defs/" + key.replace("~", "~0").replace("/", "~1")
            shared_classes[(shared.source.rel, fragment)] = f"{dotted}.{cls}"


def _client_module(
    plan: BuildPlan, previous: Mapping[str, tuple[str, str]], on_module: Callable[[str], None]
) -> tuple[str, str]:
    """The package's typed client, and its cache key. It changes only when a tool's name, data
    channels or pending actions do, so black (which formats it) runs only then."""
    aliases: dict[str, str] = {}
    for tool in plan.tools:
        alias = tool.module.replace(".", "_")
        while alias in aliases.values():
            alias += "_"
        aliases[tool.module] = alias
    imports: dict[str, set[str]] = {
        "blade_runtime.client": {"ToolClient"},
        "typing": set(),
    }
    for tool in plan.tools:
        parent, _, leaf = f"{plan.package}.{tool.module}".rpartition(".")
        imports.setdefault(parent, set()).add(f"{leaf} as {aliases[tool.module]}")
    actions = [
        (aliases[tool.module], cls, kind) for tool in plan.tools for cls, kind, _ in tool.actions
    ]
    if actions:
        imports["blade_runtime.client"].add("Parser")
        imports["typing"].update({"Any", "Final", "TypeAlias"})
        imports["collections.abc"] = {"AsyncIterator", "Mapping"}
        if len(actions) > 1:
            imports["typing"].add("Annotated")
            imports["pydantic"] = {"Field"}
    raw = (
        environment()
        .get_template("package_client.py.jinja")
        .render(
            header=header("(all specs)"),
            imports=import_block(plan.package, "client", {k: v for k, v in imports.items() if v}),
            tools=[(aliases[tool.module], tool) for tool in plan.tools],
            actions=actions,
        )
    )
    key = hashlib.sha256(raw.encode()).hexdigest()
    old = previous.get(CLIENT_MODULE + ".py")
    if old is not None and old[0] == key:
        return old[1], key
    on_module(CLIENT_MODULE + ".py")
    return raw, key


def manifest(plan: BuildPlan) -> str:
    """The serializable tool list (no context schemas, no code), with where each tool's module
    and typed input and output are (another spec package's build imports them)."""
    entries = []
    tools = {tool.spec.id: tool for tool in plan.tools}
    for spec in plan.resolved.specs:
        entry: dict[str, Any] = {
            "id": spec.id,
            "name": spec.name,
            "description": spec.description,
            "kind": spec.kind,
            "sideEffect": spec.side_effect,
            "execution": spec.execution,
            "timeoutMs": spec.timeout_ms,
            "inputSchema": spec.input.bundled,
        }
        if spec.output is not None:
            entry["outputSchema"] = spec.output.bundled
        if spec.data:
            entry["dataSchemas"] = {s.key: s.bundled for s in spec.data}
        if spec.suspend:
            entry["suspend"] = {
                p.key: {
                    "suspendSchema": p.bundled,
                    "resumeSchema": r.bundled,
                    **(
                        {"expiresAfterMs": spec.deadlines[p.key]} if p.key in spec.deadlines else {}
                    ),
                }
                for p, r in spec.suspend
            }
        if spec.effects or spec.effect_permissions:
            entry["effects"] = {s.key: s.bundled for s in spec.effects}
            if spec.effect_permissions:
                entry["effects"]["permissions"] = {"tools": list(spec.effect_permissions)}
        if spec.children:
            entry["children"] = list(spec.children)
        if spec.lease:
            entry["lease"] = True
        if spec.concurrency is not None:
            entry["concurrency"] = spec.concurrency
        if spec.locks:
            entry["locks"] = list(spec.locks)
        if spec.caller:
            entry["caller"] = True
        if spec.title is not None:
            entry["title"] = spec.title
        if spec.aliases:
            entry["aliases"] = list(spec.aliases)
        if spec.group is not None:
            entry["group"] = spec.group
        if spec.exposure != "model":
            entry["exposure"] = spec.exposure
        if spec.permissions:
            entry["permissions"] = dict(sorted(spec.permissions.items()))
        if spec.environment:
            entry["environment"] = dict(sorted(spec.environment.items()))
        tool = tools[spec.id]
        entry["python"] = {
            "module": f"{plan.package}.{tool.module}",
            "input": tool.cls(spec.input),
            "output": tool.cls(spec.output) if spec.output else None,
        }
        entry["fingerprint"] = spec.fingerprint
        entries.append(entry)
    # One tool a line: a diff shows which tools changed, and json's C encoder (used only without
    # indent) keeps a 1,000-tool manifest cheap to write on every build.
    head = json.dumps({"format": 1, "generator": f"blade-codegen {__version__}"})[:-1]
    lines = ",\n".join(json.dumps(tool, ensure_ascii=False) for tool in entries)
    guidance = "" if plan.guidance is None else f', "guidance": {json.dumps(plan.guidance)}'
    return f'{head}, "package": {json.dumps(plan.package)}{guidance}, "tools": [\n{lines}\n]}}\n'
