"""The MCP server's backends answer alike: a result a runtime returns and the same result as the
runtime stores it (what Temporal's call workflows return) are one ``Outcome``, so the MCP answer
of a call on Temporal is the answer of the same call on a runtime."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from strategies import RUNTIME_JSON, RUNTIME_TEXT

from blade_runtime.core.context import CallInfo
from blade_runtime.core.outcomes import result_json
from blade_runtime.core.results import ErrorCode, ToolError, ToolSuccess, error_content
from blade_runtime.serving.mcp_backend import Outcome

CALL = CallInfo("call_1", "run_1", "tool", "t.tool.v1")
METADATA = st.none() | st.dictionaries(RUNTIME_TEXT, RUNTIME_JSON, min_size=1, max_size=3)


def _same(result: Any) -> None:
    stored = result_json(result)
    assert isinstance(stored, dict)
    assert Outcome.stored(stored) == Outcome.of(result)


@given(RUNTIME_JSON, st.one_of(st.none(), RUNTIME_JSON.filter(lambda v: v is not None)), METADATA)
def test_a_success_stored_answers_as_it_was_returned(
    content: Any, projected_from: Any, metadata: Any
) -> None:
    """With a projection (the whole output kept beside the content) or without."""
    _same(ToolSuccess(CALL, None, content, output_json=projected_from, metadata=metadata))


@given(st.sampled_from(list(ErrorCode)), RUNTIME_TEXT, METADATA)
def test_an_error_stored_answers_as_it_was_returned(
    code: ErrorCode, message: str, metadata: Any
) -> None:
    _same(ToolError(CALL, code, message, error_content(code, message), metadata=metadata))


def test_a_pending_result_as_temporal_returns_it_carries_its_action() -> None:
    action = {
        "action_id": "act_1", "call_id": "call_1", "run_id": "run_1", "name": "tool",
        "spec_id": "t.tool.v1", "point": "confirm", "payload": {"prompt": "ok?"},
        "submit_schema": {"type": "object"}, "suspended_at": "2026-12-05T00:00:00Z",
        "tenant": "acme", "principal": "ann", "summary_only": True,
    }  # fmt: skip
    content = {"pending": "tool.confirm", "action_id": "act_1"}
    found = Outcome.stored(
        {"status": "pending", "content": content, "action_id": "act_1", "action": action}
    )
    assert (found.status, found.content, found.action_id) == ("pending", content, "act_1")
    assert found.action is not None and found.action.tenant == "acme"  # unknown keys left out
