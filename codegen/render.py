"""Stage 5, render: models with datamodel-code-generator, everything else with jinja2 templates.

Rendering is pure: a plan (and the previous output, to reuse modules whose inputs did not change)
in, a mapping of package-relative paths to text out. Nothing here touches the output folder.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import sys
import tokenize
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from blade_codegen import __version__
from blade_codegen.dependencies import Dependency
from blade_codegen.plan import CLIENT_MODULE, BuildPlan, SharedPlan, ToolPlan, pascal
from blade_codegen.refs import RefTarget, parse_ref
from blade_codegen.resolve import Slot, canonical_json, shared_key
from blade_codegen.schemas import resolve_pointer, subschemas, transform

# datamodel-code-generator options, pinned with its version: the dated preset is frozen upstream and
# gives mypy --strict clean models. parent-prefixed naming keeps one tool's class names independent
# of every other tool's; skip_root_model inlines scalar definitions instead of wrapping them.
DMCG_PRESET = "standard-py311-20261027"
DMCG_OPTIONS: Mapping[str, Any] = {
    "preset": DMCG_PRESET,
    "disable_timestamp": True,
    "formatters": [],
    "naming_strategy": "parent-prefixed",
    "use_schema_description": True,
    "enum_field_as_literal": "all",
    "skip_root_model": True,
    # Dotted property names stay in one module (its default infers a package from the dots).
    "treat_dot_as_module": False,
}
# Bumped whenever what is done to datamodel-code-generator's output changes (keep_unknown_properties
# is revision 2, keep_integers 3, model_default 4, root models left closed 5): cached modules
# of another revision are generated again (6: discriminated unions).
# 7: typed_annotations, flatten_conflicts, model_shapes, hoist_pattern_values.
POSTPROCESS_REVISION = 7
OPTIONS_SIGNATURE = canonical_json(
    {**{k: str(v) for k, v in DMCG_OPTIONS.items()}, "postprocess": POSTPROCESS_REVISION}
)
# Keywords the models do not carry. ``format`` is an annotation in 2020-12 (the runtime's JSON
# Schema validation is the single truth); as pydantic types (EmailStr, AwareDatetime) it would
# reject strings the schema accepts and change values on the way through.
MODEL_DROPPED = ("format", "$schema", "$id", "$comment", "deprecated")
# Keywords that make a schema without "type" describe objects (while still accepting non-objects).
OBJECT_KEYWORDS = frozenset(
    {"properties", "patternProperties", "additionalProperties", "required", "propertyNames"}
    | {"minProperties", "maxProperties"}
)
NON_OBJECT = {"type": ["array", "boolean", "number", "string", "null"]}
# Where a subschema stands for a value (not a constraint combined with others, as in allOf).
_VALUE_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_VALUE_SINGLES = ("items", "additionalProperties")
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
    return Path(__file__).resolve().parent.parent / "templates"  # a source checkout


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
    env.filters.update(pyrepr=pyrepr, docstring_text=docstring_text, json_text=json_text)
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
                doc.defs[name] = doc.clean(rewritten.get("$defs", {}).get(key, {}))
        doc.defs[cls] = doc.clean(rewritten)
        if not _is_object(slot):
            box = BOX_PREFIX + cls
            boxes[cls] = box
            doc.defs[box] = {
                "type": "object",
                "properties": {"value": {"$ref": f"#/$defs/{cls}"}},
                "required": ["value"],
            }
    # Every slot is a definition: with skip_root_model the document root itself yields no model.
    return {"$defs": dict(sorted(doc.defs.items()))}, boxes


def model_shapes(schema: Any, root_is_value: bool = True) -> Any:
    """``schema`` reshaped (for the model document only) where the generator's reading of it
    would reject values the schema accepts:

    - a subschema with object keywords but no ``type`` (``{"properties": ...}``) accepts any
      non-object value too: it becomes ``anyOf`` of the object and the other JSON types;
    - ``additionalProperties: false`` beside ``patternProperties`` allows the pattern-matching
      names, which a closed model would refuse: it is dropped (the schema still validates them).
    """

    def widen(node: Any) -> Any:
        if (
            isinstance(node, dict)
            and "type" not in node
            and not node.keys() & {"$ref", "allOf", "anyOf", "oneOf", "enum", "const", "not"}
            and node.keys() & OBJECT_KEYWORDS
        ):
            notes = {k: node[k] for k in ("title", "description", "default") if k in node}
            shape = {k: v for k, v in node.items() if k not in notes}
            return {**notes, "anyOf": [{**shape, "type": "object"}, NON_OBJECT]}
        return node

    def edit(node: dict[str, Any]) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        for key in _VALUE_MAPS:
            value = node.get(key)
            if isinstance(value, dict):
                widened = {name: widen(sub) for name, sub in value.items()}
                if any(widened[name] is not sub for name, sub in value.items()):
                    changes[key] = widened
        for key in _VALUE_SINGLES:
            if isinstance(node.get(key), dict) and widen(node[key]) is not node[key]:
                changes[key] = widen(node[key])
        if node.get("additionalProperties") is False and node.get("patternProperties"):
            changes["additionalProperties"] = True
        return {**node, **changes} if changes else node

    shaped = transform(schema, edit)
    return widen(shaped) if root_is_value else shaped


def hoist_pattern_values(schema: Any, stem: str, defs: dict[str, Any]) -> Any:
    """Inline object schemas under ``patternProperties`` moved to named definitions
    (``<stem>Value``...): the generator would otherwise give the value's class the name of the
    object that holds the map, and the map a numbered name."""

    def edit(node: dict[str, Any]) -> dict[str, Any]:
        patterns = node.get("patternProperties")
        if not isinstance(patterns, dict):
            return node
        moved = {}
        for pattern, sub in patterns.items():
            if isinstance(sub, dict) and "properties" in sub:
                name, n = stem + "Value", 1
                while name in defs:
                    n += 1
                    name = f"{stem}Value{n}"
                defs[name] = sub
                moved[pattern] = {"$ref": f"#/$defs/{name}"}
        return {**node, "patternProperties": {**patterns, **moved}} if moved else node

    return transform(schema, edit)


def with_discriminators(schema: Any) -> Any:
    """``schema`` with a ``discriminator`` on each union whose branches are told apart by a
    constant: every branch an object that requires the same property, each with its own ``const``
    string. datamodel-code-generator then writes a pydantic discriminated union, which picks the
    branch by that property instead of trying each. Only the model document gets the keyword."""

    def branch(node: Any) -> Any:
        ref = node.get("$ref") if isinstance(node, dict) else None
        if isinstance(ref, str) and ref.startswith("#/"):
            found, target = resolve_pointer(schema, ref[1:].replace("%25", "%"))
            return target if found else None
        return node

    def tag(node: dict[str, Any]) -> dict[str, Any]:
        for key in ("oneOf", "anyOf"):
            branches = node.get(key)
            if key not in node or "discriminator" in node or not isinstance(branches, list):
                continue
            resolved = [branch(b) for b in branches]
            if len(resolved) < 2 or not all(isinstance(b, dict) for b in resolved):
                return node
            for name in sorted(set.intersection(*(set(b.get("required", [])) for b in resolved))):
                values = [b.get("properties", {}).get(name, {}).get("const") for b in resolved]
                if all(isinstance(v, str) for v in values) and len(set(values)) == len(values):
                    return {**node, "discriminator": {"propertyName": name}}
        return node

    return transform(schema, tag)


def _is_object(slot: Slot) -> bool:
    schema = slot.schema
    return isinstance(schema, dict) and schema.get("type") == "object" and "$ref" not in schema


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
    for key, name in names.items():
        doc.defs[name] = doc.clean(rewritten.get("$defs", {}).get(key, {}))
    if shared.root_class:
        doc.defs[shared.root_class] = doc.clean(rewritten)
    return {"$defs": dict(sorted(doc.defs.items()))}


# -- datamodel-code-generator ------------------------------------------------------------------


def generate_models(document: dict[str, Any]) -> str:
    """Models for one document, in-process (the import costs once per process, not per schema)."""
    from datamodel_code_generator import generate
    from datamodel_code_generator.enums import DataModelType, InputFileType

    options = dict(DMCG_OPTIONS)
    with warnings.catch_warnings():
        # Its warnings (inexact dict maps...) are what looser_than_schema reports, per place.
        warnings.simplefilter("ignore")
        code = generate(
            json.dumps(document),
            input_file_type=InputFileType.JsonSchema,
            output_model_type=DataModelType.PydanticV2BaseModel,
            **options,
        )
    if not isinstance(code, str):
        raise ModelFailure("the generator wrote several modules for one document")
    code = with_key_types(code)
    return keep_integers(keep_unknown_properties(typed_annotations(flatten_conflicts(code))))


def with_key_types(code: str) -> str:
    """``dict[, X]`` (which datamodel-code-generator writes for some ``propertyNames`` maps, and
    which does not parse) as ``dict[str, X]``: JSON object keys are strings. Found with the
    tokenizer, so text inside strings is left alone."""
    if "[," not in code:
        return code
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    found = [
        tokens[i + 1].end
        for i in range(len(tokens) - 2)
        if tokens[i].string == "dict"
        and tokens[i + 1].string == "["
        and tokens[i + 2].string == ","
    ]
    lines = code.splitlines(keepends=True)
    for row, column in reversed(found):
        lines[row - 1] = lines[row - 1][:column] + "str" + lines[row - 1][column:]
    return "".join(lines)


Edit = tuple[int, int, int, str]  # (line, start column, end column, replacement)


def _apply(code: str, edits: list[Edit], imports: str = "") -> str:
    """Apply same-line edits (latest first, so positions hold) and add import lines (at the end:
    ``from __future__`` must stay first); split_module merges imports and keeps the used ones."""
    lines = code.splitlines(keepends=True)
    for row, start, end, text in sorted(edits, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:start] + text + line[end:]
    if not edits:
        return code
    text = "".join(lines)
    return text + ("" if text.endswith("\n") else "\n") + imports


def typed_annotations(code: str) -> str:
    """Annotations mypy --strict accepts where datamodel-code-generator writes others.

    A bare ``list``/``dict`` gets its type arguments; ``constr(...)``, which it writes for a
    constrained string inside a union, becomes ``Annotated[str, StringConstraints(...)]`` (the
    same constraints, in a form mypy takes); and a field defaulting to None that is typed
    without None (an optional property whose schema excludes null) is typed ``X | None``."""
    edits: list[Edit] = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.AnnAssign):
            continue
        subscripted = {
            id(sub.value) for sub in ast.walk(node.annotation) if isinstance(sub, ast.Subscript)
        }
        for sub in ast.walk(node.annotation):
            if (
                isinstance(sub, ast.Name)
                and sub.id in ("list", "dict")
                and id(sub) not in subscripted
            ):
                arguments = "[Any]" if sub.id == "list" else "[str, Any]"
                edits.append(
                    (
                        sub.end_lineno or 0,
                        sub.end_col_offset or 0,
                        sub.end_col_offset or 0,
                        arguments,
                    )
                )
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Name)
                and sub.func.id == "constr"
            ):
                func = sub.func
                edits.append(
                    (
                        func.lineno,
                        func.col_offset,
                        func.end_col_offset or 0,
                        "Annotated[str, StringConstraints",
                    )
                )
                edits.append(
                    (sub.end_lineno or 0, sub.end_col_offset or 0, sub.end_col_offset or 0, "]")
                )
        if isinstance(node.value, ast.Constant) and node.value.value is None:
            typed = node.annotation
            if isinstance(typed, ast.Subscript) and ast.unparse(typed.value) == "Annotated":
                first = typed.slice.elts[0] if isinstance(typed.slice, ast.Tuple) else typed.slice
                typed = first
            if not _admits_none(typed):
                edits.append(
                    (
                        typed.end_lineno or 0,
                        typed.end_col_offset or 0,
                        typed.end_col_offset or 0,
                        " | None",
                    )
                )
    imports = "from typing import Annotated, Any\nfrom pydantic import StringConstraints\n"
    return _apply(code, edits, imports)


def _admits_none(annotation: ast.expr) -> bool:
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _admits_none(annotation.left) or _admits_none(annotation.right)
    return (isinstance(annotation, ast.Constant) and annotation.value is None) or (
        isinstance(annotation, ast.Name) and annotation.id in ("Any", "JsonValue")
    )


def flatten_conflicts(code: str) -> str:
    """Models of an ``allOf`` whose parts type one property differently, without inheritance.

    datamodel-code-generator maps ``allOf`` to subclasses; where a subclass (or two of its bases)
    types an inherited field differently, mypy rejects the override. Such a class is rewritten
    as a plain model holding every field it would inherit, each with the annotation Python's
    method resolution would pick: a value valid against the ``allOf`` is valid against every
    part, so that annotation accepts it (the runtime validates the whole schema first)."""
    tree = ast.parse(code)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    lines = code.splitlines(keepends=True)

    def own(cls: ast.ClassDef) -> dict[str, tuple[str, str]]:
        """field -> (annotation, statement lines)"""
        found = {}
        for statement in cls.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                text = "".join(lines[statement.lineno - 1 : statement.end_lineno])
                found[statement.target.id] = (ast.unparse(statement.annotation), text)
        return found

    def fields(name: str, seen: frozenset[str] = frozenset()) -> dict[str, tuple[str, str]]:
        cls = classes[name]
        merged: dict[str, tuple[str, str]] = {}
        for base in reversed(cls.bases):  # the leftmost base wins, as in the MRO
            if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
                merged.update(fields(base.id, seen | {name}))
        merged.update(own(cls))
        return merged

    edits: list[tuple[int, int, str]] = []  # (first line, last line, replacement lines)
    for cls in classes.values():
        bases = [b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in classes]
        if not bases or len(bases) != len(cls.bases):
            continue
        inherited: dict[str, set[str]] = {}
        for base in bases:
            for field_name, (annotation, _) in fields(base).items():
                inherited.setdefault(field_name, set()).add(annotation)
        mine = own(cls)
        conflict = any(len(a) > 1 for a in inherited.values()) or any(
            name in inherited and inherited[name] != {annotation}
            for name, (annotation, _) in mine.items()
        )
        if not conflict:
            continue
        body = cls.body
        header_end = body[0].lineno - 1
        kept = [s for s in body if not isinstance(s, ast.AnnAssign)]
        text = [f"class {cls.name}(BaseModel):\n"]
        for statement in kept:
            text.extend(lines[statement.lineno - 1 : statement.end_lineno])
        text.extend(statement for _, statement in fields(cls.name).values())
        edits.append((cls.lineno, cls.end_lineno or header_end, "".join(text)))
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first - 1 : last] = [replacement]
    return "".join(lines)


def keep_unknown_properties(code: str) -> str:
    """Models of open objects keep the properties they do not declare (``extra='allow'``).

    datamodel-code-generator writes ``extra='forbid'`` for ``additionalProperties: false`` and
    nothing otherwise, so pydantic would *drop* undeclared properties the schema allows and the
    value would not round-trip. Its global ``extra_fields`` option would open closed objects too.
    Root models (which pydantic forbids an ``extra`` setting) are left as they are.
    """
    lines = code.splitlines(keepends=True)
    inserts: list[tuple[int, int]] = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.ClassDef) or any(
            "RootModel" in ast.unparse(b) for b in node.bases
        ):
            continue
        for statement in node.body:
            value = statement.value if isinstance(statement, ast.Assign) else None
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id == "ConfigDict"
                and not any(k.arg == "extra" for k in value.keywords)
            ):
                inserts.append((value.func.end_lineno or 0, value.func.end_col_offset or 0))
    for row, column in sorted(inserts, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[: column + 1] + "extra='allow', " + line[column + 1 :]
    return "".join(lines)


def keep_integers(code: str) -> str:
    """JSON Schema ``number`` as ``float | int``, not ``float``.

    A ``float`` field turns the JSON integer 9007199254740993 into 9007199254740992.0: the value
    would not round-trip. With ``float | int`` pydantic keeps an int an int (and mypy already
    treats an int as a float). Only ``float`` *names* are rewritten, found with the tokenizer, so
    a description that mentions floats is left alone.
    """
    lines = code.splitlines(keepends=True)
    # A float in a union that already holds int stays as it is: int | float keeps ints already.
    tree = ast.parse(code)
    imports = {
        row
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for row in range(node.lineno, (node.end_lineno or node.lineno) + 1)
    }
    beside_int = {
        (member.lineno, member.col_offset)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
        for members in [_union_members(node)]
        if any(isinstance(m, ast.Name) and m.id == "int" for m in members)
        for member in members
    }
    found = [
        (*token.start, token.string)
        for token in tokenize.generate_tokens(io.StringIO(code).readline)
        if token.type == tokenize.NAME
        and token.string in _RENAMED
        and token.start[0] not in imports
        and not (token.string == "float" and token.start in beside_int)
    ]
    for row, column, name in reversed(found):
        line = lines[row - 1]
        lines[row - 1] = line[:column] + _RENAMED[name] + line[column + len(name) :]
    return "".join(lines)


def _union_members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_members(node.left) + _union_members(node.right)
    return [node]


# Besides float: the e-mail types it writes where a ``format`` sits where no keyword is expected
# (so the model document kept it) would need email-validator and reject what the schema accepts.
_RENAMED = {"float": "float | int", "EmailStr": "str", "NameEmail": "str"}


class ModelFailure(Exception):
    """datamodel-code-generator failed on a document, or wrote code that does not parse."""


def checked_models(document: dict[str, Any]) -> str:
    try:
        code = generate_models(document)
        ast.parse(code)
    except Exception as error:  # its failures have no common base class
        raise ModelFailure(f"{type(error).__name__}: {error}") from error
    return code


def models_with_fallbacks(
    document: dict[str, Any], slots: list[tuple[str, list[str], Slot]]
) -> tuple[str, list[str]]:
    """The models of ``document``; where the generator fails, slots are typed loosely (any JSON
    object, or any JSON value), one at a time in order, until it succeeds. Slots loosened on the
    way that turn out not to be the cause are restored. Returns the code and the loosened slots.

    The JSON Schema still validates every loosened slot: only typed access is lost.
    """
    try:
        return checked_models(document), []
    except ModelFailure:
        pass
    defs = dict(document["$defs"])
    loosened: list[tuple[str, list[str], Slot]] = []
    code = None
    for entry in slots:
        loosened.append(entry)
        try:
            code = checked_models({"$defs": _loosen(defs, loosened)})
            break
        except ModelFailure:
            continue
    if code is None:
        raise ModelFailure("the generator fails even with every slot typed loosely")
    for entry in list(loosened[:-1]):
        trial = [e for e in loosened if e is not entry]
        try:
            code = checked_models({"$defs": _loosen(defs, trial)})
            loosened = trial
        except ModelFailure:
            continue
    return code, [_slot_label(slot) for _, _, slot in loosened]


def _loosen(defs: dict[str, Any], slots: list[tuple[str, list[str], Slot]]) -> dict[str, Any]:
    out = dict(defs)
    for cls, local, slot in slots:
        for name in local:
            out.pop(name, None)
        out[cls] = {"type": "object"} if _is_object(slot) else {}
    return dict(sorted(out.items()))


def _local_names(tool: ToolPlan, slot: Slot) -> list[str]:
    local = slot.schema.get("$defs", {}) if isinstance(slot.schema, dict) else {}
    return [tool.local_defs[(slot.role, slot.key, key)] for key in local]


def _slot_label(slot: Slot) -> str:
    return f"{slot.role} {slot.key}".strip()


# Keywords a pydantic model cannot hold to: where they appear, the model accepts more than the
# schema (the runtime's JSON Schema validation still enforces them).
LOOSER_KEYWORDS = {
    "not": "'not' is enforced by the JSON Schema only",
    "if": "'if'/'then'/'else' is enforced by the JSON Schema only",
    "dependentRequired": "'dependentRequired' is enforced by the JSON Schema only",
    "dependentSchemas": "'dependentSchemas' is enforced by the JSON Schema only",
    "contains": "'contains' is enforced by the JSON Schema only",
    "uniqueItems": "'uniqueItems' is enforced by the JSON Schema only",
    "propertyNames": "'propertyNames' is enforced by the JSON Schema only",
    "patternProperties": "'patternProperties' maps only approximately to a dict",
    "minProperties": "'minProperties' is enforced by the JSON Schema only",
    "maxProperties": "'maxProperties' is enforced by the JSON Schema only",
    "unevaluatedProperties": "'unevaluatedProperties' is enforced by the JSON Schema only",
    "unevaluatedItems": "'unevaluatedItems' is enforced by the JSON Schema only",
    "format": "'format' is an annotation: strings are not parsed into dates, emails, URIs",
}


_SCALARS: Mapping[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def model_default(node: dict[str, Any]) -> bool:
    """Whether a model can carry this node's ``default``: a scalar of the declared type.

    An object or array default would become a dict or list where a model or typed list is
    declared, and a default of another type than the field's is a schema authoring slip; both
    stay in the JSON Schema (an annotation there) and out of the model.
    """
    value = node["default"]
    declared = node.get("type")
    if isinstance(value, dict | list) or value is None or not isinstance(declared, str):
        return False
    kinds = _SCALARS.get(declared)
    if kinds is None or (isinstance(value, bool) and declared != "boolean"):
        return False
    return isinstance(value, kinds)


def looser_than_schema(slots: tuple[Slot, ...]) -> list[tuple[str, str]]:
    """Where each slot's models accept more than its JSON Schema, as (place, why)."""
    found = []
    for slot in slots:
        for path, node in subschemas(slot.bundled):
            where = f"{_slot_label(slot)} {''.join(f'/{p}' for p in path) or '/'}"
            for keyword in sorted(set(node) & set(LOOSER_KEYWORDS)):
                if keyword == "uniqueItems" and node[keyword] is not True:
                    continue
                found.append((where, LOOSER_KEYWORDS[keyword]))
            if "default" in node and not model_default(node):
                found.append((where, "this 'default' is not carried into the model"))
    return found


