"""JSON Schema validation: the spec's schemas are the single truth, compiled once each.

jsonschema-rs implements draft 2020-12 (the official suite's required tests pass) and checks a
medium payload in about a microsecond, against hundreds for ``jsonschema``. The fast path is
``is_valid``; messages are built only when it says no. Validators never fetch anything: the
schemas a generated module embeds are already bundled.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from json.encoder import encode_basestring as _encode_string
from typing import Any

import jsonschema_rs
from pydantic import JsonValue

MAX_REPORTED = 10
"""Violations listed in one message; the rest are counted."""
_MAX_VALUE_CHARS = 60


class SchemaValidator:
    """A compiled 2020-12 validator for one schema."""

    __slots__ = ("_validator", "is_valid")

    def __init__(
        self, schema: Mapping[str, Any] | bool, retriever: Callable[[str], Any] | None = None
    ) -> None:
        """``retriever``: serves remote ``$ref`` documents by URI (tests and conformance runs);
        without one, nothing is fetched and a remote reference is an error."""
        document = schema if isinstance(schema, bool) else dict(schema)
        if retriever is None:
            self._validator = jsonschema_rs.Draft202012Validator(document, offline=True)
        else:
            self._validator = jsonschema_rs.Draft202012Validator(document, retriever=retriever)
        # Bound once: the call path invokes it directly.
        self.is_valid = self._validator.is_valid

    def explain(self, instance: object) -> str:
        """One sentence naming each violation, where (a JSON pointer) and what was expected
        there: at most ``MAX_REPORTED`` of them, the rest counted. Built straight from the
        validator's errors, no object per violation: an invalid call is mostly this sentence."""
        shown: list[str] = []
        count = 0
        for error in self._validator.iter_errors(instance):
            count += 1
            if count <= MAX_REPORTED:
                path = error.instance_path
                shown.append(f"at {pointer(path) if path else 'the top level'}: {_expected(error)}")
        text = "; ".join(shown)
        return f"{text}; and {count - MAX_REPORTED} more" if count > MAX_REPORTED else text


def pointer(path: Iterator[str | int] | list[str | int]) -> str:
    """RFC 6901 JSON pointer of an instance path."""
    parts: list[str] = []
    for part in path:
        if type(part) is int:
            parts.append(str(part))
        else:
            text = str(part)
            if "~" in text or "/" in text:  # most names need no escape: no replace to run
                text = text.replace("~", "~0").replace("/", "~1")
            parts.append(text)
    return "/" + "/".join(parts) if parts else ""


def _expected(error: jsonschema_rs.ValidationError) -> str:
    kind = error.kind
    explain = _EXPLAIN.get(type(kind))
    return str(error.message) if explain is None else explain(kind, error)


def _enum(kind: Any, error: jsonschema_rs.ValidationError) -> str:
    options = ", ".join(_show(option) for option in kind.options)
    return f"must be one of {options} (got {_show(error.instance)})"


def _constant(kind: Any, error: jsonschema_rs.ValidationError) -> str:
    return f"must be exactly {_show(kind.expected_value)} (got {_show(error.instance)})"


def _type(kind: Any, error: jsonschema_rs.ValidationError) -> str:
    return f"must be of type {' or '.join(kind.types)} (got {_json_type(error.instance)})"


def _required(kind: Any, error: jsonschema_rs.ValidationError) -> str:
    return f"the required property {_show(kind.property)} is missing"


def _additional(kind: Any, error: jsonschema_rs.ValidationError) -> str:
    names = ", ".join(_show(name) for name in kind.unexpected)
    return f"unexpected property {names}: no other properties are allowed here"


def _pattern(kind: Any, error: jsonschema_rs.ValidationError) -> str:
    return f"must match the pattern {kind.pattern} (got {_show(error.instance)})"


_KIND = jsonschema_rs.ValidationErrorKind
# By the kind's exact class: one lookup, not a chain of isinstance checks, and the instance
# read only where the sentence shows it (an invalid call should cost no more than a valid one).
_EXPLAIN: dict[type, Callable[[Any, jsonschema_rs.ValidationError], str]] = {
    _KIND.Enum: _enum,
    _KIND.Constant: _constant,
    _KIND.Type: _type,
    _KIND.Required: _required,
    _KIND.AdditionalProperties: _additional,
    _KIND.Pattern: _pattern,
}


def _show(value: JsonValue | object) -> str:
    if type(value) is str:  # what json.dumps(value, ensure_ascii=False) calls, minus set-up
        text = _encode_string(value)
    elif type(value) is int:
        text = repr(value)
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def unreadable(error: BaseException) -> str:
    """Why a value a validator raised on cannot be validated at all: what no JSON text can hold
    (a lone surrogate, from a Python dict) or nesting deeper than the validator goes."""
    if isinstance(error, UnicodeError):
        return "the text is not valid Unicode (a lone surrogate)"
    if isinstance(error, RecursionError) or "ecursion" in str(error):
        return "nested too deeply to validate"
    return f"they cannot be validated ({error})"
