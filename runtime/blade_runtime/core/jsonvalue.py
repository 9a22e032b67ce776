"""Lossless JSON: what the runtime records and emits must read back exactly as it was written.

Values from implementations (models, aliases, plain data) are serialized by their pydantic type
with unset fields left out, then checked: NaN and infinities, non-string keys and objects JSON has
no form for are refused with the JSON pointer of the first offender, instead of being turned into
``null`` or a string on the way to the store.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import JsonValue, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_json

T = TypeVar("T")


class NotJson(ValueError):
    """A value that cannot round-trip through JSON; the message names where and why."""


def compact_json(value: JsonValue) -> str:
    """``value``, checked JSON (as the runtime holds every value it records), as compact JSON
    text, non-ASCII as it is: what a model reads of JSON content, and what a reply carries.
    pydantic-core's encoder, a tenth of ``json.dumps``'s cost (which builds an encoder on every
    call with these options). Text it refuses to encode (a lone surrogate, which has no UTF-8
    form) is written with ASCII escapes instead, so the text is still UTF-8 and reads back."""
    try:
        return to_json(value).decode()
    except PydanticSerializationError:
        return _COMPACT(value)


_COMPACT = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode


def lossless(adapter: TypeAdapter[Any], value: Any) -> JsonValue:
    """``value`` as JSON through its type ``adapter``, or NotJson."""
    dumped = adapter.serializer.to_python(
        value, mode="python", by_alias=True, exclude_unset=True, warnings=False
    )
    return checked(dumped)


def checked(value: Any, at: str = "") -> JsonValue:
    """``value`` if it is plain, finite JSON (tuples become arrays); else NotJson."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJson(f"at {at or '/'}: {value} has no JSON form")
        return value
    if isinstance(value, dict):
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJson(f"at {at or '/'}: the key {key!r} is not a string")
            out[key] = checked(item, f"{at}/{key.replace('~', '~0').replace('/', '~1')}")
        return out
    if isinstance(value, list | tuple):
        return [checked(item, f"{at}/{index}") for index, item in enumerate(value)]
    raise NotJson(f"at {at or '/'}: a {type(value).__name__} has no JSON form")


def encodable_tree(value: Any) -> bool:
    """Whether every string of a JSON value (keys included) has a UTF-8 form: no lone
    surrogate. A deep walk: used only to explain a failure."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(encodable_tree(k) and encodable_tree(v) for k, v in value.items())
    if isinstance(value, list):
        return all(encodable_tree(item) for item in value)
    return True


def model_of(validate: Callable[[Any], T], value: Any) -> T:
    """``validate(value)``, tolerant of one gap between JSON Schema and pydantic.

    JSON Schema calls 9.3e18 an integer (it has no fractional part); pydantic's ``int`` refuses
    integral floats outside 64 bits. Only when that is why validation failed is the value retried
    with integral floats turned into ints (the same numbers), so the common path pays nothing.
    """
    try:
        return validate(value)
    except ValidationError as error:
        if not any(e["type"] == "int_parsing_size" for e in error.errors()):
            raise
    return validate(_integral(value))


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral(item) for item in value]
    return value
