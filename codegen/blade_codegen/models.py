"""What datamodel-code-generator sees and what comes back: faithful, mypy-clean models.

The schema side reshapes a model document where the generator's reading would reject values the
schema accepts (typeless object schemas, closed maps beside patternProperties) or name classes
badly (patternProperties values), and tags const-discriminated unions. The code side repairs and
tightens what the generator writes (flattened allOf conflicts, typed bare containers, open models
that keep unknown properties, numbers that stay integers) and lists where a model stays looser
than its schema. The runtime validates the JSON Schema first: it is the single truth.
"""

from __future__ import annotations

import ast
import copy
import json
import tokenize
import warnings
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from functools import cache
from typing import Any

import jsonschema_rs

from blade_codegen.aliases import distinct_field_names
from blade_codegen.cheaper import bounds_per_member, by_name_only_with_aliases, inline_scalar_roots
from blade_codegen.cycles import value_cycles_expanded
from blade_codegen.patterns import model_pattern
from blade_codegen.plan import pascal
from blade_codegen.resolve import Slot, canonical_json
from blade_codegen.schemas import resolve_pointer, subschemas, transform
from blade_codegen.syntax import (
    ast_offset,
    code_lines,
    config_call,
    is_name,
    node_span,
    nodes,
    offset,
    parsed,
    source_of,
    spliced,
    tokens_of,
    union_members,
    with_imports,
)

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
    "use_missing_sentinel": True,
}


# Bumped whenever what is done to datamodel-code-generator's output changes (keep_unknown_properties
# is revision 2, keep_integers 3, model_default 4, root models left closed 5): cached modules
# of another revision are generated again (6: discriminated unions).
# 7: typed_annotations, flatten_conflicts, model_shapes, hoist_pattern_values; 8: union_bases;
# 9: optional non-nullable properties default to pydantic.MISSING; patterns translated; defaults
# checked against their schema; object keywords moved into union branches; 10: long lines wrapped;
# 11: long JSON literals split too; 12: typed keywords into union branches, titled classes;
# 13: scalar item roots inlined, numeric bounds per member, validate_by_name only with aliases,
# no protected namespaces where a field is named model_dump_ or model_validate_; 14: ruff's
# layout before black's (black's result can differ from black alone in rare cases); 15: lines and
# columns counted as the parser counts them (a U+2028 in a literal; edits after non-ASCII text);
# 16: a literal that fits a line of its own but not its line is moved to one (in parentheses);
# 17: value definitions near reference cycles written out, no field named like another's
# property, patterns both engines read, open pattern maps typed as maps of anything.
# 18: typeless array keywords widened, additionalProperties open beside patternProperties,
# unevaluatedProperties/Items out of the model unless they mean additionalProperties.
# 19: typeless allOf and anyOf parts widened with their node (found by the differential check).
POSTPROCESS_REVISION = 19


OPTIONS_SIGNATURE = canonical_json(
    {**{k: str(v) for k, v in DMCG_OPTIONS.items()}, "postprocess": POSTPROCESS_REVISION}
)


# Keywords that make a schema without "type" describe objects (while still accepting non-objects).
OBJECT_KEYWORDS = frozenset(
    {"properties", "patternProperties", "additionalProperties", "required", "propertyNames"}
    | {"minProperties", "maxProperties"}
)


# Keywords that the generator reads as "an array" where a schema without "type" says them (the
# schema still accepts every non-array).
ARRAY_KEYWORDS = frozenset({"items", "prefixItems"})
_JSON_TYPES = ("object", "array", "boolean", "number", "string", "null")

NON_OBJECT = {"type": ["array", "boolean", "number", "string", "null"]}
# A schema that accepts every value and that the generator reads as one (beside
# patternProperties it reads ``{}`` and ``true`` as nothing said).
ANY_VALUE = {"not": False}


# Where a subschema stands for a value (not a constraint combined with others, as in allOf).
_VALUE_MAPS = ("properties", "patternProperties", "$defs", "definitions")


_VALUE_SINGLES = ("items", "additionalProperties")


