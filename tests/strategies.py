"""Hypothesis strategies for JSON instances of a JSON Schema: mostly valid, sometimes not.

``instances(schema)`` draws a value built to conform to the schema, then keeps it, mutates one
place in it (a replaced value, a dropped key, an unexpected key) or replaces it by arbitrary JSON.
Whether a drawn value is valid is never assumed: tests ask an independent validator. The generator
covers what tool schemas use (objects, arrays, scalars with bounds, enum, const, pattern, oneOf
and anyOf, local ``$ref``s and recursion); for anything else it falls back to arbitrary JSON.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from hypothesis import strategies as st

from blade_codegen.schemas import resolve_pointer

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**9), 10**9)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.text(max_size=12)
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
# JSON as the runtime has it: str keys, finite floats, integers past 64 bits, and text that UTF-8
# can encode (a lone surrogate cannot be stored by a durable store, nor sent as UTF-8).
RUNTIME_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
RUNTIME_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | RUNTIME_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(RUNTIME_TEXT, inner, max_size=4),
    max_leaves=12,
)
MAX_DEPTH = 6
MAX_OPTIONAL = 8


def instances(schema: Any) -> st.SearchStrategy[Any]:
    """Values for ``schema``: about half conform, the rest are one mutation or plain JSON away."""
    conforming = conform(schema, schema, 0)
    return st.one_of(
        conforming, conforming, conforming.flatmap(_mutated), st.dictionaries(st.text(), JSON)
    )


def conform(schema: Any, root: Any, depth: int) -> st.SearchStrategy[Any]:
    """Values built to satisfy ``schema`` (references resolve against ``root``)."""
    if schema is True or schema == {}:
        return JSON
    if schema is False or not isinstance(schema, dict):
        return st.nothing()
    if "$ref" in schema:
        ref = schema["$ref"]
        found, target = resolve_pointer(root, ref[1:]) if ref.startswith("#") else (False, None)
        if not found or depth > MAX_DEPTH:
            return JSON
        return conform(target, root, depth + 1)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"]) if schema["enum"] else st.nothing()
    for key in ("oneOf", "anyOf"):
        if key in schema:
            own = {k: v for k, v in schema.items() if k != key}
            return st.one_of(
                [conform({**own, **branch}, root, depth + 1) for branch in schema[key]]
                if all(isinstance(b, dict) for b in schema[key])
                else [conform(b, root, depth + 1) for b in schema[key]]
            )
    kinds = schema.get("type", _implied_type(schema))
    if kinds is None:
        return JSON
    if isinstance(kinds, list):
        return st.one_of([_typed(kind, schema, root, depth) for kind in kinds])
    return _typed(kinds, schema, root, depth)


def _typed(kind: str, schema: dict[str, Any], root: Any, depth: int) -> st.SearchStrategy[Any]:
    if kind == "object":
        return _object(schema, root, depth)
    if kind == "array":
        return _array(schema, root, depth)
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        return _integer(schema)
    if kind == "number":
        return _integer(schema) | _number(schema)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return JSON


def _object(schema: dict[str, Any], root: Any, depth: int) -> st.SearchStrategy[Any]:
    properties: dict[str, Any] = schema.get("properties", {})
    required = [name for name in schema.get("required", []) if isinstance(name, str)]
    optional = [] if depth > MAX_DEPTH else [name for name in properties if name not in required]
    extra = schema.get("additionalProperties", True)
    # Each property's strategy is made on its first draw (not here: a recursive schema would
    # unfold to MAX_DEPTH at once) and kept: made again on every draw, building and validating
    # strategies took about half the time of drawing.
    made: dict[str | None, st.SearchStrategy[Any]] = {}

    def strategy_of(name: str | None) -> st.SearchStrategy[Any]:
        """The strategy of property ``name``, or of an unexpected key's value (None)."""
        if name not in made:
            node = extra if name is None else properties.get(name, True)
            made[name] = JSON if node is True else conform(node, root, depth + 1)
        return made[name]

    # Fewer optional properties the deeper the object: their values multiply with each level,
    # and a configuration schema's nested objects drew millions of choices per value.
    return _object_value(required, optional, extra is not False, strategy_of, MAX_OPTIONAL >> depth)


