"""The HTTP fast path's own wire writing, held to the SDK's: a text result's wire form is what the
SDK's serialization gives for its model on the protocol version."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from mcp_types import methods
from strategies import RUNTIME_JSON, RUNTIME_TEXT

from blade_runtime.core.content import is_blocks
from blade_runtime.core.results import ErrorCode
from blade_runtime.serving.mcp import (
    WIRE_VERSION,
    TextResult,
    _error,
    _success,
)


def sdk_wire(result: TextResult) -> dict[str, Any]:
    dumped = result.model().model_dump(mode="json", by_alias=True, exclude_none=True)
    return methods.serialize_server_result("tools/call", WIRE_VERSION, dumped)


@given(content=RUNTIME_JSON, projected=st.booleans())
def test_a_success_is_written_as_the_sdk_writes_it(content: Any, projected: bool) -> None:
    result = _success(content, WIRE_VERSION, projected)
    if is_blocks(content):  # content blocks are the SDK's model to build
        assert not isinstance(result, TextResult)
        return
    assert isinstance(result, TextResult)
    assert result.wire() == sdk_wire(result)


@given(code=st.sampled_from(list(ErrorCode)), message=RUNTIME_TEXT)
def test_an_error_is_written_as_the_sdk_writes_it(code: ErrorCode, message: str) -> None:
    result = _error(code, message)
    assert result.wire() == sdk_wire(result)
    assert result.wire()["isError"] is True


@given(
    text=RUNTIME_TEXT,
    structured=RUNTIME_JSON,
    is_error=st.booleans(),
    meta=st.none() | st.dictionaries(RUNTIME_TEXT, RUNTIME_JSON, max_size=3),
)
def test_any_text_result_is_written_as_the_sdk_writes_it(
    text: str, structured: Any, is_error: bool, meta: dict[str, Any] | None
) -> None:
    result = TextResult(text, structured, is_error=is_error, meta=meta)
    assert result.wire() == sdk_wire(result)
