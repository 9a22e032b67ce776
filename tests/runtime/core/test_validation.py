"""The validator's one sentence for an invalid instance: every violation's pointer and what was
expected there, at most MAX_REPORTED of them, the rest counted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from blade_runtime.core.validation import MAX_REPORTED, SchemaValidator


def required(names: list[str]) -> SchemaValidator:
    return SchemaValidator({"type": "object", "required": names})


def test_each_violation_is_named_with_its_pointer_and_the_rest_counted() -> None:
    names = [f"p{i:02d}" for i in range(MAX_REPORTED + 2)]
    sentence = required(names).explain({})
    parts = sentence.split("; ")
    assert parts[:-1] == [
        f'at the top level: the required property "{name}" is missing'
        for name in names[:MAX_REPORTED]
    ]
    assert parts[-1] == "and 2 more"


def test_pointers_escape_slash_and_tilde_and_index_arrays() -> None:
    validator = SchemaValidator(
        {
            "type": "object",
            "properties": {
                "a/b": {"type": "integer"},
                "m~n": {"type": "array", "items": {"enum": ["x"]}},
            },
        }
    )
    sentence = validator.explain({"a/b": "1", "m~n": ["x", "y"]})
    assert sentence.split("; ") == [
        "at /a~1b: must be of type integer (got string)",
        'at /m~0n/1: must be one of "x" (got "y")',
    ]


@given(st.integers(min_value=1, max_value=3 * MAX_REPORTED))
def test_as_many_parts_as_violations_up_to_the_cap(count: int) -> None:
    sentence = required([f"p{i}" for i in range(count)]).explain({})
    shown = min(count, MAX_REPORTED)
    assert sentence.count("is missing") == shown
    assert sentence.endswith(f"; and {count - shown} more") == (count > MAX_REPORTED)