def model_shapes(schema: Any, root_is_value: bool = True) -> Any:
    """``schema`` reshaped (for the model document only) where the generator's reading of it
    would reject values the schema accepts:

    - a subschema with object or array keywords but no ``type`` (``{"properties": ...}``,
      ``{"items": ...}``) accepts every value of the other types too: it becomes ``anyOf`` of
      the object (or array) and the other JSON types;
    - ``additionalProperties`` beside ``patternProperties`` says nothing about the names a
      pattern matches, which a closed model (or one whose every extra value is typed) would
      refuse: any value is allowed there (the schema still validates them);
    - a map of ``patternProperties`` alone that allows other names too (no
      ``additionalProperties``, ``true`` or a schema) would become a dict whose keys must match
      the patterns: its other values are said to be anything, and the generator writes a dict
      of any string to any value;
    - ``unevaluatedProperties`` and ``unevaluatedItems`` (see ``without_unevaluated``).
    """

    def widen(node: Any) -> Any:
        if (
            not isinstance(node, dict)
            or "type" in node
            or node.keys() & {"$ref", "oneOf", "enum", "const", "not"}
        ):
            return node
        keys = set(node)
        for combinator in _TYPELESS_COMBINATORS:  # their parts say no type either: see below
            parts = node.get(combinator)
            if parts is None:
                continue
            if not isinstance(parts, list) or not all(_typeless(part) for part in parts):
                return node
            keys |= {key for part in parts if isinstance(part, dict) for key in part}
        objects, arrays = bool(keys & OBJECT_KEYWORDS), bool(keys & ARRAY_KEYWORDS)
        if not objects and not arrays:
            return node
        notes = {k: node[k] for k in ("title", "description", "default") if k in node}
        shape = {k: v for k, v in node.items() if k not in notes}
        branches = []
        if objects:
            branches.append({**_narrowed(shape, _ARRAY_ONLY), "type": "object"})
        if arrays:
            branches.append({**_narrowed(shape, OBJECT_KEYWORDS), "type": "array"})
        taken = {"object"} if objects else set()
        taken |= {"array"} if arrays else set()
        branches.append({"type": [t for t in _JSON_TYPES if t not in taken]})
        return {**notes, "anyOf": branches}

    def edit(node: dict[str, Any]) -> dict[str, Any]:
        node = without_unevaluated(node)
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
        extra = node.get("additionalProperties", True)
        if node.get("patternProperties") and "properties" not in node:
            if extra is not False:
                changes["additionalProperties"] = ANY_VALUE
            else:
                changes["additionalProperties"] = True
        elif node.get("patternProperties") and extra not in (True, {}):
            changes["additionalProperties"] = True
        node = {**node, **changes} if changes else node
        return typed_keywords_into_branches(single_all_of(node), schema)

    shaped = transform(schema, edit)
    return widen(shaped) if root_is_value else shaped