# The composites are defined once: ``st.composite`` reads its function's source, which took a
# third of the time of a property test when it ran for every object schema and every mutation.
@st.composite
def _object_value(
    draw: st.DrawFn,
    required: list[str],
    optional: list[str],
    open_: bool,
    strategy_of: Callable[[str | None], st.SearchStrategy[Any]],
    limit: int = MAX_OPTIONAL,
) -> dict[str, Any]:
    """The required properties, some optional ones and, once in ten, an unexpected key when the
    object is open (``strategy_of(None)`` draws its value). Of many optional properties, at most
    ``limit`` are drawn: each a coin toss, a value of a configuration schema with 163 of them
    (SchemaStore's jscsrc) held about 80, and hardly one in a thousand was valid."""
    if len(optional) <= limit:
        chosen = required + [name for name in optional if draw(st.booleans())]
    elif limit == 0:
        chosen = list(required)
    else:
        some = draw(st.lists(st.sampled_from(optional), max_size=limit, unique=True))
        chosen = required + [name for name in optional if name in some]
    value = {name: draw(strategy_of(name)) for name in chosen}
    if open_ and draw(st.integers(0, 9)) == 0:
        value[draw(st.text(min_size=1, max_size=8))] = draw(strategy_of(None))
    return value


def _array(schema: dict[str, Any], root: Any, depth: int) -> st.SearchStrategy[Any]:
    items = schema.get("items", True)
    heads = schema.get("prefixItems", [])
    if isinstance(items, list):  # draft-04's tuple form
        heads, items = items, schema.get("additionalItems", True)
    prefix = [conform(item, root, depth + 1) for item in heads]
    low = max(_size(schema, "minItems", 0) - len(prefix), 0)
    spare = 3 if depth < 3 else 1  # arrays of arrays of objects multiply too
    high = min(_size(schema, "maxItems", low + len(prefix) + spare) - len(prefix), low + spare)
    element = conform(items, root, depth + 1)
    if items is False or depth > MAX_DEPTH or element.is_empty:
        high = low = 0
    rest = st.lists(element, min_size=low, max_size=max(high, low))
    return st.tuples(*prefix).flatmap(lambda head: rest.map(lambda tail: [*head, *tail]))


def _size(schema: dict[str, Any], keyword: str, default: int) -> int:
    """A size keyword as a count: a schema may write 2.0 for 2."""
    value = schema.get(keyword, default)
    return int(value) if isinstance(value, int | float) and math.isfinite(value) else default


