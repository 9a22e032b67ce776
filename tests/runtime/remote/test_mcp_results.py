"""What a remote tool's answer becomes, for any JSON a server could send: an output, content
blocks the model reads, or ``ToolFailed`` with one of our codes; never another exception."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from blade_runtime.core.context import ToolFailed
from blade_runtime.core.results import ErrorCode
from blade_runtime.remote.results import answer, blocks_of, failure

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "audio", "resource_link", "resource", "video"])},
    optional={"text": JSON, "data": JSON, "mimeType": JSON, "uri": JSON, "resource": JSON},
)
RESULT = st.fixed_dictionaries(
    {},
    optional={
        "content": st.lists(BLOCK, max_size=4) | JSON,
        "structuredContent": JSON,
        "isError": JSON,
    },
)


@given(result=RESULT | JSON, structured=st.booleans())
def test_any_answer_is_an_output_or_a_failure_with_a_code(result: Any, structured: bool) -> None:
    try:
        answer(result, structured=structured, tool="t", limit=10_000)
    except ToolFailed as failed:
        assert ErrorCode(failed.code) and failed.message


def test_unknown_blocks_are_a_line_of_text_and_known_ones_keep_their_fields() -> None:
    blocks = blocks_of(
        [
            {"type": "video", "url": "x"},
            {"type": "image", "data": "AA==", "mimeType": "image/png", "extra": 1},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "hi", "x": 2}},
        ]
    )
    assert blocks == [
        {"type": "text", "text": "(content of an unsupported type: 'video')"},
        {"type": "image", "data": "AA==", "mimeType": "image/png"},
        {"type": "resource", "resource": {"uri": "file:///a", "text": "hi"}},
    ]


def test_json_rpc_errors_are_our_codes() -> None:
    from mcp.shared.exceptions import MCPError

    codes = {-32602: "INVALID_INPUT", -32601: "TOOL_UNAVAILABLE", -32001: "TIMEOUT"}
    for code, ours in {**codes, -32000: "TOOL_UNAVAILABLE", -32603: "TOOL_ERROR"}.items():
        assert failure(MCPError(code, "no"), "t").code == ours
    assert failure(ValueError("?"), "t").code == "TOOL_ERROR"