# Keywords by which a schema takes in annotations from subschemas in place: beside them,
# ``unevaluated*`` also sees the properties and items those subschemas evaluated.
_IN_PLACE = frozenset(
    {"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "$ref"}
    | {"$dynamicRef", "contains"}
)


def without_unevaluated(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` without ``unevaluatedProperties`` and ``unevaluatedItems``, which the generator
    reads as the node's own ``additionalProperties`` and items: beside subschemas that evaluate
    more (an ``allOf``, a ``$ref``...) that refuses properties and items the schema accepts.
    Where nothing beside it evaluates anything, ``unevaluatedProperties`` is the node's
    ``additionalProperties`` and stays in the model as that."""
    if "unevaluatedProperties" not in node and "unevaluatedItems" not in node:
        return node
    rest = _without(node, {"unevaluatedProperties", "unevaluatedItems"})
    if unevaluated_is_additional(node):
        rest["additionalProperties"] = node["unevaluatedProperties"]
    return rest


def unevaluated_is_additional(node: Mapping[str, Any]) -> bool:
    """Whether this node's ``unevaluatedProperties`` means what ``additionalProperties`` would."""
    return (
        "unevaluatedProperties" in node
        and "additionalProperties" not in node
        and not node.keys() & _IN_PLACE
    )


def _without(node: Mapping[str, Any], keys: AbstractSet[str]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in keys}


# A typeless node's allOf and anyOf parts that say no type either accept every value of the
# types their keywords do not constrain, as the node itself does (a oneOf's would match twice).
_TYPELESS_COMBINATORS = ("allOf", "anyOf")
_TYPED = frozenset({"type", "$ref", "enum", "const", "not", "allOf", "anyOf", "oneOf"})


def _typeless(part: Any) -> bool:
    """A combinator's part that constrains no type (no ``type``, reference or nested choice)."""
    return part is True or (isinstance(part, dict) and not part.keys() & _TYPED)


def _narrowed(node: Mapping[str, Any], keys: AbstractSet[str]) -> dict[str, Any]:
    """``node`` without ``keys``, in its typeless combinators' parts too."""
    narrowed = _without(node, keys)
    for combinator in _TYPELESS_COMBINATORS:
        parts = narrowed.get(combinator)
        if isinstance(parts, list):
            narrowed[combinator] = [
                _without(part, keys) if isinstance(part, dict) else part for part in parts
            ]
    return narrowed


# Keywords that constrain only values of some JSON types (others pass them by).
_TYPE_KEYWORDS: Mapping[str, frozenset[str]] = {
    **{k: frozenset({"object"}) for k in OBJECT_KEYWORDS},
    **{k: frozenset({"array"}) for k in ("items", "prefixItems", "minItems", "maxItems")},
    **{k: frozenset({"array"}) for k in ("contains", "uniqueItems")},
    **{k: frozenset({"array"}) for k in ("minContains", "maxContains", "unevaluatedItems")},
    **{k: frozenset({"string"}) for k in ("minLength", "maxLength", "pattern")},
    **{
        k: frozenset({"number", "integer"})
        for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
    },
}


_ARRAY_ONLY = frozenset(k for k, kinds in _TYPE_KEYWORDS.items() if kinds == {"array"})


def _types(branch: Any, root: Any, hops: int = 0) -> frozenset[str] | None:
    """The JSON types a branch declares (through local ``$ref``s), or None if it says none."""
    if isinstance(branch, dict) and isinstance(branch.get("$ref"), str):
        ref = branch["$ref"]
        found, target = resolve_pointer(root, ref[1:]) if ref.startswith("#/") else (False, None)
        return _types(target, root, hops + 1) if found and hops < 8 else None
    declared = branch.get("type") if isinstance(branch, dict) else None
    if isinstance(declared, str):
        return frozenset({declared})
    if isinstance(declared, list):
        return frozenset(t for t in declared if isinstance(t, str))
    return None


def typed_keywords_into_branches(node: dict[str, Any], root: Any) -> dict[str, Any]:
    """Type-specific keywords beside an ``anyOf``/``oneOf`` moved into the branches they apply to.

    ``properties`` constrains objects only, so a string branch beside it still accepts every
    string; the generator would merge such keywords into every branch and make the string branch
    an object model (refusing the strings); ``items`` beside a string branch likewise. Each
    keyword goes only into branches of its types (or without a type); a ``$ref`` branch, or one
    that says something else about the same name, is left as it is, which only loosens it."""
    moved = {k: v for k, v in node.items() if k in _TYPE_KEYWORDS}
    if not moved or "type" in node:
        return node
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if not isinstance(branches, list):
            continue
        kinds = [_types(b, root) for b in branches]
        if not any(k is not None and not k & _TYPE_KEYWORDS[w] for k in kinds for w in moved):
            continue  # every branch takes every keyword: the generator's merge is right
        merged = []
        for branch, kind in zip(branches, kinds, strict=True):
            applies = {k: v for k, v in moved.items() if kind is None or kind & _TYPE_KEYWORDS[k]}
            joined = _joined(applies, branch) if applies else branch
            merged.append(branch if joined is None else joined)
        rest = {k: v for k, v in node.items() if k not in moved}
        return {**rest, key: merged}
    return node


def single_all_of(node: dict[str, Any]) -> dict[str, Any]:
    """``{"allOf": [part]}`` (with nothing the part also says) as the part itself: the
    generator would make a class of the wrapper and lose the part's non-object branches. Parts
    that accept everything (``{}``, ``true``) are no part: the generator reads an ``allOf`` of
    them as an object."""
    parts = node.get("allOf")
    if isinstance(parts, list) and any(p is True or p == {} for p in parts):
        parts = [p for p in parts if not (p is True or p == {})]
        node = {**node, "allOf": parts} if parts else _without(node, {"allOf"})
    if not isinstance(parts, list) or len(parts) != 1 or not isinstance(parts[0], dict):
        return node
    part = parts[0]
    rest = {k: v for k, v in node.items() if k != "allOf"}
    if "$ref" in part or rest.keys() & part.keys():
        return node
    return {**rest, **part}


def _joined(shared: dict[str, Any], branch: Any) -> dict[str, Any] | None:
    """Both schemas as one, or None where they say different things about one name."""
    if not isinstance(branch, dict) or "$ref" in branch:
        return None
    out = dict(branch)
    for key, value in shared.items():
        mine = branch.get(key)
        if mine is None:
            out[key] = value
        elif key == "required" and isinstance(mine, list) and isinstance(value, list):
            out[key] = sorted(set(mine) | set(value))
        elif key == "properties" and isinstance(mine, dict) and isinstance(value, dict):
            if mine.keys() & value.keys():
                return None
            out[key] = {**value, **mine}
        elif mine != value:
            return None
    return out


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


def branch_name(branch: dict[str, Any], stem: str, index: int, taken: set[str]) -> str:
    """The class name of an inline union branch: its ``title``, else ``<stem><const tag>``, else
    ``<stem><position>``; a name already taken gets the stem in front, then a number."""
    titled = pascal(branch["title"]) if isinstance(branch.get("title"), str) else ""
    properties = branch.get("properties")
    tags = [
        properties[name]["const"]
        for name in sorted(branch.get("required", []))
        if isinstance(properties, dict)
        and isinstance(properties.get(name), dict)
        and isinstance(properties[name].get("const"), str)
    ]
    tagged = pascal(tags[0]) if tags else ""
    candidates = [titled, stem + titled] if titled else []
    candidates += [stem + tagged] if tagged else []
    candidates.append(stem + str(index + 1))
    for name in candidates:
        if name and name not in taken and not name[:1].isdigit():
            break
    n = 2
    base = name
    while name in taken:
        name, n = f"{base}{n}", n + 1
    taken.add(name)
    return name


def _is_inline_object(node: Any) -> bool:
    # Only declared objects: a typeless branch (``{"properties": ...}`` beside a ``not``) is a
    # constraint more than a shape, and as a named class the generator would merge it into the
    # models that use its union through allOf.
    return isinstance(node, dict) and "$ref" not in node and node.get("type") == "object"


def name_branches(schema: Any, stem: str, defs: dict[str, Any], taken: set[str]) -> Any:
    """Inline object branches of every ``anyOf``/``oneOf``, and inline objects with a title,
    moved to named definitions (:func:`branch_name`), so classes are named for what they are,
    not numbered by the generator after their holder. Properties' unions are named after the
    property."""

    seen: dict[str, str] = {}

    def walk(node: Any, stem: str) -> Any:
        if not isinstance(node, dict):
            return node
        changes: dict[str, Any] = {}
        for key in ("anyOf", "oneOf"):
            branches = node.get(key)
            if not isinstance(branches, list):
                continue
            moved = []
            for index, branch in enumerate(branches):
                if _is_inline_object(branch):
                    name = branch_name(branch, stem, index, taken)
                    defs[name] = walk(branch, name)
                    moved.append({"$ref": f"#/$defs/{name}"})
                else:
                    moved.append(walk(branch, f"{stem}{index + 1}"))
            changes[key] = moved
        properties = node.get("properties")
        if isinstance(properties, dict):
            changes["properties"] = {
                name: titled(sub, stem + pascal(name)) for name, sub in properties.items()
            }
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                changes[key] = titled(node[key], stem + ("Item" if key == "items" else "Value"))
        return {**node, **changes} if changes else node

    def titled(node: Any, stem: str) -> Any:
        """An inline object with a title becomes a class of that name (else the generator
        names it after its holder and property, as before)."""
        title = node.get("title") if _is_inline_object(node) else None
        if not isinstance(title, str) or not pascal(title):
            return walk(node, stem)
        shape = canonical_json({k: v for k, v in node.items() if k != "description"})
        name = seen.get(shape) or branch_name({"title": title}, stem, 0, taken)
        if shape not in seen:  # the same titled object used twice is one class
            seen[shape] = name
            defs[name] = walk(node, name)
        notes = {k: node[k] for k in ("description",) if k in node}
        return {**notes, "$ref": f"#/$defs/{name}"}

    return walk(schema, stem)


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


def generate_models(document: dict[str, Any]) -> str:
    """Models for one document, in-process (the import costs once per process, not per schema)."""
    from datamodel_code_generator import generate
    from datamodel_code_generator.enums import DataModelType, InputFileType

    options = dict(DMCG_OPTIONS)
    with warnings.catch_warnings():
        # Its warnings (inexact dict maps...) are what looser_than_schema reports, per place.
        warnings.simplefilter("ignore")
        code = generate(
            json.dumps(value_cycles_expanded(document)),
            input_file_type=InputFileType.JsonSchema,
            output_model_type=DataModelType.PydanticV2BaseModel,
            **options,
        )
    if not isinstance(code, str):
        raise ModelFailure("the generator wrote several modules for one document")
    code = none_last(with_key_types(code))
    code = union_bases(typed_annotations(flatten_conflicts(code)))
    code = distinct_field_names(code)
    code = keep_integers(unprotected_fields(keep_unknown_properties(code)))
    code = inline_scalar_roots(code, keep=document.get("$defs", {}).keys())
    return by_name_only_with_aliases(bounds_per_member(code))


def none_last(code: str) -> str:
    """``X | None | MISSING`` as ``X | MISSING | None`` (the order linters ask for): the same
    type. Found with the tokenizer, so text inside strings is left alone."""
    if "None | MISSING" not in code:
        return code
    tokens = tokens_of(code)
    lines = code_lines(code)
    found = [
        tokens[i].start
        for i in range(len(tokens) - 2)
        if (tokens[i].string, tokens[i + 1].string, tokens[i + 2].string)
        == ("None", "|", "MISSING")
        and tokens[i].start[0] == tokens[i + 2].end[0]
    ]
    for row, column in reversed(found):
        line = lines[row - 1]
        lines[row - 1] = line[:column] + line[column:].replace(
            "None | MISSING", "MISSING | None", 1
        )
    return "".join(lines)


def with_key_types(code: str) -> str:
    """``dict[, X]`` (which datamodel-code-generator writes for some ``propertyNames`` maps, and
    which does not parse) as ``dict[str, X]``: JSON object keys are strings. Found with the
    tokenizer, so text inside strings is left alone."""
    if "[," not in code:
        return code
    tokens = tokens_of(code)
    after_bracket = [
        offset(code, *tokens[i + 1].end)
        for i in range(len(tokens) - 2)
        if tokens[i].string == "dict"
        and tokens[i + 1].string == "["
        and tokens[i + 2].string == ","
    ]
    return spliced(code, [(index, index, "str") for index in after_bracket])


LineEdit = tuple[int, int, int, str]  # line, start and end column (ast's: in bytes), replacement


def _apply(code: str, edits: list[LineEdit], imports: str = "") -> str:
    """Apply same-line edits and add import lines (at the end: ``from __future__`` must stay
    first); split_module merges imports and keeps the used ones."""
    if not edits:
        return code
    located = [
        (ast_offset(code, row, start), ast_offset(code, row, end), text)
        for row, start, end, text in edits
    ]
    return with_imports(spliced(code, located), imports)


def typed_annotations(code: str) -> str:
    """Annotations mypy --strict accepts where datamodel-code-generator writes others.

    A bare ``list``/``dict`` gets its type arguments; ``constr(...)``, which it writes for a
    constrained string inside a union, becomes ``Annotated[str, StringConstraints(...)]`` (the
    same constraints, in a form mypy takes); and a field defaulting to None that is typed
    without None (an optional property whose schema excludes null) is typed ``X | None``."""
    edits: list[LineEdit] = []
    # A root model's base (``RootModel[list]``) is typed like its annotation.
    bases = [
        base.slice
        for node in nodes(code, ast.ClassDef)
        for base in node.bases
        if isinstance(base, ast.Subscript) and is_name(base.value, "RootModel")
    ]
    for node in nodes(code, ast.AnnAssign):
        edits += _bare_containers(node.annotation)
        for sub in ast.walk(node.annotation):
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
            if isinstance(typed, ast.Subscript) and is_name(typed.value, "Annotated"):
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
    for base in bases:
        edits += _bare_containers(base)
    imports = "from typing import Annotated, Any\nfrom pydantic import StringConstraints\n"
    return _apply(code, edits, imports)


def _bare_containers(annotation: ast.expr) -> list[LineEdit]:
    """Type arguments for each bare ``list`` and ``dict`` of ``annotation``."""
    subscripted = {id(sub.value) for sub in ast.walk(annotation) if isinstance(sub, ast.Subscript)}
    return [
        (
            sub.end_lineno or 0,
            sub.end_col_offset or 0,
            sub.end_col_offset or 0,
            "[Any]" if sub.id == "list" else "[str, Any]",
        )
        for sub in ast.walk(annotation)
        if isinstance(sub, ast.Name) and sub.id in ("list", "dict") and id(sub) not in subscripted
    ]


def _admits_none(annotation: ast.expr) -> bool:
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _admits_none(annotation.left) or _admits_none(annotation.right)
    return (isinstance(annotation, ast.Constant) and annotation.value is None) or (
        isinstance(annotation, ast.Name) and annotation.id in ("Any", "JsonValue")
    )


def union_bases(code: str) -> str:
    """``RootModel[Union[A, B]]`` in a class's bases as ``RootModel[A | B]``.

    Bases are evaluated at import, where ``A | "B"`` fails (a quoted member: a class that refers
    to itself, not defined yet), and ruff's fixes would write just that from ``Union[A, "B"]`` or
    ``Optional["B"]`` inside another type (``dict[str, Union[A, "B"]]``). So a union that holds a
    quoted name is written as one quoted name, ``"A | B"``, which the models resolve as they
    resolve ``"B"``; the others as ``A | B``."""
    edits: list[LineEdit] = []
    for node in nodes(code, ast.ClassDef):
        for base in node.bases:
            inner: set[int] = set()  # unions inside one rewritten already
            for sub in ast.walk(base):
                if id(sub) in inner or not (
                    isinstance(sub, ast.Subscript)
                    and _is_union(sub)
                    and sub.lineno == sub.end_lineno
                ):
                    continue
                inner.update(id(n) for n in ast.walk(sub))
                if _forward_references(sub.slice):
                    text = json.dumps(ast.unparse(_piped(copy.deepcopy(sub))), ensure_ascii=False)
                elif is_name(sub.value, "Union"):
                    members = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
                    text = " | ".join(source_of(code, m) for m in members)
                else:
                    continue
                edits.append((sub.lineno, sub.col_offset, sub.end_col_offset or 0, text))
    return _apply(code, edits)


def _is_union(node: ast.Subscript) -> bool:
    return is_name(node.value, "Union") or is_name(node.value, "Optional")


def _forward_references(node: ast.expr) -> bool:
    """Whether a type expression holds a quoted name (a string outside ``Literal`` and
    ``Annotated``'s metadata, which are values)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Subscript):
        if is_name(node.value, "Literal"):
            return False
        if is_name(node.value, "Annotated") and isinstance(node.slice, ast.Tuple):
            return _forward_references(node.slice.elts[0])
        return _forward_references(node.value) or _forward_references(node.slice)
    if isinstance(node, ast.Tuple | ast.List):
        return any(_forward_references(e) for e in node.elts)
    if isinstance(node, ast.BinOp):
        return _forward_references(node.left) or _forward_references(node.right)
    return False


def _piped(node: ast.expr) -> ast.expr:
    """``node`` with its quoted names unquoted and its ``Union``/``Optional`` as ``|``."""

    class Pipes(ast.NodeTransformer):
        def visit_Constant(self, constant: ast.Constant) -> ast.expr:
            return ast.Name(constant.value) if isinstance(constant.value, str) else constant

        def visit_Call(self, call: ast.Call) -> ast.expr:
            return call  # Field(...) and its arguments are values

        def visit_Subscript(self, sub: ast.Subscript) -> ast.expr:
            if is_name(sub.value, "Literal"):
                return sub  # its strings are values
            if is_name(sub.value, "Annotated") and isinstance(sub.slice, ast.Tuple):
                first, *metadata = sub.slice.elts
                sub.slice.elts = [self.visit(first), *metadata]
                return sub
            return self._union(sub)

        def _union(self, sub: ast.Subscript) -> ast.expr:
            self.generic_visit(sub)
            if not _is_union(sub):
                return sub
            members = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
            if is_name(sub.value, "Optional"):
                members = [*members, ast.Constant(None)]
            piped = members[0]
            for member in members[1:]:
                piped = ast.BinOp(piped, ast.BitOr(), member)
            return piped

    return Pipes().visit(node)  # type: ignore[no-any-return]


def flatten_conflicts(code: str) -> str:
    """Models of an ``allOf`` whose parts type one property differently, without inheritance.

    datamodel-code-generator maps ``allOf`` to subclasses; where a subclass (or two of its bases)
    types an inherited field differently, mypy rejects the override. Such a class is rewritten
    as a plain model holding every field it would inherit, each with the annotation Python's
    method resolution would pick: a value valid against the ``allOf`` is valid against every
    part, so that annotation accepts it (the runtime validates the whole schema first)."""
    tree = parsed(code)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    lines = code_lines(code)

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
    return _configured(
        code,
        "extra",
        "extra='allow'",
        lambda cls: not any("RootModel" in ast.unparse(b) for b in cls.bases),
    )


def unprotected_fields(code: str) -> str:
    """``protected_namespaces=()`` in the configuration of a model with a field named like
    ``model_dump_`` (a property ``model_dump``, renamed): pydantic would warn at every import
    of the module that the name is in its ``model_`` namespace, though it takes nothing there."""
    return _configured(
        code,
        "protected_namespaces",
        "protected_namespaces=()",
        lambda cls: any(
            isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)
            and s.target.id.startswith(("model_validate", "model_dump"))
            for s in cls.body
        ),
    )


def _configured(code: str, key: str, setting: str, wanted: Callable[[ast.ClassDef], bool]) -> str:
    """``setting`` added to the ``ConfigDict(...)`` of each class ``wanted`` picks that does not
    set ``key`` already (every model the generator writes has one)."""
    inserts: list[int] = []
    for node in nodes(code, ast.ClassDef):
        if not wanted(node):
            continue
        config = config_call(node)
        if config is not None and not any(k.arg == key for k in config.keywords):
            inserts.append(node_span(code, config.func)[1] + 1)  # after "ConfigDict("
    return spliced(code, [(index, index, f"{setting}, ") for index in inserts])


def keep_integers(code: str) -> str:
    """JSON Schema ``number`` as ``float | int``, not ``float``.

    A ``float`` field turns the JSON integer 9007199254740993 into 9007199254740992.0: the value
    would not round-trip. With ``float | int`` pydantic keeps an int an int (and mypy already
    treats an int as a float). Only ``float`` *names* are rewritten, found with the tokenizer, so
    a description that mentions floats is left alone.
    """
    if not any(name in code for name in _RENAMED):
        return code  # no number, no e-mail type: no need to tokenize
    # A float in a union that already holds int stays as it is: int | float keeps ints already.
    tree = parsed(code)
    imports = {
        row
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for row in range(node.lineno, (node.end_lineno or node.lineno) + 1)
    }
    beside_int = {
        node_span(code, member)[0]
        for node in nodes(code, ast.BinOp)
        if isinstance(node.op, ast.BitOr)
        for members in [union_members(node)]
        if any(isinstance(m, ast.Name) and m.id == "int" for m in members)
        for member in members
    }
    renamed = [
        (offset(code, *token.start), offset(code, *token.end), _RENAMED[token.string])
        for token in tokens_of(code)
        if token.type == tokenize.NAME
        and token.string in _RENAMED
        and token.start[0] not in imports
        and not (token.string == "float" and offset(code, *token.start) in beside_int)
    ]
    return spliced(code, renamed)


# Besides float: the e-mail types it writes where a ``format`` sits where no keyword is expected
# (so the model document kept it) would need email-validator and reject what the schema accepts.
_RENAMED = {"float": "float | int", "EmailStr": "str", "NameEmail": "str"}


class ModelFailure(Exception):
    """datamodel-code-generator failed on a document, or wrote code that does not parse."""


def checked_models(document: dict[str, Any]) -> str:
    try:
        code = generate_models(document)
        parsed(code)
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


def is_object_slot(slot: Slot) -> bool:
    """A slot whose root is a plain object schema (the others get a one-field box class)."""
    schema = slot.schema
    return isinstance(schema, dict) and schema.get("type") == "object" and "$ref" not in schema


def _loosen(defs: dict[str, Any], slots: list[tuple[str, list[str], Slot]]) -> dict[str, Any]:
    out = dict(defs)
    for cls, local, slot in slots:
        for name in local:
            out.pop(name, None)
        out[cls] = {"type": "object"} if is_object_slot(slot) else {}
    return dict(sorted(out.items()))


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
    if not isinstance(value, kinds):
        return False
    # A default its own schema refuses (not in its enum, too long...) would be a value the model
    # invents that the runtime then rejects; such a default stays in the schema only.
    own = {k: v for k, v in node.items() if k in _VALUE_KEYWORDS}
    return _accepts(canonical_json(own), canonical_json(value))


# Keywords of a node that constrain a scalar by themselves (no references to resolve).
_VALUE_KEYWORDS = frozenset(
    {"type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    | {"multipleOf", "minLength", "maxLength", "pattern"}
)


@cache
def _accepts(schema: str, value: str) -> bool:
    try:
        return bool(
            jsonschema_rs.Draft202012Validator(json.loads(schema)).is_valid(json.loads(value))
        )
    except (jsonschema_rs.ValidationError, ValueError):
        return False


def with_model_patterns(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``pattern`` (and ``patternProperties`` names) in the dialect of the
    models' engine; a pattern that engine cannot hold is left out of the model, and where a
    property name pattern is left out, any other name may hold any value (the names it allowed
    must stay allowed)."""
    pattern = node.get("pattern")
    names = node.get("patternProperties")
    if not isinstance(pattern, str) and not isinstance(names, dict):
        return node
    node = dict(node)
    if isinstance(pattern, str):
        translated = model_pattern(pattern)
        if translated is None:
            del node["pattern"]
        else:
            node["pattern"] = translated
    if isinstance(names, dict):
        kept = {}
        for name, sub in names.items():
            translated = model_pattern(name)
            if translated is not None:
                kept[translated] = sub
        node["patternProperties"] = kept
        if len(kept) < len(names):
            node["additionalProperties"] = ANY_VALUE
    return node


def looser_than_schema(slots: tuple[Slot, ...]) -> list[tuple[str, str]]:
    """Where each slot's models accept more than its JSON Schema, as (place, why)."""
    found = []
    for slot in slots:
        for path, node in subschemas(slot.bundled):
            where = f"{_slot_label(slot)} {''.join(f'/{p}' for p in path) or '/'}"
            for keyword in sorted(set(node) & set(LOOSER_KEYWORDS)):
                if keyword == "uniqueItems" and node[keyword] is not True:
                    continue
                if keyword == "unevaluatedProperties" and unevaluated_is_additional(node):
                    continue  # the model's additionalProperties
                found.append((where, LOOSER_KEYWORDS[keyword]))
            patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
            if isinstance(node.get("patternProperties"), dict):
                patterns += list(node["patternProperties"])
            if any(model_pattern(p) is None for p in patterns):
                found.append((where, "a 'pattern' the models' regex engine cannot hold"))
            if "default" in node and not model_default(node):
                found.append((where, "this 'default' is not carried into the model"))
    return found