def _string(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    low = _size(schema, "minLength", 0)
    high = _size(schema, "maxLength", max(low, 20))
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            re.compile(pattern)
            # fullmatch: a whole match also matches as JSON Schema searches, without the padding
            # (random text around it) that made some schemas draw for minutes
            return st.from_regex(pattern, fullmatch=True).map(
                lambda s: s if low <= len(s) <= high else None
            )
        except re.error:
            pass
    return st.text(min_size=low, max_size=high)


def _integer(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    low = schema.get("minimum")
    high = schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low = int(schema["exclusiveMinimum"]) + 1
    if "exclusiveMaximum" in schema:
        high = int(schema["exclusiveMaximum"]) - 1
    low = None if low is None else int(-(-low // 1))  # ceil for float bounds
    high = None if high is None else int(high // 1)
    values = st.integers(min_value=low, max_value=high)
    step = schema.get("multipleOf")
    if isinstance(step, int) and step > 0:
        values = values.map(lambda n: n - n % step).filter(
            lambda n: (low is None or n >= low) and (high is None or n <= high)
        )
    return values


def _number(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.floats(
        min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
        max_value=schema.get("maximum", schema.get("exclusiveMaximum")),
        exclude_min="exclusiveMinimum" in schema,
        exclude_max="exclusiveMaximum" in schema,
        allow_nan=False,
        allow_infinity=False,
    )


def _implied_type(schema: dict[str, Any]) -> str | None:
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "minItems" in schema:
        return "array"
    if "pattern" in schema or "minLength" in schema or "maxLength" in schema:
        return "string"
    if "minimum" in schema or "maximum" in schema:
        return "number"
    return None


def _mutated(value: Any) -> st.SearchStrategy[Any]:
    """``value`` with one place changed: a value replaced, a key dropped or a key added."""
    places = list(_containers(value))
    if not places:
        return JSON
    return _mutation(value, places)


@st.composite
def _mutation(draw: st.DrawFn, value: Any, places: list[tuple[Any, ...]]) -> Any:
    copy = _deep_copy(value)
    path = draw(st.sampled_from(places))
    node = copy
    for step in path:
        node = node[step]
    keys = list(node.keys()) if isinstance(node, dict) else list(range(len(node)))
    action = draw(st.sampled_from(["replace", "drop", "add"] if keys else ["add"]))
    if action == "replace":
        node[draw(st.sampled_from(keys))] = draw(JSON)
    elif action == "drop":
        del node[draw(st.sampled_from(keys))]
    elif isinstance(node, dict):
        node[draw(st.text(min_size=1, max_size=8))] = draw(JSON)
    else:
        node.append(draw(JSON))
    return copy


def _containers(value: Any, path: tuple[Any, ...] = ()) -> Any:
    if isinstance(value, dict):
        yield path
        for key, child in value.items():
            yield from _containers(child, (*path, key))
    elif isinstance(value, list):
        yield path
        for index, child in enumerate(value):
            yield from _containers(child, (*path, index))


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _deep_copy(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_deep_copy(child) for child in value]
    return value


def oracle(schema: Any) -> Any:
    """An independent 2020-12 validator (``jsonschema``) with ECMA-262 ``pattern`` semantics.

    JSON Schema patterns are ECMA-262 regular expressions; Python's ``re`` differs where tool
    schemas notice: ``$`` also matches before a final newline, and ``\\d``/``\\w`` match non-ASCII
    digits and letters. The translation below fixes those two, which is what the runtime's
    validator (jsonschema-rs) gets right and plain ``jsonschema`` does not.
    """
    return _ORACLE(schema)


def _ecma_pattern(validator: Any, regex: str, instance: Any, schema: Any) -> Any:
    if not isinstance(instance, str):
        return
    try:
        found = re.search(ecma_to_python(regex), instance, re.ASCII)
    except re.error:  # ECMA-262 that Python's re cannot read (\p{L}): no verdict here; the
        return  # runtime's validator judges every value a check keeps
    if not found:
        yield jsonschema.ValidationError(f"{instance!r} does not match {regex!r}")


_ORACLE = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _ecma_pattern})


def ecma_to_python(regex: str) -> str:
    """``$`` outside a character class becomes ``\\Z`` (the very end, as in ECMA-262)."""
    out: list[str] = []
    escaped = in_class = False
    for char in regex:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char == "$" and not in_class:
            out.append(r"\Z")
            continue
        out.append(char)
    return "".join(out)


def valid_instances(schema: Any, count: int, levels: int = MAX_DEPTH + 1) -> list[Any]:
    """Up to ``count`` values drawn from ``schema`` that the oracle accepts (derandomized, so a
    run is repeatable): the instances the fidelity checks feed to models. They are distinct
    values, topped up with repeats only when the schema gives fewer than ``count``. Optional
    properties are drawn in the first ``levels`` levels of objects only: a large schema's values
    drawn to the full depth took seconds each (SchemaStore's chrome-manifest: 57 s for ten).

    Each test case of the engine draws VALUES_PER_CASE values: the engine's own work per test
    case (running it, recording it, mutating it into the next one) was about half of the time
    of drawing one value per case. Most schemas give ``count`` distinct valid values within
    ``count * 1.4`` draws; only those that do not are drawn again with a budget of
    ``count * 4``. Only the generate phase runs: nothing here fails, so there is nothing to
    shrink."""
    strategy, check = conform(schema, schema, MAX_DEPTH + 1 - levels), oracle(schema)
    distinct: dict[str, Any] = {}
    repeats: list[Any] = []
    for budget in (count + 2 * count // 5, count * 4):
        _draw_valid(strategy, check, count, budget, distinct, repeats)
        if len(distinct) == count:
            break
    found = list(distinct.values())
    return found + repeats[: count - len(found)]


VALUES_PER_CASE = 3


def _draw_valid(
    strategy: st.SearchStrategy[Any],
    check: Any,
    count: int,
    budget: int,
    distinct: dict[str, Any],
    repeats: list[Any],
) -> None:
    """Draw ``budget`` values (rounded up to whole test cases) into ``distinct`` (by their JSON
    text) until it holds ``count``; the valid values seen again go to ``repeats``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable

    @settings(
        max_examples=math.ceil(budget / VALUES_PER_CASE),
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def collect(data: st.DataObject) -> None:
        # Always the same number of draws, whatever was found: the engine replays and mutates
        # test cases, and one that stopped early would differ from its own replay.
        for _ in range(VALUES_PER_CASE):
            value = data.draw(strategy)
            if len(distinct) >= count or not _oracle_takes(check, value):
                continue
            key = json.dumps(value, sort_keys=True)
            if key in distinct:
                repeats.append(value)
            else:
                distinct[key] = value

    # A strategy that filters out all it draws leaves the values found so far.
    with contextlib.suppress(Unsatisfiable):
        collect()


def _oracle_takes(check: Any, value: Any) -> bool:
    """The oracle's verdict; a pattern Python's re cannot read (\\p{L}) is no verdict, and the
    value is kept for the runtime's validator to judge."""
    try:
        return bool(check.is_valid(value))
    except re.error:
        return True


def round_trip(adapter: Any, value: Any) -> str | None:
    """How a generated model treats a schema-valid ``value``: None if it accepts it (as the
    runtime parses JSON) and dumps it back unchanged, else "rejected: ..." or "changed: ..."."""
    from blade_runtime.core.jsonvalue import model_of

    try:
        model = model_of(adapter.validate_python, value)
    except Exception as error:  # any failure on a valid value is a rejection (pydantic bugs too)
        return f"rejected: {type(error).__name__}: {error}"
    back = adapter.dump_python(model, mode="json", by_alias=True, exclude_unset=True)
    return None if back == value else f"changed: {back!r}"
