"""JSON as compact text (what a model reads of JSON content, what a reply carries)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from strategies import RUNTIME_JSON, RUNTIME_TEXT

from blade_runtime.core.jsonvalue import compact_json


@given(value=RUNTIME_JSON)
def test_compact_json_reads_back_as_the_value(value: Any) -> None:
    assert json.loads(compact_json(value)) == value


# Floats aside (the same number may be spelled otherwise: 1e-7 for 1e-07), the same text as the
# standard library's compact JSON.
_NO_FLOATS: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | RUNTIME_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(RUNTIME_TEXT, inner, max_size=4),
    max_leaves=12,
)


@given(value=_NO_FLOATS)
def test_compact_json_is_the_standard_librarys_compact_text(value: Any) -> None:
    assert compact_json(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_a_lone_surrogate_is_written_as_an_escape_and_reads_back() -> None:
    """It has no UTF-8 form: the text goes as ASCII escapes, which any UTF-8 wire carries."""
    value = {"result": {"content": [{"text": "lone \ud800 é", "type": "text"}]}}
    text = compact_json(value)
    assert text.isascii() and "\\ud800" in text
    text.encode()  # no UnicodeEncodeError
    assert json.loads(text) == value