def escape_controls(code: str) -> str:
    """Write control characters inside (non-raw) string literals as escapes: the values stay the
    same, and linters do not flag invisible characters that spec text carried into docstrings."""
    lines = code.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    pieces, last = [], 0
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        text = token.string
        if token.type != tokenize.STRING or "r" in text[: text.index(text[-1])].lower():
            continue
        if all(c in "\n\t" or c.isprintable() for c in text):
            continue
        begin = offsets[token.start[0] - 1] + token.start[1]
        pieces.append(code[last:begin])
        pieces.append(
            "".join(c if c in "\n\t" or c.isprintable() else f"\\u{ord(c):04x}" for c in text)
        )
        last = offsets[token.end[0] - 1] + token.end[1]
    return "".join(pieces) + code[last:]


@dataclass(frozen=True)
class SplitModule:
    imports: dict[str, set[str]]  # module -> names ("" for plain `import x`)
    body: str
    names: frozenset[str]  # top-level classes and assignments


def split_module(code: str, boxes: Mapping[str, str] | None = None) -> SplitModule:
    """Separate imports from definitions; replace each box class by an alias of its value's type."""
    code = escape_controls(code)
    tree = ast.parse(code)
    lines = code.splitlines()
    imports: dict[str, set[str]] = {}
    keep: list[str] = []
    aliases: list[str] = []
    box_to_alias = {box: cls for cls, box in (boxes or {}).items()}
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            entry = imports.setdefault(node.module or "", set())
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
            annotation = ast.get_source_segment(code, value.annotation)
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
    used = {n.id for n in ast.walk(ast.parse(body)) if isinstance(n, ast.Name)}
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
    schemas = {f"{s.role}:{s.key}" if s.key else s.role: s.bundled for s in spec.slots}
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
            schemas_json=canonical_json(schemas),
            action_inputs=action_inputs,
            children=children,
            action_payloads=action_payloads,
        )
    )
    return text, notes


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
    packages = [d for d in plan.resolved.tree.dependencies.values() if isinstance(d, Dependency)]
    found: list[ChildTool] = []
    for spec_id in tool.spec.children:
        child = ours.get(spec_id)
        if child is not None:
            module = f"{plan.package}.{child.module}"
            input_cls = child.cls(child.spec.input)
            output = child.cls(child.spec.output) if child.spec.output else None
        else:
            holder = next(d for d in packages if spec_id in d.tools)
            python = holder.tools[spec_id]["python"]
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
        header=header("(all specs)"), tools=plan.tools, specs=plan.tools, package=prefix
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
        imports["collections.abc"] = {"Mapping"}
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
                p.key: {"suspendSchema": p.bundled, "resumeSchema": r.bundled}
                for p, r in spec.suspend
            }
        if spec.children:
            entry["children"] = list(spec.children)
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
    return f'{head}, "package": {json.dumps(plan.package)}, "tools": [\n{lines}\n]}}\n'
