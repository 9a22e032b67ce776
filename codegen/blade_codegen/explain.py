"""Meta-schema failures in plain words, at the offending key, with the nearest known name.

jsonschema-rs reports what its validator saw ("is not valid under any of the schemas listed in
the 'anyOf' keyword", at the object holding a misspelled key); a spec author wants the key that
is wrong, where it is, and what was probably meant.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

import jsonschema_rs

from blade_codegen.schemas import Segments

JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
_WORDS = {
    "array": "a list",
    "boolean": "true or false",
    "integer": "a whole number",
    "null": "null",
    "number": "a number",
    "object": "an object",
    "string": "a string",
}


def nearest(word: str, known: Iterable[str]) -> str | None:
    """The known name ``word`` most likely misspells, or None."""
    options = sorted(set(known))
    folded = {o.lower().replace("_", "").replace("-", ""): o for o in options}
    key = word.lower().replace("_", "").replace("-", "")
    if key in folded and folded[key] != word:
        return folded[key]
    found = difflib.get_close_matches(word, options, n=1, cutoff=0.7)
    return found[0] if found else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    guess = nearest(word, known)
    return f"did you mean {json.dumps(guess)}?" if guess else ""


# (segments, message, hint): what validate turns into a Problem.
Explained = tuple[Segments, str, str]


def spec_error(error: Any, spec: Any, meta: Mapping[str, Any]) -> list[Explained]:
    """One meta-schema error of a spec file, in plain words."""
    at: Segments = tuple(error.instance_path)
    kind = error.kind
    name = type(kind).__name__
    if name == "AdditionalProperties":
        known = _allowed_keys(meta, list(error.schema_path)[:-1])
        found = []
        for key in kind.unexpected:
            hint = did_you_mean(key, known) or (
                "remove it; known keys: " + ", ".join(sorted(known)) if known else "remove it"
            )
            found.append(((*at, key), f"unknown key {json.dumps(key)}", hint))
        return found
    if name == "Required":
        holder = _value(spec, at)
        present = [k for k in holder if isinstance(k, str)] if isinstance(holder, dict) else []
        typo = nearest(kind.property, present)
        allowed = _allowed_keys(meta, list(error.schema_path)[:-1])
        if typo and typo not in allowed:
            return []  # reported once, at the misspelled key, as an unknown key
        # A key the spec format allows (a valid sibling such as outputSchema) is never blamed
        # as a misspelling: following that hint would break the spec further.
        hint = f"add the key {json.dumps(kind.property)}"
        return [(at, f"the key {json.dumps(kind.property)} is missing", hint)]
    if name == "Enum":
        options = [o for o in kind.options if isinstance(o, str)]
        value = error.instance
        guess = did_you_mean(value, options) if isinstance(value, str) else ""
        listed = "use one of " + ", ".join(json.dumps(o) for o in kind.options)
        return [(at, error.message, f"{guess} {listed}" if guess else listed)]
    if name == "Pattern":
        return [(at, error.message, f"it must match {kind.pattern}")]
    if name == "Type":
        return [(at, _type_message(at, error.instance, kind.types), "")]
    return [(at, error.message, "")]


@cache
def _schema_validator() -> Any:
    return jsonschema_rs.Draft202012Validator(
        {"$ref": "https://json-schema.org/draft/2020-12/schema"}
    )


def schema_errors(schema: Any) -> list[Explained]:
    """Every way ``schema`` is not a valid 2020-12 schema, one per place, in plain words."""
    validator = _schema_validator()
    if validator.is_valid(schema):
        return []
    found: dict[Segments, Explained] = {}
    for error in validator.iter_errors(schema):
        at: Segments = tuple(error.instance_path)
        if any(seen[: len(at)] == at or at[: len(seen)] == seen for seen in found):
            continue  # one message per place: anyOf branches repeat the same complaint
        found[at] = _schema_error(at, error)
    return list(found.values())


def _schema_error(at: Segments, error: Any) -> Explained:
    keyword = next((s for s in reversed(at) if isinstance(s, str)), "")
    value = error.instance
    kind = type(error.kind).__name__
    if keyword == "type" and isinstance(value, str):
        hint = f"{did_you_mean(value, JSON_TYPES)} the types are {', '.join(JSON_TYPES)}"
        return at, f"{json.dumps(value)} is not a JSON Schema type", hint.strip()
    if keyword == "type" and isinstance(value, list):
        bad = [v for v in value if v not in JSON_TYPES]
        if bad:
            word = bad[0]
            hint = did_you_mean(word, JSON_TYPES) if isinstance(word, str) else ""
            message = f"{json.dumps(word)} in the type list is not a JSON Schema type"
            return at, message, f"{hint} the types are {', '.join(JSON_TYPES)}".strip()
        return at, "the type list names a type twice", "list each type once"
    if kind == "Type":
        return at, _type_message(at, value, error.kind.types), ""
    if kind == "Minimum":
        return at, f"{keyword} must be {error.kind.limit} or more, not {json.dumps(value)}", ""
    if kind == "UniqueItems":
        return at, f"{keyword} lists a value twice", "list each value once"
    if kind in ("AnyOf", "OneOfNotValid"):
        return at, f"{json.dumps(value)[:60]} is not a valid value for {keyword}", ""
    return at, f"{keyword}: {error.message}", ""


def _type_message(at: Segments, value: Any, types: list[str]) -> str:
    keyword = next((s for s in reversed(at) if isinstance(s, str)), "the value")
    if sorted(types) == ["boolean", "object"]:
        expected = "a schema (an object, or true or false)"
    else:
        expected = " or ".join(_WORDS.get(t, t) for t in types)
    return f"{keyword} must be {expected}, not {json.dumps(value)[:60]}"


def _allowed_keys(meta: Mapping[str, Any], path: list[str | int]) -> list[str]:
    """The property names the meta-schema allows at ``path`` (a schema path)."""
    node = _value(meta, tuple(path))
    if isinstance(node, dict) and isinstance(node.get("$ref"), str):
        ref = node["$ref"]
        if ref.startswith("#/"):
            pointer = [p.replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")]
            return _allowed_keys(meta, list(pointer))
    properties = node.get("properties") if isinstance(node, dict) else None
    return sorted(properties) if isinstance(properties, dict) else []


def _value(document: Any, at: Segments) -> Any:
    """What ``at`` points to in ``document``, or None."""
    for segment in at:
        if isinstance(document, dict):
            document = document.get(segment) if isinstance(segment, str) else None
        elif isinstance(document, list) and isinstance(segment, int) and segment < len(document):
            document = document[segment]
        else:
            return None
    return document
