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


def test_text_the_fast_encoder_refuses_is_encoded_as_before() -> None:
    reply = {"result": {"content": [{"text": "lone \ud800", "type": "text"}]}}
    assert compact_json(reply) == json.dumps(reply, ensure_ascii=False, separators=(",", ":"))
